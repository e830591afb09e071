"""Replaying votes over programs and prose from the sampling study's lines."""

from __future__ import annotations

import json

import pytest

from evals.votes import VoteItem, load, replay, table, winner

pytestmark = pytest.mark.unit


def line(id_: str, gold: int, plans: list, prose: list, error: str | None = None) -> str:
    votes = [{"source": "plan", "answer": a} for a in plans]
    votes += [{"source": "prose", "answer": a} for a in prose]
    return json.dumps({"id": id_, "gold": gold, "error": error, "agreement": {"votes": votes}})


def test_answers_meaning_one_number_vote_together_and_ties_go_to_the_first() -> None:
    assert winner(["72.0", "5", "72", "5"]) == "72.0"
    assert winner(["5", "72"]) == "5"
    assert winner([None, None]) is None
    assert winner([None, "$1,200", "1200"]) == "$1,200"


def test_replay_takes_the_first_plans_and_solutions() -> None:
    item = VoteItem("x", 72, plans=("5", "5", "72", "72"), prose=("72", "6", "6", "6"))
    assert replay(item, 1, 0) == "5"
    assert replay(item, 2, 1) == "5"
    assert replay(item, 1, 1) == "5"  # a tie goes to the plan, drawn first
    assert replay(item, 0, 4) == "6"
    assert replay(item, 4, 1) == "72"


def test_table_counts_right_answers_per_combination(tmp_path) -> None:
    path = tmp_path / "votes.jsonl"
    path.write_text(
        "\n".join(
            [
                line("a", 72, ["5", "72"], ["72", "72"]),
                line("b", 3, ["3", "3"], ["4", "4"]),
                line("c", 1, ["1"], ["1"], error="deadline"),  # failed: left out
                line("a", 72, ["72", "72"], ["72", "72"]),  # the last line counts
            ]
        )
        + "\n"
    )
    items = load([path])
    assert sorted(i.id for i in items) == ["a", "b"]
    rows = {(r["plans"], r["prose"]): r for r in table(items, max_p=2, max_q=2)}
    assert (rows[1, 0]["right"], rows[1, 0]["items"]) == (2, 2)
    assert rows[0, 2]["right"] == 1  # b's solutions say 4
    assert rows[1, 1]["right"] == 2  # b: a tie, the plan's 3 drawn first
    assert (0, 0) not in rows


def test_a_router_by_the_questions_numbers_picks_the_vote_per_item() -> None:
    from evals.votes import largest_number, routed

    assert largest_number("She had 1,250 apples and 3.5 pears") == 1250
    assert largest_number("no numbers") == 0
    big = VoteItem("b", 5000, plans=("5000",), prose=("4000",), question="Add 2,500 twice")
    small = VoteItem("s", 7, plans=("8",), prose=("7",), question="Add 3 and 4")
    assert routed([big, small], 1000, large=(1, 0), small=(0, 1)) == 2
    assert routed([big, small], 1000, large=(0, 1), small=(1, 0)) == 0
