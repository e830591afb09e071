"""Exact arithmetic on untrusted expressions, shared by the calc tool and the verifier.

`evaluate` never calls `eval`/`exec`: the text is rewritten into Python expression syntax
(thousands separators, percentages, `^`, `×`, `÷`), parsed with `ast.parse(mode="eval")`
and walked over an allowlist of node types. Every number is a `Fraction`, so
`0.1 + 0.2 == 3/10` holds exactly. Only `sqrt`, a non-integral power without an exact
rational root, and the constants `pi` and `e` are inexact: those return a `float`.

Bounds make every evaluation fast (well under a millisecond for any accepted input):
the source length, the AST node count and depth, the exponent (|exp| <= 1000), and the
size of every intermediate result (numerator and denominator at most `MAX_DIGITS`
decimal digits) are checked, a power *before* it is computed, so `9**9**9` is refused
without being evaluated. Parsing numbers out of text (`parse_number`, `parse_quantity`,
`as_fraction`) has the same bounds: at most `MAX_SOURCE_CHARS` characters, and a
written exponent or digit count past `MAX_DIGITS` is refused before any big integer is
built, so `1e30000000` costs microseconds, not the seconds `Fraction()` would spend.

This module imports no service package; the planner, orchestrator and verifier may all
import it.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

Number = Fraction | float

MAX_SOURCE_CHARS = 2000
MAX_NODES = 400
MAX_DEPTH = 60
MAX_EXPONENT = 1000
MAX_DIGITS = 1000  # decimal digits of a numerator or denominator
MAX_ROUND_DIGITS = 100
_MAX_BITS = int(MAX_DIGITS * math.log2(10)) + 1
_MAX_ROOT_DEGREE = 64


class ArithError(ValueError):
    """The expression cannot be evaluated; the message says why, fit for a user."""


class ArithLimitError(ArithError):
    """The expression exceeds a size or magnitude bound."""


class UnknownName(ArithError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown name {name!r}")
        self.name = name


# ---------------------------------------------------------------- numbers in text

_NUMBER_RE = re.compile(
    r"""
    (?P<sign>[-+\u2212])?\s*
    (?P<currency>[$€£])?\s*
    (?P<body>
        (?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?   # 1,234.5  or 1234.
      | \.\d+                                  # .5
    )
    (?P<exp>[eE][-+]?\d{1,4})?
    """,
    re.VERBOSE,
)
_FRACTION_RE = re.compile(r"(?P<num>[-+\u2212]?\d+)\s*/\s*(?P<den>\d+)")
_UNIT_RE = re.compile(r"(?:1/)?[A-Za-z°µΩ%][A-Za-z°µΩ%/·*^\-\d .()]{0,40}")
_FORMATTED_RE = re.compile(r"(?P<dec>\S+)\s*\((?P<frac>[-+]?\d+/\d+)\)")


def _within_bounds(value: Fraction) -> Fraction | None:
    if value.numerator.bit_length() > _MAX_BITS or value.denominator.bit_length() > _MAX_BITS:
        return None
    return value


def _parse_plain(text: str) -> Fraction | None:
    text = text.strip()
    if not text or len(text) > MAX_SOURCE_CHARS:
        return None
    m = _FRACTION_RE.fullmatch(text)
    if m:
        if max(len(m["num"]), len(m["den"])) > MAX_DIGITS + 1:
            return None
        den = int(m["den"])
        if den == 0:
            return None
        return _within_bounds(Fraction(int(m["num"].replace("\u2212", "-")), den))
    m = _NUMBER_RE.fullmatch(text)
    if m:
        return _match_to_fraction(m)
    if text.endswith("%"):
        inner = _parse_plain(text[:-1])
        return None if inner is None else inner / 100
    return None


def _match_to_fraction(m: re.Match[str]) -> Fraction | None:
    """The matched number, or None when it has more than `MAX_DIGITS` digits either way.

    The digit count and the exponent are checked on the text first: `Fraction("1e9999")`
    builds a 10,000-digit integer, and the time that takes grows faster than the exponent.
    """
    body = m["body"].replace(",", "")
    if body.endswith("."):
        body = body[:-1]
    exp = m["exp"] or ""
    if len(body) > MAX_DIGITS + 1 or (exp and abs(int(exp[1:])) > MAX_DIGITS):
        return None
    value = _within_bounds(Fraction(body + exp))
    if value is None:
        return None
    return -value if m["sign"] in ("-", "\u2212") else value


def parse_number(text: str) -> Fraction | None:
    """Parse one number written as text, exactly, or None.

    Accepts integers, decimals, scientific notation (`1.5e-3`), thousands separators
    (`1,234.5`), a leading currency sign, fractions (`-3/4`), percentages (`15%` ->
    3/20) and this module's own output (`0.3333333333 (1/3)` -> 1/3). Anything else,
    including trailing words, gives None; so does text longer than `MAX_SOURCE_CHARS` and
    a number with more than `MAX_DIGITS` digits in its numerator or denominator.
    """
    if len(text) > MAX_SOURCE_CHARS:
        return None
    m = _FORMATTED_RE.fullmatch(text.strip())
    if m:
        return _parse_plain(m["frac"])
    return _parse_plain(text)


def parse_quantity(text: str) -> tuple[Fraction, str] | None:
    """Parse a number followed by an optional unit (`299792458 m/s`) -> (value, unit)."""
    exact = parse_number(text)
    if exact is not None:
        return exact, ""
    text = text.strip()
    if len(text) > MAX_SOURCE_CHARS:
        return None
    m = _NUMBER_RE.match(text)
    if not m:
        return None
    rest = text[m.end() :].strip()
    if not _UNIT_RE.fullmatch(rest):
        return None
    value = _match_to_fraction(m)
    return None if value is None else (value, rest)


def as_fraction(value: Any) -> Number:
    """Coerce an int, float, Decimal, Fraction or numeric string to this module's numbers."""
    if isinstance(value, bool):
        raise ArithError("a boolean is not a number")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ArithError(f"not a finite number: {value!r}")
        return value
    if isinstance(value, Decimal):
        return _decimal_fraction(value)
    if isinstance(value, str):
        parsed = parse_number(value)
        if parsed is None:
            raise ArithError(f"not a number: {value[:60]!r}")
        return parsed
    raise ArithError(f"not a number: {type(value).__name__}")


def _decimal_fraction(value: Decimal) -> Fraction:
    """A finite Decimal as a Fraction, refused before building more than `MAX_DIGITS`
    digits (`Fraction(Decimal("1e999999999"))` would build a billion-digit integer)."""
    if not value.is_finite():
        raise ArithError(f"not a finite number: {value}")
    t = value.as_tuple()
    assert isinstance(t.exponent, int)  # finite
    if len(t.digits) > MAX_DIGITS or abs(t.exponent) > MAX_DIGITS:
        raise ArithLimitError(f"number has more than {MAX_DIGITS} digits")
    return Fraction(value)


# ------------------------------------------------------------------ rewriting

_REPLACEMENTS = {
    "×": "*",
    "·": "*",
    "÷": "/",
    "\u2212": "-",  # minus sign
    "\u2013": "-",  # en dash
    "^": "**",
}
_THOUSANDS_RE = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?![\d])")
_CURRENCY_RE = re.compile(r"[$€£](?=\s*[\d.])")
_LITERAL = r"((?<![\w.])(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
_PERCENT_OF_RE = re.compile(_LITERAL + r"\s*%\s*of\b", re.IGNORECASE)
# A '%' after a number literal is a percentage when what follows cannot start an
# operand (`15%`, `15% + 2`); otherwise it is modulo (`7 % 3`).
_PERCENT_RE = re.compile(_LITERAL + r"\s*%(?!\s*[\w.(])")


