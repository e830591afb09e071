"""Deterministic repairs of valid plans whose steps cannot see what they use.

A model that splits a program into several python steps often writes them as one
program cut into pieces: `s2` reads `total_cards`, which `s1` assigned. The sandbox runs
each step in a namespace of its own, where earlier steps are visible only by their ids
(`s1`, `s2`, ...; `services.toolspecs.PYTHON`), so such a step fails with `NameError` and
the plan answers nothing. The same models also cite a step by its id in a calc step
without listing it in `depends_on`, which the executor treats as an unknown name.

`repair_plan` fixes these without asking the model again, and changes nothing else:
- a calc step that cites the id of a step that is not its descendant gets that step as a
  dependency (python steps the same, by the ids their code reads; other tools never read
  earlier results, and a SQL alias such as `s1` is no citation);
- a python step that reads a variable another python step assigns (at module level; the
  nearest such ancestor, else the nearest such step before it) runs that step's code
  before its own, with the dependencies that code needs: each step's code once, in plan
  order; `result` is only ever taken from an ancestor, and a step that reads `result`
  that no ancestor sets, with one dependency, reads that dependency's value;
- a python step whose code ends with an assignment, and prints nothing, answers with the
  assigned variable (`planner.drafts.with_answer`, the convention of program-aided
  prompting).

A repaired step that would break a wire bound (`services.schemas.PlanStep`) is left as the
model wrote it, and so is one whose inlined code prints into an answer read from what it
prints. The repairs run to a fixed point (repairing a repaired plan changes nothing), and a
valid plan stays a valid DAG: new edges only point to steps before the step in dependency
order. A name no step provides is left alone: `undefined_names` reports it, and the
planner asks the model again for such a plan (a weak plan, kept only when nothing better
comes).
"""

from __future__ import annotations

import ast
import builtins
import re
import symtable
from dataclasses import dataclass, field

from pydantic import ValidationError

from planner.drafts import with_answer
from services.errors import PlanInvalid
from services.plans import topological_order
from services.schemas import Plan, PlanStep
from services.toolspecs import python_sets_result

_STEP_ID = re.compile(r"\bs[1-9][0-9]?\b")
_BUILTINS = frozenset(dir(builtins))
MAX_PASSES = 4  # repairs that enable further repairs; a fixed point comes in two or three


