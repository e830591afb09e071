"""The tie-break replay: the verifier chooses only among answers within the margin."""

from __future__ import annotations

import pytest

from scripts.replay_tie_break import choose

pytestmark = pytest.mark.unit


def s(kind: str, k: int, answer: str, p: float) -> dict:
    return {"kind": kind, "sample": k, "answer": answer, "p": p}


def test_an_agreeing_first_stage_is_served_without_the_verifier() -> None:
    samples = [s("plan", 0, "5", 0.1), s("prose", 0, "5.0", 0.1), s("plan", 1, "6", 0.9)]
    assert choose(samples, "", 0.0, 4, 3) == ("5", False)


def test_the_verifier_picks_among_answers_within_the_margin_only() -> None:
    samples = [
        s("plan", 0, "5", 0.2),
        s("plan", 1, "5", 0.2),
        s("plan", 2, "6", 0.9),
        s("prose", 0, "6", 0.3),
        s("prose", 1, "7", 0.99),
    ]
    # 5 and 6 tie with two votes; 7 has one
    assert choose(samples, "", None, 4, 3) == ("5", False)  # the plain vote: drawn first
    assert choose(samples, "", 0.0, 4, 3) == ("6", True)  # the verifier breaks the tie
    assert choose(samples, "", 1.0, 4, 3) == ("7", True)  # 7 is within one vote
