"""Majority vote against the verifier's ranking over the pipeline's samples
(`training.rerank`), with a scripted scorer: which sample each rule serves, and the
claim-level metrics."""

from __future__ import annotations

import pytest

from training import rerank

pytestmark = [pytest.mark.unit]


def s(qid: str, kind: str, k: int, answer: str | None, right: bool) -> dict:
    claim = None
    if answer is not None:
        claim = {"question": qid, "statement": f"The answer is {answer}.", "context": f"{kind}{k}"}
    return {"id": qid, "kind": kind, "sample": k, "answer": answer, "label": right, "claim": claim}


ROWS = [
    # q1: the majority (two plans say 5) is wrong; the verifier trusts the lone 7
    s("q1", "plan", 0, "5", False),
    s("q1", "plan", 1, "7", True),
    s("q1", "plan", 2, "5.0", False),
    # q2: every rule is right
    s("q2", "plan", 0, "3", True),
    s("q2", "plan", 1, "3", True),
    s("q2", "plan", 2, "4", False),
    # q3: no sample right; one has no answer
    s("q3", "plan", 0, None, False),
    s("q3", "plan", 1, "8", False),
    s("q3", "plan", 2, "9", False),
    # q4: too few plans for k = 3 (left out); its solution is another kind
    s("q4", "plan", 0, "1", True),
    s("q4", "prose", 0, "1", True),
]
SCORES = {"plan0": 0.2, "plan1": 0.9, "plan2": 0.3}  # by the claim's context


def scorer(claims: list[dict[str, str]]) -> list[float]:
    return [SCORES.get(c["context"], 0.5) for c in claims]


def test_each_rule_serves_its_sample_and_the_oracle_is_the_headroom() -> None:
    got = rerank.rerank(ROWS, scorer, k=3, kinds=["plan"])
    # q1: first 5, majority 5 (with 5.0), best 7 (0.9), weighted 7 (0.9 > 0.2 + 0.3);
    # q2: all right; q3: none right
    assert got["questions"] == 3  # q4 has one plan only
    votes = {rule: got["right"][rule] for rule in (*rerank.VOTE_RULES, "oracle")}
    assert votes == {"first": 1, "majority": 1, "best": 2, "weighted": 2, "oracle": 2}
    assert got["accuracy"]["best"] == pytest.approx(2 / 3, abs=1e-4)
    # 8 distinct claims (q3's sample without an answer has none), 3 of them right;
    # positives 0.9, 0.2, 0.9 against negatives 0.2, 0.3, 0.3, 0.9, 0.3: 9.5 of 15 pairs
    assert (got["claims"], got["claims_right"]) == (8, 3)
    assert got["auroc"] == pytest.approx(9.5 / 15, abs=1e-4)


def test_weighted_sums_the_probabilities_of_an_answer_s_samples() -> None:
    q1 = [r for r in ROWS if r["id"] == "q1"]
    got = rerank.rerank(q1, lambda claims: [0.45, 0.8, 0.45], k=3, kinds=["plan"])
    # "5" has 0.45 + 0.45 = 0.9 against 0.8 for "7": weighted serves 5, best serves 7
    assert (got["right"]["weighted"], got["right"]["best"]) == (0, 1)


def test_samples_are_taken_plans_first_then_solutions_in_sample_order() -> None:
    rows = [
        s("q", "prose", 1, "2", True),
        s("q", "prose", 0, "2", True),
        s("q", "plan", 0, "1", False),
    ]
    ordered = rerank.by_question(rows, k=2, kinds=["plan", "prose"])["q"]
    assert [(r["kind"], r["sample"]) for r in ordered] == [("plan", 0), ("prose", 0)]
    got = rerank.rerank(rows, lambda claims: [0.5] * len(claims), k=3, kinds=["plan", "prose"])
    # a three-way tie of scores: best keeps the first drawn (the plan, wrong); the
    # majority (two solutions) is right
    assert got["right"]["best"] == 0 and got["right"]["majority"] == 1


