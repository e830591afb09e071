"""Items in, one line per item out, resumable after an interruption, bounded concurrency."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from evals.data import (
    DataError,
    Item,
    ResultWriter,
    dataset_name,
    iter_results,
    load_items,
    load_results,
)
from evals.harness import run_items
from evals.modes import EvalAborted, base_record, score

pytestmark = pytest.mark.unit


def write_items(path: Path, n: int) -> list[Item]:
    rows = [
        {"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_items(path)


class FakeRunner:
    """Answers right on even items; can fail, stall or abort on chosen items."""

    def __init__(
        self,
        *,
        fail_on: set[str] | None = None,
        abort_on: set[str] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.fail_on = fail_on or set()
        self.abort_on = abort_on or set()
        self.delay_s = delay_s
        self.seen: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, item: Item) -> dict[str, Any]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if item.id in self.abort_on:
                raise EvalAborted("service went away")
            if item.id in self.fail_on:
                raise RuntimeError("boom")
            self.seen.append(item.id)
            record = base_record(item, dataset="toy", mode="plan", model="fake")
            index = int(item.id[1:])
            score(record, f"The answer is {item.gold if index % 2 == 0 else -1}", item.gold)
            return record
        finally:
            self.in_flight -= 1


async def test_every_item_gets_exactly_one_line(tmp_path: Path) -> None:
    items = write_items(tmp_path / "items.jsonl", 10)
    out = tmp_path / "results.jsonl"
    runner = FakeRunner(delay_s=0.01)
    summary = await run_items(
        items, runner, out, dataset="toy", mode="plan", concurrency=3, show_progress=False
    )
    lines = out.read_text().splitlines()
    assert len(lines) == 10
    ids = [json.loads(line)["id"] for line in lines]
    assert sorted(ids) == sorted(it.id for it in items)
    assert summary.ran == 10 and summary.correct == 5 and summary.errors == 0
    assert 1 < runner.max_in_flight <= 3
    assert all(json.loads(line)["finished_at"] for line in lines)


async def test_interrupt_then_rerun_resumes_without_duplicates(tmp_path: Path) -> None:
    items = write_items(tmp_path / "items.jsonl", 12)
    out = tmp_path / "results.jsonl"
    # First run: the service vanishes at q7; items already finished stay on disk.
    with pytest.raises(EvalAborted):
        await run_items(
            items,
            FakeRunner(abort_on={"q7"}),
            out,
            dataset="toy",
            mode="plan",
            concurrency=1,
            show_progress=False,
        )
    first = [r["id"] for r in iter_results(out)]
    assert first == [f"q{i}" for i in range(7)]
    # Simulate a kill in the middle of a write: a torn last line.
    with out.open("a") as f:
        f.write('{"id": "q7", "mode": "plan", "corr')
    second = FakeRunner()
    summary = await run_items(
        items, second, out, dataset="toy", mode="plan", concurrency=2, show_progress=False
    )
    assert summary.skipped == 7 and summary.ran == 5
    assert sorted(second.seen) == sorted(f"q{i}" for i in range(7, 12))
    ids = [r["id"] for r in iter_results(out)]
    assert sorted(ids) == sorted(it.id for it in items)  # each id once, torn line ignored
    # A third run has nothing left to do.
    third = FakeRunner()
    summary = await run_items(items, third, out, dataset="toy", mode="plan", show_progress=False)
    assert summary.ran == 0 and summary.skipped == 12 and third.seen == []


async def test_other_modes_and_datasets_in_the_same_file_are_not_skipped(tmp_path: Path) -> None:
    items = write_items(tmp_path / "items.jsonl", 3)
    out = tmp_path / "results.jsonl"
    await run_items(items, FakeRunner(), out, dataset="toy", mode="plan", show_progress=False)
    summary = await run_items(
        items, FakeRunner(), out, dataset="toy", mode="plan+verify", show_progress=False
    )
    assert summary.ran == 3


async def test_item_failure_is_recorded_and_retried_on_request(tmp_path: Path) -> None:
    items = write_items(tmp_path / "items.jsonl", 4)
    out = tmp_path / "results.jsonl"
    summary = await run_items(
        items, FakeRunner(fail_on={"q2"}), out, dataset="toy", mode="plan", show_progress=False
    )
    assert summary.errors == 1
    failed = [r for r in iter_results(out) if r["error"]]
    assert [r["id"] for r in failed] == ["q2"]
    assert failed[0]["error"] == "RuntimeError: boom" and failed[0]["correct"] is False
    # A plain rerun keeps the failure; --retry-errors runs only that item again.
    assert (
        await run_items(items, FakeRunner(), out, dataset="toy", mode="plan", show_progress=False)
    ).ran == 0
    retry = FakeRunner()
    summary = await run_items(
        items, retry, out, dataset="toy", mode="plan", retry_errors=True, show_progress=False
    )
    assert retry.seen == ["q2"] and summary.errors == 0
    latest = {r["id"]: r for r in load_results([out])}
    assert len(latest) == 4 and latest["q2"]["error"] is None  # the last line wins


def test_load_items_offset_limit_and_validation(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    write_items(path, 10)
    assert [it.id for it in load_items(path, offset=3, limit=2)] == ["q3", "q4"]
    assert [it.id for it in load_items(path, offset=8)] == ["q8", "q9"]
    assert load_items(path, limit=0) == []
    item = load_items(path, limit=1)[0]
    assert item.gold == 0 and item.gold_text == "0"
    path.write_text(
        '{"id": "a", "question": "x?", "answer": "1"}\n{"id": "a", "question": "y?", "answer": "2"}\n'
    )
    with pytest.raises(DataError, match="duplicate id"):
        load_items(path)
    path.write_text('{"id": "a", "question": "x?", "answer": "many"}\n')
    with pytest.raises(DataError, match="not a number"):
        load_items(path)
    path.write_text('{"id": "a", "answer": "1"}\n')
    with pytest.raises(DataError, match=":1: not an item line"):
        load_items(path)


def test_dataset_names() -> None:
    assert dataset_name(Path("datasets/gsm8k/test.norm.jsonl")) == "gsm8k-test"
    assert dataset_name(Path("/data/svamp/svamp.norm.jsonl")) == "svamp"
    assert dataset_name(Path("evals/splits/gsm8k-train-dev.jsonl")) == "gsm8k-train-dev"


def test_writer_starts_a_fresh_line_after_a_torn_one(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text('{"id": "a", "mode": "plan"}\n{"id": "b", "mo')
    with ResultWriter(out) as w:
        w.write({"id": "c", "mode": "plan"})
    assert [r["id"] for r in iter_results(out)] == ["a", "c"]


async def test_reason_runner_maps_failures() -> None:
    import httpx

    from evals.modes import ReasonRunner

    bodies = {
        "slow": (
            503,
            {
                "error": {"type": "dependency_unavailable", "message": "planner did not answer"},
                "trace_id": "a" * 32,
            },
        ),
        "bad": (
            502,
            {
                "error": {"type": "planning_failed", "message": "no valid plan"},
                "trace_id": "b" * 32,
            },
        ),
    }
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        status, payload = bodies[body["question"]]
        return httpx.Response(status, json=payload)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        run = ReasonRunner(client, "http://o", "plan+verify+sc5", dataset="d", model="m")
        slow = await run(Item("1", "slow", 3, "3"))
        bad = await run(Item("2", "bad", 3, "3"))
    assert sent[0]["options"] == {
        "n_plans": 5,
        "verify": True,
        "use_cache": False,
        "deadline_s": 120.0,
    }
    assert slow["error"].startswith("503 dependency_unavailable") and slow["schema_valid"] is None
    assert bad["error"].startswith("502 planning_failed") and bad["schema_valid"] is False
    assert bad["trace_id"] == "b" * 32 and bad["correct"] is False


@pytest.mark.parametrize(
    ("mode", "n_plans", "n_prose"),
    [("plan+verify+mixed5", 2, 3), ("plan+verify+mixed7", 4, 3)],
)
async def test_mixed_modes_ask_for_plans_and_solutions(
    mode: str, n_plans: int, n_prose: int
) -> None:
    import httpx

    from evals.modes import ReasonRunner

    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(
            503, json={"error": {"type": "x", "message": "x"}, "trace_id": "c" * 32}
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        await ReasonRunner(client, "http://o", mode, dataset="d", model="m")(Item("1", "q", 3, "3"))
    assert sent[0]["options"] == {
        "n_plans": n_plans,
        "n_prose": n_prose,
        "verify": True,
        "use_cache": False,
        "deadline_s": 120.0,
    }


async def test_reason_runner_keeps_every_round_of_a_replanned_request() -> None:
    import httpx

    from evals.modes import ReasonRunner

    rounds = [
        {"replan_for": None, "answer": None, "samples": 1, "agreeing": 0, "confidence": 0.0,
         "verdict": "unverified", "replan_reasons": ["no_answer"], "ms": 900.0},
        {"replan_for": "no_answer", "answer": "3", "samples": 1, "agreeing": 1,
         "confidence": 0.6, "verdict": "unverified", "replan_reasons": [], "ms": 800.0},
    ]  # fmt: skip
    base = {"trace_id": "c" * 32, "verdict": "unverified", "confidence": 0.6, "plan": None,
            "steps": [], "timings_ms": {"total": 1700.0}}  # fmt: skip
    replies = {"twice": {**base, "answer": "3", "replanning": rounds},
               "once": {**base, "answer": "3", "replanning": None}}  # fmt: skip

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=replies[json.loads(request.content)["question"]])

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        run = ReasonRunner(client, "http://o", "plan+verify", dataset="d", model="m")
        twice = await run(Item("1", "twice", 3, "3"))
        once = await run(Item("2", "once", 3, "3"))
    assert twice["replanning"] == rounds and twice["correct"] is True
    assert "replanning" not in once


def test_plan_validity_checks_the_plan_and_leaves_prose_answers_out() -> None:
    from evals.modes import plan_validity

    plan = {
        "reasoning": "r",
        "steps": [{"id": "s1", "tool": "calc", "input": "1 + 1", "depends_on": []}],
        "answer_step": "s1",
    }
    assert plan_validity({"plan": plan}) is True
    assert plan_validity({"plan": {**plan, "answer_step": "s9", "steps": []}}) is False
    assert plan_validity({"plan": None, "solution": {"text": "2", "answer": "2"}}) is None
    assert plan_validity({"plan": None}) is False