def _follows_identifier(text: str, i: int) -> bool:
    """Whether the parenthesis at `i` follows a name, i.e. opens a call's arguments."""
    j = i - 1
    while j >= 0 and text[j].isspace():
        j -= 1
    end = j
    while j >= 0 and (text[j].isalnum() or text[j] == "_"):
        j -= 1
    return end > j and not text[j + 1].isdigit()


def _strip_thousands(text: str) -> str:
    """Drop thousands separators outside function-call argument lists.

    Inside `max(...)` a comma separates arguments, so `max(1,234)` keeps its two
    arguments; outside calls `1,234` is one thousand two hundred thirty-four.
    """
    out: list[str] = []
    stack: list[bool] = []  # True = this parenthesis opens a call's arguments
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "(":
            stack.append(_follows_identifier(text, i))
        elif ch == ")":
            if stack:
                stack.pop()
        elif ch.isdigit() and not (stack and stack[-1]):
            m = _THOUSANDS_RE.match(text, i)
            if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "._")):
                out.append(m.group().replace(",", ""))
                i = m.end()
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _rewrite(expr: str) -> str:
    for old, new in _REPLACEMENTS.items():
        expr = expr.replace(old, new)
    expr = _CURRENCY_RE.sub("", expr)
    expr = _strip_thousands(expr)
    expr = _PERCENT_OF_RE.sub(r"(\1/100)*", expr)
    expr = _PERCENT_RE.sub(r"(\1/100)", expr)
    return " ".join(expr.split())


