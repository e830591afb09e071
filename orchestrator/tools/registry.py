"""The tool registry: specs, implementations, timeouts, caching and fallback chains.

Running a tool never raises. The chain for one call is:
1. a fresh cached result for the same tenant, tool and normalized input (cacheable tools);
2. the primary call under its timeout;
3. on timeout or failure, a stale cached result (kept past the fresh TTL for this);
4. else the configured fallback tool, with a warning in the result;
5. else an error (or timeout) status with the reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, replace
from typing import Any, cast

import structlog
from prometheus_client import Counter, Histogram

from orchestrator.cache import Cache, cache_get, make_key
from orchestrator.limits import SANDBOX_TOOLS, TenantSemaphore
from orchestrator.sandbox.events import security_alert
from orchestrator.tools.base import ToolContext, ToolError, ToolFn, ToolRefused
from services.answers import normalize_text
from services.claims import render_value
from services.schemas import StepSource, StepStatus, ToolRunResult, ToolSpec

log = structlog.get_logger("tools")

STEPS = Counter("tool_calls_total", "Tool calls", ["tool", "status", "source"])
STEP_LATENCY = Histogram(
    "tool_call_duration_seconds",
    "Tool call latency",
    ["tool"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

# Inputs a tool refused (a security check), by the check's category (a literal of the
# tool's code: the SQL policy's, the sandbox checker's).
REFUSALS = Counter("tool_refusals_total", "Tool inputs refused", ["tool", "category"])

STALE_FACTOR = 12  # stale copies live this many fresh TTLs, for use when the tool fails


@dataclass
class Tool:
    spec: ToolSpec
    fn: ToolFn
    timeout_s: float
    cache_ttl_s: float | None = None
    fallback: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class Outcome:
    """A tool run's result plus the value later steps receive."""

    result: ToolRunResult
    value: Any = None


