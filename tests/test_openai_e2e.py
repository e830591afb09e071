"""The OpenAI-compatible API end to end: the three services as processes on the scripted
models, the official `openai` client pointed at the orchestrator's /v1 with a key from
ORCH_API_KEYS, streaming and not, the python sandbox behind it; an auth error, an
unsupported field, a deadline; and LangChain's ChatOpenAI as a framework that speaks it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import openai
import pytest

from orchestrator.traces import read_trace
from services.openai_schemas import MODEL_ID
from tests.conftest import REPO, Stack, make_stack

pytestmark = [pytest.mark.integration]

KEY = "e2e-k3y-0123456789abcdef"
SPIN = {
    "reasoning": "runs past any deadline",
    "steps": [
        {"id": "s1", "tool": "python", "input": "x = 0\nwhile True:\n    x += 1", "depends_on": []}
    ],
    "answer_step": "s1",
}


@pytest.fixture(scope="module")
def openai_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("openai-e2e")
    script = json.loads((REPO / "tests" / "data" / "plans.json").read_text())
    (tmp / "plans.json").write_text(json.dumps({**script, "spin": SPIN}))
    s = make_stack(
        tmp,
        ORCH_API_KEYS=json.dumps({KEY: "acme"}),
        PLANNER_SCRIPT_PATH=str(tmp / "plans.json"),
    ).start()
    yield s
    s.stop()


def client(stack: Stack, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{stack.url('orchestrator')}/v1", api_key=key, max_retries=0, timeout=60
    )


def ask(c: openai.OpenAI, question: str, **kw):
    kw.setdefault("extra_body", {"reason": {"use_cache": False}})
    return c.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": question}], **kw
    )


def test_a_completion_answers_and_its_trace_joins_all_three_services(openai_stack: Stack) -> None:
    raw = client(openai_stack).chat.completions.with_raw_response.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "What is 17 * 23 + 4?"}],
        extra_body={"reason": {"use_cache": False}},
    )
    completion = raw.parse()
    reason = completion.model_extra["reason"]
    assert completion.choices[0].message.content == "395"
    assert reason["verdict"] == "verified" and reason["steps"][0]["tool"] == "calc"
    assert raw.headers["x-trace-id"] == reason["trace_id"]
    time.sleep(0.3)
    lines = read_trace(openai_stack.log_dir, reason["trace_id"])
    assert {ln["service.name"] for ln in lines} == {"orchestrator", "planner", "verifier"}
    assert any(ln.get("message") == "POST /v1/chat/completions 200" for ln in lines)


def test_a_stream_through_the_sandbox(openai_stack: Stack) -> None:
    chunks = list(ask(client(openai_stack), "chain through python", stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    reasoning = "".join(
        c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks
    )
    assert content == "43"
    assert "s1 calc" in reasoning and "s2 python [ok" in reasoning
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop"
    assert last.model_extra["reason"]["result"]["steps"][1]["tool"] == "python"


def test_models_names_the_scripted_planner_and_verifier(openai_stack: Stack) -> None:
    (model,) = client(openai_stack).models.list().data
    meta = model.model_extra["metadata"]
    assert model.id == MODEL_ID
    assert (meta["planner"]["backend"], meta["planner"]["ready"]) == ("scripted", True)
    assert meta["verifier"]["backend"] == "scripted"


def test_a_wrong_key_and_an_unsupported_field_are_openai_errors(openai_stack: Stack) -> None:
    with pytest.raises(openai.AuthenticationError) as auth:
        ask(client(openai_stack, key="not-the-key-0123456789"), "What is 2 + 2?")
    assert auth.value.code == "invalid_api_key"
    with pytest.raises(openai.BadRequestError) as tools:
        ask(
            client(openai_stack),
            "What is 2 + 2?",
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    assert (tools.value.code, tools.value.param) == ("unsupported_parameter", "tools")


def test_the_deadline_bounds_a_step_that_never_ends(openai_stack: Stack) -> None:
    started = time.monotonic()
    completion = ask(
        client(openai_stack), "spin", extra_body={"reason": {"deadline_s": 1.5, "use_cache": False}}
    )
    took = time.monotonic() - started
    reason = completion.model_extra["reason"]
    assert took < 1.5 + 2.0, took
    assert reason["steps"][0]["status"] == "timeout"
    assert completion.choices[0].message.content is None and reason["answer"] is None


def test_langchain_chat_openai_answers_and_streams(openai_stack: Stack) -> None:
    chat_openai = pytest.importorskip("langchain_openai").ChatOpenAI
    llm = chat_openai(
        model=MODEL_ID,
        base_url=f"{openai_stack.url('orchestrator')}/v1",
        api_key=KEY,
        max_retries=0,
        extra_body={"reason": {"use_cache": False}},
    )
    assert llm.invoke("What is 6 * 7?").content == "42"
    assert "".join(chunk.content for chunk in llm.stream("What is 6 * 8?")) == "48"
