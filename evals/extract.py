"""The one answer-extraction rule every mode is scored with.

Rule (pinned; changing it changes every published figure):

1. The text is the mode's final answer text: the `answer` field of `/reason` for the
   pipeline modes, the whole completion for `direct`.
2. The predicted answer is the LAST number in that text. A number is an optional minus
   sign (ASCII or U+2212) that does not follow a letter, digit or dot, then digits with
   optional thousands commas (`1,234,567`), an optional decimal part and an optional
   exponent (`1e-05`), or a bare decimal part (`.5`). Commas inside a number are removed;
   a comma between numbers that is not a thousands separator ends the number (`3,4` is
   two numbers). A number glued to a preceding letter (`s1`, `x2`) does not count.
3. A prediction is correct when `|predicted - gold| <= 1e-6 * max(1, |gold|)`: an
   absolute tolerance of 1e-6, relative for golds larger than 1.
4. No number, or no text at all, is a wrong answer.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

TOLERANCE = 1e-6

_NUMBER_RE = re.compile(
    r"(?<![\w.])-?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
)


def _numbers(text: str) -> list[str]:
    return _NUMBER_RE.findall(text.replace("\u2212", "-"))


def extract_number(text: str | None) -> int | float | None:
    """The last number in `text` (rule above), as an int when it is integral."""
    if not text:
        return None
    found = _numbers(text)
    if not found:
        return None
    try:
        value = Decimal(found[-1].replace(",", ""))
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return int(value)
    number = float(value)
    return number if math.isfinite(number) else None


def is_correct(predicted: int | float | None, gold: int | float | None) -> bool:
    if predicted is None or gold is None:
        return False
    try:
        return abs(float(predicted) - float(gold)) <= TOLERANCE * max(1.0, abs(float(gold)))
    except OverflowError:  # an integer past the float range (a model wrote 10**400)
        return predicted == gold
