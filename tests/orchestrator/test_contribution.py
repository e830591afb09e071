"""Step contribution: each step's value changed, then taken away, the steps after it run
again with the real tools, and the answer compared."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.contribution import answer_path, contributions, perturb, void_steps
from orchestrator.executor import PlanExecutor
from orchestrator.limits import ToolBudget
from orchestrator.tools.base import ToolContext, ToolError
from orchestrator.tools.calc import calc
from orchestrator.tools.registry import Tool, ToolRegistry
from services import toolspecs
from services.schemas import Plan, ToolSpec
from tests.orchestrator.helpers import plan

pytestmark = [pytest.mark.unit]


class RecordingCache:
    """A cache that keeps what it is given and counts every read and write."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.reads = 0
        self.writes = 0

    async def get(self, key: str) -> str | None:
        self.reads += 1
        return self.data.get(key)

    async def set(self, key: str, value: str, ttl_s: float) -> None:
        self.writes += 1
        self.data[key] = value


async def const(text: str, ctx: ToolContext) -> Any:
    """The number its input states, whatever it depends on."""
    return float(text) if "." in text else int(text)


def registry(cache: RecordingCache | None = None) -> ToolRegistry:
    reg = ToolRegistry(cache)
    reg.register(Tool(toolspecs.CALC, calc, timeout_s=1.0, cache_ttl_s=60))
    reg.register(
        Tool(ToolSpec(name="const", description="const", input_format="n"), const, timeout_s=1.0)
    )
    return reg


def make_plan(steps: list[tuple[str, str, str, list[str]]], answer: str) -> Plan:
    return Plan.model_validate(plan(*steps, answer=answer))


# s2 is declared a dependency of s3 and never used; s5 is off the answer's path
PLAN = make_plan(
    [
        ("s1", "const", "3", []),
        ("s2", "const", "4", []),
        ("s3", "calc", "s1 * 2", ["s1", "s2"]),
        ("s4", "calc", "s3 + 1", ["s3"]),
        ("s5", "const", "9", []),
    ],
    "s4",
)


async def measure(plan: Plan, reg: ToolRegistry, **kw: Any) -> dict[str, Any]:
    executor = PlanExecutor(reg)
    loop = asyncio.get_running_loop()
    execution = await executor.run(plan, deadline=loop.time() + 10)
    kw.setdefault("deadline", loop.time() + 10)
    kw.setdefault("budget", ToolBudget(100))
    return {"execution": execution, "found": await contributions(executor, execution, **kw)}


async def test_each_step_is_credited_with_what_the_answer_loses_without_it() -> None:
    got = await measure(PLAN, registry())
    assert got["execution"].answer == "7"
    c = {sid: (x.perturbed, x.removed, x.contributes) for sid, x in got["found"].items()}
    assert c == {
        "s1": ("changed", "failed", True),  # 3 -> 5 gives 11; without it calc has no s1
        "s2": ("same", "same", False),  # declared, never read
        "s3": ("changed", "failed", True),
        "s4": ("changed", "failed", True),  # the answer itself
        "s5": ("unused", "unused", False),
    }


async def test_counterfactuals_neither_read_nor_fill_the_tool_cache() -> None:
    cache = RecordingCache()
    reg = registry(cache)
    executor = PlanExecutor(reg)
    loop = asyncio.get_running_loop()
    execution = await executor.run(PLAN, deadline=loop.time() + 10)
    reads, writes, keys = cache.reads, cache.writes, set(cache.data)
    assert writes == 2  # the plan's own calc steps are cached as always
    await contributions(executor, execution, deadline=loop.time() + 10, budget=ToolBudget(100))
    assert (cache.reads, cache.writes, set(cache.data)) == (reads, writes, keys)


async def test_a_counterfactual_past_the_call_budget_is_unknown_not_guessed() -> None:
    got = await measure(PLAN, registry(), max_calls=1)
    found = got["found"]
    # s1's counterfactual must run s3 and s4 again (2 calls): it does not fit
    assert (found["s1"].perturbed, found["s1"].contributes) == ("unknown", None)
    # the answer step needs no call; s5 none either
    assert found["s4"].contributes is True and found["s5"].contributes is False
    # the one call left went to s3's perturbation (s4 again); its removal did not fit,
    # and what the perturbation found already decides it
    assert (found["s3"].perturbed, found["s3"].removed, found["s3"].contributes) == (
        "changed",
        "unknown",
        True,
    )


async def test_the_reruns_tool_calls_are_labelled_as_counterfactuals_in_the_logs() -> None:
    import structlog

    seen: list[object] = []

    async def recording(text: str, ctx: ToolContext) -> Any:
        seen.append(structlog.contextvars.get_contextvars().get("labels.counterfactual_of"))
        return ctx.values.get("s1", 0) * 2

    reg = registry()
    reg.register(
        Tool(ToolSpec(name="rec", description="rec", input_format="s1"), recording, timeout_s=1)
    )
    plan = make_plan([("s1", "const", "3", []), ("s2", "rec", "s1", ["s1"])], "s2")
    await measure(plan, reg)
    assert seen == [None, "s1", "s1"]  # the plan's own call, then s1's two reruns of s2
    assert "labels.counterfactual_of" not in structlog.contextvars.get_contextvars()


