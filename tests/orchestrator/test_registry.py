"""Tool registry fallback chain: primary, cache, fallback tool, error; never raises."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

import pytest
from structlog.testing import capture_logs

from orchestrator.cache import MemoryCache
from orchestrator.sandbox import Sandbox, SandboxSettings
from orchestrator.tools.base import ToolContext, ToolError, ToolRefused
from orchestrator.tools.python import PythonTool
from orchestrator.tools.registry import Tool, ToolRegistry
from services.schemas import ToolSpec
from services.toolspecs import PYTHON


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


@pytest.mark.unit
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


@pytest.mark.unit
async def test_fresh_cache_hit_skips_the_primary_and_is_per_tenant() -> None:
    reg, primary = build(MemoryCache(), with_fallback=False)
    reg.get("io").cache_ttl_s = 60
    await reg.run("io", "Q  ", CTX)
    hit = (await reg.run("io", "q", CTX)).result  # normalized input: same key
    assert hit.source == "cache" and primary.calls == 1
    other = (await reg.run("io", "q", ToolContext(tenant="t2", timeout_s=2))).result
    assert other.source == "tool" and primary.calls == 2


@pytest.mark.unit
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


@pytest.mark.unit
async def test_step_timeout_is_bounded_by_the_request_budget() -> None:
    reg, primary = build(None, with_fallback=False)
    reg.get("io").timeout_s = 5
    primary.mode = "hang"
    r = (await reg.run("io", "q", ToolContext(timeout_s=0.05))).result
    assert r.status == "timeout" and r.latency_ms < 500


# The shape of every SECURITY_ALERT, whichever layer logs it (orchestrator/sandbox/events.py).
ALERT_SHAPE = {
    "event", "log_level", "event.action", "event.kind", "labels.category", "labels.tool",
    "labels.status", "error.message",
}  # fmt: skip


@pytest.mark.unit
async def test_a_refusal_logs_one_alert_in_the_shared_shape() -> None:
    async def refuse(text: str, ctx: ToolContext) -> Any:
        raise ToolRefused("writes are not allowed", category="sql_write")

    reg = ToolRegistry(None)
    reg.register(Tool(ToolSpec(name="guarded", description="d", input_format="f"), refuse, 1))
    with capture_logs() as logs:
        await reg.run("guarded", "DROP TABLE x", CTX)
    (alert,) = [entry for entry in logs if entry["event"] == "SECURITY_ALERT"]
    assert set(alert) == ALERT_SHAPE, alert
    assert alert["event.action"] == "SECURITY_ALERT" and alert["event.kind"] == "alert"
    assert (alert["labels.category"], alert["labels.tool"]) == ("sql_write", "guarded")
    assert alert["labels.status"] == "refused" and alert["log_level"] == "warning"
    assert alert["error.message"] == "writes are not allowed"


@pytest.mark.unit
async def test_a_tool_that_times_itself_gets_its_grace() -> None:
    """The registry waits `fn.timeout_grace_s` past the step's timeout for the tool's own."""

    class SelfTimed:
        timeout_grace_s = 0.5

        async def __call__(self, text: str, ctx: ToolContext) -> Any:
            await asyncio.sleep(ctx.timeout_s + 0.1)  # its own limit, a little late
            raise TimeoutError("the tool's own timeout")

    reg = ToolRegistry(None)
    reg.register(Tool(ToolSpec(name="timed", description="d", input_format="f"), SelfTimed(), 0.1))
    r = (await reg.run("timed", "x", CTX)).result
    assert r.status == "timeout" and r.error == "the tool's own timeout", r


@pytest.mark.integration
@pytest.mark.security
async def test_python_timeout_at_the_registry_is_the_sandboxs_own() -> None:
    """A spinning job: timeout status, one ordinary limit line, no alert, same worker."""
    sandbox = Sandbox(SandboxSettings(workers=1))
    await sandbox.start()
    try:
        reg = ToolRegistry(None)
        reg.register(Tool(PYTHON, PythonTool(sandbox), timeout_s=0.5))
        worker_pids = {worker.proc.pid for worker in sandbox._workers}
        with capture_logs() as logs:
            r = (await reg.run("python", "while True:\n    pass", CTX)).result
        assert r.status == "timeout", r
        assert r.error == "wall-clock timeout" and 450 < r.latency_ms < 1500, r
        events = [entry["event"] for entry in logs]
        assert events.count("tool_limit") == 1 and "SECURITY_ALERT" not in events, logs
        (limit,) = [entry for entry in logs if entry["event"] == "tool_limit"]
        assert limit["labels.category"] == "timeout"
        # The sandbox killed the job and kept its worker: nothing was replaced.
        assert not sandbox._tasks
        assert {worker.proc.pid for worker in sandbox._workers} == worker_pids
        assert sandbox.healthy
        assert (await reg.run("python", "6 * 7", CTX)).result.output == "42"
    finally:
        await sandbox.close()


# ------------------------------------------------ the registry build_registry makes


class _IdleSandbox:
    """Stands in for the sandbox: build_registry only starts, wraps and closes it."""

    timeout_grace_s = 2.0

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def _built(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, **env: str) -> ToolRegistry:
    import orchestrator.sandbox
    from orchestrator.tools import build_registry
    from services.settings import OrchestratorSettings

    monkeypatch.setattr(orchestrator.sandbox, "Sandbox", _IdleSandbox)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = OrchestratorSettings(sqlite_path=tmp_path / "s.sqlite3", database_url=None)
    async with AsyncExitStack() as stack:
        return await build_registry(settings, MemoryCache(), stack)


@pytest.mark.unit
async def test_registry_tools_are_the_shared_specs_with_settings_limits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Each tool's spec is the one object of services.toolspecs, and its timeout and
    cache lifetime come from OrchestratorSettings (env overrides included)."""
    from services import toolspecs

    registry = await _built(
        monkeypatch,
        tmp_path,
        ORCH_PYTHON_TIMEOUT_S="4.5",
        ORCH_CALC_TIMEOUT_S="2.5",
        ORCH_IO_TOOL_TIMEOUT_S="1.5",
        ORCH_SQL_CACHE_TTL_S="30",
        ORCH_LOOKUP_CACHE_TTL_S="90",
    )
    assert registry.specs() == list(toolspecs.DEFAULT_TOOLS)
    for spec in toolspecs.DEFAULT_TOOLS:
        tool = registry.get(spec.name)
        assert tool is not None and tool.spec is spec
    limits = {
        name: (tool.timeout_s, tool.cache_ttl_s, tool.fallback)
        for name in registry.names
        if (tool := registry.get(name)) is not None
    }
    assert limits == {
        "python": (4.5, None, None),
        "calc": (2.5, None, "python"),
        "sql": (1.5, 30, None),
        "lookup": (1.5, 90, None),
    }


@pytest.mark.unit
async def test_registry_limits_default_to_the_settings_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in (
        "ORCH_PYTHON_TIMEOUT_S",
        "ORCH_CALC_TIMEOUT_S",
        "ORCH_IO_TOOL_TIMEOUT_S",
        "ORCH_SQL_CACHE_TTL_S",
        "ORCH_LOOKUP_CACHE_TTL_S",
    ):
        monkeypatch.delenv(name, raising=False)
    registry = await _built(monkeypatch, tmp_path)
    limits = {
        name: (tool.timeout_s, tool.cache_ttl_s)
        for name in registry.names
        if (tool := registry.get(name)) is not None
    }
    assert limits == {
        "python": (5.0, None),
        "calc": (1.0, None),
        "sql": (0.8, 60),
        "lookup": (0.8, 3600),
    }