# ------------------------------------------------------------------- evaluation


def _check_size(value: Number) -> Number:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ArithLimitError("result is too large")
        return value
    if value.numerator.bit_length() > _MAX_BITS or value.denominator.bit_length() > _MAX_BITS:
        raise ArithLimitError(f"result has more than {MAX_DIGITS} digits")
    return value


def _to_float(value: Number) -> float:
    try:
        result = float(value)
    except OverflowError as exc:
        raise ArithLimitError("number is too large for an inexact operation") from exc
    return result


def _int_root(n: int, k: int) -> int | None:
    """The exact k-th root of n >= 0, or None."""
    if n < 2:
        return n
    # Newton's method on integers, starting above the root so that it descends.
    x = 1 << (n.bit_length() // k + 1)
    while True:
        y = ((k - 1) * x + n // x ** (k - 1)) // k
        if y >= x:
            break
        x = y
    for cand in (x - 1, x, x + 1):
        if cand >= 0 and cand**k == n:
            return cand
    return None


def _exact_root(value: Fraction, k: int) -> Fraction | None:
    if value < 0:
        return None
    num, den = _int_root(value.numerator, k), _int_root(value.denominator, k)
    if num is None or den is None:
        return None
    return Fraction(num, den)


def _power(base: Number, exp: Number) -> Number:
    if isinstance(exp, Fraction) and exp.denominator == 1:
        e = exp.numerator
        if abs(e) > MAX_EXPONENT:
            raise ArithLimitError(f"exponent {e} is out of range (|exponent| <= {MAX_EXPONENT})")
        if isinstance(base, float):
            try:
                return _check_size(base**e)
            except OverflowError as exc:
                raise ArithLimitError("result is too large") from exc
            except ZeroDivisionError as exc:
                raise ArithError("division by zero") from exc
        if base == 0 and e < 0:
            raise ArithError("division by zero")
        bits = max(base.numerator.bit_length(), base.denominator.bit_length())
        if bits > 1 and (bits - 1) * abs(e) > _MAX_BITS:
            raise ArithLimitError(f"result would have more than {MAX_DIGITS} digits")
        return _check_size(base**e)
    # Non-integral exponent: exact when the root is rational, else inexact.
    if isinstance(exp, Fraction) and isinstance(base, Fraction):
        if abs(exp) > MAX_EXPONENT:
            raise ArithLimitError(f"exponent is out of range (|exponent| <= {MAX_EXPONENT})")
        if exp.denominator <= _MAX_ROOT_DEGREE:
            root = _exact_root(base, exp.denominator)
            if root is not None:
                return _power(root, Fraction(exp.numerator))
    b, x = _to_float(base), _to_float(exp)
    if b < 0:
        raise ArithError("a negative number to a fractional power is not a real number")
    if b == 0 and x < 0:
        raise ArithError("division by zero")
    try:
        return _check_size(math.pow(b, x))
    except OverflowError as exc:
        raise ArithLimitError("result is too large") from exc


def _divide(a: Number, b: Number) -> Number:
    if b == 0:
        raise ArithError("division by zero")
    return _check_size(a / b)


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise ArithError("division by zero")
    quotient = a // b
    return _check_size(Fraction(quotient) if isinstance(quotient, int) else quotient)


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise ArithError("modulo by zero")
    return _check_size(a % b)


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise ArithError("square root of a negative number")
    if isinstance(x, Fraction):
        root = _exact_root(x, 2)
        if root is not None:
            return root
    return math.sqrt(_to_float(x))


def _round_half_up(x: Number, ndigits: Number = Fraction(0)) -> Number:
    """Round half away from zero (2.5 -> 3, -2.5 -> -3), as people expect."""
    if not (isinstance(ndigits, Fraction) and ndigits.denominator == 1):
        raise ArithError("round() takes a whole number of digits")
    n = ndigits.numerator
    if abs(n) > MAX_ROUND_DIGITS:
        raise ArithLimitError(f"round() digits out of range (|digits| <= {MAX_ROUND_DIGITS})")
    if isinstance(x, float):
        x = Fraction(x)
    scale = Fraction(10) ** n
    scaled = abs(x) * scale
    rounded = math.floor(scaled + Fraction(1, 2))
    result = Fraction(rounded) / scale
    return -result if x < 0 else result


def _floor(x: Number) -> Number:
    return Fraction(math.floor(x))


def _ceil(x: Number) -> Number:
    return Fraction(math.ceil(x))


def _min(*args: Number) -> Number:
    if not args:
        raise ArithError("min() needs at least one argument")
    return min(args)


def _max(*args: Number) -> Number:
    if not args:
        raise ArithError("max() needs at least one argument")
    return max(args)


_FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    # name: (function, min args, max args)
    "abs": (abs, 1, 1),
    "round": (_round_half_up, 1, 2),
    "min": (_min, 1, 50),
    "max": (_max, 1, 50),
    "sqrt": (_sqrt, 1, 1),
    "floor": (_floor, 1, 1),
    "ceil": (_ceil, 1, 1),
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}

_BINOPS: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: lambda a, b: _check_size(a + b),
    ast.Sub: lambda a, b: _check_size(a - b),
    ast.Mult: lambda a, b: _check_size(a * b),
    ast.Div: _divide,
    ast.FloorDiv: _floordiv,
    ast.Mod: _mod,
    ast.Pow: _power,
}
_UNARYOPS: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: lambda a: +a,
    ast.USub: lambda a: -a,
}
_ALLOWED_NODES = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.Call,
    *_BINOPS,
    *_UNARYOPS,
)


