"""Exact checks for claims about arithmetic, numeric comparisons, percentages and units.

`check(statement, context, question)` returns a `SymbolicResult`, or None when the claim
is outside what it can check (the model decides then). It accepts only statements that
parse completely; anything else (extra words, negations it does not model, unknown
units, ambiguous readings) gives None rather than a guess.

What it decides:
- equations: `17 * 23 + 4 = 395`, "The sum of 12 and 30 is 42.", "15 is 20% of 75.",
  "Increasing 80 by 15% gives 92.", "2.5 km is 2500 m." (expressions evaluated exactly by
  `services.arith`, both sides of a unit claim converted to a base unit);
- comparisons: `3/4 > 0.7`, "0.5 is less than 0.45.", "2 km is longer than 1500 m.";
- a proposed answer against the computation that produced it, given as context in the
  step form of `services.claims` (read with its `parse_steps`), one step per line,
  optionally followed by `answer_step: sN` (otherwise the last step is the answer step):

      s1 [calc] 17*23+4 -> 395
      s2 [python] s1 * 2 -> 790
      answer_step: s2

  with the statement "The answer is 790.". Each step whose input is an arithmetic
  expression (over numbers and earlier step ids) is recomputed; a wrong output on the
  answer's path, or a stated answer that differs from the answer step's output, makes
  the claim FALSE. When everything checks out the result is *not* decisive: consistent
  arithmetic does not show that the plan answers the question, so the model still
  judges it (method `both`).

Numbers agree when they are equal within a relative 1e-9 (`3.1415926535` against
`3.141592653589793`), or when the stated number, written with two or more decimals,
is the exact value rounded or truncated to those decimals (`2/3 = 0.67`). "About" /
"approximately" / `≈` claims accept one unit in the last stated place.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from services.answers import answer_number
from services.arith import ArithError, evaluate, numbers_close, parse_number
from services.claims import Step, parse_steps

MAX_STATEMENT_CHARS = 500
TRUE_CONFIDENCE = 0.999
FALSE_CONFIDENCE = 0.001
# A wrong intermediate step or a stated answer that differs from the computed one.
INCONSISTENT_CONFIDENCE = 0.01


@dataclass(frozen=True)
class SymbolicResult:
    verdict: bool
    confidence: float
    # False: the checkable parts hold but do not settle the claim; the model decides.
    decisive: bool = True
    reason: str = ""


def _true(reason: str) -> SymbolicResult:
    return SymbolicResult(True, TRUE_CONFIDENCE, reason=reason)


def _false(reason: str, confidence: float = FALSE_CONFIDENCE) -> SymbolicResult:
    return SymbolicResult(False, confidence, reason=reason)


# --------------------------------------------------------------------------- units

# unit -> (dimension, factor to the dimension's base unit)
_UNIT_TABLE: dict[str, tuple[str, Fraction]] = {}


def _units(dimension: str, factor: Fraction | int | str, *names: str) -> None:
    for name in names:
        _UNIT_TABLE[name] = (dimension, Fraction(factor))


_units("length", "0.001", "mm", "millimeter", "millimeters", "millimetre", "millimetres")
_units("length", "0.01", "cm", "centimeter", "centimeters", "centimetre", "centimetres")
_units("length", 1, "m", "meter", "meters", "metre", "metres")
_units("length", 1000, "km", "kilometer", "kilometers", "kilometre", "kilometres")
_units("length", "0.0254", "in", "inch", "inches")
_units("length", "0.3048", "ft", "foot", "feet")
_units("length", "0.9144", "yd", "yard", "yards")
_units("length", "1609.344", "mi", "mile", "miles")
_units("mass", "0.001", "mg", "milligram", "milligrams")
_units("mass", 1, "g", "gram", "grams")
_units("mass", 1000, "kg", "kilogram", "kilograms")
_units("mass", "453.59237", "lb", "lbs", "pound", "pounds")
_units("mass", "28.349523125", "oz", "ounce", "ounces")
_units("time", 1, "s", "sec", "secs", "second", "seconds")
_units("time", 60, "min", "mins", "minute", "minutes")
_units("time", 3600, "h", "hr", "hrs", "hour", "hours")
_units("time", 86400, "day", "days")
_units("time", 604800, "week", "weeks")
_units("volume", 1, "ml", "milliliter", "milliliters", "millilitre", "millilitres")
_units("volume", 1000, "l", "liter", "liters", "litre", "litres")
_units("money", 1, "cent", "cents")
_units("money", 100, "dollar", "dollars", "$")

_QUANTITY_RE = re.compile(
    r"(?P<cur>\$)?\s*(?P<num>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?)"
    r"\s*(?P<unit>[a-z]+)?"
)
_DIMENSION_WORDS = {
    "longer": ("length", ">"),
    "shorter": ("length", "<"),
    "heavier": ("mass", ">"),
    "lighter": ("mass", "<"),
}


@dataclass(frozen=True)
class _Quantity:
    value: Fraction  # in the dimension's base unit
    dimension: str
    text: str  # the number as written, for the precision rule
    factor: Fraction  # base units per written unit


def _quantity(text: str) -> _Quantity | None:
    """`2.5 km`, `$3.50`, `90 minutes` -> value in the base unit; plain numbers -> None."""
    m = _QUANTITY_RE.fullmatch(text.strip())
    if not m:
        return None
    unit = m["unit"]
    if m["cur"]:
        if unit in (None, "dollar", "dollars"):
            unit = "$"
        else:
            return None
    if unit is None or unit not in _UNIT_TABLE:
        return None
    value = parse_number(m["num"])
    if value is None:
        return None
    dimension, factor = _UNIT_TABLE[unit]
    return _Quantity(value * factor, dimension, m["num"], factor)


# --------------------------------------------------------------------------- expressions

_WORD_FORMS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"^{p}$"), r)
    for p, r in [
        (r"the sum of (?P<a>.+?) and (?P<b>.+)", "({a})+({b})"),
        (r"adding (?P<a>.+?) (?:and|to) (?P<b>.+)", "({a})+({b})"),
        # a-b or |a-b|? only decided when both readings agree (a >= b)
        (r"the difference between (?P<a>.+?) and (?P<b>.+)", "({a})-({b})"),
        (r"subtracting (?P<b>.+?) from (?P<a>.+)", "({a})-({b})"),
        (r"the product of (?P<a>.+?) and (?P<b>.+)", "({a})*({b})"),
        (r"multiplying (?P<a>.+?) by (?P<b>.+)", "({a})*({b})"),
        (r"the quotient of (?P<a>.+?) and (?P<b>.+)", "({a})/({b})"),
        (r"dividing (?P<a>.+?) by (?P<b>.+)", "({a})/({b})"),
        (r"(?:the )?square root of (?P<a>.+)", "sqrt({a})"),
        (r"(?P<a>.+?) squared", "({a})**2"),
        (r"(?P<a>.+?) cubed", "({a})**3"),
        (r"twice (?P<a>.+)", "2*({a})"),
        (r"half of (?P<a>.+)", "({a})/2"),
        (
            r"(?:increasing )?(?P<a>.+?) (?:increased )?by (?P<p>[\d.]+) ?(?:%|percent)",
            "({a})*(1+({p})/100)",
        ),
        (
            r"(?:decreasing|reducing) (?P<a>.+?) by (?P<p>[\d.]+) ?(?:%|percent)",
            "({a})*(1-({p})/100)",
        ),
        (
            r"(?P<a>.+?) (?:decreased|reduced) by (?P<p>[\d.]+) ?(?:%|percent)",
            "({a})*(1-({p})/100)",
        ),
        (
            r"the percentage (?:increase|change) from (?P<a>.+?) to (?P<b>.+)",
            "(({b})-({a}))/({a})",
        ),
        (r"the percentage decrease from (?P<a>.+?) to (?P<b>.+)", "(({a})-({b}))/({a})"),
        (r"the result of (?P<a>.+)", "{a}"),
    ]
]
_WORD_OPS = [
    (re.compile(r"\bmultiplied by\b"), "*"),
    (re.compile(r"\bdivided by\b"), "/"),
    (re.compile(r"\btimes\b"), "*"),
    (re.compile(r"\bplus\b"), "+"),
    (re.compile(r"\bminus\b"), "-"),
    (re.compile(r"\bpercent\b"), "%"),
]
_SAFE_EXPR_RE = re.compile(r"[\d\s.,+\-*/%()^×÷·$a-z_]*")


def _expr_value(text: str, depth: int = 0) -> Fraction | float | None:
    """The exact value of an arithmetic expression (words like 'plus' allowed), or None."""
    text = text.strip()
    if not text or depth > 3 or not _SAFE_EXPR_RE.fullmatch(text):
        return None
    for pattern, template in _WORD_FORMS:
        m = pattern.match(text)
        if m:
            parts = m.groupdict()
            values = {k: _expr_value(v, depth + 1) for k, v in parts.items()}
            if any(v is None for v in values.values()):
                continue
            if "difference" in pattern.pattern and values["a"] < values["b"]:  # type: ignore[operator]
                return None
            expr = template.format(**{k: _as_literal(v) for k, v in values.items()})
            try:
                return evaluate(expr)
            except ArithError:
                return None
    for pattern, symbol in _WORD_OPS:
        text = pattern.sub(symbol, text)
    if re.search(r"[a-z]", text.replace("sqrt", "").replace("pi", "").replace("of", "")):
        # words other than the few arith knows: not a pure expression
        return None
    if re.search(r"\d\s+\d", text):  # `12 3` is not a number
        return None
    try:
        return evaluate(text)
    except ArithError:
        return None


def _as_literal(value: Fraction | float | None) -> str:
    if isinstance(value, Fraction):
        return f"({value.numerator}/{value.denominator})"
    return repr(value)


def _decimals(text: str) -> int | None:
    """Decimals written in a plain number literal (`3.14` -> 2), or None if not one."""
    m = re.fullmatch(r"\s*\$?\s*[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?\s*", text)
    if not m:
        return None
    return len(m[1] or "")


def _round(value: Fraction, places: int) -> Fraction:
    scale = Fraction(10) ** places
    sign = -1 if value < 0 else 1
    return sign * Fraction(math.floor(abs(value) * scale + Fraction(1, 2))) / scale


def _trunc(value: Fraction, places: int) -> Fraction:
    scale = Fraction(10) ** places
    sign = -1 if value < 0 else 1
    return sign * Fraction(math.floor(abs(value) * scale)) / scale


def _agree(
    exact: Fraction | float, stated: Fraction, stated_text: str | None, approx: bool
) -> bool | None:
    """Whether a stated number matches a computed one: True, False, or None (ambiguous)."""
    if numbers_close(exact, stated):
        return True
    exact_f = Fraction(exact)
    places = _decimals(stated_text) if stated_text is not None else None
    if approx:
        unit = Fraction(1, 10**places) if places is not None else abs(stated) / 100
        diff = abs(exact_f - stated)
        if diff <= unit:
            return True
        return False if diff > max(abs(exact_f), abs(stated)) / 10 else None
    if places is None:
        return False
    representable = exact_f * 10**places == int(exact_f * 10**places)
    if not representable and stated in (_round(exact_f, places), _trunc(exact_f, places)):
        # `2/3 = 0.67` is the usual way to write a rounded value; `10/3 = 3.3` is too
        # coarse to call either way.
        return True if places >= 2 else None
    return False


# --------------------------------------------------------------------------- statements

_APPROX_RE = re.compile(r"\b(?:approximately|about|roughly|around|nearly)\b|≈|~")
_EQ_CONNECTORS = [
    r"==",
    r"=",
    r"\bis equal to\b",
    r"\bequals\b",
    r"\bequal\b",
    r"\bgives\b",
    r"\byields\b",
    r"\bmakes\b",
    r"\bcomes to\b",
    r"\bis\b",
]
_CMP_CONNECTORS: list[tuple[str, Callable[[Fraction, Fraction], bool]]] = [
    (r">=|≥|\bis (?:at least|greater than or equal to|no less than|not less than)\b", operator.ge),
    (
        r"<=|≤|\bis (?:at most|less than or equal to|no more than|not more than|not greater than)\b",
        operator.le,
    ),
    (
        r"!=|≠|\bis not equal to\b|\bdoes not equal\b"
        r"|\b(?:is not|isn't)\b(?! (?:equal|greater|less|more|larger|smaller|at|higher|lower))",
        operator.ne,
    ),
    (r">(?!=)|\b(?:is (?:greater|larger|bigger|more|higher) than|exceeds)\b", operator.gt),
    (r"<(?!=)|\bis (?:less|smaller|fewer|lower) than\b", operator.lt),
]
_NEGATION_RE = re.compile(r"\b(?:not|no|never|n't|none|neither|nor|cannot|false|untrue)\b|n't")
_ANSWER_RE = re.compile(r"(?:so |therefore |thus )?(?:the )?(?:final )?answer is:?\s+(?P<value>.+)")


def _normalise(text: str) -> str:
    text = " ".join(text.strip().split()).lower()
    text = text.replace("−", "-").replace("–", "-")
    return re.sub(r"[.!]+$", "", text).strip()


@dataclass(frozen=True)
class _Side:
    value: Fraction | float  # in the dimension's base unit when there is a unit
    literal: str | None  # the number as written, when the side is a plain number
    dimension: str | None  # None for a bare number
    factor: Fraction = Fraction(1)  # base units per written unit

    def stated(self) -> Fraction | None:
        """The written number (in its own unit), when this side is a plain literal."""
        if self.literal is None or isinstance(self.value, float):
            return None
        return Fraction(self.value) / self.factor


def _side(text: str) -> _Side | None:
    q = _quantity(text)
    if q is not None:
        return _Side(q.value, q.text, q.dimension, q.factor)
    value = _expr_value(text)
    if value is None:
        return None
    literal = text.strip() if _decimals(text) is not None else None
    return _Side(value, literal, None)


def _check_equation(lhs_text: str, rhs_text: str, approx: bool) -> bool | None:
    if re.match(r"\s*the percentage", lhs_text) and not re.search(r"%|percent", rhs_text):
        return None  # "the percentage increase ... is 20" could mean 20% or 0.2
    lhs, rhs = _side(lhs_text), _side(rhs_text)
    if lhs is None or rhs is None:
        return None
    if lhs.dimension != rhs.dimension:  # different kinds of unit, or a unit against none
        return None
    if isinstance(lhs.value, float) and isinstance(rhs.value, float):
        return None
    # The plain literal side is the stated value, compared in its own unit; the other
    # side is the computed one.
    for stated, computed in ((rhs, lhs), (lhs, rhs)):
        written = stated.stated()
        if written is not None:
            value = Fraction(computed.value) / stated.factor
            agree = _agree(value, written, stated.literal, approx)
            if agree and computed.stated() is not None and not approx:
                # two written numbers (`1251 ml = 1.25 l`): a rounding match is no proof
                return True if numbers_close(value, written) else None
            return agree
    if isinstance(rhs.value, Fraction):
        return _agree(lhs.value, rhs.value, None, approx)
    return _agree(rhs.value, Fraction(lhs.value), None, approx)


def _check_comparison(
    lhs_text: str, rhs_text: str, op: Callable[[Fraction, Fraction], bool], dimension: str | None
) -> bool | None:
    lhs, rhs = _side(lhs_text), _side(rhs_text)
    if lhs is None or rhs is None or lhs.dimension != rhs.dimension:
        return None
    if dimension is not None and lhs.dimension != dimension:
        return None
    lv, rv = Fraction(lhs.value), Fraction(rhs.value)
    inexact = isinstance(lhs.value, float) or isinstance(rhs.value, float)
    if inexact and numbers_close(lhs.value, rhs.value, rel_tol=1e-12):
        return None  # too close to call with a floating-point side
    return bool(op(lv, rv))


def _readings(text: str) -> list[bool | None]:
    """Every way the statement parses as an equation or comparison, with its truth."""
    results: list[bool | None] = []
    for word, (dimension, symbol) in _DIMENSION_WORDS.items():
        for m in re.finditer(rf"\bis {word} than\b", text):
            op: Callable[[Fraction, Fraction], bool] = operator.gt if symbol == ">" else operator.lt
            lhs, rhs = text[: m.start()], text[m.end() :]
            verdict = _check_comparison(lhs, rhs, op, dimension)
            if verdict is not None or (_side(lhs) is not None and _side(rhs) is not None):
                results.append(verdict)
    for pattern, op in _CMP_CONNECTORS:
        for m in re.finditer(pattern, text):
            lhs, rhs = text[: m.start()], text[m.end() :]
            verdict = _check_comparison(lhs, rhs, op, None)
            if verdict is not None or (_side(lhs) is not None and _side(rhs) is not None):
                results.append(verdict)
    approx = bool(_APPROX_RE.search(text))
    plain = re.sub(r"≈|~", " = ", text)
    plain = re.sub(r"\b(?:approximately|about|roughly|around|nearly)\b", " ", plain)
    plain = " ".join(plain.split())
    for pattern in _EQ_CONNECTORS:
        for m in re.finditer(pattern, plain):
            lhs, rhs = plain[: m.start()], plain[m.end() :]
            if not lhs.strip() or not rhs.strip():
                continue
            if re.match(r"\s*(?:not\b|n't|=|<|>)", rhs) or lhs.rstrip().endswith(
                ("!", "<", ">", "=")
            ):
                continue
            verdict = _check_equation(lhs, rhs, approx)
            if verdict is not None or (_side(lhs) is not None and _side(rhs) is not None):
                results.append(verdict)
    return results


def _check_statement(statement: str) -> SymbolicResult | None:
    text = _normalise(statement)
    readings = _readings(text)
    decided = {r for r in readings if r is not None}
    if not readings or None in readings or len(decided) != 1:
        return None
    verdict = decided.pop()
    if _NEGATION_RE.search(text) and not any(
        re.search(p, text)
        for p, op in _CMP_CONNECTORS
        if op in (operator.ne, operator.le, operator.ge)
    ):
        return None
    return _true(f"checked exactly: {text}") if verdict else _false(f"checked exactly: {text}")


# --------------------------------------------------------------------------- context

_STEP_NAME_RE = re.compile(r"\bs\d{1,2}\b")
_PYTHON_UNSAFE = ("^", "**", "//", "%", "=", ";", "\n", "import")


def _recompute(step: Step, values: dict[str, Fraction]) -> Fraction | float | None:
    """The step's output recomputed from its input, when the input is plain arithmetic."""
    if step.tool not in ("calc", "python"):
        return None
    if step.tool == "python" and (
        any(t in step.input for t in _PYTHON_UNSAFE)
        or re.search(r"[A-Za-z_]", _STEP_NAME_RE.sub("", step.input))
    ):
        # Python's ^, % and round() differ from the calculator's; statements and calls
        # are not plain arithmetic
        return None
    names = set(_STEP_NAME_RE.findall(step.input))
    if not names <= set(values):
        return None
    try:
        return evaluate(step.input, {k: values[k] for k in names})
    except ArithError:
        return None


