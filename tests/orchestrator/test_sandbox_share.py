"""A tenant's sandbox share (ORCH_TENANT_SANDBOX_JOBS) holds for every sandbox job:
python steps, and calc steps that fall back to python inside the registry."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orchestrator.executor import PlanExecutor
from orchestrator.limits import TenantSemaphore
from orchestrator.tools.base import ToolContext, ToolError
from orchestrator.tools.registry import Tool, ToolRegistry
from services import toolspecs

pytestmark = [pytest.mark.unit]


class Sandbox:
    """Stands in for the python tool and records how many of its jobs run at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.tenants: list[str] = []

    async def __call__(self, text: str, ctx: ToolContext) -> Any:
        self.running += 1
        self.most = max(self.most, self.running)
        self.tenants.append(ctx.tenant)
        try:
            await asyncio.sleep(0.2)
            return f"py:{text}"
        finally:
            self.running -= 1


async def no_calc(text: str, ctx: ToolContext) -> Any:
    raise ToolError("calc cannot read this")


def executor(share: int) -> tuple[PlanExecutor, Sandbox]:
    sandbox = Sandbox()
    reg = ToolRegistry()
    reg.register(Tool(toolspecs.PYTHON, sandbox, timeout_s=5))
    reg.register(Tool(toolspecs.CALC, no_calc, timeout_s=1, fallback="python"))
    return PlanExecutor(reg, sandbox_slots=TenantSemaphore(share)), sandbox


async def test_a_calc_fallback_to_python_takes_the_tenants_sandbox_slot() -> None:
    ex, sandbox = executor(share=1)
    ctx = ToolContext(tenant="default", timeout_s=5)
    python, calc, calc2 = await asyncio.gather(
        ex.run_tool("python", "1", ctx, slots_tenant="10.0.0.1"),
        ex.run_tool("calc", "2", ctx, slots_tenant="10.0.0.1"),
        ex.run_tool("calc", "3", ctx, slots_tenant="10.0.0.1"),
    )
    assert python.result.status == "ok" and python.result.output == "py:1"
    assert (calc.result.status, calc.result.output) == ("fallback", "py:2")
    assert (calc2.result.status, calc2.result.output) == ("fallback", "py:3")
    assert sandbox.most == 1  # one job at a time for this tenant, fallbacks included
    assert sandbox.tenants == ["default"] * 3  # the cache namespace is unchanged


async def test_other_tenants_fallbacks_run_beside_it() -> None:
    ex, sandbox = executor(share=1)
    ctx = ToolContext(timeout_s=5)
    await asyncio.gather(
        ex.run_tool("calc", "1", ctx, slots_tenant="a"),
        ex.run_tool("calc", "2", ctx, slots_tenant="b"),
    )
    assert sandbox.most == 2


async def test_a_fallback_waiting_past_its_time_for_a_slot_times_out() -> None:
    ex, sandbox = executor(share=1)
    slow = asyncio.create_task(
        ex.run_tool("python", "1", ToolContext(timeout_s=5), slots_tenant="a")
    )
    await asyncio.sleep(0.02)
    calc = await ex.run_tool("calc", "2", ToolContext(timeout_s=0.1), slots_tenant="a")
    assert calc.result.status == "error" and "no sandbox slot" in (calc.result.error or "")
    assert (await slow).result.status == "ok" and sandbox.most == 1
