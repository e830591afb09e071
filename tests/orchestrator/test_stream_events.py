"""The /reason stream's events (services.schemas): rounds as they start and end, each
plan before its steps run, each step with its round and plan; and over the app, the SSE
framing and the `error` event. In process: the planner and verifier are scripted
clients handed to the service, the tools an in-process registry."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.app import create_app
from orchestrator.cache import Cache, MemoryCache
from orchestrator.confidence import Calibrator
from orchestrator.service import ReasonService
from orchestrator.tools.base import ToolContext
from orchestrator.tools.calc import calc
from orchestrator.tools.registry import Tool, ToolRegistry
from orchestrator.traces import build_view, read_trace
from services import toolspecs
from services.errors import DependencyUnavailable
from services.schemas import (
    STREAM_EVENT_NAMES,
    ErrorBody,
    PlanEvent,
    ReasonRequest,
    RoundEnd,
    RoundStart,
    StepEvent,
    StepResult,
    StreamError,
)
from services.settings import OrchestratorSettings
from tests.orchestrator.helpers import PASSTHROUGH_CALIBRATOR, plan

pytestmark = [pytest.mark.unit]


class ScriptedPlanner:
    """`/plan` from a script: question -> rounds, each a list of plans (samples by
    `offset`); `fail_round`: that round (0-based) answers as a planner that is down."""

    def __init__(
        self,
        script: dict[str, list[list[dict[str, Any]]]],
        fail_round: int = -1,
        fail_always: bool = False,
    ) -> None:
        self.script = script
        self.fail_round = fail_round
        self.fail_always = fail_always  # every request answers as a planner that is down
        self.rounds: dict[str, int] = {}
        self.model = "fake"

    async def post_json(self, path: str, body: dict[str, Any], *, timeout_s: float) -> Any:
        assert path == "/plan", path
        question = body["question"]
        if not body.get("offset"):
            self.rounds[question] = self.rounds.get(question, -1) + 1
        done = self.rounds[question]
        if done == self.fail_round or self.fail_always:
            raise DependencyUnavailable("planner is down")
        rounds = self.script[question]
        offset = body.get("offset", 0)
        plans = rounds[min(done, len(rounds) - 1)][offset : offset + body.get("n", 1)]
        return {"plans": plans, "model": self.model, "backend": "fake", "latency_ms": 1.0}

    async def get_json(self, path: str, *, timeout_s: float) -> Any:
        assert path == "/info", path
        if self.fail_always:
            raise DependencyUnavailable("planner is down")
        return {"service": "planner", "backend": "fake", "model": self.model, "ready": True}

    async def close(self) -> None:
        return None


class ScriptedVerifier:
    """Scores claims by the answer they state (default 0.9)."""

    def __init__(self, scores: dict[str, float] | None = None) -> None:
        self.scores = scores or {}

    def _score(self, statement: str) -> dict[str, Any]:
        p = next((v for k, v in self.scores.items() if statement == f"The answer is {k}."), 0.9)
        return {"verdict": p >= 0.5, "confidence": p, "method": "model", "latency_ms": 1.0}

    async def post_json(self, path: str, body: dict[str, Any], *, timeout_s: float) -> Any:
        if path == "/verify":
            return self._score(body["statement"])
        return {"results": [self._score(i["statement"]) for i in body["items"]], "latency_ms": 1}

    async def close(self) -> None:
        return None


async def slow(text: str, ctx: ToolContext) -> Any:
    await asyncio.sleep(float(text))
    return text


def registry(cache: Cache | None = None) -> ToolRegistry:
    reg = ToolRegistry(cache)
    reg.register(Tool(toolspecs.CALC, calc, timeout_s=1.0))
    spec = toolspecs.CALC.model_copy(update={"name": "slow", "description": "sleeps"})
    reg.register(Tool(spec, slow, timeout_s=2.0))
    return reg


def service(planner: Any, verifier: Any | None = None, **kw: Any) -> ReasonService:
    return ReasonService(
        planner=planner,
        verifier=verifier or ScriptedVerifier(),
        registry=registry(),
        cache=MemoryCache(),
        calibrator=Calibrator.load(PASSTHROUGH_CALIBRATOR),
        **kw,
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.steps: list[StepResult] = []

    def on_event(self, name: str, event: Any) -> None:
        assert STREAM_EVENT_NAMES[type(event)] == name
        self.events.append((name, event))

    async def on_step(self, step: StepResult) -> None:
        self.steps.append(step)

    def names(self) -> list[str]:
        return [n for n, _ in self.events]

    def of(self, kind: type) -> list[Any]:
        return [e for _, e in self.events if isinstance(e, kind)]


async def reason(svc: ReasonService, question: str, rec: Recorder, **options: Any) -> Any:
    request = ReasonRequest.model_validate({"question": question, "options": options})
    return await svc.reason(request, on_event=rec.on_event, on_step=rec.on_step)


DIAMOND = plan(
    ("s1", "calc", "48", []),
    ("s2", "calc", "s1 / 2", ["s1"]),
    ("s3", "calc", "s1 + s2", ["s1", "s2"]),
)


async def test_one_round_one_plan_in_order_plan_first_then_steps_then_round_end() -> None:
    rec = Recorder()
    result = await reason(service(ScriptedPlanner({"q": [[DIAMOND]]})), "q", rec, use_cache=False)

    assert rec.names() == ["round_start", "plan", "step", "step", "step", "round_end"]
    start, drawn = rec.events[0][1], rec.events[1][1]
    assert start == RoundStart(round=1, replan_for=None)
    assert isinstance(drawn, PlanEvent) and (drawn.round, drawn.plan) == (1, 0)
    assert drawn.steps == result.plan.steps and drawn.answer_step == "s3"
    steps = rec.of(StepEvent)
    assert [(s.round, s.plan) for s in steps] == [(1, 0)] * 3
    assert [s.id for s in steps] == ["s1", "s2", "s3"]  # each after the steps it uses
    # the step event is the response's StepResult with round and plan beside it
    served = {s.id: s for s in result.steps}
    for event in steps:
        fields = event.model_dump(exclude={"round", "plan"})
        assert StepResult.model_validate(fields) == served[event.id]
    assert rec.steps == result.steps  # on_step still hears every step, unchanged
    end = rec.of(RoundEnd)[0]
    assert (end.round, end.answer, end.samples, end.agreeing) == (1, "72", 1, 1)
    assert [(v.plan, v.answer, v.agrees, v.verifier) for v in end.votes] == [(0, "72", True, 0.9)]


async def test_plan_event_arrives_before_any_of_its_steps_has_finished() -> None:
    seen: list[str] = []
    started = asyncio.Event()

    def on_event(name: str, event: Any) -> None:
        seen.append(name)
        if name == "plan":
            started.set()

    svc = service(ScriptedPlanner({"q": [[plan(("s1", "slow", "0.3", []))]]}))
    task = asyncio.create_task(
        svc.reason(ReasonRequest(question="q"), on_event=on_event)  # type: ignore[arg-type]
    )
    await asyncio.wait_for(started.wait(), 2)
    assert seen == ["round_start", "plan"]  # the step is still running
    await task
    assert seen[-2:] == ["step", "round_end"]


async def test_several_plans_are_named_by_their_place_in_the_vote_with_scores() -> None:
    a = plan(("s1", "calc", "6 * 7", []))
    b = plan(("s1", "calc", "40 + 2", []))
    c = plan(("s1", "calc", "6 * 8", []))
    verifier = ScriptedVerifier({"42": 0.8, "48": 0.3})
    rec = Recorder()
    # adaptive: 2 of 3 drawn first; they disagree, so the third is drawn after
    svc = service(ScriptedPlanner({"q": [[a, c, b]]}), verifier)
    result = await reason(svc, "q", rec, n_plans=3, use_cache=False)

    plans = rec.of(PlanEvent)
    assert [(p.round, p.plan) for p in plans] == [(1, 0), (1, 1), (1, 2)]
    assert [p.steps[0].input for p in plans] == ["6 * 7", "6 * 8", "40 + 2"]
    names = rec.names()
    # the third plan is drawn after the first two have run
    assert names.index("plan", names.index("step")) > names.index("step")
    steps = rec.of(StepEvent)
    assert sorted((s.plan, s.output) for s in steps) == [(0, "42"), (1, "48"), (2, "42")]
    end = rec.of(RoundEnd)[0]
    assert [(v.plan, v.answer, v.agrees) for v in end.votes] == [
        (0, "42", True),
        (1, "48", False),
        (2, "42", True),
    ]
    # the verifier is asked about the leading answer only: 48 lost the vote unasked
    assert [v.verifier for v in end.votes] == [0.8, None, 0.8]
    assert (end.agreeing, end.samples) == (2, 3) == (result.agreement.agreeing, 3)


async def test_a_replanning_round_streams_its_start_reason_and_its_own_plans() -> None:
    failing = plan(("s1", "calc", "1/0", []))
    fixed = plan(("s1", "calc", "2 + 2", []))
    rec = Recorder()
    svc = service(ScriptedPlanner({"q": [[failing], [fixed]]}), max_replans=2)
    result = await reason(svc, "q", rec, use_cache=False)

    assert result.answer == "4"
    assert rec.names() == [
        "round_start", "plan", "step", "round_end",
        "round_start", "plan", "step", "round_end",
    ]  # fmt: skip
    starts = rec.of(RoundStart)
    assert [(s.round, s.replan_for) for s in starts] == [(1, None), (2, "no_answer")]
    assert [(p.round, p.plan) for p in rec.of(PlanEvent)] == [(1, 0), (2, 0)]
    steps = rec.of(StepEvent)
    assert [(s.round, s.status) for s in steps] == [(1, "error"), (2, "ok")]
    ends = rec.of(RoundEnd)
    assert [(e.round, e.answer, e.replan_for) for e in ends] == [
        (1, None, None),
        (2, "4", "no_answer"),
    ]
    assert ends[0].replan_reasons == ["no_answer"] and ends[0].votes[0].agrees is False
    # the round summaries of the response are the stream's, less round and votes
    assert [e.model_dump(exclude={"round", "votes"}) for e in ends] == [
        r.model_dump() for r in result.replanning
    ]


async def test_a_failed_replanning_round_ends_with_its_error() -> None:
    rec = Recorder()
    planner = ScriptedPlanner({"q": [[plan(("s1", "calc", "1/0", []))]]}, fail_round=1)
    result = await reason(service(planner, max_replans=1), "q", rec, use_cache=False)

    assert result.answer is None
    ends = rec.of(RoundEnd)
    assert [(e.round, e.error, e.votes) for e in ends] == [
        (1, None, ends[0].votes),
        (2, "dependency_unavailable", []),
    ]


async def test_a_first_round_that_cannot_plan_ends_before_the_error() -> None:
    rec = Recorder()
    planner = ScriptedPlanner({"q": [[DIAMOND]]}, fail_round=0)
    with pytest.raises(DependencyUnavailable):
        await reason(service(planner), "q", rec)
    assert rec.names() == ["round_start", "round_end"]
    assert rec.of(RoundEnd)[0].error == "dependency_unavailable"


async def test_an_answer_from_the_cache_streams_no_round() -> None:
    svc = service(ScriptedPlanner({"q": [[DIAMOND]]}))
    await reason(svc, "q", Recorder())
    rec = Recorder()
    result = await reason(svc, "q", rec)
    assert result.cached is True
    assert rec.events == []


# --------------------------------------------------------------------------- over the app


def app_with(planner: Any, log_dir: Path) -> Any:
    async def tools(s: OrchestratorSettings, cache: Cache, stack: AsyncExitStack) -> ToolRegistry:
        return registry(cache)

    config = OrchestratorSettings(
        log_dir=log_dir, log_format="json", confidence_calibrator=PASSTHROUGH_CALIBRATOR
    )
    app = create_app(config, tools_factory=tools)

    class Swap:
        def __enter__(self) -> TestClient:
            self.client = TestClient(app).__enter__()
            # the service built at startup, with the scripted peers handed in
            app.state.reason.planner = planner
            app.state.reason.verifier = ScriptedVerifier()
            return self.client

        def __exit__(self, *exc: object) -> None:
            self.client.__exit__(*exc)

    return Swap()


def sse(text: str) -> list[tuple[str, Any]]:
    events = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_the_stream_frames_every_event_and_ends_with_the_result(tmp_path: Path) -> None:
    with app_with(ScriptedPlanner({"q": [[DIAMOND]]}), tmp_path) as client:
        r = client.post(
            "/reason?events=all",
            json={"question": "q", "options": {"use_cache": False}},
            headers={"Accept": "text/event-stream"},
        )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse(r.text)
    names = [n for n, _ in events]
    assert names == ["round_start", "plan", "step", "step", "step", "round_end", "result"]
    kinds = {v: k for k, v in STREAM_EVENT_NAMES.items()}
    for name, data in events[:-1]:
        kinds[name].model_validate(data)  # each payload is its wire schema, exactly
    step = events[2][1]
    assert (step["round"], step["plan"], step["id"], step["status"]) == (1, 0, "s1", "ok")
    assert events[-1][1]["answer"] == "72" and events[-1][1]["trace_id"] == r.headers["x-trace-id"]
    # read to its end: nothing was cancelled
    lines = read_trace(tmp_path, r.headers["x-trace-id"])
    assert "request.cancelled" not in {ln.get("event.action") for ln in lines}


def test_the_stream_error_carries_the_status_and_retry_time_of_the_json_answer(
    tmp_path: Path,
) -> None:
    planner = ScriptedPlanner({"q": [[DIAMOND]]}, fail_always=True)
    with app_with(planner, tmp_path) as client:
        r = client.post(
            "/reason?events=all", json={"question": "q"}, headers={"Accept": "text/event-stream"}
        )
        plain = client.post("/reason", json={"question": "q"})
    name, data = sse(r.text)[-1]
    assert name == "error"
    error = StreamError.model_validate(data)
    assert error.error.type == "dependency_unavailable" == plain.json()["error"]["type"]
    assert (error.status, error.retry_after_s) == (503, int(plain.headers["retry-after"]))
    assert plain.status_code == 503
    # the stream's request line says 200; its trace says how it ended, as the JSON one's
    lines = read_trace(tmp_path, r.headers["x-trace-id"])
    requests = [ln for ln in lines if ln.get("event.kind") == "request"]
    assert [ln["http.response.status_code"] for ln in requests] == [200]
    (ended,) = [ln for ln in lines if ln.get("event.action") == "reason.stream_error"]
    assert (ended["log.level"], ended["error.type"], ended["labels.status"]) == (
        "warning",
        "dependency_unavailable",
        503,
    )
    assert build_view(r.headers["x-trace-id"], lines, source="files").spans[0].error is True


def test_without_events_all_the_stream_is_as_it_always_was(tmp_path: Path) -> None:
    with app_with(ScriptedPlanner({"q": [[DIAMOND]]}), tmp_path) as client:
        r = client.post(
            "/reason",
            json={"question": "q", "options": {"use_cache": False}},
            headers={"Accept": "text/event-stream"},
        )
        events = sse(r.text)
        assert [n for n, _ in events] == ["step", "step", "step", "result"]
        for _, data in events[:-1]:  # exactly a StepResult: a strict client still reads it
            StepResult.model_validate(data, strict=True)
        client.app.state.reason.planner = ScriptedPlanner({"q": [[DIAMOND]]}, fail_always=True)
        failed = client.post(
            "/reason", json={"question": "q"}, headers={"Accept": "text/event-stream"}
        )
        name, data = sse(failed.text)[-1]
        assert name == "error"
        ErrorBody.model_validate(data, strict=True)  # the plain error body
        bad = client.post(
            "/reason?events=plans", json={"question": "q"}, headers={"Accept": "text/event-stream"}
        )
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "query.events"