@dataclass
class Repairs:
    """What `repair_plan` changed, one note per change (empty: the plan as it came)."""

    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.notes)


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _tables(code: str) -> symtable.SymbolTable | None:
    try:
        return symtable.symtable(code, "<step>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def assigned_names(code: str) -> set[str]:
    """Names the program binds at module level (assignments, loop targets, imports,
    definitions, `global` names a function assigns); empty for code that does not parse."""
    table = _tables(code)
    if table is None:
        return set()
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    pending = list(table.get_children())
    while pending:
        scope = pending.pop()
        pending.extend(scope.get_children())
        bound |= {
            s.get_name() for s in scope.get_symbols() if s.is_declared_global() and s.is_assigned()
        }
    return bound


def _stored_anywhere(tree: ast.Module) -> set[str]:
    """Every name the program binds in any scope: a name a program binds somewhere is not
    reported as missing (a walrus in a comprehension binds in the enclosing scope, which
    the symbol table shows only inside the comprehension)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def free_names(code: str) -> set[str]:
    """Names the program reads from its namespace that nothing in it binds and that are
    not builtins: what it expects the namespace to hold already (step ids among them)."""
    table = _tables(code)
    tree = _parse(code)
    if table is None or tree is None:
        return set()
    bound = assigned_names(code) | _stored_anywhere(tree)
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


def _prints(code: str) -> bool:
    tree = _parse(code)
    return tree is not None and any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
        for node in ast.walk(tree)
    )


def _answers_alone(code: str) -> bool:
    """Whether the code's own answer cannot be a `result` set before it: it sets
    `result` itself, reads it, or ends with an expression other than a call (a call such
    as `print(...)` may be None, and then the rule falls back to `result`)."""
    tree = _parse(code)
    if tree is None:
        return True  # the python check refuses it; nothing to protect
    if python_sets_result(tree) or "result" in free_names(code):
        return True
    last = tree.body[-1] if tree.body else None
    return isinstance(last, ast.Expr) and not isinstance(last.value, ast.Call)


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
    """Step ids the step reads: python by its code's names, calc by its expression's
    words; other tools never read earlier results (`ToolContext.values`)."""
    if step.tool == "python":
        cited = free_names(step.input) & ids
    elif step.tool == "calc":
        cited = set(_STEP_ID.findall(step.input)) & ids
    else:
        return set()
    return cited - {step.id}


def _valid_step(step: PlanStep) -> bool:
    try:
        PlanStep.model_validate(step.model_dump())
    except ValidationError:
        return False
    return True


def _with_missing_dependencies(plan: Plan, notes: list[str]) -> Plan:
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
            fixed = step.model_copy(
                update={"depends_on": [*dict.fromkeys(step.depends_on), *missing]}
            )
            if _valid_step(fixed):
                notes.append(f"{step.id} depends on {', '.join(missing)}, which it cites")
                step = fixed
                # the new edges can make later additions cycles: recompute before the next
                plan = plan.model_copy(
                    update={"steps": [step if s.id == step.id else s for s in plan.steps]}
                )
                below = _descendants(plan)
        steps.append(step)
    return plan.model_copy(update={"steps": steps})


def _inline_python(plan: Plan, notes: list[str]) -> Plan:
    order = topological_order(plan)
    position = {sid: k for k, sid in enumerate(order)}
    steps = {s.id: s for s in plan.steps}
    ids = set(steps)
    below = _descendants(plan)
    python = [sid for sid in order if steps[sid].tool == "python"]
    written = {sid: steps[sid].input.strip("\n") for sid in python}
    # each step's code as it will answer: ended with its last assignment unless it prints
    answered = {sid: code if _prints(code) else with_answer(code) for sid, code in written.items()}
    assigns = {sid: assigned_names(answered[sid]) for sid in python}

    def definer(name: str, reader: str) -> str | None:
        """The python step that assigns `name` for `reader`: its nearest ancestor that
        does, else (not for `result`, which every step may set) the nearest step before
        it that is not below it."""
        before = [
            sid for sid in python if position[sid] < position[reader] and name in assigns[sid]
        ]
        ancestors = [sid for sid in before if reader in below[sid]]
        if ancestors:
            return ancestors[-1]
        if name == "result":
            return None
        others = [sid for sid in before if sid not in below[reader]]
        return others[-1] if others else None

    body: dict[str, str] = {}  # as the step will answer
    plain: dict[str, str] = {}  # as written: what is inlined unless `result` is read
    prelude_note: dict[str, str] = {}
    for sid in python:
        prelude = ""
        deps = steps[sid].depends_on
        if (
            "result" in free_names(written[sid])
            and definer("result", sid) is None
            and len(deps) == 1
        ):
            # `result` read and set by no ancestor, one step before this one: that step's
            # value, the one the python tool's answer rule calls `result`
            prelude = f"result = {deps[0]}\n"
            prelude_note[sid] = f"{sid} reads the result of {deps[0]} as `result`"
        body[sid] = prelude + answered[sid]
        plain[sid] = prelude + written[sid]

    updated: dict[str, PlanStep] = {}
    for sid in python:
        step = steps[sid]
        needed: dict[str, set[str]] = {}  # step inlined -> the names read from it
        frontier = [sid]
        while frontier:
            reader = frontier.pop()
            for name in sorted(free_names(body[reader]) - ids):
                source = definer(name, reader)
                if source is None or source == sid:
                    continue
                if source not in needed:
                    frontier.append(source)
                needed.setdefault(source, set()).add(name)
        own = body[sid]
        step_notes = [prelude_note[sid]] if sid in prelude_note else []
        depends = list(dict.fromkeys(step.depends_on))
        if needed:
            inlined = sorted(needed, key=position.__getitem__)
            prefix = "\n".join(body[k] if "result" in needed[k] else plain[k] for k in inlined)
            if _prints(prefix) and not _answers_alone(own):
                continue  # the inlined prints would become this step's printed answer
            parts = [prefix]
            if "result" in assigned_names(prefix) and not _answers_alone(own):
                parts.append("result = None")  # the step's own answer, not an inlined one's
            own = "\n".join([*parts, own])
            for k in inlined:
                for dep in [k, *steps[k].depends_on]:
                    if dep not in depends and dep != sid:
                        depends.append(dep)
            step_notes.append(f"{sid} runs the code of {', '.join(inlined)} that it reads")
        elif answered[sid] != written[sid]:
            step_notes.append(f"{sid} answers with the variable its code assigns last")
        if own == written[sid]:
            continue
        fixed = step.model_copy(update={"input": own, "depends_on": depends})
        if _valid_step(fixed):  # past a wire bound: left as the model wrote it
            notes.extend(step_notes)
            updated[sid] = fixed
    if not updated:
        return plan
    return plan.model_copy(update={"steps": [updated.get(s.id, s) for s in plan.steps]})


def repair_plan(plan: Plan) -> tuple[Plan, Repairs]:
    """The plan with the repairs above applied until they change nothing more, and what
    they changed. A plan needing none comes back as it is; the result is a valid DAG
    within the wire's bounds whenever the input is one."""
    repairs = Repairs()
    current = plan
    for _ in range(MAX_PASSES):
        notes: list[str] = []
        candidate = _inline_python(_with_missing_dependencies(current, notes), notes)
        if not notes:
            break
        try:  # the repairs add edges only towards earlier steps; checked all the same
            topological_order(candidate)
            Plan.model_validate(candidate.model_dump())
        except (PlanInvalid, ValidationError):
            break
        repairs.notes.extend(n for n in notes if n not in repairs.notes)
        current = candidate
    return current, repairs


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
