"""The DAG executor: parallel steps, values by id, failures recorded, deadline honoured."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from orchestrator.executor import PlanExecutor
from orchestrator.tools.base import ToolContext, ToolError
from orchestrator.tools.registry import Tool, ToolRegistry
from services.schemas import Plan, ToolSpec

pytestmark = [pytest.mark.unit]


def spec(name: str) -> ToolSpec:
    return ToolSpec(name=name, description=name, input_format="text")


async def sleeper(text: str, ctx: ToolContext) -> Any:
    await asyncio.sleep(float(text))
    return float(text)


async def adder(text: str, ctx: ToolContext) -> Any:
    return sum(ctx.values.values()) + float(text)


async def boom(text: str, ctx: ToolContext) -> Any:
    raise ToolError("bad input")


async def crash(text: str, ctx: ToolContext) -> Any:
    return 1 / 0


async def hang(text: str, ctx: ToolContext) -> Any:
    await asyncio.Event().wait()


def registry() -> ToolRegistry:
    reg = ToolRegistry()
    for name, fn, timeout in [
        ("sleep", sleeper, 5),
        ("add", adder, 5),
        ("boom", boom, 5),
        ("crash", crash, 5),
        ("hang", hang, 0.2),
    ]:
        reg.register(Tool(spec(name), fn, timeout_s=timeout))
    return reg


def plan(steps: list[tuple[str, str, str, list[str]]], answer: str) -> Plan:
    return Plan.model_validate(
        {
            "reasoning": "test",
            "steps": [{"id": i, "tool": t, "input": x, "depends_on": d} for i, t, x, d in steps],
            "answer_step": answer,
        }
    )


def deadline(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def test_independent_steps_run_in_parallel_and_values_flow_by_id() -> None:
    steps = [(f"s{i}", "sleep", "0.2", []) for i in range(1, 9)]
    steps.append(("s9", "add", "1", [f"s{i}" for i in range(1, 9)]))
    started = time.perf_counter()
    result = await PlanExecutor(registry()).run(plan(steps, "s9"), deadline=deadline(5))
    elapsed = time.perf_counter() - started
    assert elapsed < 0.2 * 1.5  # 8 sleeps of 0.2 s in parallel, not 1.6 s in sequence
    assert result.values["s9"] == pytest.approx(8 * 0.2 + 1)
    assert [s.status for s in result.steps] == ["ok"] * 9
    assert result.complete


async def test_a_step_starts_as_soon_as_its_own_dependencies_finish() -> None:
    # s3 depends only on the fast s1; it must not wait for the slow s2.
    p = plan(
        [
            ("s1", "sleep", "0.05", []),
            ("s2", "sleep", "0.5", []),
            ("s3", "add", "0", ["s1"]),
            ("s4", "add", "0", ["s2", "s3"]),
        ],
        "s4",
    )
    finished: dict[str, float] = {}
    t0 = time.perf_counter()
    await PlanExecutor(registry()).run(
        p,
        deadline=deadline(5),
        on_step=lambda s: finished.__setitem__(s.id, time.perf_counter() - t0),
    )
    assert finished["s3"] < 0.3 < finished["s2"]


async def test_failures_are_recorded_and_dependents_skipped() -> None:
    p = plan(
        [
            ("s1", "boom", "x", []),
            ("s2", "crash", "x", []),
            ("s3", "sleep", "0.01", []),
            ("s4", "add", "0", ["s1", "s3"]),
            ("s5", "add", "0", ["s4"]),
        ],
        "s5",
    )
    result = await PlanExecutor(registry()).run(p, deadline=deadline(5))
    by_id = {s.id: s for s in result.steps}
    assert by_id["s1"].status == "error" and by_id["s1"].error == "bad input"
    assert by_id["s2"].status == "error" and "ZeroDivisionError" in by_id["s2"].error
    assert by_id["s3"].status == "ok"
    assert by_id["s4"].status == "skipped" and "s1" in by_id["s4"].error
    assert by_id["s5"].status == "skipped"
    assert result.answer is None


async def test_tool_timeout_marks_step_timeout() -> None:
    started = time.perf_counter()
    result = await PlanExecutor(registry()).run(
        plan([("s1", "hang", "x", [])], "s1"), deadline=deadline(5)
    )
    assert result.steps[0].status == "timeout"
    assert time.perf_counter() - started < 1


async def test_deadline_cuts_running_and_waiting_steps() -> None:
    p = plan([("s1", "sleep", "3", []), ("s2", "add", "0", ["s1"])], "s2")
    t0 = time.perf_counter()
    result = await PlanExecutor(registry()).run(p, deadline=deadline(0.3))
    assert time.perf_counter() - t0 < 0.5
    assert [s.status for s in result.steps] == ["timeout", "skipped"]


async def test_invalid_plans_are_refused_before_running() -> None:
    from services.errors import PlanInvalid

    with pytest.raises(PlanInvalid, match="unknown tool"):
        await PlanExecutor(registry()).run(
            plan([("s1", "shell", "rm -rf /", [])], "s1"), deadline=deadline(1)
        )
    with pytest.raises(PlanInvalid, match="cycle"):
        await PlanExecutor(registry()).run(
            plan([("s1", "add", "1", ["s2"]), ("s2", "add", "1", ["s1"])], "s1"),
            deadline=deadline(1),
        )


class BrokenRegistry(ToolRegistry):
    """A registry that breaks its contract (never raise) for the tool `cached`."""

    async def run(self, name: str, text: str, ctx: ToolContext) -> Any:
        if name == "cached":
            raise RuntimeError("a bug in the registry")
        return await super().run(name, text, ctx)


async def test_a_failure_in_the_tool_runner_fails_the_step_not_the_run() -> None:
    # Should the registry raise, that is one step's error, not an exception that takes
    # down the whole request.
    reg = BrokenRegistry()
    reg.register(Tool(spec("cached"), sleeper, timeout_s=5, cache_ttl_s=60))
    reg.register(Tool(spec("sleep"), sleeper, timeout_s=5))
    p = plan(
        [("s1", "cached", "0", []), ("s2", "sleep", "0", []), ("s3", "sleep", "0", ["s1"])], "s2"
    )
    result = await PlanExecutor(reg).run(p, deadline=deadline(5))
    assert [s.status for s in result.steps] == ["error", "ok", "skipped"]
    assert result.steps[0].error == "cached failed: RuntimeError"
    assert result.answer == "0.0"


async def test_the_answer_is_the_rendered_output_of_the_answer_step() -> None:
    p = plan([("s1", "sleep", "0", []), ("s2", "add", "2", ["s1"])], "s2")
    result = await PlanExecutor(registry()).run(p, deadline=deadline(5))
    assert result.answer == result.steps[1].output == "2.0"
