"""Answers are tool output: through `/reason` a huge numeric output cannot hold the event
loop, a long one is cut in the votes but served whole, and a huge step output cannot push
the rest of the work out of the claim."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.orchestrator.helpers import FakePlanner, FakeVerifier, orchestrator_stack, plan


@pytest.mark.integration
def test_a_huge_numeric_output_does_not_stall_the_request(tmp_path) -> None:
    script = {"q": [[plan(("s1", "echo", "1e6000000", []))] * 2]}
    with orchestrator_stack(tmp_path, FakePlanner(script), FakeVerifier()) as url:
        started = time.monotonic()
        r = httpx.post(
            f"{url}/reason", json={"question": "q", "options": {"n_plans": 2}}, timeout=120
        )
        took = time.monotonic() - started
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "1e6000000" and body["agreement"]["agreeing"] == 2
    # each Fraction("1e6000000") costs about 3 s; the request votes several times
    assert took < 5


@pytest.mark.integration
def test_votes_list_every_plans_answer_and_cut_long_ones(tmp_path) -> None:
    long = "7" * 300
    script = {"q": [[plan(("s1", "echo", long, [])), plan(("s1", "echo", "8", []))]]}
    with orchestrator_stack(tmp_path, FakePlanner(script), FakeVerifier()) as url:
        r = httpx.post(
            f"{url}/reason", json={"question": "q", "options": {"n_plans": 2}}, timeout=60
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == long  # the served answer is whole; only its vote is cut
    assert body["agreement"]["votes"] == [
        {"source": "plan", "answer": "7" * 200 + "…"},
        {"source": "plan", "answer": "8"},
    ]


@pytest.mark.unit
def test_a_huge_step_output_does_not_push_the_rest_of_the_work_out_of_the_claim() -> None:
    from orchestrator.executor import Execution
    from orchestrator.service import claim
    from services.schemas import Plan, StepResult

    p = Plan.model_validate(plan(("s1", "echo", "x", []), ("s2", "calc", "s1 * 0 + 5", ["s1"])))
    steps = [
        StepResult(id="s1", tool="echo", input="x", status="ok", output="7" * 20_000),
        StepResult(id="s2", tool="calc", input="s1 * 0 + 5", status="ok", output="5"),
    ]
    c = claim("q", Execution(p, steps, {"s1": "7" * 20_000, "s2": 5}))
    assert c["statement"] == "The answer is 5."
    assert "s2 [calc] 's1 * 0 + 5' -> '5'" in c["context"]
    assert c["context"].endswith("answer_step: s2") and len(c["context"]) < 16_000
