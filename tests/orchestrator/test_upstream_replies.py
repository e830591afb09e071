"""What the planner and the verifier answer is held to the shared schemas, strictly: a
verifier reply outside its schema leaves the answer `unverified` (never an error), a
question the planner cannot plan is a 422 `planning_failed` (not a 503 to retry), and
the planner being down or overloaded stays a 503 with Retry-After."""

from __future__ import annotations

import math

import httpx
import pytest

from tests.orchestrator.helpers import (
    DROP,
    FakePlanner,
    FakeVerifier,
    ToolSwitch,
    orchestrator_stack,
    plan,
)

pytestmark = [pytest.mark.integration]

SCRIPT = {
    "q": [[plan(("s1", "calc", "2+2", []))]],
    "two": [[plan(("s1", "calc", "2+2", [])), plan(("s1", "calc", "1+3", []))]],
}


def ask(url: str, question: str = "q", **options) -> httpx.Response:
    body = {"question": question, "options": {"use_cache": False, **options}}
    return httpx.post(f"{url}/reason", json=body, timeout=30)


@pytest.mark.parametrize(
    "override",
    [
        {"verdict": "false"},  # a string: bool("false") is True
        {"verdict": 1},
        {"confidence": math.nan},
        {"confidence": math.inf},
        {"confidence": 1.5},
        {"confidence": "0.9"},
        {"method": DROP},
        {"extra": "field"},
    ],
    ids=repr,
)
@pytest.mark.parametrize("question", ["q", "two"])  # /verify, and /verify/batch
def test_a_verifier_reply_outside_its_schema_leaves_the_answer_unverified(
    tmp_path, override, question
) -> None:
    verifier = FakeVerifier(default=0.1, override=override)  # 0.1: would be rejected
    with orchestrator_stack(tmp_path, FakePlanner(SCRIPT), verifier, max_replans=0) as url:
        r = ask(url, question, n_plans=2 if question == "two" else 1)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["answer"] == "4" and body["verdict"] == "unverified"
        assert body["confidence"] == 0.5
        assert verifier.calls == 1


def test_a_batch_reply_with_too_few_results_leaves_answers_unverified(tmp_path) -> None:
    script = {"q": [[plan(("s1", "calc", "2+2", [])), plan(("s1", "calc", "2+3", []))]]}
    verifier = FakeVerifier(batch_results=1)
    with orchestrator_stack(tmp_path, FakePlanner(script), verifier, max_replans=0) as url:
        body = ask(url, n_plans=2).json()
        assert body["verdict"] == "unverified" and verifier.calls == 1


def test_a_valid_verifier_reply_is_still_taken(tmp_path) -> None:
    verifier = FakeVerifier(default=0.1, override={"verdict": False})
    with orchestrator_stack(tmp_path, FakePlanner(SCRIPT), verifier, max_replans=0) as url:
        body = ask(url).json()
        assert body["verdict"] == "rejected" and body["confidence"] == pytest.approx(0.1)


def test_a_question_that_cannot_be_planned_is_422_not_retryable(tmp_path) -> None:
    planner = FakePlanner(SCRIPT, mode="planning_failed")
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        r = ask(url)
        assert r.status_code == 422, r.text
        assert "retry-after" not in r.headers
        body = r.json()
        assert body["error"]["type"] == "planning_failed" and len(body["trace_id"]) == 32
        assert "no valid plan" in body["error"]["message"]
        # plans that all fail the orchestrator's own validation: the same answer
        planner.mode = "raw"
        planner.raw = {
            "plans": [plan(("s1", "shell", "rm -rf /", []))],
            "model": "m",
            "backend": "b",
            "latency_ms": 1.0,
        }
        r = ask(url)
        assert r.status_code == 422 and r.json()["error"]["type"] == "planning_failed"
        assert "retry-after" not in r.headers


@pytest.mark.parametrize(
    "raw",
    [
        {"plans": "none", "model": "m", "backend": "b", "latency_ms": 1.0},
        {"plans": [], "model": "m", "backend": "b", "latency_ms": "1.0"},  # strict: a string
        {"plans": [plan(("s1", "calc", "1", []))], "model": "m", "backend": "b"},
        [1, 2, 3],
    ],
)
def test_a_malformed_planner_reply_is_the_planner_failing(tmp_path, raw) -> None:
    planner = FakePlanner(SCRIPT, mode="raw", raw=raw)
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        r = ask(url)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "dependency_unavailable"


def test_no_more_plans_run_than_were_asked_for(tmp_path) -> None:
    tools = ToolSwitch()
    planner = FakePlanner(
        SCRIPT,
        mode="raw",
        raw={
            "plans": [plan(("s1", "calc", f"2+{i}", [])) for i in range(5)],
            "model": "m",
            "backend": "b",
            "latency_ms": 1.0,
        },
    )
    with orchestrator_stack(tmp_path, planner, FakeVerifier(), tools) as url:
        body = ask(url, n_plans=2).json()
        assert body["agreement"]["plans"] == 2 and tools.calls == 2
