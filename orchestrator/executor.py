"""Runs a plan as a DAG of tool calls.

Every step is a task in one `asyncio.TaskGroup`; a step awaits the futures of the steps
it depends on, so it starts the moment they are done (nothing polls). A step's failure
is recorded on the step and its dependents are marked `skipped`; the deadline cancels
whatever is still running and those steps are recorded as `timeout` or `skipped`.

Each step that runs takes one call from the request's `ToolBudget` (a step past it is
skipped); a sandbox step first takes one of its tenant's sandbox slots.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from orchestrator.limits import TenantSemaphore, ToolBudget
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import Outcome, ToolRegistry
from services.plans import check_plan
from services.schemas import Plan, StepResult, ToolRunResult

log = structlog.get_logger("orchestrator")

StepCallback = Callable[[StepResult], Awaitable[None] | None]

_SUCCESS = ("ok", "fallback")


@dataclass
class Execution:
    plan: Plan
    steps: list[StepResult]
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def answer(self) -> str | None:
        """The answer step's output, as the registry rendered it (read many times while
        voting: never re-serialized from the value)."""
        step = next(s for s in self.steps if s.id == self.plan.answer_step)
        return step.output if step.status in _SUCCESS else None

    @property
    def complete(self) -> bool:
        return all(s.status in _SUCCESS for s in self.steps)


class PlanExecutor:
    def __init__(
        self, registry: ToolRegistry, *, sandbox_slots: TenantSemaphore | None = None
    ) -> None:
        self.registry = registry
        if sandbox_slots is not None:
            registry.sandbox_slots = sandbox_slots  # the registry takes them per job
        self.sandbox_slots = registry.sandbox_slots

    async def run_tool(
        self, name: str, text: str, ctx: ToolContext, *, slots_tenant: str | None = None
    ) -> Outcome:
        """One tool call within `ctx.timeout_s`. Every sandbox job it runs (a python
        step, or another tool's fallback to python) first waits, within that time, for
        one of the sandbox slots of `slots_tenant` (default: `ctx.tenant`), in the
        registry. The registry never raises, by contract; should it, the failure is
        recorded as this call's, not the request's."""
        if slots_tenant is not None:
            ctx = replace(ctx, limits_tenant=slots_tenant)
        try:
            return await self.registry.run(name, text, ctx)
        except Exception as exc:
            log.exception(
                f"running tool {name} failed",
                **{"event.action": f"tool.{name}", "labels.tool": name},
            )
            failed = ToolRunResult(
                tool=name, input=text, status="error", error=f"{name} failed: {type(exc).__name__}"
            )
            return Outcome(failed)

    async def run(
        self,
        plan: Plan,
        *,
        deadline: float,
        trace_id: str = "",
        tenant: str = "default",
        on_step: StepCallback | None = None,
        budget: ToolBudget | None = None,
        limits_tenant: str | None = None,
    ) -> Execution:
        """Execute `plan` until done or until the monotonic `deadline` (loop time).

        `tenant` namespaces the tools' caches; `limits_tenant` (default: `tenant`) is who
        the sandbox share counts."""
        check_plan(plan, self.registry.names)
        loop = asyncio.get_running_loop()
        by_id = {s.id: s for s in plan.steps}
        done: dict[str, asyncio.Future[bool]] = {s.id: loop.create_future() for s in plan.steps}
        results: dict[str, StepResult] = {}
        values: dict[str, Any] = {}
        running: set[str] = set()

        async def record(result: StepResult) -> None:
            results[result.id] = result
            if on_step is not None:
                maybe = on_step(result)
                if maybe is not None:
                    await maybe

        async def run_step(step_id: str) -> None:
            step = by_id[step_id]
            try:
                deps_ok = [await done[d] for d in step.depends_on]
                if not all(deps_ok):
                    failed = [d for d, ok in zip(step.depends_on, deps_ok, strict=True) if not ok]
                    await record(_skipped(step, f"dependency {', '.join(failed)} did not succeed"))
                    done[step_id].set_result(False)
                    return
                if budget is not None and not budget.take():
                    await record(
                        _skipped(
                            step,
                            f"the request's budget of {budget.limit} tool calls "
                            "(over all its plans and rounds) is spent",
                        )
                    )
                    done[step_id].set_result(False)
                    return
                running.add(step_id)
                ctx = ToolContext(
                    trace_id=trace_id,
                    tenant=tenant,
                    values={d: values[d] for d in step.depends_on},
                    timeout_s=max(deadline - loop.time(), 0.001),
                )
                outcome = await self.run_tool(
                    step.tool, step.input, ctx, slots_tenant=limits_tenant
                )
                running.discard(step_id)
                ok = outcome.result.status in _SUCCESS
                if ok:
                    values[step_id] = outcome.value
                await record(StepResult(id=step_id, **outcome.result.model_dump()))
                done[step_id].set_result(ok)
            except asyncio.CancelledError:
                if not done[step_id].done():
                    done[step_id].cancel()
                raise

        try:
            async with asyncio.timeout_at(deadline), asyncio.TaskGroup() as group:
                for step in plan.steps:
                    group.create_task(run_step(step.id), name=f"step-{step.id}")
        except TimeoutError:
            pass
        for step in plan.steps:  # whatever the deadline cut short
            if step.id not in results:
                if step.id in running:
                    result = StepResult(
                        id=step.id,
                        tool=step.tool,
                        input=step.input,
                        status="timeout",
                        error="request deadline reached before the step finished",
                    )
                else:
                    result = _skipped(step, "request deadline reached before the step started")
                await record(result)
        ordered = [results[s.id] for s in plan.steps]
        return Execution(plan, ordered, values)


def _skipped(step: Any, reason: str) -> StepResult:
    return StepResult(id=step.id, tool=step.tool, input=step.input, status="skipped", error=reason)
