"""Repaired plans run in the orchestrator's real sandbox and answer what the program the
model cut into steps computes, where the plan as written fails with `NameError`."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from orchestrator.executor import PlanExecutor
from orchestrator.limits import ToolBudget
from planner.repair import repair_plan
from tests.orchestrator.helpers import sandbox_registry
from tests.planner.test_repair import make_plan

pytestmark = [pytest.mark.integration]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def executor():
    async with sandbox_registry() as reg:
        yield PlanExecutor(reg)


async def run(executor: PlanExecutor, plan):
    loop = asyncio.get_running_loop()
    return await executor.run(plan, deadline=loop.time() + 20, budget=ToolBudget(24))


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("steps", "answer"),
    [
        (
            [
                ("s1", "python", "initial = 29", []),
                ("s2", "python", "after_todd = initial - 4", ["s1"]),
                ("s3", "python", "total = initial + after_todd", ["s2"]),
            ],
            "54",
        ),
        (
            [
                ("s1", "python", "x = 2\nresult = x", []),
                ("s2", "python", "y = x * 3\nprint(y)", ["s1"]),
            ],
            "6",
        ),
        (
            [
                ("s1", "calc", "50 * 36", []),
                ("s2", "python", "x = result", ["s1"]),
                ("s3", "python", "x / 2", ["s2"]),
            ],
            "900",
        ),
        (
            [
                ("s1", "calc", "20 * 2", []),
                ("s2", "calc", "s1 * 2", ["s1"]),
                ("s3", "calc", "s2 + s1", ["s2"]),
            ],
            "120",
        ),
    ],
)
async def test_a_repaired_plan_answers_where_the_written_one_fails(
    executor: PlanExecutor, steps, answer: str
) -> None:
    plan = make_plan(steps, steps[-1][0])
    written = await run(executor, plan)
    assert written.answer is None
    assert any(s.status == "error" for s in written.steps)
    fixed, repairs = repair_plan(plan)
    assert repairs
    got = await run(executor, fixed)
    assert [s.status for s in got.steps] == ["ok"] * len(steps)
    assert float(got.answer) == float(answer)