def _check_tree(tree: ast.Expression) -> None:
    count = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ArithLimitError(f"expression is too long (more than {MAX_NODES} parts)")
        if depth > MAX_DEPTH:
            raise ArithLimitError(f"expression is nested too deeply (more than {MAX_DEPTH})")
        if not isinstance(node, _ALLOWED_NODES):
            raise ArithError(f"not allowed in an arithmetic expression: {_describe(node)}")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
                raise ArithError("unknown function; allowed: " + ", ".join(sorted(_FUNCTIONS)))
            if node.keywords:
                raise ArithError("functions take positional arguments only")
            stack.extend((arg, depth + 1) for arg in node.args)
            continue
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _describe(node: ast.AST) -> str:
    names = {
        ast.Compare: "comparison",
        ast.BoolOp: "and/or",
        ast.Attribute: "attribute access",
        ast.Subscript: "indexing",
        ast.Lambda: "lambda",
        ast.Tuple: "a tuple (use a function such as max(a, b), or drop the commas)",
    }
    return names.get(type(node), type(node).__name__)


class _Evaluator:
    def __init__(self, source: str, names: Mapping[str, Number]) -> None:
        self.source = source
        self.names = names

    def eval(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Expression):
            return self.eval(node.body)
        if isinstance(node, ast.Constant):
            return self._constant(node)
        if isinstance(node, ast.BinOp):
            left = self.eval(node.left)
            right = self.eval(node.right)
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            return _UNARYOPS[type(node.op)](self.eval(node.operand))
        if isinstance(node, ast.Name):
            if node.id in self.names:
                return self.names[node.id]
            if node.id in _CONSTANTS:
                return _CONSTANTS[node.id]
            raise UnknownName(node.id)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            fn, lo, hi = _FUNCTIONS[node.func.id]
            if not lo <= len(node.args) <= hi:
                raise ArithError(f"{node.func.id}() takes {lo}..{hi} arguments")
            args = [self.eval(arg) for arg in node.args]
            return _check_size(fn(*args))
        raise ArithError(f"not allowed in an arithmetic expression: {_describe(node)}")

    def _constant(self, node: ast.Constant) -> Number:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ArithError(f"not a number: {value!r}"[:80])
        if isinstance(value, int):
            return _check_size(Fraction(value))
        # Re-read a float literal from its source text so that 0.1 is exactly 1/10.
        text = ast.get_source_segment(self.source, node)
        if text is None:  # pragma: no cover - the parser always records positions
            raise ArithError("cannot read a number literal")
        text = text.replace("_", "")
        mantissa, _, exponent = text.lower().partition("e")
        if exponent and abs(int(exponent)) + len(mantissa) > MAX_DIGITS:
            raise ArithLimitError(f"number literal has more than {MAX_DIGITS} digits")
        try:
            return _check_size(Fraction(text))
        except (ValueError, ZeroDivisionError) as exc:
            raise ArithError(f"not a number: {text[:40]!r}") from exc


