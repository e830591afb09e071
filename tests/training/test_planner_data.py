"""The planner's rejection-sampling data (`training.planner_data`): which plans each rule
removes, in order, what is kept and how it is split, on scripted sample lines and on
the committed samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training import planner_data

pytestmark = [pytest.mark.unit]

SAMPLES = Path(__file__).resolve().parents[2] / "training" / "samples"


def step(sid: str, code: str, status: str = "ok", deps: tuple[str, ...] = ()) -> tuple:
    spec = {"id": sid, "tool": "python", "input": code, "depends_on": list(deps)}
    result = {"id": sid, "tool": "python", "input": code, "status": status, "output": "1"}
    return spec, result


def sample(
    qid: str,
    k: int,
    steps: list[tuple],
    *,
    right: bool = True,
    answer: str = "s1",
    reasoning: str = "r",
    kind: str = "plan",
) -> dict:
    plan = {"reasoning": reasoning, "steps": [s for s, _ in steps], "answer_step": answer}
    return {
        "id": qid,
        "kind": kind,
        "sample": k,
        "model": "m",
        "plan_format": "draft",
        "label": right,
        "claim": {"question": f"question {qid}?"},
        "plan": plan if steps else None,
        "steps": [r for _, r in steps],
    }


def test_each_rule_removes_what_it_names_in_order() -> None:
    ok = [step("s1", "result = 1")]
    rows = [
        sample("q1", 0, ok),  # kept
        sample("q1", 1, ok, reasoning="other words"),  # same program: duplicate
        sample("q1", 2, [step("s1", "result = 2")]),  # another program: kept
        sample("q1", 3, ok, right=False),  # wrong (before duplicate)
        sample("q2", 0, []),  # no plan
        # a step no path to the answer uses: void, even though the answer is right
        sample("q2", 1, [step("s1", "x = 3"), step("s2", "result = 1")], answer="s2"),
        # a failed step on the path: void
        sample(
            "q2",
            2,
            [step("s1", "x = 1", status="error"), step("s2", "result = 1", deps=("s1",))],
            answer="s2",
        ),
        # both steps on the answer's path and ok: kept
        sample("q2", 3, [step("s1", "x = 1"), step("s2", "result = x", deps=("s1",))], answer="s2"),
        sample("q3", 0, ok, kind="prose"),  # not a plan: not counted
    ]
    splits, counts = planner_data.build(rows, planner_data.Split(val=0.0))
    assert counts["plans"] == 8
    assert counts["removed"] == {"no_plan": 1, "wrong": 1, "void": 2, "duplicate": 1}
    assert counts["kept"] == 3 and counts["questions"] == 2 and counts["questions_kept"] == 2
    kept = [(e["id"], e["sample"]) for e in splits["train"]]
    assert kept == [("q1", 0), ("q1", 2), ("q2", 3)] and splits["val"] == []
    assert splits["train"][0]["question"] == "question q1?"
    assert splits["train"][0]["plan"]["steps"][0]["input"] == "result = 1"


def test_a_question_s_plans_share_one_split() -> None:
    split = planner_data.Split(seed=3, val=0.5)
    ids = [f"q{i}" for i in range(40)]
    rows = [sample(q, k, [step("s1", f"result = {k}")]) for q in ids for k in range(2)]
    splits, _ = planner_data.build(rows, split)
    for name, examples in splits.items():
        assert all(planner_data.split_of(e["id"], split) == name for e in examples)
    assert 0 < len(splits["val"]) < len(rows)  # both splits used at a share of 0.5
    val_ids = {e["id"] for e in splits["val"]}
    assert not val_ids & {e["id"] for e in splits["train"]}


def test_the_command_writes_splits_and_recipe_from_the_committed_samples(tmp_path) -> None:
    path = SAMPLES / "qwen2.5-coder-1.5b-instruct" / "gsm8k-train-draft.jsonl"
    out = tmp_path / "sft"
    assert planner_data.main(["--samples", str(path), "--out", str(out)]) == 0
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["recipe"] == planner_data.RECIPE
    assert recipe["source"] == [["qwen2.5-coder-1.5b-instruct", "draft"]]
    # every plan is either removed by one rule or kept
    assert recipe["plans"] == sum(recipe["removed"].values()) + recipe["kept"]
    kept = [json.loads(x) for n in ("train", "val") for x in (out / f"{n}.jsonl").open()]
    assert len(kept) == recipe["kept"] > 0
    assert all(e["plan"]["steps"] and e["weight"] == 1.0 for e in kept)
    rows = {
        (r["id"], r["sample"]): r for r in planner_data.read_samples(path) if r["kind"] == "plan"
    }
    assert all(rows[(e["id"], e["sample"])]["label"] for e in kept)  # only right plans


def test_mixed_sources_and_missing_files_are_refused(tmp_path) -> None:
    a = tmp_path / "a.jsonl"
    rows = [
        sample("q1", 0, [step("s1", "result = 1")]),
        {**sample("q2", 0, [step("s1", "result = 1")]), "model": "other"},
    ]
    a.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit):
        planner_data.main(["--samples", str(a), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit):
        planner_data.main(["--samples", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)])
    assert not (tmp_path / "o").exists()
