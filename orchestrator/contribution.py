"""What each step of an executed plan contributes to its answer, measured counterfactually.

A step contributes when the answer depends on what it produced. For every step that ran,
two counterfactuals are run with the real tools: its value *perturbed* (`perturb`: a
different value of the same kind) and its value *removed* (the dependents no longer see
it). In each, only the steps on a path from it to the answer step run again, in
dependency order, with every other step's value as it was; the answer is then compared
with the served one by `services.answers.answer_key` (the vote's rule: 72 and 72.0 are
the same answer). A step whose counterfactuals both leave the answer as it was, or that
no path to the answer uses, contributes nothing.

The same definitions serve the planner's training data (`void_steps`): a void step
produced no value (it failed, timed out or was skipped) or no path to the answer uses it.

Counterfactual runs never read or fill the tool cache (their inputs are not the plan's),
and they are bounded by the request's own tool-call budget (at most `max_calls` of what
is left of it) and by the caller's deadline: a step whose counterfactual did not fit, or
whose rerun timed out, is reported `unknown`, never guessed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import structlog

from orchestrator.executor import Execution, PlanExecutor
from orchestrator.limits import ToolBudget
from orchestrator.tools.base import ToolContext
from services.answers import answer_key
from services.claims import render_value
from services.plans import topological_order
from services.schemas import CounterfactualEffect, Plan, StepContribution

_SUCCESS = ("ok", "fallback")
REMOVED = object()  # marks a value taken away: dependents do not see the step at all


def perturb(value: Any) -> Any:
    """A value of the same kind as `value` that differs from it: numbers move by half
    their size plus one (so 0 and small numbers move too), booleans flip, strings that
    state a number carry the moved number, other strings and containers change in each
    element. Deterministic, so a counterfactual can be rerun and give the same result."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + abs(value) // 2 + 1
    if isinstance(value, float):
        if not math.isfinite(value):
            return 0.0
        return value + abs(value) / 2 + 1.0
    if isinstance(value, str):
        try:
            number = float(value.replace(",", "").strip())
        except ValueError:
            return value + " (changed)"
        moved = perturb(int(number) if number.is_integer() else number)
        return str(moved)
    if isinstance(value, list):
        return [perturb(v) for v in value] or [0]
    if isinstance(value, dict):
        return {k: perturb(v) for k, v in value.items()} or {"changed": True}
    return 1  # None and anything else: a value where there was none


def answer_path(plan: Plan) -> set[str]:
    """The steps the answer step depends on, directly or not, and the answer step."""
    by_id = {s.id: s for s in plan.steps}
    seen: set[str] = set()
    todo = [plan.answer_step]
    while todo:
        sid = todo.pop()
        if sid in seen or sid not in by_id:
            continue
        seen.add(sid)
        todo.extend(by_id[sid].depends_on)
    return seen


def _downstream(plan: Plan, step_id: str, on_path: set[str]) -> list[str]:
    """The steps that depend on `step_id` (directly or not) and lie on the answer's
    path, in dependency order: what a counterfactual for `step_id` must run again."""
    order = topological_order(plan)
    by_id = {s.id: s for s in plan.steps}
    affected = {step_id}
    for sid in order:
        if sid != step_id and any(d in affected for d in by_id[sid].depends_on):
            affected.add(sid)
    return [sid for sid in order if sid in affected and sid != step_id and sid in on_path]


def void_steps(execution: Execution) -> list[str]:
    """The plan's void steps: those that produced no value (failed, timed out, skipped)
    and those no path to the answer uses, in plan order."""
    on_path = answer_path(execution.plan)
    return [s.id for s in execution.steps if s.status not in _SUCCESS or s.id not in on_path]


async def contributions(
    executor: PlanExecutor,
    execution: Execution,
    *,
    deadline: float,
    budget: ToolBudget,
    max_calls: int = 24,
    trace_id: str = "",
    tenant: str = "default",
    limits_tenant: str | None = None,
    perturbation: Callable[[Any], Any] = perturb,
) -> dict[str, StepContribution]:
    """Each step's contribution to `execution`'s answer, by step id.

    `deadline` is on the running loop's clock; the counterfactuals' tool calls come out
    of `budget` (the request's), at most `max_calls` of them together. A plan without an
    answer contributes nothing to measure: every step is then `unknown`."""
    plan = execution.plan
    loop = asyncio.get_running_loop()
    served = answer_key(execution.answer)
    on_path = answer_path(plan)
    by_id = {s.id: s for s in plan.steps}
    status = {s.id: s.status for s in execution.steps}
    calls = ToolBudget(max(min(max_calls, budget.left), 0))
    out: dict[str, StepContribution] = {}

    async def counterfactual(step_id: str, replacement: Any) -> CounterfactualEffect:
        """The answer when `step_id`'s value is `replacement` (REMOVED: taken away); a
        rerun the deadline cuts short is `unknown`."""
        # the rerun's tool calls log as steps do; this label tells them from the plan's own
        label = {"labels.counterfactual_of": step_id}
        try:
            with structlog.contextvars.bound_contextvars(**label):
                async with asyncio.timeout_at(deadline):
                    return await rerun_without(step_id, replacement)
        except TimeoutError:
            return "unknown"

    async def rerun_without(step_id: str, replacement: Any) -> CounterfactualEffect:
        rerun = _downstream(plan, step_id, on_path)
        if step_id == plan.answer_step:
            if replacement is REMOVED:
                return "failed"
            return "same" if answer_key(render_value(replacement)) == served else "changed"
        if not calls.take(len(rerun)):
            return "unknown"
        budget.take(len(rerun))  # `calls` is capped at what the request's budget had left
        values = dict(execution.values)
        if replacement is REMOVED:
            del values[step_id]
        else:
            values[step_id] = replacement
        for sid in rerun:
            step = by_id[sid]
            remaining = deadline - loop.time()
            if remaining <= 0.001:
                return "unknown"
            ctx = ToolContext(
                trace_id=trace_id,
                tenant=tenant,
                values={d: values[d] for d in step.depends_on if d in values},
                timeout_s=remaining,
                use_cache=False,
            )
            outcome = await executor.run_tool(
                step.tool, step.input, ctx, slots_tenant=limits_tenant
            )
            if outcome.result.status == "timeout":
                return "unknown"  # out of time, which says nothing of the step's worth
            if outcome.result.status not in _SUCCESS:
                return "failed"  # the answer is lost without this step's real value
            values[sid] = outcome.value
            if sid == plan.answer_step:
                answer = outcome.result.output
                return "same" if answer_key(answer) == served else "changed"
        return "unknown"  # not reached: the answer step is on every rerun path's end

    for step in plan.steps:
        if status.get(step.id) not in _SUCCESS or served is None:
            out[step.id] = StepContribution(
                perturbed="unknown", removed="unknown", contributes=None
            )
            continue
        if step.id not in on_path:
            out[step.id] = StepContribution(perturbed="unused", removed="unused", contributes=False)
            continue
        perturbed = await counterfactual(step.id, perturbation(execution.values[step.id]))
        removed = await counterfactual(step.id, REMOVED)
        effects = (perturbed, removed)
        if any(e in ("changed", "failed") for e in effects):
            contributes: bool | None = True
        elif "unknown" in effects:
            contributes = None
        else:
            contributes = False
        out[step.id] = StepContribution(
            perturbed=perturbed, removed=removed, contributes=contributes
        )
    return out