def test_a_question_without_any_answer_counts_as_wrong_for_every_rule() -> None:
    rows = [s("q", "plan", k, None, False) for k in range(3)]
    got = rerank.rerank(rows, lambda claims: [], k=3, kinds=["plan"])
    assert got["questions"] == 1 and sum(got["right"].values()) == 0
    assert got["auroc"] is None and got["claims"] == 0


def test_plan_replans_only_without_an_answer_and_plan_verify_also_on_rejection() -> None:
    got = rerank.rerank(ROWS, scorer, k=3, kinds=["plan"], threshold=0.5, rounds=3)
    # q1: plan serves the first plan (5, wrong, 1 drawn); plan+verify rejects it (0.2)
    # and accepts the second (7, 0.9, right, 2 drawn).
    # q2: plan 3 (right, 1); plan+verify rejects 3 (0.2), accepts 3 at 0.9 (right, 2).
    # q3: plan replans the empty first plan and serves 8 (wrong, 2); plan+verify: 8 at
    # 0.9 accepted (wrong, 2).
    assert (got["right"]["plan"], got["right"]["plan+verify"]) == (1, 2)
    assert got["samples_drawn"] == {"plan": pytest.approx(4 / 3, abs=1e-3), "plan+verify": 2.0}


def test_when_every_round_is_rejected_the_most_trusted_answer_is_served() -> None:
    q1 = [r for r in ROWS if r["id"] == "q1"]
    # all three under the threshold: the 7 scored 0.4 beats 0.2 and 0.3
    got = rerank.rerank(q1, lambda claims: [0.2, 0.4, 0.3], k=3, kinds=["plan"], rounds=3)
    assert got["right"]["plan+verify"] == 1 and got["samples_drawn"]["plan+verify"] == 3
    # with one round only, plan+verify has nothing to replan with: the first plan
    one = rerank.rerank(q1, lambda claims: [0.2, 0.4, 0.3], k=3, kinds=["plan"], rounds=1)
    assert one["right"]["plan+verify"] == 0 and one["samples_drawn"]["plan+verify"] == 1
    with pytest.raises(ValueError, match="rounds"):
        rerank.rerank(q1, lambda claims: [0.2, 0.4, 0.3], k=3, kinds=["plan"], rounds=4)


def test_a_report_replays_from_its_saved_scores_without_the_model() -> None:
    first = rerank.rerank(ROWS, scorer, k=3, kinds=["plan"])
    saved = rerank.saved_scores(first)
    assert saved[("q1", "plan", 1)] == 0.9 and ("q3", "plan", 0) not in saved  # no claim
    again = rerank.rerank(ROWS, None, k=3, kinds=["plan"], saved=saved)
    assert again["right"] == first["right"] and again["auroc"] == first["auroc"]
    # another threshold, the same scores: 0.95 rejects every plan of q1 and q2, and
    # the most trusted (0.9) is served, still right
    strict = rerank.rerank(ROWS, None, k=3, kinds=["plan"], saved=saved, threshold=0.95)
    assert strict["right"]["plan+verify"] == 2 and strict["samples_drawn"]["plan+verify"] == 3
    del saved[("q2", "plan", 2)]
    with pytest.raises(ValueError, match="no saved score"):
        rerank.rerank(ROWS, None, k=3, kinds=["plan"], saved=saved)


def test_the_command_replays_a_report_and_refuses_ambiguous_sources(tmp_path) -> None:
    import json

    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    report = tmp_path / "report.json"
    report.write_text(json.dumps(rerank.rerank(ROWS, scorer, k=3, kinds=["plan"])))
    out = tmp_path / "replay.json"
    args = ["--samples", str(samples), "--k", "3", "--scores-from", str(report)]
    assert rerank.main([*args, "--threshold", "0.95", "--out", str(out)]) == 0
    replay = json.loads(out.read_text())
    assert replay["threshold"] == 0.95 and replay["right"]["plan+verify"] == 2
    with pytest.raises(SystemExit):
        rerank.main([*args, "--base-model", "x"])  # both sources
    with pytest.raises(SystemExit):
        rerank.main([*args, "--rounds", "4"])  # more rounds than samples
