"""Test doubles served over real HTTP: a scriptable planner and verifier, custom tools,
and the real orchestrator app, each in a uvicorn server on a free port."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from orchestrator.app import create_app
from orchestrator.cache import Cache
from orchestrator.tools.base import ToolContext, ToolError
from orchestrator.tools.calc import calc
from orchestrator.tools.registry import Tool, ToolRegistry
from services import toolspecs
from services.answers import last_number
from services.schemas import ToolSpec
from services.settings import OrchestratorSettings
from tests.conftest import free_port

PASSTHROUGH_CALIBRATOR = (
    Path(__file__).resolve().parents[1] / "data" / "passthrough-confidence.json"
)


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()  # FakeVerifier.override: leave the field out


class ServerThread:
    def __init__(self, app: Any, port: int | None = None, config: Any = None) -> None:
        self.port = port or free_port()
        config = config or uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=1,
        )
        self.port = config.port
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@asynccontextmanager
async def sandbox_registry() -> AsyncIterator[ToolRegistry]:
    """The python tool on a real one-worker sandbox, with calc beside it."""
    from orchestrator.sandbox import Sandbox, SandboxSettings
    from orchestrator.tools.python import PythonTool

    sandbox = Sandbox(SandboxSettings(workers=1, memory_mb=256, cpu_s=2))
    await sandbox.start()
    reg = ToolRegistry()
    reg.register(Tool(toolspecs.PYTHON, PythonTool(sandbox), timeout_s=5.0))
    reg.register(Tool(toolspecs.CALC, calc, timeout_s=1.0))
    try:
        yield reg
    finally:
        await sandbox.close()


def plan(
    *steps: tuple[str, str, str, list[str]], answer: str | None = None, reasoning: str = "test plan"
) -> dict[str, Any]:
    return {
        "reasoning": reasoning,
        "steps": [{"id": i, "tool": t, "input": x, "depends_on": d} for i, t, x, d in steps],
        "answer_step": answer or steps[-1][0],
    }


def votes(*answers: str | None, source: str = "plan") -> list[dict[str, Any]]:
    """`agreement.votes` as /reason reports it, for answers in the order drawn."""
    return [{"source": source, "answer": a} for a in answers]


def error_reply(kind: str, message: str, status: int) -> JSONResponse:
    """An error in the services' one shape."""
    return JSONResponse(
        {"error": {"type": kind, "message": message}, "trace_id": "0" * 32}, status_code=status
    )


@dataclass
class FakePlanner:
    """Answers /plan from a script: question -> list of rounds, each a list of plans; and
    /solve from `prose`: question -> solution texts, or `solve_mode` to fail."""

    script: dict[str, list[list[dict[str, Any]]]] = field(default_factory=dict)
    mode: str = "ok"  # ok | hang | error | planning_failed | raw
    requests: list[dict[str, Any]] = field(default_factory=list)
    raw: Any = None  # mode "raw": this body, as is, with status 200
    prose: dict[str, list[str]] = field(default_factory=dict)
    solve_mode: str = "ok"  # ok | hang | error | missing (404) | raw (`solve_raw` as is)
    solve_raw: Any = None
    solve_requests: list[dict[str, Any]] = field(default_factory=list)
    # seconds a request for later samples (`offset` > 0, /plan or /solve) waits first
    more_delay_s: float = 0.0
    model: str = "fake-planner"  # the model its /plan and /solve responses name
    # GET /info's body (None: 404, a planner from before /info); its model: `model`'s
    info: dict[str, Any] | None = field(
        default_factory=lambda: {"service": "planner", "backend": "fake", "ready": True}
    )

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/readyz")
        async def readyz() -> dict[str, bool]:
            return {"ready": True}

        @app.get("/info")
        async def info() -> Any:
            if self.info is None:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            return {"model": self.model, **self.info}

        @app.post("/plan")
        async def plan_(request: Request) -> Any:
            body = await request.json()
            self.requests.append({**body, "traceparent": request.headers.get("traceparent")})
            if body.get("offset"):
                await asyncio.sleep(self.more_delay_s)
            if self.mode == "hang":
                await asyncio.sleep(3600)
            if self.mode == "error":
                return error_reply("internal_error", "boom", 500)
            if self.mode == "planning_failed":  # what the real planner answers
                return error_reply("planning_failed", "no valid plan after 3", 502)
            if self.mode == "raw":
                return JSONResponse(self.raw)
            rounds = self.script[body["question"]]
            # a request for more samples of the same round (`offset`) is not a new round
            done = (
                sum(
                    1
                    for r in self.requests
                    if r["question"] == body["question"] and not r.get("offset")
                )
                - 1
            )
            offset = body.get("offset", 0)
            plans = rounds[min(done, len(rounds) - 1)][offset : offset + body.get("n", 1)]
            return {"plans": plans, "model": self.model, "backend": "fake", "latency_ms": 1.0}

        @app.post("/solve")
        async def solve(request: Request) -> Any:
            body = await request.json()
            self.solve_requests.append(body)
            if body.get("offset"):
                await asyncio.sleep(self.more_delay_s)
            if self.solve_mode == "hang":
                await asyncio.sleep(3600)
            if self.solve_mode == "error":
                return error_reply("internal_error", "boom", 500)
            if self.solve_mode == "raw":
                return JSONResponse(self.solve_raw)
            if self.solve_mode == "missing":  # a planner from before /solve
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            texts = self.prose.get(body["question"], [])
            offset = body.get("offset", 0)
            solutions = [
                {"text": t, "answer": last_number(t)}
                for t in texts[offset : offset + body.get("n", 1)]
            ]
            return {
                "solutions": solutions,
                "model": self.model,
                "backend": "fake",
                "latency_ms": 1.0,
            }

        return app


