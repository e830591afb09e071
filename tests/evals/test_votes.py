"""Replaying votes over programs and prose from the sampling study's lines."""

from __future__ import annotations

import json

import pytest

from evals.votes import VoteItem, load, replay, table, whole_weighting, winner

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


def test_pipeline_sample_files_replay_in_the_order_drawn(tmp_path) -> None:
    """The sampler's lines (training/sample_pipeline.py) give each question its plans and
    solutions by sample index, whatever order the lines are in."""

    def sample(id_: str, kind: str, k: int, answer: str | None) -> str:
        claim = {"question": f"q {id_}", "statement": "", "context": ""} if answer else None
        return json.dumps(
            {"id": id_, "kind": kind, "sample": k, "gold": 72, "answer": answer, "claim": claim}
        )

    path = tmp_path / "samples.jsonl"
    rows = [
        sample("a", "plan", 1, "72"),
        sample("a", "plan", 0, "5"),
        sample("a", "prose", 0, "72"),
        sample("a", "prose", 1, None),
        sample("b", "plan", 0, "5"),
        sample("b", "prose", 0, "5"),
    ]
    path.write_text("\n".join(rows) + "\n")
    items = {i.id: i for i in load([path])}
    assert items["a"].plans == ("5", "72") and items["a"].prose == ("72", None)
    assert items["a"].question == "q a"
    assert replay(items["a"], 1, 0) == "5" and replay(items["a"], 2, 1) == "72"
    rows_ = {(r["plans"], r["prose"]): r for r in table(list(items.values()), 2, 2)}
    assert (rows_[1, 0]["right"], rows_[1, 0]["items"]) == (0, 2)
    assert (rows_[2, 1]["right"], rows_[2, 1]["items"]) == (1, 1)  # b has one plan


def test_adaptive_sampling_draws_the_rest_only_while_the_vote_is_open() -> None:
    from evals.votes import drawn, served

    agreeing = VoteItem("a", 72, plans=("72", "72", "72", "5", "5"), prose=("72", "6", "6"))
    assert drawn(agreeing, 5, 0) == 3  # three of five agree: two more cannot change it
    split = VoteItem("b", 72, plans=("72", "5", "6", "72", "72"), prose=())
    assert drawn(split, 5, 0) == 5
    assert drawn(split, 2, 0) == 2  # two plans or fewer are drawn at once
    # programs and prose: the first plan and the greedy solution agree, nothing more
    assert served(agreeing, 5, 3) == ("72", 2)
    # they disagree: all of both are drawn and vote (72 has 4 of 8)
    disagreeing = VoteItem("d", 72, plans=("5", "72", "72", "72", "6"), prose=("6", "6", "72"))
    assert served(disagreeing, 5, 3) == ("72", 8)
    # the early stop serves the two's answer even where the full vote would differ
    outvoted = VoteItem("o", 5, plans=("6", "5", "5", "5"), prose=("6", "5", "5"))
    assert served(outvoted, 4, 3) == ("6", 2)
    assert replay(outvoted, 4, 3) == "5"
    # one solution beside several plans: two stages as well
    assert served(agreeing, 5, 1) == ("72", 2)
    assert served(VoteItem("e", 5, plans=("5", "6", "5"), prose=("6",)), 3, 1) == ("5", 4)
    # a first sample without an answer is no agreement
    silent = VoteItem("n", 5, plans=(None, "5"), prose=(None, "5"))
    assert served(silent, 2, 2) == ("5", 4)


def test_a_sample_file_item_keeps_its_question_and_refuses_a_repeated_sample(tmp_path) -> None:
    no_answer = {"id": "a", "kind": "plan", "sample": 0, "gold": 1, "answer": None, "claim": None}
    answered = {
        **no_answer,
        "sample": 1,
        "answer": "1",
        "claim": {"question": "Add 2,500 twice", "statement": "", "context": ""},
    }
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(no_answer) + "\n" + json.dumps(answered) + "\n")
    (item,) = load([path])
    assert item.question == "Add 2,500 twice"  # from a sample that has a claim
    twice = tmp_path / "twice.jsonl"
    twice.write_text(path.read_text())
    with pytest.raises(ValueError, match="plan sample 0 twice"):
        load([path, twice])


def test_the_report_covers_the_votes_every_file_can_replay(tmp_path, capsys) -> None:
    from evals.votes import main

    votes = tmp_path / "votes.jsonl"
    votes.write_text(line("a", 72, ["72", "72", "5", "5"], ["72", "72", "72", "72"]) + "\n")
    samples = tmp_path / "samples.jsonl"
    rows = [("plan", k, "72") for k in range(5)] + [("prose", k, "6") for k in range(3)]
    samples.write_text(
        "".join(
            json.dumps({"id": "b", "kind": kd, "sample": k, "gold": 72, "answer": a, "claim": None})
            + "\n"
            for kd, k, a in rows
        )
    )
    assert main([str(votes), str(samples)]) == 0
    table_rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ")]
    # 4 plans and 3 solutions: every item has them (the first line is the header)
    (row,) = [r for r in table_rows if r.startswith("| 4 | 3 | 7 |")]
    assert row.startswith("| 4 | 3 | 7 | 2/2 |")
    # adaptive: a's first plan and solution agree (2 drawn); b's disagree (all 7)
    assert row.endswith("| 2/2 | 4.50 |")
    # the first stages compared: one plan and one solution first stops early for a
    assert "| 1 | 1 | 2/2 | 4.50 | 1 (1) |" in table_rows


