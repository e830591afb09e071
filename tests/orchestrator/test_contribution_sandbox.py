"""Step contribution over model-written python: the counterfactual reruns run in the real
sandbox, as the plan's own steps do."""

from __future__ import annotations

import pytest
import pytest_asyncio

from tests.orchestrator.helpers import sandbox_registry
from tests.orchestrator.test_contribution import make_plan, measure

pytestmark = [pytest.mark.integration]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def python_registry():
    async with sandbox_registry() as reg:
        yield reg


@pytest.mark.asyncio(loop_scope="module")
async def test_model_written_python_steps_are_rerun_in_the_sandbox(python_registry) -> None:
    plan = make_plan(
        [
            ("s1", "python", "price = 12\nresult = price * 3", []),
            ("s2", "python", "unused = s1\n'done'", ["s1"]),  # reads s1, answers nothing of it
            ("s3", "python", "s1 + 4", ["s1", "s2"]),
        ],
        "s3",
    )
    got = await measure(plan, python_registry)
    assert got["execution"].answer == "40"
    c = {sid: (x.perturbed, x.removed, x.contributes) for sid, x in got["found"].items()}
    assert c["s1"] == ("changed", "failed", True)
    # s2 only mentions s1: without its own value s3 still runs and answers the same
    assert c["s2"] == ("same", "same", False)
    assert c["s3"] == ("changed", "failed", True)
