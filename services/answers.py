"""The final answer of a free-text solution: the last number in it.

One rule for the service and its evaluation: the planner's chain-of-thought solutions
(`POST /solve`) carry the answer this rule reads, and `evals/extract.py` scores every
mode's answer text with it (the rule is pinned there; changing it changes every published
figure).

A number is an optional minus sign (ASCII or U+2212) that does not follow a letter, digit
or dot, then digits with optional thousands commas (`1,234,567`), an optional decimal part
and an optional exponent (`1e-05`), or a bare decimal part (`.5`). Commas inside a number
are removed; a comma between numbers that is not a thousands separator ends the number
(`3,4` is two numbers). A number glued to a preceding letter (`s1`, `x2`) does not count.

The text is model output: the number comes back as text, never converted here (an
exponent such as `1e999999999` is cheap as text and ruinous as an integer); readers
convert it with a bounded parser (`services.arith.parse_number`).
"""

from __future__ import annotations

import re

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
