"""What number an answer is, and where the answer of a free-text solution is.

`answer_number` is the one reading of an answer as a number: the whole answer text (an
executed plan's output, a solution's answer) read exactly by the bounded
`services.arith.parse_number`, after surrounding whitespace, double quotes and a final
full stop are removed (`72`, `72.0`, `"72"`, `72.`, `$72`, `1,234`, `3/4`, `15%`). It is
never `Fraction()` or `Decimal()` of model output, which spends seconds on an answer such
as `1e30000000`. `answer_key` makes votes of it: answers that mean the same number vote
together (the orchestrator's vote, which answers it verifies, and `evals.votes`); the
verifier's symbolic checks read step outputs with `answer_number`, and the evaluation
reads the number it found with it (`evals.extract`).

`last_number` finds the final answer of a free-text solution: the last number in it.
One rule for the service and its evaluation: the planner's chain-of-thought solutions
(`POST /solve`) carry the answer this rule reads, and `evals/extract.py` scores every
mode's answer text with it (the rule is pinned there; changing it changes every published
figure).

A number is an optional minus sign (ASCII or U+2212) that does not follow a letter, digit
or dot, then digits with optional thousands commas (`1,234,567`), an optional decimal part
and an optional exponent (`1e-05`), or a bare decimal part (`.5`). Commas inside a number
are removed; a comma between numbers that is not a thousands separator ends the number
(`3,4` is two numbers). A number glued to a preceding letter (`s1`, `x2`) does not count.

`last_number` returns the number as text; `answer_number` converts it.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

from services.arith import parse_number

NUMBER_RE = re.compile(
    r"(?<![\w.])-?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
)


def numbers(text: str) -> list[str]:
    """Every number in `text`, in order, as written (U+2212 read as a minus)."""
    return NUMBER_RE.findall(text.replace("\u2212", "-"))


def last_number(text: str | None) -> str | None:
    """The last number in `text`, thousands commas removed, or None."""
    if not text:
        return None
    found = numbers(text)
    return found[-1].replace(",", "") if found else None


def normalize_text(text: str) -> str:
    """Case, Unicode form and whitespace do not change what a text says."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _bare(answer: str) -> str:
    return answer.strip().strip('"').rstrip(".")


def answer_number(answer: str | None) -> Fraction | None:
    """The number `answer` is, exactly, or None when it is not one number (rule above)."""
    if answer is None:
        return None
    return parse_number(_bare(answer))


# A program's float prints with up to 17 significant digits, and its arithmetic leaves
# noise in the last of them: `798.6000000000003`, `798.6000000000001` and a solution's
# `798.6` are one answer, and `30.000000000000004` is whole. The vote reads a decimal
# written with more significant digits than a float holds exactly (15, C's DBL_DIG) to
# that many (`answer_key`, `vote_weight`); a decimal of 15 digits or fewer is read as
# written. `answer_number` stays exact (the evaluation's and the symbolic checks' reading).
VOTE_DIGITS = 15


def _without_float_noise(value: Fraction, answer: str) -> Fraction:
    """`value`, read to VOTE_DIGITS significant digits when `answer` writes a decimal
    with more of them (a program's float); exactly otherwise (whole numbers, fractions,
    short decimals)."""
    found = NUMBER_RE.search(_bare(answer).replace(",", ""))
    if found is None or value.denominator == 1:
        return value
    mantissa = re.split("[eE]", found.group())[0]
    if "." not in mantissa or len(mantissa.lstrip("-").replace(".", "").lstrip("0")) <= VOTE_DIGITS:
        return value
    try:
        return Fraction(format(float(value), f".{VOTE_DIGITS}g"))
    except (OverflowError, ValueError):  # beyond a float's range: it was written exactly
        return value


def _vote_number(answer: str) -> Fraction | None:
    value = answer_number(answer)
    return None if value is None else _without_float_noise(value, answer)


def answer_key(answer: str | None) -> str | None:
    """Answers that mean the same number vote together ('72', '72.0', '1,234', '$72',
    and a program's '72.00000000000001'); other answers vote by their normalized text
    ('Paris', ' paris ')."""
    if answer is None:
        return None
    value = _vote_number(answer)
    return str(value) if value is not None else normalize_text(_bare(answer))


# How much a sample's answer counts in a vote when it is a number that is not whole and
# the question states whole numbers only (`vote_weight`). Chosen on the pipeline's own
# samples of GSM8K **train** questions (docs/eval/dev/README.md, "Whole answers"): of
# 1,178 answers, 51 were such numbers and one of those was right; halving their vote
# turned 2 of 205 answers right and none wrong.
NOT_WHOLE_WEIGHT = 0.5


def _as_written(answer: str) -> Fraction | None:
    """The answer's number as written, as the vote reads it: `15%` is 15 (percent),
    `$1,234` is 1234, `30.000000000000004` is 30."""
    bare = _bare(answer)
    value = parse_number(bare[:-1].rstrip() if bare.endswith("%") else bare)
    return None if value is None else _without_float_noise(value, answer)


# A fraction the question states (`1/2 of the pies`, `3 ½ cups`): `numbers` reads
# `1/2` as two whole numbers, so fractions are looked for on their own.
_FRACTION_RE = re.compile(r"\d\s*/\s*\d")


def _states_fraction(question: str) -> bool:
    if _FRACTION_RE.search(question):
        return True
    return any(not float(unicodedata.numeric(c, 0)).is_integer() for c in question)


def vote_weight(answer: str | None, question: str) -> float:
    """What one sample's answer counts in a vote: 1, or `NOT_WHOLE_WEIGHT` for a number
    that is not whole (`72.5`, `1/3`, `12.5%`) answering a question whose numbers are all
    whole (`48 clips`, `15%`). A question that states a fraction or a decimal (`$2.50`,
    `1/2`, `½`) or no number at all gives no such evidence, and every answer counts 1
    there; so does an answer that is not a number."""
    value = _as_written(answer) if answer is not None else None
    if value is None or value.denominator == 1:
        return 1.0
    stated = [parse_number(n.replace(",", "")) for n in numbers(question)]
    if not stated or any(v is None or v.denominator != 1 for v in stated):
        return 1.0
    if _states_fraction(question):
        return 1.0
    return NOT_WHOLE_WEIGHT