class ToolRegistry:
    """`sandbox_slots`, when set, bounds the sandbox jobs each tenant runs at once: every
    call of a sandbox tool, a fallback's included, first waits (within its time) for one
    of the slots of `ctx.limits_tenant or ctx.tenant`."""

    def __init__(
        self, cache: Cache | None = None, *, sandbox_slots: TenantSemaphore | None = None
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._cache = cache
        self.sandbox_slots = sandbox_slots

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} registered twice")
        self._tools[tool.name] = tool

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def health(self) -> tuple[bool, str]:
        """Readiness of the tools whose implementation reports it (`fn.health()`)."""
        ready, parts = True, []
        for tool in self._tools.values():
            check = getattr(tool.fn, "health", None)
            if check is None:
                continue
            tool_ready, detail = check()
            ready = ready and tool_ready
            parts.append(f"{tool.name}: {detail}")
        return ready, "; ".join(parts) or "no tool reports its health"

    def _cache_key(self, tool: Tool, text: str, ctx: ToolContext) -> str:
        values = {k: ctx.values[k] for k in sorted(ctx.values)} if ctx.values else None
        return make_key("tool", ctx.tenant, tool.name, normalize_text(text), values)

    async def run(self, name: str, text: str, ctx: ToolContext) -> Outcome:
        started = time.perf_counter()
        outcome = await self._run(name, text, ctx, started)
        r = outcome.result
        r.latency_ms = round((time.perf_counter() - started) * 1000, 3)
        STEPS.labels(name if name in self._tools else "unknown", r.status, r.source).inc()
        STEP_LATENCY.labels(name if name in self._tools else "unknown").observe(r.latency_ms / 1000)
        log.info(
            f"step {name} {r.status}",
            **{
                "event.action": f"tool.{name}",
                "event.kind": "step",
                "event.duration": int(r.latency_ms * 1e6),
                "event.outcome": "success" if r.status in ("ok", "fallback") else "failure",
                "labels.tool": name,
                "labels.source": r.source,
                "labels.status": r.status,
                "labels.input_hash": _hash(text),
                "labels.output_hash": _hash(r.output) if r.output is not None else None,
                "error.message": r.error,
            },
        )
        return outcome

    async def _run(self, name: str, text: str, ctx: ToolContext, started: float) -> Outcome:
        tool = self._tools.get(name)
        if tool is None:
            return _outcome(name, text, "error", error=f"unknown tool {name!r}")
        cached = tool.cache_ttl_s and self._cache and ctx.use_cache
        key = self._cache_key(tool, text, ctx) if cached else None
        if key is not None and self._cache is not None:
            entry = await cache_get(self._cache, key, "tool", _parse_entry)
            if entry is not None and entry[1] >= time.time():
                return _outcome(name, text, "ok", value=entry[0], source="cache")

        timeout_s = max(min(tool.timeout_s, ctx.timeout_s), 0.001)
        status, error, value = await self._attempt(tool, text, ctx, timeout_s, ctx.timeout_s)
        if status == "ok":
            if key is not None and self._cache is not None and tool.cache_ttl_s:
                fresh = {"value": value, "fresh_until": time.time() + tool.cache_ttl_s}
                await self._cache.set(
                    key, json.dumps(fresh, default=str), tool.cache_ttl_s * STALE_FACTOR
                )
            return _outcome(name, text, "ok", value=value)
        log.warning(
            f"tool {name} failed, trying fallbacks",
            **{
                "event.action": f"tool.{name}.attempt",
                "labels.tool": name,
                "labels.status": status,
                "error.message": error,
            },
        )
        if status == "refused":
            # A refused input is the caller's (or model's) fault: no fallback makes it safe.
            return _outcome(name, text, "error", error=error)

        if key is not None and self._cache is not None:
            entry = await cache_get(self._cache, key, "tool", _parse_entry)
            if entry is not None:
                return _outcome(
                    name,
                    text,
                    "ok",
                    value=entry[0],
                    source="cache",
                    error=f"{name} {status}: {error}; served a cached result",
                )

        remaining = ctx.timeout_s - (time.perf_counter() - started)
        fallback = self._tools.get(tool.fallback) if tool.fallback else None
        if fallback is not None and remaining > 0.01:
            fb_status, fb_error, fb_value = await self._attempt(
                fallback, text, ctx, max(min(fallback.timeout_s, remaining), 0.001), remaining
            )
            if fb_status == "ok":
                return _outcome(
                    name,
                    text,
                    "fallback",
                    value=fb_value,
                    source="fallback",
                    error=f"warning: {name} {status} ({error}); answered by "
                    f"fallback tool {fallback.name}",
                )
            error = f"{error}; fallback {fallback.name} {fb_status}: {fb_error}"
        return _outcome(name, text, "timeout" if status == "timeout" else "error", error=error)

    async def _attempt(
        self, tool: Tool, text: str, ctx: ToolContext, timeout_s: float, budget_s: float
    ) -> tuple[str, str | None, Any]:
        """One call of `tool` within `timeout_s`; a sandbox tool first waits for its
        tenant's slot, within `budget_s` (the call's time left) for wait and run."""
        slots = self.sandbox_slots if tool.name in SANDBOX_TOOLS else None
        if slots is None:
            return await self._call(tool, text, ctx, timeout_s)
        holder = ctx.limits_tenant or ctx.tenant
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(budget_s, timeout_s)
        try:
            async with asyncio.timeout_at(deadline):
                await slots.acquire(holder)
        except TimeoutError:
            return (
                "timeout",
                "no sandbox slot of this tenant came free in time "
                f"({slots.per_tenant} at once per tenant)",
                None,
            )
        try:
            run_s = max(min(timeout_s, deadline - loop.time()), 0.001)
            return await self._call(tool, text, ctx, run_s)
        finally:
            slots.release(holder)

    async def _call(
        self, tool: Tool, text: str, ctx: ToolContext, timeout_s: float
    ) -> tuple[str, str | None, Any]:
        call_ctx = replace(ctx, timeout_s=timeout_s)
        # A tool that enforces `ctx.timeout_s` itself (the sandbox kills its job, says so
        # and keeps its worker) gets this much longer, so that its own timeout fires first.
        grace_s = float(getattr(tool.fn, "timeout_grace_s", 0.0))
        deadline = asyncio.timeout(timeout_s + grace_s)
        try:
            async with deadline:
                value = await tool.fn(text, call_ctx)
        except TimeoutError as exc:
            if deadline.expired() or not str(exc):
                return "timeout", f"no result within {timeout_s:.3g}s", None
            return "timeout", str(exc), None  # the tool's own timeout, with its reason
        except ToolRefused as exc:
            REFUSALS.labels(tool.name, exc.category[:32]).inc()
            security_alert(
                log, category=exc.category, tool=tool.name, status="refused", detail=str(exc)
            )
            return "refused", str(exc), None
        except ToolError as exc:
            return "error", str(exc) or type(exc).__name__, None
        except Exception as exc:  # a tool's bug must not take the request down
            log.exception(f"tool {tool.name} crashed", **{"labels.tool": tool.name})
            return "error", f"{tool.name} failed: {type(exc).__name__}", None
        return "ok", None, value


def _parse_entry(text: str) -> tuple[Any, float]:
    """A tool-cache entry as (value, fresh until); ValueError, TypeError or KeyError for
    one that is corrupt or of another schema (cache_get then deletes it)."""
    entry = json.loads(text)
    if not isinstance(entry, dict) or set(entry) != {"value", "fresh_until"}:
        raise ValueError("not a tool-cache entry")
    fresh_until = entry["fresh_until"]
    if isinstance(fresh_until, bool) or not isinstance(fresh_until, int | float):
        raise TypeError("fresh_until is not a number")
    return entry["value"], float(fresh_until)


def _outcome(
    name: str,
    text: str,
    status: str,
    *,
    value: Any = None,
    source: str = "tool",
    error: str | None = None,
) -> Outcome:
    output = render_value(value) if status in ("ok", "fallback") else None
    result = ToolRunResult(
        tool=name,
        input=text,
        status=cast(StepStatus, status),
        output=output,
        error=error,
        source=cast(StepSource, source),
    )
    return Outcome(result, value)


def _hash(text: str | None) -> str | None:
    return hashlib.sha256(text.encode()).hexdigest()[:16] if text is not None else None