def evaluate(expr: str, names: Mapping[str, Any] | None = None) -> Number:
    """Evaluate an arithmetic expression exactly.

    Returns a `Fraction`, or a `float` when an inexact operation (sqrt of a non-square,
    an irrational power, pi, e) was involved. `names` binds identifiers (e.g. step
    results `s1`) to numbers: numeric strings are parsed with `parse_number`, and floats
    are read as the decimal they print as (0.1 is exactly 1/10).
    Raises `ArithError` (or its subclass `ArithLimitError`) with a readable message.
    """
    if not isinstance(expr, str):
        raise ArithError("the expression must be text")
    if len(expr) > MAX_SOURCE_CHARS:
        raise ArithLimitError(f"expression is longer than {MAX_SOURCE_CHARS} characters")
    source = _rewrite(expr)
    if not source:
        raise ArithError("empty expression")
    depth = max_depth = 0
    for ch in source:
        if ch == "(":
            depth += 1
            max_depth = max(max_depth, depth)
        elif ch == ")":
            depth -= 1
    if max_depth > MAX_DEPTH:
        raise ArithLimitError(f"expression is nested too deeply (more than {MAX_DEPTH})")
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ArithError(f"not a valid arithmetic expression: {expr[:80]!r}") from exc
    _check_tree(tree)
    bound: dict[str, Number] = {}
    for key, value in (names or {}).items():
        if not key.isidentifier():
            continue
        try:
            number = as_fraction(value)
            if isinstance(number, float):
                # A float handed over by an earlier step means the decimal it prints
                # as: 0.1 is 1/10, not the binary double nearest to it.
                number = Fraction(repr(number))
            bound[key] = _check_size(number)
        except ArithError:
            continue
    try:
        return _Evaluator(source, bound).eval(tree)
    except ArithError:
        raise
    except ZeroDivisionError as exc:
        raise ArithError("division by zero") from exc
    except (OverflowError, RecursionError, MemoryError) as exc:
        raise ArithLimitError("result is too large") from exc
    except (TypeError, ValueError) as exc:
        raise ArithError(f"cannot evaluate: {exc}") from exc