async def test_counterfactual_calls_come_out_of_the_requests_own_budget() -> None:
    budget = ToolBudget(100)
    await measure(PLAN, registry(), budget=budget)
    # s1: s3, s4 twice; s2: the same; s3: s4 twice; s4 (the answer) and s5: none
    assert budget.left == 100 - 10
    # what the request's plans left of its budget bounds them, whatever max_calls says
    spent = ToolBudget(1)
    found = (await measure(PLAN, registry(), budget=spent, max_calls=24))["found"]
    assert (found["s1"].perturbed, found["s3"].perturbed, found["s3"].removed) == (
        "unknown",
        "changed",
        "unknown",
    )
    assert spent.left == 0


async def test_a_rerun_that_times_out_is_unknown_not_a_lost_answer() -> None:
    async def slow_when_moved(text: str, ctx: ToolContext) -> Any:
        if "s1" not in ctx.values:
            raise ToolError("needs s1")
        if ctx.values["s1"] != 3:
            await asyncio.sleep(5)
        return ctx.values["s1"] * 2

    reg = registry()
    reg.register(
        Tool(
            ToolSpec(name="slow", description="slow", input_format="s1"),
            slow_when_moved,
            timeout_s=0.05,
        )
    )
    plan = make_plan([("s1", "const", "3", []), ("s2", "slow", "s1", ["s1"])], "s2")
    got = await measure(plan, reg)
    assert got["execution"].answer == "6"
    s1 = got["found"]["s1"]
    # perturbed, s2 ran out of time: that says nothing; removed, s2 failed: it counts
    assert (s1.perturbed, s1.removed, s1.contributes) == ("unknown", "failed", True)


async def test_a_rerun_the_request_deadline_cuts_short_is_unknown() -> None:
    async def stuck(text: str, ctx: ToolContext) -> Any:
        if ctx.values.get("s1") != 3:
            await asyncio.sleep(5)
        return 1

    reg = registry()
    reg.register(
        Tool(ToolSpec(name="stuck", description="stuck", input_format="s1"), stuck, timeout_s=30)
    )
    plan = make_plan([("s1", "const", "3", []), ("s2", "stuck", "s1", ["s1"])], "s2")
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await measure(plan, reg, deadline=loop.time() + 0.3)
    assert loop.time() - started < 2  # the deadline holds, not the tool's own 30 s
    assert {got["found"]["s1"].perturbed, got["found"]["s1"].removed} == {"unknown"}


async def test_a_counterfactual_past_the_deadline_is_unknown() -> None:
    loop = asyncio.get_running_loop()
    got = await measure(PLAN, registry(), deadline=loop.time() - 1)
    assert got["found"]["s1"].perturbed == "unknown"
    assert got["found"]["s2"].contributes is None


async def test_steps_of_a_plan_without_an_answer_are_not_measured() -> None:
    plan = make_plan([("s1", "const", "3", []), ("s2", "calc", "s1 / 0", ["s1"])], "s2")
    got = await measure(plan, registry())
    assert got["execution"].answer is None
    assert {x.contributes for x in got["found"].values()} == {None}
    assert void_steps(got["execution"]) == ["s2"]


async def test_void_steps_are_those_without_a_value_or_off_the_answers_path() -> None:
    got = await measure(PLAN, registry())
    assert void_steps(got["execution"]) == ["s5"]
    assert answer_path(PLAN) == {"s1", "s2", "s3", "s4"}


async def test_a_step_whose_value_only_moves_the_answer_within_rounding_still_counts() -> None:
    # perturbing s1 (3 -> 5) leaves round(s1 / 100) at 0, but without s1 there is no
    # answer: the step still contributes
    plan = make_plan([("s1", "const", "3", []), ("s2", "calc", "round(s1 / 100)", ["s1"])], "s2")
    got = await measure(plan, registry())
    s1 = got["found"]["s1"]
    assert (s1.perturbed, s1.removed, s1.contributes) == ("same", "failed", True)


@given(
    st.one_of(
        st.integers(min_value=-(10**12), max_value=10**12),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        st.booleans(),
        st.text(max_size=20),
        st.lists(st.integers(min_value=-100, max_value=100), max_size=5),
    )
)
def test_a_perturbed_value_differs_and_keeps_its_kind(value: Any) -> None:
    moved = perturb(value)
    assert type(moved) is type(value)
    assert moved != value


def test_a_number_written_as_text_is_perturbed_as_a_number() -> None:
    assert perturb("1,200") == "1801"
    assert perturb("2.5") == "4.75"
    assert perturb("Paris") == "Paris (changed)"
    assert perturb(None) == 1
