"""Exact checks for claims that are arithmetic: `expr = value`, `expr is value`.

`check` returns None when the claim is outside what it can check, so the model decides.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from fractions import Fraction

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_EQ_RE = re.compile(
    r"^\s*(?P<lhs>[-+*/().\d\s]+?)\s*(?:=|==|is|equals)\s*(?P<rhs>-?[\d.]+)\s*\.?\s*$"
)


@dataclass(frozen=True)
class SymbolicResult:
    verdict: bool
    confidence: float
    decisive: bool = True
    reason: str = ""


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("unsupported expression")


def check(statement: str, context: str = "", question: str | None = None) -> SymbolicResult | None:
    match = _EQ_RE.match(statement)
    if not match or len(statement) > 500:
        return None
    try:
        lhs = _eval(ast.parse(match["lhs"], mode="eval"))
        rhs = Fraction(match["rhs"])
    except (ValueError, SyntaxError, ZeroDivisionError):
        return None
    ok = abs(lhs - rhs) <= max(abs(rhs), 1) * Fraction(1, 10**9)
    return SymbolicResult(
        ok, 0.999 if ok else 0.001, reason=f"{match['lhs'].strip()} = {float(lhs)}"
    )