def test_a_number_that_is_not_whole_counts_half_in_a_replay() -> None:
    question = "A box holds 12 eggs and 3 boxes are full. How many eggs are there?"
    assert winner(["36.5", "36.5", "36"], question) == "36.5"  # two halves tie one: first
    assert winner(["36.5", "36", "36.5", "37"], question) == "36.5"
    assert winner(["36.5", "36"], question) == "36"
    assert winner(["36.5", "36"]) == "36.5"  # no question: every answer counts 1
    item = VoteItem("x", 36, plans=("36.5", "36"), prose=("36.5",), question=question)
    assert replay(item, 2, 0) == "36"
    assert replay(item, 2, 1) == "36.5"


def test_whole_weighting_counts_what_the_weighting_changed() -> None:
    question = "A box holds 12 eggs and 3 boxes are full. How many eggs are there?"
    items = [
        # weighting turns a wrong 36.5 into the right 36
        VoteItem("won", 36, plans=("36.5", "36"), prose=(), question=question),
        # weighting turns a right 7.5 (rare, but it happens) into a wrong 8
        VoteItem("lost", 7.5, plans=("7.5", "8"), prose=(), question=question),
        # unchanged: whole answers only
        VoteItem("same", 36, plans=("36", "35"), prose=(), question=question),
        # unchanged: the question states a decimal, so 2.5 keeps its full vote
        VoteItem("decimal", 2.5, plans=("2.5", "3"), prose=(), question="Each costs $1.25."),
    ]
    got = whole_weighting(items, 2, 0)
    assert got == {
        "weighed": 3,
        "plain": 3,
        "changed": 2,
        "won": 1,
        "lost": 1,
        "samples": 8,
        "down": 2,
        "down_right": 1,
    }
    assert whole_weighting(items, 1, 0) == {
        "weighed": 3,
        "plain": 3,
        "changed": 0,
        "won": 0,
        "lost": 0,
        "samples": 4,
        "down": 2,
        "down_right": 1,
    }


def test_a_served_run_reports_the_weighting_over_every_vote_it_recorded(tmp_path, capsys) -> None:
    from evals.votes import main

    def served(id_: str, gold: int, plans: list, prose: list) -> str:
        record = json.loads(line(id_, gold, plans, prose))
        record["question"] = "Tom has 12 apples and buys 3 more bags of 4. How many apples?"
        return json.dumps(record) + "\n"

    runs = tmp_path / "served.jsonl"
    # a stopped after its first stage; b drew the second and its two 23.5s lead on count
    runs.write_text(
        served("a", 24, ["24"], ["24"]) + served("b", 24, ["23.5", "24", "23.5"], ["24", "7"])
    )
    assert main([str(runs)]) == 0
    out = capsys.readouterr().out
    assert (
        "whole-number weighting (1 plans and 1 solutions, all drawn): 2/2 right with it, 1/2" in out
    )
    assert (
        "whole-number weighting (every vote each item recorded): 2/2 right with it, 1/2 without; "
        "it changed 1 answers: 1 became right, 0 wrong; it weighed down 2 of 7 answers, 0 of them right"
    ) in out


def test_a_third_stage_is_drawn_only_while_the_leader_is_within_the_open_margin() -> None:
    from evals.votes import escalated, margin

    assert margin(["5", "5", "6"]) == 1.0
    assert margin(["5", "6"]) == 0.0
    assert margin(["5"]) == 1.0
    assert margin([None]) == 0.0
    stages = [(1, 1), (2, 2), (4, 4)]
    # the first plan and the greedy solution agree: two samples, whatever comes after
    agree = VoteItem("a", 5, plans=("5", "6", "6", "6"), prose=("5", "6", "6", "6"))
    assert escalated(agree, stages, open_margin=1.0) == ("5", 2)
    # second stage: 5 has three of four votes, two ahead of 6: it stops there
    ahead = VoteItem("b", 5, plans=("5", "5", "9", "9"), prose=("6", "5", "9", "9"))
    assert escalated(ahead, stages, open_margin=1.0) == ("5", 4)
    # a tie after the second stage goes on to the third, where 9 leads
    tied = VoteItem("c", 9, plans=("5", "6", "9", "9"), prose=("6", "5", "9", "9"))
    assert escalated(tied, stages, open_margin=0.0) == ("9", 8)
    # a margin of one: open at 1.0, closed at 0.5
    one = VoteItem("d", 5, plans=("5", "5", "9", "9"), prose=("6", "7", "9", "9"))
    assert escalated(one, stages, open_margin=1.0) == ("9", 8)
    assert escalated(one, stages, open_margin=0.5) == ("5", 4)
    # with one stage the first answers
    assert escalated(tied, [(2, 2)], open_margin=5.0) == ("5", 4)


def test_the_escalation_table_counts_right_answers_and_samples(tmp_path) -> None:
    from evals.votes import escalation_table

    items = [
        VoteItem("a", 5, plans=("5",) * 8, prose=("5",) * 8),
        VoteItem(
            "b",
            9,
            plans=("5", "6", "9", "6", "9", "9", "9", "9"),
            prose=("6", "5", "9") + ("9",) * 5,
        ),
    ]
    rows = {label: (k, mean, third) for label, k, mean, third in escalation_table(items, 8, 8)}
    # b's second stage: 6 has three votes, 9 and 5 two each: 6 leads by one, wrongly
    assert rows["two stages, 4 plans + 3 solutions (served)"] == (1, (2 + 7) / 2, 0)
    assert rows["two stages, 8 plans + 8 solutions"] == (2, (2 + 16) / 2, 0)
    assert rows["three stages, to 8 + 8 when the margin is <= 0"] == (1, (2 + 7) / 2, 0)
    # a lead of one is open at a margin of one: the third stage, where 9 wins
    assert rows["three stages, to 8 + 8 when the margin is <= 1"] == (2, (2 + 16) / 2, 1)
