"""The one answer-extraction rule every mode is scored with.

Rule (pinned; changing it changes every published figure):

1. The text is the mode's final answer text: the `answer` field of `/reason` for the
   pipeline modes, the whole completion for `direct`.
2. The predicted answer is the LAST number in that text (`services.answers.last_number`,
   the rule the planner's `/solve` answers are read with too), read as a number by the
   service's one answer parser (`services.answers.answer_number`). A number is an optional
   minus sign (ASCII or U+2212) that does not follow a letter, digit or dot, then digits
   with optional thousands commas (`1,234,567`), an optional decimal part and an optional
   exponent (`1e-05`), or a bare decimal part (`.5`). Commas inside a number are removed;
   a comma between numbers that is not a thousands separator ends the number (`3,4` is
   two numbers). A number glued to a preceding letter (`s1`, `x2`) does not count, and
   neither does one past 10^400 (`1e999999999`: no gold is near it, and as an integer
   it would take minutes to build) or one the parser does not read exactly (more than
   1000 digits, an exponent past +-1000 or written with more than four digits).
3. A prediction is correct when `|predicted - gold| <= 1e-6 * max(1, |gold|)`: an
   absolute tolerance of 1e-6, relative for golds larger than 1.
4. No number, or no text at all, is a wrong answer.
"""

from __future__ import annotations

from services.answers import answer_number, last_number

TOLERANCE = 1e-6
MAX_EXPONENT = 400  # past any float; an int of 10**999999999 would take minutes
_TOO_LARGE = 10 ** (MAX_EXPONENT + 1)  # the first value whose leading digit is past 10^400


def extract_number(text: str | None) -> int | float | None:
    """The last number in `text` (rule above), as an int when it is integral."""
    value = answer_number(last_number(text))
    if value is None or abs(value) >= _TOO_LARGE:
        return None
    if value.denominator == 1:
        return int(value)
    try:
        return float(value)
    except OverflowError:  # a fraction past the float range
        return None


def is_correct(predicted: int | float | None, gold: int | float | None) -> bool:
    if predicted is None or gold is None:
        return False
    try:
        return abs(float(predicted) - float(gold)) <= TOLERANCE * max(1.0, abs(float(gold)))
    except OverflowError:  # an integer past the float range (a model wrote 10**400)
        return predicted == gold
