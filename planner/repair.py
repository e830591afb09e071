"""Deterministic repairs of valid plans whose steps cannot see what they use.

A model that splits a program into several python steps often writes them as one
program cut into pieces: `s2` reads `total_cards`, which `s1` assigned. The sandbox runs
each step in a namespace of its own, where earlier steps are visible only by their ids
(`s1`, `s2`, ...; `services.toolspecs.PYTHON`), so such a step fails with `NameError` and
the plan answers nothing. The same models also cite a step by its id in a step's input
without listing it in `depends_on`, which the executor treats as an unknown name.

`repair_plan` fixes both without asking the model again, and changes nothing else:
- a step that cites the id of a step that is not its descendant gets that step as a
  dependency;
- a python step that reads a name another python step assigns (at module level, the
  nearest such step in dependency order) gets that step's code before its own, with the
  dependencies that code needs; what it inlines is each step's own code as written, in
  plan order, each step at most once;
- a python step whose code ends with an assignment answers with the assigned variable
  (`planner.drafts.with_answer`, the convention of program-aided prompting).

A name no step assigns is left alone: `undefined_names` reports it, and the planner asks
the model again for such a plan (a weak plan, kept only when nothing better comes).
"""

from __future__ import annotations

import ast
import builtins
import re
import symtable
from dataclasses import dataclass, field

from planner.drafts import with_answer
from services.plans import topological_order
from services.schemas import MAX_STEP_INPUT_CHARS, Plan, PlanStep
from services.toolspecs import python_sets_result

_STEP_ID = re.compile(r"\bs[1-9][0-9]?\b")
_BUILTINS = frozenset(dir(builtins))


@dataclass
class Repairs:
    """What `repair_plan` changed, one note per change (empty: the plan as it came)."""

    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.notes)


