"""Step contribution over model-written python: the counterfactual reruns run in the real
sandbox, as the plan's own steps do."""

from __future__ import annotations

import pytest
import pytest_asyncio

from orchestrator.sandbox import Sandbox, SandboxSettings
from orchestrator.tools.calc import calc
from orchestrator.tools.python import PythonTool
from orchestrator.tools.registry import Tool, ToolRegistry
from services import toolspecs
from tests.orchestrator.test_contribution import make_plan, measure

pytestmark = [pytest.mark.integration]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def python_registry():
    sandbox = Sandbox(SandboxSettings(workers=1, memory_mb=256, cpu_s=2))
    await sandbox.start()
    reg = ToolRegistry()
    reg.register(Tool(toolspecs.PYTHON, PythonTool(sandbox), timeout_s=5.0))
    reg.register(Tool(toolspecs.CALC, calc, timeout_s=1.0))
    try:
        yield reg
    finally:
        await sandbox.close()


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
