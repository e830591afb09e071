"""Tool registry fallback chain: primary, cache, fallback tool, error; never raises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orchestrator.cache import MemoryCache
from orchestrator.tools.base import ToolContext, ToolError, ToolRefused
from orchestrator.tools.registry import Tool, ToolRegistry
from services.schemas import ToolSpec

pytestmark = [pytest.mark.unit]


class Flaky:
    """A tool whose behaviour the test switches: answer, hang or fail."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.calls = 0

    async def __call__(self, text: str, ctx: ToolContext) -> Any:
        self.calls += 1
        if self.mode == "hang":
            await asyncio.sleep(10)
        if self.mode == "fail":
            raise ToolError("backend down")
        return f"primary:{text}"


async def backup(text: str, ctx: ToolContext) -> Any:
    return f"backup:{text}"


def build(cache: MemoryCache | None, with_fallback: bool) -> tuple[ToolRegistry, Flaky]:
    primary = Flaky()
    reg = ToolRegistry(cache)
    reg.register(
        Tool(
            ToolSpec(name="io", description="d", input_format="f"),
            primary,
            timeout_s=0.1,
            cache_ttl_s=0.05,
            fallback="backup" if with_fallback else None,
        )
    )
    reg.register(
        Tool(ToolSpec(name="backup", description="d", input_format="f"), backup, timeout_s=1)
    )
    return reg, primary


CTX = ToolContext(tenant="t1", timeout_s=2)


async def test_fallback_order_cache_then_fallback_tool_then_error() -> None:
    cache = MemoryCache()
    reg, primary = build(cache, with_fallback=True)
    first = (await reg.run("io", "q", CTX)).result
    assert (first.status, first.source, first.output) == ("ok", "tool", "primary:q")

    await asyncio.sleep(0.06)  # past the fresh TTL: the primary is asked again
    primary.mode = "hang"
    cached = (await reg.run("io", "q", CTX)).result
    assert (cached.status, cached.source, cached.output) == ("ok", "cache", "primary:q")
    assert "timed out" in cached.error or "no result" in cached.error

    fb = (await reg.run("io", "other input", CTX)).result  # nothing cached for this input
    assert (fb.status, fb.source, fb.output) == ("fallback", "fallback", "backup:other input")
    assert fb.error.startswith("warning:")

    reg2, primary2 = build(MemoryCache(), with_fallback=False)
    primary2.mode = "hang"
    err = (await reg2.run("io", "q", CTX)).result
    assert (err.status, err.output) == ("timeout", None)
    primary2.mode = "fail"
    err = (await reg2.run("io", "q", CTX)).result
    assert (err.status, err.error) == ("error", "backend down")


async def test_fresh_cache_hit_skips_the_primary_and_is_per_tenant() -> None:
    reg, primary = build(MemoryCache(), with_fallback=False)
    reg.get("io").cache_ttl_s = 60
    await reg.run("io", "Q  ", CTX)
    hit = (await reg.run("io", "q", CTX)).result  # normalized input: same key
    assert hit.source == "cache" and primary.calls == 1
    other = (await reg.run("io", "q", ToolContext(tenant="t2", timeout_s=2))).result
    assert other.source == "tool" and primary.calls == 2


async def test_refusals_get_no_fallback_and_unknown_tools_an_error() -> None:
    async def refuse(text: str, ctx: ToolContext) -> Any:
        raise ToolRefused("writes are not allowed", category="sql_write")

    reg = ToolRegistry(MemoryCache())
    reg.register(
        Tool(
            ToolSpec(name="guarded", description="d", input_format="f"),
            refuse,
            timeout_s=1,
            fallback="backup",
        )
    )
    reg.register(
        Tool(ToolSpec(name="backup", description="d", input_format="f"), backup, timeout_s=1)
    )
    r = (await reg.run("guarded", "DROP TABLE x", CTX)).result
    assert (r.status, r.source) == ("error", "tool") and "not allowed" in r.error
    assert (await reg.run("nope", "x", CTX)).result.status == "error"


async def test_step_timeout_is_bounded_by_the_request_budget() -> None:
    reg, primary = build(None, with_fallback=False)
    reg.get("io").timeout_s = 5
    primary.mode = "hang"
    r = (await reg.run("io", "q", ToolContext(timeout_s=0.05))).result
    assert r.status == "timeout" and r.latency_ms < 500
