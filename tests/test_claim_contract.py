"""The claim the orchestrator sends is in the format the verifier's symbolic checks read."""

from __future__ import annotations

import pytest

from orchestrator.executor import Execution
from orchestrator.service import claim
from services.schemas import Plan, StepResult
from verifier.symbolic import check

pytestmark = [pytest.mark.unit]


def execution(outputs: dict[str, object]) -> Execution:
    plan = Plan.model_validate(
        {
            "reasoning": "multiply then double",
            "steps": [
                {"id": "s1", "tool": "calc", "input": "17*23+4", "depends_on": []},
                {"id": "s2", "tool": "calc", "input": "s1 * 2", "depends_on": ["s1"]},
            ],
            "answer_step": "s2",
        }
    )
    steps = [
        StepResult(id=k, tool="calc", input=s.input, status="ok", output=str(v))
        for (k, v), s in zip(outputs.items(), plan.steps, strict=True)
    ]
    return Execution(plan, steps, dict(outputs))


def test_consistent_work_is_passed_to_the_model() -> None:
    c = claim("q", execution({"s1": 395, "s2": 790}))
    result = check(c["statement"], c["context"], c["question"])
    assert result is not None and result.verdict and not result.decisive


def test_a_wrong_step_on_the_answer_path_is_rejected_exactly() -> None:
    c = claim("q", execution({"s1": 396, "s2": 792}))
    result = check(c["statement"], c["context"], c["question"])
    assert result is not None and result.decisive and not result.verdict
