"""The GSM-Hard-style split: one number made large, the answer recomputed from the
solution's own calculations, and the questions it cannot rebuild left out."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

import pytest

from evals import hard

pytestmark = [pytest.mark.unit]

# GSM8K train's first question with 46 for 48 (its results 24 and 72 would be a unit's
# value and a question's number: `hard.UNIT_VALUES`), not a prompt's worked example then
NATALIA = {
    "id": "gsm8k-train-0",
    "question": "Natalia sold clips to 46 of her friends in April, and then she sold half as "
    "many clips in May. How many clips did Natalia sell altogether in April and May?",
    "answer": "69",
    "solution": "Natalia sold 46/2 = <<46/2=23>>23 clips in May.\n"
    "Natalia sold 46+23 = <<46+23=69>>69 clips altogether in April and May.\n#### 69",
}


def test_the_answer_is_recomputed_through_every_calculation() -> None:
    item = hard.harden(NATALIA, random.Random(1))
    assert item is not None
    new = int(item["replaced"]["new"])
    assert item["replaced"]["old"] == "46" and 1000 <= new <= 9_999_999
    assert f" {new} of her friends" in item["question"] and "46" not in item["question"]
    # 46/2 = 23 and 46 + 23 = 69 become new/2 and new + new/2
    assert Fraction(item["answer"]) == Fraction(new) + Fraction(new, 2)
    assert item["source"] == "gsm8k-train-0" and item["id"] == "gsm8k-train-hard-0"


def test_a_solution_whose_calculation_does_not_match_its_result_is_skipped() -> None:
    slip = {**NATALIA, "solution": NATALIA["solution"].replace("<<46/2=23>>", "<<46/2=25>>")}
    assert hard.harden(slip, random.Random(1)) is None
    rounded = {**NATALIA, "solution": "<<46/7=6.57>> <<46+6.57=52.57>>\n#### 52.57"}
    assert hard.harden({**rounded, "answer": "52.57"}, random.Random(1)) is None


def test_a_unit_a_repeated_number_and_a_percentage_are_never_replaced() -> None:
    dozen = {
        "id": "gsm8k-train-5",
        "question": "A box holds 12 eggs. How many eggs are in 5 boxes and 5 more eggs?",
        "answer": "65",
        "solution": "<<12*5=60>> <<60+5=65>>\n#### 65",
    }
    assert hard.harden(dozen, random.Random(0)) is None  # 12 a unit, 5 twice
    percent = {
        "id": "gsm8k-train-6",
        "question": "A shirt costs 84 dollars with 25% off. What does it cost?",
        "answer": "63",
        "solution": "<<84*25/100=21>> <<84-21=63>>\n#### 63",
    }
    for seed in range(20):
        item = hard.harden(percent, random.Random(seed))
        assert item is not None and item["replaced"]["old"] == "84"
    # a result that changes may not have a unit's value: 80 - 20 = 60 might be minutes
    sixty = {**percent, "question": percent["question"].replace("84", "80")}
    sixty.update(answer="60", solution="<<80*25/100=20>> <<80-20=60>>\n#### 60")
    assert hard.harden(sixty, random.Random(0)) is None


def test_a_question_the_change_makes_negative_is_skipped() -> None:
    fewer = {
        "id": "gsm8k-train-7",
        "question": "Ann has 11 apples. Bob has 5 fewer apples than Ann. How many does Bob have?",
        "answer": "6",
        "solution": "<<11-5=6>>\n#### 6",
    }
    made = [hard.harden(fewer, random.Random(seed)) for seed in range(20)]
    # 11 made large: Bob has millions; 5 made large: Bob has fewer than none, skipped
    assert {item["replaced"]["old"] for item in made if item is not None} == {"11"}
    assert None in made


def test_a_decimal_gold_is_exact_to_twelve_places() -> None:
    assert hard._gold_text(Fraction(9384988, 10)) == "938498.8"
    assert hard._gold_text(Fraction(1, 3)) == "0.333333333333"
    assert hard._gold_text(Fraction(42)) == "42"


def test_the_split_is_built_from_train_only_and_reproducibly(tmp_path: Path) -> None:
    data = tmp_path / "train.norm.jsonl"
    data.write_text(json.dumps(NATALIA) + "\n")
    out = tmp_path / "hard.jsonl"
    assert hard.main(["--data", str(data), "--n", "5", "--exclude", "--out", str(out)]) == 0
    first = out.read_text()
    assert len(first.splitlines()) == 1
    hard.main(["--data", str(data), "--n", "5", "--exclude", "--out", str(out)])
    assert out.read_text() == first  # seeded per item
    test = tmp_path / "test.norm.jsonl"
    test.write_text(json.dumps({**NATALIA, "id": "gsm8k-test-0"}) + "\n")
    with pytest.raises(SystemExit, match="reporting"):
        hard.main(["--data", str(test), "--out", str(out)])
    excluded = tmp_path / "dev.jsonl"
    excluded.write_text(json.dumps({"id": "gsm8k-train-0"}) + "\n")
    hard.main(["--data", str(data), "--exclude", str(excluded), "--out", str(out)])
    assert out.read_text() == ""