def _tables(code: str) -> symtable.SymbolTable | None:
    try:
        return symtable.symtable(code, "<step>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def assigned_names(code: str) -> set[str]:
    """Names the program binds at module level (assignments, loop targets, imports,
    definitions); empty for code that does not parse."""
    table = _tables(code)
    if table is None:
        return set()
    return {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}


def free_names(code: str) -> set[str]:
    """Names the program reads that nothing in it binds and that are not builtins: what
    it expects its namespace to hold already (step ids among them)."""
    table = _tables(code)
    if table is None:
        return set()
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    free: set[str] = set()
    pending = [table]
    while pending:
        scope = pending.pop()
        pending.extend(scope.get_children())
        for sym in scope.get_symbols():
            name = sym.get_name()
            if not sym.is_referenced() or name in bound or name in _BUILTINS:
                continue
            if scope is table or sym.is_global():
                free.add(name)
    return free


def _descendants(plan: Plan) -> dict[str, set[str]]:
    children: dict[str, set[str]] = {s.id: set() for s in plan.steps}
    for step in plan.steps:
        for dep in step.depends_on:
            children[dep].add(step.id)
    below: dict[str, set[str]] = {}
    for sid in reversed(topological_order(plan)):
        below[sid] = set(children[sid])
        for child in children[sid]:
            below[sid] |= below[child]
    return below


def _cited_ids(step: PlanStep, ids: set[str]) -> set[str]:
    if step.tool == "python":
        cited = free_names(step.input) & ids
    else:
        cited = set(_STEP_ID.findall(step.input)) & ids
    return cited - {step.id}


def _with_missing_dependencies(plan: Plan, repairs: Repairs) -> Plan:
    ids = {s.id for s in plan.steps}
    below = _descendants(plan)
    steps = []
    for step in plan.steps:
        missing = sorted(
            sid
            for sid in _cited_ids(step, ids) - set(step.depends_on)
            if sid not in below[step.id]  # a descendant would close a cycle
        )
        if missing:
            repairs.notes.append(f"{step.id} depends on {', '.join(missing)}, which it cites")
            step = step.model_copy(update={"depends_on": [*step.depends_on, *missing]})
            # the new edges can make later additions cycles: recompute before the next
            plan = plan.model_copy(
                update={"steps": [step if s.id == step.id else s for s in plan.steps]}
            )
            below = _descendants(plan)
        steps.append(step)
    return plan.model_copy(update={"steps": steps})


def _inline_python(plan: Plan, repairs: Repairs) -> Plan:
    order = topological_order(plan)
    position = {sid: k for k, sid in enumerate(order)}
    steps = {s.id: s for s in plan.steps}
    ids = set(steps)
    below = _descendants(plan)
    python = [sid for sid in order if steps[sid].tool == "python"]
    assigns = {sid: assigned_names(steps[sid].input) for sid in python}

    def definer(name: str, reader: str) -> str | None:
        """The python step, before `reader` in dependency order and not below it, that
        assigns `name`: its nearest ancestor that does, else the nearest such step."""
        candidates = [
            sid
            for sid in python
            if sid != reader
            and position[sid] < position[reader]
            and sid not in below[reader]
            and name in assigns[sid]
        ]
        if not candidates:
            return None
        ancestors = [sid for sid in candidates if reader in below[sid]]
        return (ancestors or candidates)[-1]

    updated: dict[str, PlanStep] = {}
    body: dict[str, str] = {}  # each python step's own code, with what it reads as `result`
    for sid in python:
        step = steps[sid]
        written = step.input.strip("\n")
        needed: set[str] = set()
        frontier = [sid]
        while frontier:
            reader = frontier.pop()
            for name in sorted(free_names(steps[reader].input) - ids):
                source = definer(name, reader)
                if source is not None and source not in needed and source != sid:
                    needed.add(source)
                    frontier.append(source)
        notes = []
        prelude = ""
        if (
            "result" in free_names(written)
            and definer("result", sid) is None
            and len(step.depends_on) == 1
        ):
            # `result` read and set by no step, one step before this one: that step's
            # value, the one the python tool's answer rule calls `result`
            prelude = f"result = {step.depends_on[0]}\n"
            notes.append(f"{sid} reads the result of {step.depends_on[0]} as `result`")
        body[sid] = prelude + written
        own = prelude + with_answer(written)
        depends = list(step.depends_on)
        if needed:
            inlined = sorted(needed, key=position.__getitem__)
            prefix = "\n".join(body[k] for k in inlined)
            parts = [prefix]
            if "result" in assigned_names(prefix) and not _answers_alone(own):
                parts.append("result = None")  # the step's own answer, not an inlined one's
            code = "\n".join([*parts, own])
            if len(code) > MAX_STEP_INPUT_CHARS:
                continue  # left to fail as written rather than cut
            for k in inlined:
                for dep in [k, *steps[k].depends_on]:
                    if dep not in depends and dep != sid:
                        depends.append(dep)
            notes.append(f"{sid} runs the code of {', '.join(inlined)} that it reads")
            own = code
        elif own != body[sid]:
            notes.append(f"{sid} answers with the variable its code assigns last")
        if own != written:
            repairs.notes.extend(notes)
            updated[sid] = step.model_copy(update={"input": own, "depends_on": depends})
    if not updated:
        return plan
    return plan.model_copy(update={"steps": [updated.get(s.id, s) for s in plan.steps]})


def _answers_alone(code: str) -> bool:
    """Whether the code's own answer cannot be a `result` set before it: it sets
    `result` itself, reads it, or ends with an expression other than a call (a call such
    as `print(...)` may be None, and then the rule falls back to `result`)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True  # the python check refuses it; nothing to protect
    if python_sets_result(tree) or "result" in free_names(code):
        return True
    last = tree.body[-1] if tree.body else None
    return isinstance(last, ast.Expr) and not isinstance(last.value, ast.Call)


def repair_plan(plan: Plan) -> tuple[Plan, Repairs]:
    """The plan with the repairs above applied, and what they changed. A plan needing
    none comes back as it is; the result is a valid DAG whenever the input is one."""
    repairs = Repairs()
    plan = _with_missing_dependencies(plan, repairs)
    plan = _inline_python(plan, repairs)
    topological_order(plan)  # the repairs add edges only towards later steps
    return plan, repairs


def undefined_names(plan: Plan) -> dict[str, set[str]]:
    """Per python step, the names it reads that neither it, nor the steps it depends on
    by id, nor any builtin provides: the step can only fail with `NameError`."""
    ids = {s.id for s in plan.steps}
    out: dict[str, set[str]] = {}
    for step in plan.steps:
        if step.tool != "python":
            continue
        missing = free_names(step.input) - (ids & set(step.depends_on))
        if missing:
            out[step.id] = missing
    return out