def _check_with_steps(statement: str, steps: list[Step], answer_id: str) -> SymbolicResult | None:
    m = _ANSWER_RE.fullmatch(_normalise(statement))
    if not m:
        return None
    parsed_answer = _answer_number(m["value"])
    if parsed_answer is None:
        return None
    stated, stated_text = parsed_answer
    values: dict[str, Fraction] = {}
    wrong: dict[str, str] = {}
    for step in steps:
        output = answer_number(step.output)  # read as the vote reads an answer
        if output is None:
            continue
        recomputed = _recompute(step, values)
        if recomputed is not None and not numbers_close(recomputed, output):
            wrong[step.id] = f"{step.id}: {step.input} is {recomputed}, not {step.output}"
        values[step.id] = output
    # Steps the answer depends on, through the step ids named in inputs.
    by_id = {s.id: s for s in steps}
    needed, todo = set(), [answer_id]
    while todo:
        sid = todo.pop()
        if sid in needed or sid not in by_id:
            continue
        needed.add(sid)
        todo += _STEP_NAME_RE.findall(by_id[sid].input)
    bad = [wrong[s] for s in sorted(needed) if s in wrong]
    if bad:
        return _false("wrong step output: " + "; ".join(bad), INCONSISTENT_CONFIDENCE)
    if answer_id not in values:
        return None
    agree = _agree(values[answer_id], stated, stated_text, approx=False)
    if agree is None:
        return None
    if not agree:
        return _false(
            f"stated answer {stated_text} differs from {answer_id} = {by_id[answer_id].output}",
            INCONSISTENT_CONFIDENCE,
        )
    return SymbolicResult(
        True, TRUE_CONFIDENCE, decisive=False, reason="steps and stated answer are consistent"
    )


