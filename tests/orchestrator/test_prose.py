"""Programs and prose: chain-of-thought solutions (`n_prose`) vote beside executed plans."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.orchestrator.helpers import (
    FakePlanner,
    FakeVerifier,
    orchestrator_stack,
    plan,
    votes,
)

pytestmark = [pytest.mark.integration]

WORKED = "She sold 48/2 = 24 in May, 48+24 = 72 in all.\nThe answer is 72."


def reason(url: str, question: str, **options) -> httpx.Response:
    return httpx.post(f"{url}/reason", json={"question": question, "options": options}, timeout=60)


def ok(url: str, question: str, **options) -> dict:
    r = reason(url, question, **options)
    assert r.status_code == 200, r.text
    return r.json()


def calc(expression: str) -> dict:
    return plan(("s1", "calc", expression, []))


def test_solutions_outvote_a_plan_and_are_served_with_their_work(tmp_path) -> None:
    planner = FakePlanner({"q": [[calc("48+48")]]}, prose={"q": [WORKED, WORKED]})
    verifier = FakeVerifier()
    with orchestrator_stack(tmp_path, planner, verifier) as url:
        body = ok(url, "q", n_prose=2, use_cache=False)
    assert body["answer"] == "72"
    assert body["plan"] is None and body["steps"] == []
    assert body["solution"] == {"text": WORKED, "answer": "72"}
    assert body["agreement"] == {
        "plans": 3,
        "agreeing": 2,
        "rounds": 1,
        "votes": votes("96") + votes("72", "72", source="prose"),
    }
    assert body["signals"]["plans"] == 3 and body["signals"]["complete"] is True
    # the plan and the greedy solution disagree: the second solution is drawn after them
    assert planner.solve_requests == [
        {"question": "q", "n": 1},
        {"question": "q", "n": 1, "offset": 1},
    ]
    # the solution is what the verifier is shown for the answer it gave
    assert verifier.claims == [
        {
            "question": "q",
            "statement": "The answer is 72.",
            "context": f"Worked solution:\n{WORKED}",
        }
    ]
    assert body["timings_ms"]["solve"] > 0


def test_an_answer_a_plan_gave_too_is_served_with_the_plan(tmp_path) -> None:
    planner = FakePlanner({"q": [[calc("70+2")]]}, prose={"q": [WORKED]})
    verifier = FakeVerifier()
    with orchestrator_stack(tmp_path, planner, verifier) as url:
        body = ok(url, "q", n_prose=1)
    assert body["answer"] == "72" and body["solution"] is None
    assert [s["input"] for s in body["steps"]] == ["70+2"]
    assert body["agreement"]["agreeing"] == 2
    assert len(verifier.claims) == 1 and verifier.claims[0]["context"].startswith("Plan:")


def test_a_first_plan_and_greedy_solution_that_agree_end_the_draw(tmp_path) -> None:
    plans = [calc("70+2"), calc("9*8"), calc("1+1")]
    planner = FakePlanner({"q": [plans]}, prose={"q": [WORKED, WORKED]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        body = ok(url, "q", n_plans=3, n_prose=2)
    # the first plan and the greedy solution both say 72: nothing more is drawn
    assert [(r["n"], r.get("offset", 0)) for r in planner.requests] == [(1, 0)]
    assert planner.solve_requests == [{"question": "q", "n": 1}]
    assert body["agreement"]["plans"] == 2 and body["agreement"]["agreeing"] == 2


def test_a_first_plan_and_solution_that_disagree_draw_the_rest_of_both(tmp_path) -> None:
    plans = [calc("2+3"), calc("9*8"), calc("70+2")]
    planner = FakePlanner({"q": [plans]}, prose={"q": [WORKED, "So 6.\nThe answer is 6."]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        body = ok(url, "q", n_plans=3, n_prose=2)
    assert [(r["n"], r.get("offset", 0)) for r in planner.requests] == [(1, 0), (2, 1)]
    assert planner.solve_requests == [
        {"question": "q", "n": 1},
        {"question": "q", "n": 1, "offset": 1},
    ]
    # plans before solutions, in the order drawn
    assert body["agreement"]["votes"] == votes("5", "72", "72") + votes("72", "6", source="prose")
    assert body["answer"] == "72" and body["agreement"]["agreeing"] == 3


def test_one_solution_beside_several_plans_is_drawn_in_two_stages_too(tmp_path) -> None:
    plans = [calc("70+2"), calc("9*8"), calc("1+1"), calc("2+2")]
    planner = FakePlanner({"q": [plans]}, prose={"q": [WORKED]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        body = ok(url, "q", n_plans=4, n_prose=1)
    assert [(r["n"], r.get("offset", 0)) for r in planner.requests] == [(1, 0)]
    assert body["agreement"]["plans"] == 2 and body["answer"] == "72"


def test_a_first_plan_that_cannot_be_made_leaves_the_second_stage_to_try(tmp_path) -> None:
    planner = FakePlanner(mode="planning_failed", prose={"q": [WORKED, WORKED]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        body = ok(url, "q", n_plans=3, n_prose=2)
        assert body["answer"] == "72" and body["plan"] is None
        assert [(r["n"], r.get("offset", 0)) for r in planner.requests] == [(1, 0), (2, 1)]
        assert body["agreement"]["plans"] == 2  # the two solutions, no plan
        # nothing planned and no solution with a number: the planner's failure
        r = reason(url, "other", n_plans=3, n_prose=2)
    assert r.status_code == 422 and r.json()["error"]["type"] == "planning_failed"


def test_a_second_stage_the_deadline_cuts_short_leaves_the_first_to_vote(tmp_path) -> None:
    planner = FakePlanner(
        {"q": [[calc("2+3"), calc("70+2"), calc("9*8")]]},
        prose={"q": [WORKED, WORKED]},
        more_delay_s=3600,
    )
    verifier = FakeVerifier(by_answer={"72": 0.8, "5": 0.2})
    with orchestrator_stack(tmp_path, planner, verifier) as url:
        started = time.monotonic()
        body = ok(url, "q", n_plans=3, n_prose=2, deadline_s=6)
        took = time.monotonic() - started
    assert len(planner.requests) == 2 and len(planner.solve_requests) == 2  # both stages
    # the first stage's two disagree: the verifier, which had its time, breaks the tie
    assert body["answer"] == "72" and verifier.calls >= 1
    assert body["agreement"]["plans"] == 2
    assert took < 6.5


def test_without_n_prose_no_solution_is_asked_for(tmp_path) -> None:
    planner = FakePlanner({"q": [[calc("70+2")]]}, prose={"q": ["The answer is 5."]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        body = ok(url, "q")
    assert body["answer"] == "72" and planner.solve_requests == []
    assert body["agreement"] is None and body["solution"] is None


def test_the_cache_keeps_answers_with_and_without_prose_apart(tmp_path) -> None:
    planner = FakePlanner({"q": [[calc("48+48")]]}, prose={"q": [WORKED, WORKED]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        assert ok(url, "q")["answer"] == "96"
        mixed = ok(url, "q", n_prose=2)
        assert mixed["answer"] == "72" and mixed["cached"] is False
        assert ok(url, "q", n_prose=2)["cached"] is True


@pytest.mark.parametrize(
    "mode, raw",
    [
        ("error", None),
        ("missing", None),
        ("raw", {"solutions": "72", "model": "m", "backend": "b", "latency_ms": 1}),
        # an answer past the wire's bound: model output held to the schema
        (
            "raw",
            {
                "solutions": [{"text": "x", "answer": "7" * 65}],
                "model": "m",
                "backend": "b",
                "latency_ms": 1,
            },
        ),
        (
            "raw",
            {
                "solutions": [{"text": "x", "answer": 72}],
                "model": "m",
                "backend": "b",
                "latency_ms": 1,
            },
        ),
    ],
)
def test_a_failing_or_malformed_solve_leaves_the_plans_to_decide(tmp_path, mode, raw) -> None:
    planner = FakePlanner({"q": [[calc("70+2")]]}, solve_mode=mode, solve_raw=raw)
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        body = ok(url, "q", n_prose=2)
    assert body["answer"] == "72" and body["agreement"]["votes"] == votes("72")
    assert len(planner.solve_requests) == 1


def test_a_hanging_solve_leaves_time_to_verify(tmp_path) -> None:
    planner = FakePlanner({"q": [[calc("70+2")]]}, solve_mode="hang")
    verifier = FakeVerifier()
    with orchestrator_stack(tmp_path, planner, verifier) as url:
        started = time.monotonic()
        body = ok(url, "q", n_prose=1, deadline_s=5)
        took = time.monotonic() - started
    assert body["answer"] == "72" and verifier.calls == 1
    assert body["signals"]["verifier"] == pytest.approx(0.9)  # the verifier had its time
    assert took < 5.5


def test_solutions_answer_a_question_no_plan_can_be_made_for(tmp_path) -> None:
    planner = FakePlanner(mode="planning_failed", prose={"q": [WORKED]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        body = ok(url, "q", n_prose=1)
        assert body["answer"] == "72" and body["plan"] is None
        assert body["solution"]["answer"] == "72"
        # with no solution stating an answer either, it is still the planner's failure
        r = reason(url, "other", n_prose=1)
    assert r.status_code == 422 and r.json()["error"]["type"] == "planning_failed"


@pytest.mark.parametrize("mode", ["hang", "error"])
def test_solutions_answer_when_the_plan_does_not_come(tmp_path, mode) -> None:
    # a planner whose /plan outlives the deadline (or fails) while /solve answered: the
    # answer is the solution's, served within the deadline, not the planner's error
    planner = FakePlanner(mode=mode, prose={"q": [WORKED]})
    verifier = FakeVerifier()
    with orchestrator_stack(tmp_path, planner, verifier) as url:
        started = time.monotonic()
        body = ok(url, "q", n_prose=1, n_plans=4, deadline_s=3, use_cache=False)
        took = time.monotonic() - started
        # with no solution stating an answer either, it is still the planner's failure
        r = reason(url, "other", n_prose=1, deadline_s=3)
    assert body["answer"] == "72" and body["plan"] is None
    assert body["solution"] == {"text": WORKED, "answer": "72"}
    assert body["agreement"]["votes"] == votes("72", source="prose")
    # the plan's wait left the verifier its time to check the solution's answer
    assert body["signals"]["verifier"] == pytest.approx(0.9)
    assert verifier.claims[0]["context"] == f"Worked solution:\n{WORKED}"
    assert took < 4.5
    assert r.status_code in (502, 503, 504) and "error" in r.json()


def test_an_answer_without_plans_for_a_passing_reason_is_not_cached(tmp_path) -> None:
    # the planner's /plan failing is not the question's fault: once it plans again, the
    # answer must come from its plans, not from a cached answer of its solutions alone
    planner = FakePlanner({"q": [[calc("70+2")]]}, mode="error", prose={"q": [WORKED]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        first = ok(url, "q", n_prose=1)
        planner.mode = "ok"
        again = ok(url, "q", n_prose=1)
        assert first["plan"] is None and again["plan"] is not None
        assert again["cached"] is False
        # an answer of plans is cached as before
        assert ok(url, "q", n_prose=1)["cached"] is True


def test_n_prose_is_bounded(tmp_path) -> None:
    planner = FakePlanner({"q": [[calc("70+2")]]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        r = reason(url, "q", n_prose=9)
    assert r.status_code == 422 and r.json()["error"]["param"] == "options.n_prose"


def test_every_vote_is_reported_when_plans_and_solutions_pass_eight(tmp_path) -> None:
    """n_plans and n_prose may be 8 each: the vote lists all 16 samples (a response
    bound of 8 votes used to turn such a request into a 500 after all its work)."""
    plans = [calc("70+2")] * 8
    planner = FakePlanner({"q": [plans]}, prose={"q": [WORKED] * 8})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        body = ok(url, "q", n_plans=8, n_prose=8, adaptive=False, use_cache=False)
    assert body["answer"] == "72"
    assert body["agreement"]["plans"] == 16 and body["agreement"]["agreeing"] == 16
    assert len(body["agreement"]["votes"]) == 16
