"""Self-consistency over executed answers: the vote, adaptive sampling, and the replanning
rules (`replan_on`)."""

from __future__ import annotations

import itertools

import httpx
import pytest

from orchestrator.executor import Execution
from orchestrator.service import Attempt, settled, vote
from services.answers import answer_key, vote_weight
from services.schemas import Plan, PlanStep, ReasonRequest, StepResult
from tests.orchestrator.helpers import (
    FakePlanner,
    FakeVerifier,
    orchestrator_stack,
    plan,
    votes,
)


def ask(url: str, question: str, **options) -> dict:
    r = httpx.post(f"{url}/reason", json={"question": question, "options": options}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def calc_plans(*expressions: str) -> list[dict]:
    return [plan(("s1", "calc", e, [])) for e in expressions]


def attempt(answer: str | None) -> Attempt:
    p = Plan(
        reasoning="",
        steps=[PlanStep(id="s1", tool="calc", input="1", depends_on=[])],
        answer_step="s1",
    )
    step = StepResult(
        id="s1", tool="calc", input="1", status="ok" if answer else "error", output=answer
    )
    return Attempt(Execution(plan=p, steps=[step]))


# --------------------------------------------------------------------------- unit


@pytest.mark.unit
def test_adaptive_sampling_serves_what_the_full_draw_would() -> None:
    """Every sequence of five answers over three values and failures: stopping after the
    first three when `settled` says so serves the answer, and the agreement count, that
    voting over all five gives whenever the stop happens."""
    for answers in itertools.product(["4", "5", "6", None], repeat=5):
        full = vote([attempt(a) for a in answers])
        first = list(answers[:3])
        if settled(first, 5):
            early = vote([attempt(a) for a in first])
            assert early[0].answer == full[0].answer, answers
            assert early[1] > 5 // 2 and full[1] >= early[1]


@pytest.mark.unit
def test_adaptive_sampling_serves_what_the_full_draw_would_with_answers_weighed() -> None:
    """The same with answers that are not whole (half a vote each for a question of whole
    numbers): `settled`, given the vote's weights, never stops a draw the rest could
    overturn."""
    question = "Tom has 3 bags of 4 apples. How many apples?"
    for answers in itertools.product(["4", "4.5", "6", None], repeat=5):
        full = vote([attempt(a) for a in answers], question)
        first = list(answers[:3])
        weights = [vote_weight(a, question) for a in first]
        if settled([answer_key(a) for a in first], 5, weights):
            early = vote([attempt(a) for a in first], question)
            assert early[0].answer == full[0].answer, answers


@pytest.mark.unit
def test_a_number_that_is_not_whole_counts_half_a_vote() -> None:
    question = "Tom has 3 bags of 4 apples. How many apples?"
    served, agreeing = vote([attempt("12.5"), attempt("12.5"), attempt("12")], question)
    assert served.answer == "12.5" and agreeing == 2  # two halves tie one: drawn first
    four = [attempt("12.5"), attempt("12"), attempt("12.5"), attempt("13")]
    served, agreeing = vote(four, question)
    assert served.answer == "12.5" and agreeing == 2
    served, agreeing = vote([attempt("12.5"), attempt("12")], question)
    assert served.answer == "12" and agreeing == 1  # the agreement stays a count
    assert vote([attempt("12.5"), attempt("12")])[0].answer == "12.5"  # no question
    assert settled(["25/2", "25/2"], 3) and not settled(["25/2", "25/2"], 3, [0.5, 0.5])


@pytest.mark.unit
@pytest.mark.parametrize(
    ("answers", "n", "expected"),
    [
        (["4", "4", "4"], 5, True),  # three of five cannot be overtaken
        (["4", "4", "5"], 5, False),
        (["4", "4", None], 5, False),  # a failed plan is no vote
        (["4", "4"], 3, True),
        (["4", "5"], 3, False),
        ([None, None], 3, False),
        (["4", "4", "4", "4", "4"], 8, True),
    ],
)
def test_settled(answers: list[str | None], n: int, expected: bool) -> None:
    assert settled(answers, n) is expected


@pytest.mark.unit
def test_the_verifier_only_breaks_ties_and_then_the_first_drawn_wins() -> None:
    a, b, c = attempt("4"), attempt("5"), attempt("5")
    a.confidence, b.confidence, c.confidence = 0.99, 0.2, 0.2
    assert vote([a, b, c])[0].answer == "5"  # two plans beat one, whatever the score
    x, y = attempt("4"), attempt("5")
    x.confidence, y.confidence = 0.3, 0.8
    assert vote([x, y])[0].answer == "5"
    x.confidence = y.confidence = 0.5
    assert vote([x, y])[0].answer == "4"


# --------------------------------------------------------------------------- service


@pytest.mark.integration
def test_agreeing_first_plans_stop_the_draw(tmp_path) -> None:
    planner = FakePlanner({"q": [calc_plans("2+2", "1+3", "8/2", "2+3", "2+3")]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        body = ask(url, "q", n_plans=5)
        assert body["answer"] == "4"
        assert body["agreement"] == {
            "plans": 3,
            "agreeing": 3,
            "rounds": 1,
            "votes": votes("4", "4", "4"),
        }
        assert [(r["n"], r.get("offset", 0)) for r in planner.requests] == [(3, 0)]


@pytest.mark.integration
def test_an_open_vote_draws_the_rest_and_counts_them(tmp_path) -> None:
    planner = FakePlanner({"q": [calc_plans("2+2", "2+3", "2+4", "2+3", "1+4")]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        body = ask(url, "q", n_plans=5)
        assert body["answer"] == "5"
        assert body["agreement"] == {
            "plans": 5,
            "agreeing": 3,
            "rounds": 1,
            "votes": votes("4", "5", "6", "5", "5"),
        }
        assert [(r["n"], r.get("offset", 0)) for r in planner.requests] == [(3, 0), (2, 3)]
        # without adaptive sampling the five are drawn at once
        full = ask(url, "q", n_plans=5, adaptive=False, use_cache=False)
        assert full["answer"] == "5" and full["agreement"]["plans"] == 5
        assert (planner.requests[-1]["n"], planner.requests[-1].get("offset", 0)) == (5, 0)


@pytest.mark.integration
def test_when_more_plans_cannot_be_drawn_the_first_ones_vote(tmp_path) -> None:
    class FailsOnMore(FakePlanner):
        def app(self):  # the planner fails the request for more samples
            app = super().app()

            @app.middleware("http")
            async def fail_more(request, call_next):
                from fastapi.responses import JSONResponse

                body = await request.body()
                if b'"offset"' in body:
                    return JSONResponse(
                        {"error": {"type": "overloaded", "message": "busy"}, "trace_id": "0" * 32},
                        status_code=503,
                    )
                return await call_next(request)

            return app

    planner = FailsOnMore({"q": [calc_plans("2+2", "2+3", "1+3", "2+3", "2+3")]})
    with orchestrator_stack(tmp_path, planner, FakeVerifier(), max_replans=0) as url:
        body = ask(url, "q", n_plans=5)
        assert body["answer"] == "4"
        assert body["agreement"] == {
            "plans": 3,
            "agreeing": 2,
            "rounds": 1,
            "votes": votes("4", "5", "4"),
        }


@pytest.mark.integration
def test_replanning_follows_the_configured_reasons(tmp_path) -> None:
    rounds = [calc_plans("2+3"), calc_plans("2+2")]
    verifier = FakeVerifier(by_answer={"5": 0.1, "4": 0.95})
    # a rejected answer is not a reason here: served as is, one round
    planner = FakePlanner({"q": rounds})
    with orchestrator_stack(tmp_path, planner, verifier, replan_on=["no_answer"]) as url:
        body = ask(url, "q")
        assert body["answer"] == "5" and body["verdict"] == "rejected"
        assert len(planner.requests) == 1
        assert body["replanning"] is None  # one round: nothing more to show


@pytest.mark.integration
def test_low_agreement_is_replanned_with_the_disagreement_as_feedback(tmp_path) -> None:
    split = calc_plans("2+2", "2+3", "2+4", "2+5", "2+6")  # five different answers
    agreed = calc_plans("3+3", "4+2", "1+5", "6", "2*3")
    planner = FakePlanner({"q": [split, agreed]})
    with orchestrator_stack(
        tmp_path, planner, FakeVerifier(), replan_on=["no_answer", "low_agreement"]
    ) as url:
        body = ask(url, "q", n_plans=5)
        assert body["answer"] == "6"
        assert body["agreement"] == {
            "plans": 3,
            "agreeing": 3,
            "rounds": 2,
            "votes": votes("6", "6", "6"),
        }
        feedback = planner.requests[-1]["feedback"]
        assert "disagreed" in feedback and "'4' (1 of 5)" in feedback
        first, second = body["replanning"]
        assert (first["replan_for"], first["samples"], first["agreeing"]) == (None, 5, 1)
        assert first["replan_reasons"] == ["low_agreement"]
        assert (second["replan_for"], second["answer"], second["agreeing"]) == (
            "low_agreement",
            "6",
            3,
        )


@pytest.mark.integration
def test_any_configured_reason_replans_even_behind_one_that_is_not(tmp_path) -> None:
    """A split vote that the verifier also rejects is replanned for its low agreement
    when only that reason is configured."""
    split = calc_plans("2+2", "2+3", "2+4", "2+5", "2+6")
    agreed = calc_plans("3+3", "4+2", "1+5")
    planner = FakePlanner({"q": [split, agreed]})
    verifier = FakeVerifier(default=0.2)
    with orchestrator_stack(tmp_path, planner, verifier, replan_on=["low_agreement"]) as url:
        body = ask(url, "q", n_plans=5)
        assert body["answer"] == "6" and body["agreement"]["rounds"] == 2
        assert "disagreed" in planner.requests[-1]["feedback"]


@pytest.mark.unit
async def test_the_served_vote_weighs_answers_against_the_question_and_verifies_the_leader() -> (
    None
):
    """Through the service: two plans of 25/2 (half a vote each, for a question of whole
    numbers) tie one plan of 12; the verifier is asked about the leaders only and breaks
    the tie, and agreement stays a count of samples."""
    from tests.orchestrator.test_stream_events import ScriptedPlanner, ScriptedVerifier, service

    question = "Tom has 3 bags of 4 apples and eats 1. How many apples are left?"
    plans = [calc_plans("25/2")[0], calc_plans("5/2*5")[0], calc_plans("11+1")[0]]
    verifier = ScriptedVerifier({"12": 0.8, "12.5": 0.3})
    svc = service(ScriptedPlanner({question: [plans]}), verifier)
    request = ReasonRequest.model_validate(
        {
            "question": question,
            "options": {"n_plans": 3, "n_prose": 0, "adaptive": False, "use_cache": False},
        }
    )
    result = await svc.reason(request)
    assert result.answer == "12"
    assert result.agreement is not None and result.agreement.agreeing == 1


@pytest.mark.unit
def test_the_answer_cache_key_changes_with_the_vote_rule_and_the_model(monkeypatch) -> None:
    """A cached answer was voted by the rule of its time and made by one planner model:
    a new rule, or another model, misses it."""
    import orchestrator.service as service_module
    from orchestrator.cache import MemoryCache
    from orchestrator.tools.registry import ToolRegistry

    service = service_module.ReasonService(
        planner=None, verifier=None, registry=ToolRegistry(), cache=MemoryCache()
    )
    request = ReasonRequest(question="What is 40 + 2?")
    key = service._answer_cache_key(request, "default", "m")
    assert service._answer_cache_key(request, "default", "m") == key
    assert service._answer_cache_key(request, "default", "another model") != key
    monkeypatch.setattr(service_module, "VOTE_RULE", "another/1")
    assert service._answer_cache_key(request, "default", "m") != key