_MULTIPLIER_WORDS = {
    "dozen",
    "dozens",
    "hundred",
    "thousand",
    "million",
    "billion",
    "percent",
    "score",
}


def _answer_number(text: str) -> tuple[Fraction, str | None] | None:
    """The number of a stated answer (`18`, `$18.50`, `18 eggs`) and its plain text.

    A trailing noun is a label (`18 eggs`); a unit of measure or a multiplier word
    (`18 km`, `2 dozen`) changes the number, so such answers are left to the model.
    """
    text = text.strip()
    m = re.fullmatch(
        r"(?P<cur>\$)?\s*(?P<num>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\d+\s*/\s*\d+)"
        r"(?:\s+(?P<words>[a-z][a-z' -]{0,40}))?",
        text,
    )
    if not m:
        value = answer_number(text)  # e.g. `0.3333333333 (1/3)`
        return None if value is None else (value, None)
    words = (m["words"] or "").split()
    if words and (
        words[0] in _MULTIPLIER_WORDS
        or (words[0] in _UNIT_TABLE and words[0] not in ("dollar", "dollars", "cent", "cents"))
    ):
        return None
    if words and words[0] in ("cent", "cents"):
        return None
    value = parse_number(m["num"])
    if value is None:
        return None
    return value, (m["num"] if _decimals(m["num"]) is not None else None)


# --------------------------------------------------------------------------- entry point


def check(statement: str, context: str = "", question: str | None = None) -> SymbolicResult | None:
    """Check a claim exactly; None when it is outside what this module can decide."""
    if not statement or len(statement) > MAX_STATEMENT_CHARS:
        return None
    result = _check_statement(statement)
    if result is not None:
        return result
    if context and context.strip():
        parsed = parse_steps(context)
        if parsed is not None:
            return _check_with_steps(statement, *parsed)
    return None