@dataclass
class FakeVerifier:
    """Verdicts by answer text found in the statement; `mode` makes it fail or hang."""

    by_answer: dict[str, float] = field(default_factory=dict)
    default: float = 0.9
    mode: str = "ok"
    calls: int = 0
    # Fields of every result replaced by these (a verifier answering outside its schema)
    override: dict[str, Any] = field(default_factory=dict)
    batch_results: int | None = None  # a batch reply cut to this many results
    claims: list[dict[str, Any]] = field(default_factory=list)  # every item asked about
    info: dict[str, Any] = field(
        default_factory=lambda: {
            "service": "verifier",
            "backend": "fake",
            "model": "fake-verifier",
            "ready": True,
        }
    )

    def _score(self, statement: str) -> dict[str, Any]:
        p = self.default
        for answer, prob in self.by_answer.items():
            if statement == f"The answer is {answer}.":
                p = prob
        result = {"verdict": p >= 0.5, "confidence": p, "method": "model", "latency_ms": 1.0}
        return {k: v for k, v in {**result, **self.override}.items() if v is not DROP}

    def app(self) -> FastAPI:
        app = FastAPI()

        async def gate() -> JSONResponse | None:
            self.calls += 1
            if self.mode == "hang":
                await asyncio.sleep(3600)
            if self.mode == "error":
                return JSONResponse(
                    {"error": {"type": "internal_error", "message": "x"}, "trace_id": "0" * 32},
                    status_code=500,
                )
            return None

        @app.get("/info")
        async def info() -> Any:
            return self.info

        def reply(body: Any) -> Response:
            # json.dumps, not JSONResponse: a NaN in `override` goes out as the NaN literal
            return Response(json.dumps(body), media_type="application/json")

        @app.post("/verify")
        async def verify(request: Request) -> Any:
            body = await request.json()
            self.claims.append(body)
            return await gate() or reply(self._score(body["statement"]))

        @app.post("/verify/batch")
        async def batch(request: Request) -> Any:
            failed = await gate()
            if failed:
                return failed
            items = (await request.json())["items"]
            self.claims.extend(items)
            results = [self._score(i["statement"]) for i in items]
            return reply({"results": results[: self.batch_results], "latency_ms": 1.0})

        return app


class ToolSwitch:
    """Custom tools for failure tests."""

    def __init__(self) -> None:
        self.cancelled = 0
        self.started = 0
        self.calls = 0  # every tool call
        self.jobs = 0  # `python` jobs running now
        self.max_jobs = 0  # the most that ever ran at once

    async def sleep(self, text: str, ctx: ToolContext) -> Any:
        self.started += 1
        try:
            await asyncio.sleep(float(text))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return text

    async def hang(self, text: str, ctx: ToolContext) -> Any:
        return await self.sleep("3600", ctx)

    async def fail(self, text: str, ctx: ToolContext) -> Any:
        raise ToolError(f"cannot handle {text}")

    async def crash(self, text: str, ctx: ToolContext) -> Any:
        raise RuntimeError("tool bug")

    async def echo(self, text: str, ctx: ToolContext) -> Any:
        return text

    async def python(self, text: str, ctx: ToolContext) -> Any:
        """Stands in for a sandbox job that runs for `text` seconds."""
        self.jobs += 1
        self.max_jobs = max(self.max_jobs, self.jobs)
        try:
            await asyncio.sleep(float(text))
        finally:
            self.jobs -= 1
        return text

    def factory(self):
        async def build(
            settings: OrchestratorSettings, cache: Cache, stack: AsyncExitStack
        ) -> ToolRegistry:
            reg = ToolRegistry(cache)
            reg.register(Tool(toolspecs.CALC, self._counted(calc), timeout_s=1.0))
            for name, fn, timeout in [
                ("sleep", self.sleep, 5.0),
                ("hang", self.hang, 0.3),
                ("fail", self.fail, 1.0),
                ("crash", self.crash, 1.0),
                ("echo", self.echo, 1.0),
                ("python", self.python, 5.0),
            ]:
                reg.register(
                    Tool(
                        ToolSpec(name=name, description=name, input_format="x"),
                        self._counted(fn),
                        timeout_s=timeout,
                    )
                )
            return reg

        return build

    def _counted(self, fn: Any) -> Any:
        async def counted(text: str, ctx: ToolContext) -> Any:
            self.calls += 1
            return await fn(text, ctx)

        return counted


@contextmanager
def running_orchestrator(
    tmp: Path,
    planner: FakePlanner,
    verifier: FakeVerifier,
    tools: ToolSwitch | None = None,
    **settings: Any,
) -> Iterator[tuple[str, FastAPI]]:
    """The real orchestrator app over HTTP, and the app (its state holds the service)."""
    tools = tools or ToolSwitch()
    with ServerThread(planner.app()) as p, ServerThread(verifier.app()) as v:
        # the served confidence is the verifier's score unless a test brings its own
        settings.setdefault("confidence_calibrator", PASSTHROUGH_CALIBRATOR)
        config = OrchestratorSettings(
            planner_url=p.url, verifier_url=v.url, log_dir=tmp, log_format="json", **settings
        )
        app = create_app(config, tools_factory=tools.factory())
        with ServerThread(app) as o:
            yield o.url, app


@contextmanager
def orchestrator_stack(
    tmp: Path,
    planner: FakePlanner,
    verifier: FakeVerifier,
    tools: ToolSwitch | None = None,
    **settings: Any,
) -> Iterator[str]:
    with running_orchestrator(tmp, planner, verifier, tools, **settings) as (url, _):
        yield url