# ------------------------------------------------------------------- formatting


def _is_terminating(value: Fraction) -> bool:
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    return den == 1


def _decimal_string(value: Fraction, places: int) -> str:
    """Exact or rounded (half away from zero) fixed-point text, trailing zeros dropped."""
    scaled = _round_half_up(value, Fraction(places))
    assert isinstance(scaled, Fraction)
    sign = "-" if scaled < 0 else ""
    n = abs(scaled.numerator) * 10**places // scaled.denominator
    whole, frac = divmod(n, 10**places)
    frac_text = str(frac).rjust(places, "0").rstrip("0") if places else ""
    return f"{sign}{whole}" + (f".{frac_text}" if frac_text else "")


def format_number(value: Any, places: int = 10) -> str:
    """Readable text for a number.

    Integers print as integers; terminating fractions as their exact decimal (up to 30
    decimal places); other fractions as a decimal rounded to `places` places (for
    |x| < 1, to `places` significant digits) followed by the exact fraction, e.g.
    `0.3333333333 (1/3)`. Floats print in their shortest round-trip form.
    """
    if isinstance(value, bool):
        raise ArithError("a boolean is not a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        value = _decimal_fraction(value)
    if not isinstance(value, Fraction):
        raise ArithError(f"not a number: {type(value).__name__}")
    if value.numerator.bit_length() > _MAX_BITS or value.denominator.bit_length() > _MAX_BITS:
        raise ArithLimitError(f"number has more than {MAX_DIGITS} digits")
    if value.denominator == 1:
        return str(value.numerator)
    if _is_terminating(value) and _decimal_places_needed(value.denominator) <= 30:
        return _decimal_string(value, _decimal_places_needed(value.denominator))
    # For |x| < 1 keep `places` significant digits: shift past the leading zeros.
    leading = 0
    while abs(value) * 10 ** (leading + 1) < 1:
        leading += 1
    exact = f"({value.numerator}/{value.denominator})"
    if places + leading > MAX_ROUND_DIGITS:  # too many zeros to write out: 3.3e-201
        mantissa = _decimal_string(value * 10 ** (leading + 1), places - 1)
        return f"{mantissa}e-{leading + 1} {exact}"
    return f"{_decimal_string(value, places + leading)} {exact}"


def _decimal_places_needed(den: int) -> int:
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    return max(twos, fives)


def numbers_close(a: Any, b: Any, rel_tol: float = 1e-9, abs_tol: float = 1e-12) -> bool:
    """Whether two numbers agree within a relative or absolute tolerance, compared exactly.

    `3.1415926535` and `3.141592653589793` are close (relative difference 3e-11);
    `0.1 + 0.2` and `0.3` given as floats are close; `1` and `1.001` are not.
    Inputs may be numbers or numeric strings; anything unparsable is never close.
    """
    if rel_tol < 0 or abs_tol < 0:
        raise ValueError("tolerances must be non-negative")
    try:
        x, y = as_fraction(a), as_fraction(b)
    except ArithError:
        return False
    fx = Fraction(x) if isinstance(x, float) else x
    fy = Fraction(y) if isinstance(y, float) else y
    if fx == fy:
        return True
    diff = abs(fx - fy)
    return diff <= max(Fraction(rel_tol) * max(abs(fx), abs(fy)), Fraction(abs_tol))


def json_number(value: Number) -> int | float | str:
    """A calc result as the value a step hands on. Later steps get the result as a number (python steps compute with it): integers as
    int, terminating decimals as float when the float prints as the same decimal (0.3,
    12.5; a later calc step reads it back as exactly that decimal). Anything a float
    would change stays exact text: "0.3333333333 (1/3)", "123456789.123456789"."""
    if isinstance(value, float):
        return value
    if value.denominator == 1:
        return int(value)
    text = format_number(value)
    if "(" not in text:
        as_float = float(text)
        if Fraction(repr(as_float)) == value:
            return as_float
    return text
