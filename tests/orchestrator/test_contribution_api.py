"""`/reason` with the option `contributions`: each served step says what it contributes."""

from __future__ import annotations

import httpx
import pytest

from tests.orchestrator.helpers import (
    FakePlanner,
    FakeVerifier,
    ToolSwitch,
    orchestrator_stack,
    plan,
)

pytestmark = [pytest.mark.integration]

SCRIPT = {
    "q": [
        [
            plan(
                ("s1", "calc", "6 * 7", []),
                ("s2", "calc", "100", []),  # off the answer's path
                ("s3", "calc", "s1 + 30", ["s1"]),
                answer="s3",
            )
        ]
    ]
}


def test_the_served_steps_carry_their_contribution_only_when_asked(tmp_path) -> None:
    tools = ToolSwitch()
    with orchestrator_stack(tmp_path, FakePlanner(SCRIPT), FakeVerifier(), tools) as url:
        plain = httpx.post(
            f"{url}/reason", json={"question": "q", "options": {"use_cache": False}}
        ).json()
        calls_plain = tools.calls
        asked = httpx.post(
            f"{url}/reason",
            json={"question": "q", "options": {"use_cache": False, "contributions": True}},
        ).json()
        calls_asked = tools.calls - calls_plain
        # the cache keeps the two apart: a cached plain answer is not served to a request
        # that asks for contributions
        first = httpx.post(f"{url}/reason", json={"question": "q"}).json()
        second = httpx.post(
            f"{url}/reason", json={"question": "q", "options": {"contributions": True}}
        ).json()
    assert plain["answer"] == asked["answer"] == "72"
    assert all(s["contribution"] is None for s in plain["steps"])
    assert plain["timings_ms"]["contribute"] == 0
    found = {s["id"]: s["contribution"] for s in asked["steps"]}
    assert found["s1"] == {"perturbed": "changed", "removed": "failed", "contributes": True}
    assert found["s2"] == {"perturbed": "unused", "removed": "unused", "contributes": False}
    assert found["s3"]["contributes"] is True
    # the plan's 3 calls, then s1's two counterfactuals rerun s3 once each
    assert calls_asked == 3 + 2
    assert asked["timings_ms"]["contribute"] > 0
    assert first["steps"][0]["contribution"] is None
    assert second["cached"] is False and second["steps"][0]["contribution"] is not None


def test_counterfactuals_spend_the_requests_tool_budget_and_unknowns_are_not_cached(
    tmp_path,
) -> None:
    tools = ToolSwitch()
    # the plan's 3 calls leave 1 of the request's 4: s1's two counterfactuals need 2
    with orchestrator_stack(
        tmp_path, FakePlanner(SCRIPT), FakeVerifier(), tools, max_tool_calls_per_request=4
    ) as url:
        options = {"contributions": True}
        first = httpx.post(f"{url}/reason", json={"question": "q", "options": options}).json()
        calls_first = tools.calls
        again = httpx.post(f"{url}/reason", json={"question": "q", "options": options}).json()
    found = {s["id"]: s["contribution"] for s in first["steps"]}
    assert found["s1"]["perturbed"] == "unknown" or found["s1"]["removed"] == "unknown"
    assert calls_first <= 4  # never past the request's budget
    # a response with a contribution still unknown is measured again, not served cached
    assert again["cached"] is False
