"""One rule for what a python step answers, `services.toolspecs.PYTHON_ANSWER_RULE`: the
planner sees it in the tool's spec and checks answer steps by it, and the sandbox worker
(which cannot import `services`) applies it with its own copy of `python_sets_result`."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from orchestrator.sandbox import Sandbox
from planner.service import check_python_steps
from services import toolspecs
from services.errors import PlanInvalid
from services.schemas import Plan

WORKER = Path(toolspecs.__file__).resolve().parents[1] / "orchestrator" / "sandbox" / "_worker.py"

# code, the result the rule gives it, whether the planner's check sees a value
CASES = [
    ("6 * 7", 42, True),
    ("result = 3\nresult * 100", 300, True),  # the last line's value wins
    ("result = 3\nprint(result)", 3, True),  # a last line of None falls back to result
    ("result = 3\nx = 4", 3, True),
    ("for result in range(4):\n    pass", 3, True),
    ("x = 5", None, False),
    ("if True:\n    x = 5", None, False),
    ("def f():\n    result = 1\n    return 2\nf()", 2, True),
    ("def f():\n    result = 1\nf()", None, True),  # a function's local is not the program's
    ("print('hi')", None, True),  # the tool answers with the printed text
]


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"{name} is not defined once"
    return found[0]


@pytest.mark.unit
def test_the_spec_states_the_rule() -> None:
    assert toolspecs.PYTHON_ANSWER_RULE in toolspecs.PYTHON.description


@pytest.mark.unit
def test_the_worker_copy_of_the_rule_is_the_spec_s() -> None:
    spec = _function(
        ast.parse(textwrap.dedent(inspect.getsource(toolspecs.python_sets_result))),
        "python_sets_result",
    )
    worker = _function(ast.parse(WORKER.read_text(encoding="utf-8")), "python_sets_result")
    assert ast.dump(worker) == ast.dump(spec)


@pytest.mark.unit
@pytest.mark.parametrize(("code", "result", "gives"), CASES)
def test_the_planner_checks_answer_steps_by_the_rule(
    code: str, result: object, gives: bool
) -> None:
    plan = Plan.model_validate(
        {
            "reasoning": "r",
            "steps": [{"id": "s1", "tool": "python", "input": code, "depends_on": []}],
            "answer_step": "s1",
        }
    )
    assert toolspecs.python_gives_answer(ast.parse(code)) is gives
    if gives:
        check_python_steps(plan)
    else:
        with pytest.raises(PlanInvalid):
            check_python_steps(plan)
    if result is not None:  # a value the worker gives is one the check expects
        assert gives


@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("code", "result", "gives"), CASES)
async def test_the_worker_answers_by_the_rule(
    sandbox: Sandbox, code: str, result: object, gives: bool
) -> None:
    outcome = await sandbox.run(code, {}, 5.0)
    assert (outcome.status, outcome.result) == ("ok", result), outcome
