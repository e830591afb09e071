"""The pipeline sampler (`training.sample_pipeline`): the planner's samples, executed by
the orchestrator's executor, labelled by the evaluation's rule, with the claim the
orchestrator asks the verifier about, byte for byte; resumable and time-bounded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from planner.backends.scripted import ScriptedBackend
from planner.service import PlannerService
from services.settings import PlannerSettings
from tests.orchestrator.helpers import FakePlanner, FakeVerifier, ToolSwitch, orchestrator_stack
from training import sample_pipeline as sp

Q_PLAN = "Natalia sold 48 clips in April and half as many in May. How many in all?"
Q_PROSE = "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts?"
RIGHT = "She sold 48/2 = 24 in May and 48+24 = 72 in all.\nThe answer is 72."
WRONG = "Half of 48 is 24.\nThe answer is 24."
ROBE = "White is 2/2 = 1 bolt, so 2+1 = 3 bolts.\nThe answer is 3."


def calc(*exprs: str) -> dict:
    steps = [
        {"id": f"s{k}", "tool": "calc", "input": e, "depends_on": []}
        for k, e in enumerate(exprs, 1)
    ]
    return {"reasoning": "add the months", "steps": steps, "answer_step": steps[-1]["id"]}


PLANS = {
    Q_PLAN: [calc("48/2", "48+24"), calc("48*2")],  # 72 (right), 96 (wrong)
    Q_PROSE: [calc("2*2")],  # 4 (wrong): the solutions carry the right answer
}
PROSE = {Q_PLAN: [RIGHT, WRONG, "I cannot tell."], Q_PROSE: [ROBE, ROBE]}


def items_file(tmp_path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path = tmp_path / "items.jsonl"
    path.write_text(
        "".join(json.dumps({"id": i, "question": q, "answer": a}) + "\n" for i, q, a in rows)
    )
    return path


def planner(script: dict | None = None, prose: dict | None = None) -> PlannerService:
    backend = ScriptedBackend(
        {q: [json.dumps(p) for p in plans] for q, plans in (script or PLANS).items()},
        prose=prose or PROSE,
    )
    return PlannerService(backend, PlannerSettings(backend="scripted", seed=5))


def args(tmp_path: Path, data: Path, *extra: str) -> object:
    return sp.parse_args(
        [
            "--data",
            str(data),
            "--out",
            str(tmp_path / "out.jsonl"),
            "--exclude",
            "--no-progress",
            *extra,
        ]
    )


def sample(
    tmp_path: Path, data: Path, *extra: str, script: dict | None = None, prose: dict | None = None
) -> list[dict]:
    a = args(tmp_path, data, *extra)
    asyncio.run(sp.run(a, planner=planner(script, prose), tools=ToolSwitch().factory()))
    return list(sp.read_samples(a.out))


@pytest.mark.unit
def test_every_sample_is_executed_labelled_and_carries_its_claim(tmp_path: Path) -> None:
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72")])
    rows = sample(tmp_path, data, "--plans", "2", "--prose", "3")
    assert [(r["kind"], r["sample"], r["answer"], r["label"]) for r in rows] == [
        ("plan", 0, "72", True),
        ("plan", 1, "96", False),
        ("prose", 0, "72", True),
        ("prose", 1, "24", False),
        ("prose", 2, None, False),
    ]
    # distinct answers of the question: 72, 96, 24 (the second 72 repeats the first)
    assert [r["first_of_answer"] for r in rows] == [True, True, False, True, False]
    plan0 = rows[0]
    assert [(s["input"], s["status"], s["output"]) for s in plan0["steps"]] == [
        ("48/2", "ok", "24"),
        ("48+24", "ok", "72"),
    ]
    assert plan0["claim"]["statement"] == "The answer is 72."
    assert plan0["claim"]["context"].splitlines()[-1] == "answer_step: s2"
    assert rows[2]["claim"]["context"] == f"Worked solution:\n{RIGHT}"
    assert rows[4]["claim"] is None  # no answer: the orchestrator never asks about it
    assert {r["seed"] for r in rows} == {5} and {r["model"] for r in rows} == {"scripted"}
    assert {r["plan_format"] for r in rows} == {PlannerSettings().plan_format}
    assert {r["recipe"] for r in rows} == {sp.RECIPE}


@pytest.mark.integration
def test_the_stored_claim_is_the_one_the_orchestrator_sends_the_verifier(tmp_path: Path) -> None:
    """Training and serving see byte-identical claims: the same plans and solutions
    through the real orchestrator, whose /verify requests a fake verifier records."""
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72"), ("t-2", Q_PROSE, "3")])
    rows = sample(tmp_path, data, "--plans", "2", "--prose", "2")
    fake = FakePlanner({q: [p] for q, p in PLANS.items()}, prose=PROSE)
    verifier = FakeVerifier()
    with orchestrator_stack(tmp_path / "logs", fake, verifier) as url:
        for question in (Q_PLAN, Q_PROSE):
            options = {"n_plans": 2, "n_prose": 2, "adaptive": False, "verify": True}
            options["use_cache"] = False
            r = httpx.post(
                f"{url}/reason", json={"question": question, "options": options}, timeout=30
            )
            assert r.status_code == 200, r.text
    # Q_PLAN: 72 leads (plan 0 and solution 0), verified with plan 0's claim;
    # Q_PROSE: 3 leads (both solutions), verified with solution 0's claim.
    stored = {(r["id"], r["kind"], r["sample"]): r["claim"] for r in rows}
    assert verifier.claims == [stored[("t-1", "plan", 0)], stored[("t-2", "prose", 0)]]


@pytest.mark.unit
def test_a_rerun_resumes_and_excluded_or_shown_questions_are_never_sampled(
    tmp_path: Path,
) -> None:
    shown = next(iter(sp.shown_questions()))
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72"), ("t-2", Q_PROSE, "3"), ("t-3", shown, "1")])
    first = sample(tmp_path, data, "--plans", "1", "--limit", "1")
    assert {r["id"] for r in first} == {"t-1"}
    # --limit is the first N items: the same command again has nothing left to sample
    assert sample(tmp_path, data, "--plans", "1", "--limit", "1") == first
    second = sample(tmp_path, data, "--plans", "1")
    assert [r["id"] for r in second] == ["t-1", "t-2"]  # t-1 not again; t-3 is a prompt's
    (tmp_path / "ex.jsonl").write_text(json.dumps({"id": "t-2"}) + "\n")
    a = sp.parse_args(
        [
            "--data",
            str(data),
            "--out",
            str(tmp_path / "other.jsonl"),
            "--exclude",
            str(tmp_path / "ex.jsonl"),
        ]
    )
    assert [i.id for i in sp.pending_items(a)] == ["t-1"]
    # by default the dev split the answer calibrator is fitted on is left out
    assert sp.parse_args(["--out", "x"]).exclude == [sp.DEV_SPLIT]


@pytest.mark.unit
def test_a_torn_last_line_is_not_a_done_question(tmp_path: Path) -> None:
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72"), ("t-2", Q_PROSE, "3")])
    rows = sample(tmp_path, data, "--plans", "1", "--limit", "1")
    out = tmp_path / "out.jsonl"
    with out.open("a") as f:
        f.write('{"id": "t-2", "label": tr')  # a run killed mid-line
    assert sp.done_ids(out) == {"t-1"} and len(rows) == 1
    again = sample(tmp_path, data, "--plans", "1")
    assert [r["id"] for r in again] == ["t-1", "t-2"]


@pytest.mark.unit
def test_time_is_bounded(tmp_path: Path) -> None:
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72"), ("t-2", Q_PROSE, "3")])
    rows = sample(tmp_path, data, "--plans", "1", "--max-seconds", "1e-9")
    # the first question always runs (every run makes progress), then time was up
    assert [r["id"] for r in rows] == ["t-1"]


@pytest.mark.unit
def test_a_question_that_cannot_be_planned_is_labelled_wrong_without_a_claim(
    tmp_path: Path,
) -> None:
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72")])
    rows = sample(tmp_path, data, "--plans", "2", script={Q_PLAN: ["not a plan"]})
    assert len(rows) == 2
    for r in rows:
        assert (r["answer"], r["label"], r["claim"], r["plan"]) == (None, False, None, None)
        assert r["error"]


@pytest.mark.unit
def test_plans_the_planner_could_not_make_are_samples_without_an_answer(tmp_path: Path) -> None:
    # three valid plans asked for, one scripted valid text then invalid ones: the planner
    # returns what it could make within its attempts, and the rest are no-answer samples
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72")])
    script = {Q_PLAN: [PLANS[Q_PLAN][0], "not a plan"]}
    rows = sample(tmp_path, data, "--plans", "3", script=script)
    assert [r["sample"] for r in rows] == [0, 1, 2]
    made = [r for r in rows if r["plan"] is not None]
    assert made and all(r["answer"] == "72" for r in made)
    for r in rows[len(made) :]:
        assert (r["answer"], r["claim"], r["label"]) == (None, None, False)
        assert "valid plans of the 3 asked for" in r["error"]


@pytest.mark.unit
def test_a_planner_failure_leaves_the_question_out_for_a_rerun(tmp_path: Path) -> None:
    from services.errors import DependencyUnavailable

    data = items_file(tmp_path, [("t-1", Q_PLAN, "72"), ("t-2", Q_PROSE, "3")])
    p = planner()
    real = p.plan

    async def flaky(request):
        if request.question == Q_PLAN:
            raise DependencyUnavailable("llama.cpp: no room in the KV cache")
        return await real(request)

    p.plan = flaky  # type: ignore[method-assign]
    a = args(tmp_path, data, "--plans", "1")
    assert asyncio.run(sp.run(a, planner=p, tools=ToolSwitch().factory())) == 1
    assert [r["id"] for r in sp.read_samples(a.out)] == ["t-2"]
    # the rerun, with the planner well again, samples what was left out
    assert asyncio.run(sp.run(a, planner=planner(), tools=ToolSwitch().factory())) == 1
    assert sorted(r["id"] for r in sp.read_samples(a.out)) == ["t-1", "t-2"]


@pytest.mark.unit
def test_a_question_s_plans_share_one_tool_budget_as_a_request_s_do(tmp_path: Path) -> None:
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72")])
    item = sp.pending_items(args(tmp_path, data, "--plans", "2"))[0]

    async def statuses(max_tool_calls: int) -> list[list[str]]:
        from contextlib import AsyncExitStack

        async with AsyncExitStack() as stack:
            executor = await sp.make_executor(stack, ToolSwitch().factory())
            p = planner()
            await p.load()
            sampler = sp.Sampler(p, executor, dataset="d", max_tool_calls=max_tool_calls)
            samples = await sampler.sample(item, 2, 0)
        return [[step["status"] for step in s.steps] for s in samples]

    # plan 0 has two calc steps, plan 1 one: three calls in all
    assert asyncio.run(statuses(3)) == [["ok", "ok"], ["ok"]]
    tight = [status for plan in asyncio.run(statuses(2)) for status in plan]
    assert tight.count("ok") == 2 and tight.count("skipped") == 1


@pytest.mark.unit
def test_the_report_counts_every_question_whatever_its_mix(tmp_path: Path) -> None:
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72"), ("t-2", Q_PROSE, "3")])
    sample(tmp_path, data, "--plans", "2", "--prose", "2")
    got = sp.report([tmp_path / "out.jsonl"])
    # t-1: plans 72 (right), 96; solutions 72 (right), 24.
    # t-2: plans 4, 4 (its one scripted plan, drawn twice); solutions 3, 3 (right).
    assert got["questions"] == 2 and got["samples"] == 8
    assert got["right"] == 4 and got["answered"] == 8
    assert (got["distinct_answers"], got["distinct_right"]) == (5, 2)
    assert got["questions_by_mix"] == {"mixed": 2}
    assert got["by_kind"]["prose"] == {"samples": 4, "answered": 4, "right": 3}


@pytest.mark.unit
def test_claims_are_written_once_each_with_every_claim_of_a_question_in_one_split(
    tmp_path: Path,
) -> None:
    questions = [f"{Q_PLAN} (case {k})" for k in range(30)]
    data = items_file(tmp_path, [(f"t-{k}", q, "72") for k, q in enumerate(questions)])
    script = {q: PLANS[Q_PLAN] for q in questions}
    prose = {q: [RIGHT, RIGHT, WRONG] for q in questions}  # the second 72 repeats the first
    sample(tmp_path, data, "--plans", "2", "--prose", "3", script=script, prose=prose)
    out = tmp_path / "claims"
    assert sp.main(["--report", str(tmp_path / "out.jsonl"), "--claims", str(out)]) == 0
    splits = {
        n: [json.loads(x) for x in (out / f"{n}.jsonl").read_text().splitlines()]
        for n in ("train", "val", "test")
    }
    every = [r for rows in splits.values() for r in rows]
    # per question: plans 72 and 96, solutions 72 and 24 (the repeated solution once)
    assert len(every) == 4 * 30
    assert len({(r["question"], r["statement"], r["context"]) for r in every}) == len(every)
    assert sum(r["label"] for r in every) == 2 * 30
    by_question = {}
    for name, rows in splits.items():
        for r in rows:
            by_question.setdefault(r["source"]["id"], set()).add(name)
            assert set(r) >= {"question", "statement", "context", "label", "kind", "id"}
            assert r["kind"] in ("pipeline-plan", "pipeline-prose")
    assert len(by_question) == 30 and all(len(names) == 1 for names in by_question.values())
    assert all(splits[name] for name in splits)  # 30 questions reach every split
    # the split is a function of the question id and the seed
    assert {sp.split_of(f"t-{k}", sp.ClaimSplit()) for k in range(200)} == {"train", "val", "test"}
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["sampler"] == sp.RECIPE and recipe["recipe"]["seed"] == 7
    assert sum(v["n"] for v in recipe["summary"].values()) == len(every)
    # what the training script reads: train.jsonl rows with a label
    from training.data import read_jsonl

    assert read_jsonl(out / "train.jsonl") == splits["train"]
    # reporting claims: every one in the one split named
    only = tmp_path / "only"
    sp.main(
        [
            "--report",
            str(tmp_path / "out.jsonl"),
            "--claims",
            str(only),
            "--claims-split",
            "gsm8k_test",
        ]
    )
    assert [p.name for p in sorted(only.iterdir())] == ["gsm8k_test.jsonl", "recipe.json"]
    assert len(read_jsonl(only / "gsm8k_test.jsonl")) == len(every)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "x", "--plans", "0"], "at least one sample"),
        (["--out", "x", "--plans", "9"], "0-8 each"),
        (["--out", "x", "--prose", "-1"], "0-8 each"),
        (["--plans", "1"], "--out is required"),
        (["--claims", "d"], "--claims needs --report"),
    ],
)
def test_bad_arguments_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        sp.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.unit
def test_a_file_holds_one_model_and_plan_format(tmp_path: Path) -> None:
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72"), ("t-2", Q_PROSE, "3")])
    rows = sample(tmp_path, data, "--plans", "1", "--limit", "1")
    out = tmp_path / "out.jsonl"
    for field, other in (("model", "another-model"), ("plan_format", "reasoning")):
        out.write_text(json.dumps({**rows[0], field: other}) + "\n")
        with pytest.raises(SystemExit, match="write them to another file"):
            sample(tmp_path, data, "--plans", "1")
        assert len(list(sp.read_samples(out))) == 1  # nothing was added
    # a line that does not say its format (recipe 1) is refused too
    out.write_text(json.dumps({k: v for k, v in rows[0].items() if k != "plan_format"}) + "\n")
    with pytest.raises(SystemExit, match="write them to another file"):
        sample(tmp_path, data, "--plans", "1")


@pytest.mark.unit
@pytest.mark.parametrize("flag", ["--limit", "--offset"])
def test_a_negative_limit_or_offset_is_refused(tmp_path: Path, flag: str) -> None:
    with pytest.raises(SystemExit):
        sp.parse_args(["--out", str(tmp_path / "o.jsonl"), flag, "-1"])


@pytest.mark.unit
def test_the_command_refuses_the_scripted_test_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLANNER_BACKEND", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env here
    data = items_file(tmp_path, [("t-1", Q_PLAN, "72")])
    out = tmp_path / "out.jsonl"
    with pytest.raises(SystemExit, match="PLANNER_BACKEND=llamacpp"):
        sp.main(["--data", str(data), "--out", str(out), "--exclude", "--no-progress"])
    assert not out.exists()
