"""The typed client (reason/): against the real orchestrator app over loopback HTTP
(scripted planner and verifier in-process), and against recorded answers through
httpx's MockTransport for retries, timeouts and errors."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx
import pytest

import reason
from reason import AsyncClient, Client
from services.schemas import (
    ErrorBody,
    PlanEvent,
    ReasonResponse,
    RoundEnd,
    RoundStart,
    StepEvent,
    StepResult,
    TraceView,
)
from tests.orchestrator.helpers import FakePlanner, FakeVerifier, orchestrator_stack, plan

pytestmark = [pytest.mark.unit]

KEY = "k3y-0123456789abcdefghij"
SCRIPT = {"q": [[plan(("s1", "calc", "6 * 7", []), ("s2", "calc", "s1 + 0", ["s1"]))]]}
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("client")
    with orchestrator_stack(
        tmp, FakePlanner(script=SCRIPT), FakeVerifier(), api_keys={KEY: "acme"}
    ) as u:
        yield u


def test_ask_answers_typed(url: str) -> None:
    with Client(url, KEY) as client:
        answer = client.ask("q", use_cache=False)
    assert isinstance(answer, ReasonResponse)
    assert answer.answer == "42" and [s.id for s in answer.steps] == ["s1", "s2"]


def test_stream_yields_typed_steps_then_the_response(url: str) -> None:
    with Client(url, KEY) as client:
        events = list(client.stream("q", use_cache=False))
        every = list(client.stream("q", use_cache=False, events="all"))
    assert [type(e) for e in events] == [StepResult, StepResult, ReasonResponse]
    assert events[-1].answer == "42"
    assert [type(e) for e in every] == [
        RoundStart,
        PlanEvent,
        StepEvent,
        StepEvent,
        RoundEnd,
        ReasonResponse,
    ]
    assert every[2].plan == 0 and every[2].id == "s1"


def test_trace_reads_a_request_back(url: str) -> None:
    with Client(url, KEY) as client:
        answer = client.ask("q", use_cache=False)
        deadline = time.monotonic() + 5
        while True:  # the lines are written as the request ends
            try:
                view = client.trace(answer.trace_id)
                break
            except reason.NotFound:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    assert isinstance(view, TraceView) and view.trace_id == answer.trace_id


def test_errors_are_typed_with_the_body_and_trace_id(url: str) -> None:
    with Client(url, "wrong-key-0123456789", max_retries=0) as client:
        with pytest.raises(reason.Unauthorized) as caught:
            client.ask("q")
        with pytest.raises(reason.Unauthorized):
            list(client.stream("q"))
    error = caught.value
    assert error.status == 401 and error.error_type == "unauthorized"
    assert isinstance(error.body, ErrorBody) and error.trace_id == error.body.trace_id
    assert len(error.trace_id) == 32 and error.trace_id in str(error)
    with Client(url, KEY) as client:
        with pytest.raises(reason.NotFound):
            client.trace("a" * 32)
        with pytest.raises(reason.InvalidRequest) as bad:  # refused before anything is sent
            client.ask("q", n_plans=9)
        with pytest.raises(reason.InvalidRequest, match="question"):
            client.ask("x" * 4001)
    assert (bad.value.error_type, bad.value.param, bad.value.status) == (
        "validation_error",
        "n_plans",
        None,
    )


async def test_the_async_client_asks_and_streams(url: str) -> None:
    async with AsyncClient(url, KEY) as client:
        answer = await client.ask("q", use_cache=False)
        events = [e async for e in client.stream("q", use_cache=False)]
    assert answer.answer == "42"
    assert isinstance(events[-1], ReasonResponse) and isinstance(events[0], StepResult)


def test_an_unreachable_orchestrator_is_connection_failed() -> None:
    from tests.conftest import free_port

    with Client(f"http://127.0.0.1:{free_port()}") as client:
        with pytest.raises(reason.ConnectionFailed, match="unreachable"):
            client.ask("q")


# --------------------------------------------------------------------------- recorded


def error(status: int, kind: str, retry_after: str | None = None) -> httpx.Response:
    headers = {"x-trace-id": TRACE}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    body = {"error": {"type": kind, "message": kind}, "trace_id": TRACE}
    return httpx.Response(status, json=body, headers=headers)


def ok() -> httpx.Response:
    body = {
        "trace_id": TRACE,
        "answer": "4",
        "verdict": "verified",
        "confidence": 0.9,
        "plan": None,
        "steps": [],
        "timings_ms": {},
    }
    return httpx.Response(200, json=body)


def client_with(answers: list[httpx.Response], seen: list[httpx.Request], **kw: Any) -> Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    return Client("http://orch", transport=httpx.MockTransport(handler), **kw)


def test_429_and_503_with_retry_after_are_retried_and_logged(caplog: Any) -> None:
    seen: list[httpx.Request] = []
    answers = [error(429, "too_many_requests", "0"), error(503, "overloaded", "0.01"), ok()]
    with caplog.at_level(logging.WARNING, logger="reason.client"):
        answer = client_with(answers, seen).ask("q")
    assert answer.answer == "4" and len(seen) == 3
    assert len([r for r in caplog.records if "retrying" in r.getMessage()]) == 2


@pytest.mark.parametrize(
    ("answer", "raised"),
    [
        (error(429, "too_many_requests"), reason.TooManyRequests),  # no Retry-After
        (error(503, "dependency_unavailable", "3600"), reason.Unavailable),  # too long
        (error(500, "internal_error", "0"), reason.ServerError),  # not a retryable status
        (error(504, "deadline_exceeded", "0"), reason.DeadlineExceeded),
        (error(422, "planning_failed"), reason.PlanningFailed),
        (error(422, "validation_error"), reason.InvalidRequest),
        (httpx.Response(502, text="<html>bad gateway</html>"), reason.ServerError),
    ],
)
def test_only_what_the_server_says_to_retry_is_retried(
    answer: httpx.Response, raised: type[Exception]
) -> None:
    seen: list[httpx.Request] = []
    with pytest.raises(raised) as caught:
        client_with([answer, ok()], seen).ask("q")
    assert len(seen) == 1
    if answer.headers.get("x-trace-id"):
        assert caught.value.trace_id == TRACE  # type: ignore[attr-defined]


def test_retries_are_bounded() -> None:
    seen: list[httpx.Request] = []
    answers = [error(503, "overloaded", "0") for _ in range(3)]
    with pytest.raises(reason.Unavailable) as caught:
        client_with(answers, seen, max_retries=2).ask("q")
    assert len(seen) == 3 and caught.value.retry_after_s == 0


def test_the_timeout_is_the_deadline_plus_a_margin() -> None:
    seen: list[httpx.Request] = []
    client_with([ok(), ok()], seen, timeout_margin_s=5).ask("q", deadline_s=12)
    client_with([ok()], seen).ask("q")
    first, second = (r.extensions["timeout"] for r in seen)
    assert first["read"] == 17 and second["read"] == 40  # the default deadline, 30 s
    assert json.loads(seen[0].content)["options"]["deadline_s"] == 12


def test_a_stream_error_event_is_raised_with_its_status() -> None:
    frames = (
        'event: round_start\ndata: {"round":1}\n\n'
        'event: error\ndata: {"error":{"type":"dependency_unavailable","message":"down"},'
        f'"trace_id":"{TRACE}","status":503,"retry_after_s":5}}\n\n'
    )
    seen: list[httpx.Request] = []
    client = client_with([httpx.Response(200, text=frames)], seen)
    got: list[Any] = []
    with pytest.raises(reason.Unavailable) as caught:
        for event in client.stream("q", events="all"):
            got.append(event)
    assert [type(e) for e in got] == [RoundStart]
    assert (caught.value.status, caught.value.retry_after_s) == (503, 5)
    assert caught.value.trace_id == TRACE
    assert seen[0].url.params["events"] == "all"
    assert seen[0].headers["accept"] == "text/event-stream"


def test_a_stream_refused_with_retry_after_is_retried() -> None:
    seen: list[httpx.Request] = []
    body = json.dumps(ok().json())
    answers = [
        error(429, "too_many_requests", "0"),
        httpx.Response(200, text=f"event: result\ndata: {body}\n\n"),
    ]
    events = list(client_with(answers, seen).stream("q"))
    assert len(seen) == 2 and isinstance(events[0], ReasonResponse)
