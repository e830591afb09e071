"""Checks that a plan is a runnable DAG over registered tools.

The planner runs these before it answers and the orchestrator runs them again before it
executes: a plan is model output, so it is hostile input on both sides.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from pydantic import ValidationError

from services.errors import PlanInvalid
from services.schemas import Plan


def parse_plan(
    text: str, tool_names: Collection[str], *, drop_self_dependencies: bool = False
) -> Plan:
    """Parse model output into a validated plan, or raise `PlanInvalid` saying why.

    `drop_self_dependencies` (the planner's own parsing): a step that lists itself in
    `depends_on` has that entry dropped instead of failing the plan; it can never have
    been meant, and nothing else about the plan changes."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanInvalid(f"not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:  # free text (a draft) can nest brackets past the parser's stack
        raise PlanInvalid("not valid JSON: nested too deeply") from None
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "plan"
        raise PlanInvalid(f"{where}: {first['msg']}") from None
    if drop_self_dependencies and any(s.id in s.depends_on for s in plan.steps):
        steps = [
            s.model_copy(update={"depends_on": [d for d in s.depends_on if d != s.id]})
            for s in plan.steps
        ]
        plan = plan.model_copy(update={"steps": steps})
    check_plan(plan, tool_names)
    return plan


def check_plan(plan: Plan, tool_names: Collection[str]) -> list[str]:
    """Validate the DAG; return the step ids in an order where dependencies come first."""
    ids = [step.id for step in plan.steps]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise PlanInvalid(f"duplicate step ids: {', '.join(dupes)}")
    known = set(ids)
    for step in plan.steps:
        if step.tool not in tool_names:
            raise PlanInvalid(
                f"step {step.id} uses unknown tool {step.tool!r}; "
                f"registered tools: {', '.join(sorted(tool_names))}"
            )
        for dep in step.depends_on:
            if dep not in known:
                raise PlanInvalid(f"step {step.id} depends on unknown step {dep}")
            if dep == step.id:
                raise PlanInvalid(f"step {step.id} depends on itself")
    if plan.answer_step not in known:
        raise PlanInvalid(f"answer_step {plan.answer_step} is not a step of the plan")
    return topological_order(plan)


def topological_order(plan: Plan) -> list[str]:
    deps = {step.id: set(step.depends_on) for step in plan.steps}
    order: list[str] = []
    ready = [sid for sid, d in deps.items() if not d]
    remaining = {sid: set(d) for sid, d in deps.items() if d}
    while ready:
        sid = ready.pop(0)
        order.append(sid)
        for other, d in list(remaining.items()):
            d.discard(sid)
            if not d:
                ready.append(other)
                del remaining[other]
    if remaining:
        raise PlanInvalid(f"dependency cycle among steps {', '.join(sorted(remaining))}")
    return order
