"""The OpenAI-compatible front door, driven by the official `openai` package against the
real orchestrator app over loopback HTTP (scripted planner and verifier in-process):
answers, streams, the `reason` extra field, the mapping of options, every refusal in
OpenAI's error shape, auth, the tenant's limit, the deadline and a planner that is down."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from services.openai_schemas import (
    MODEL_ID,
    ChatCompletion,
    ChatCompletionChunk,
    ModelList,
    OpenAIErrorBody,
)
from services.schemas import ErrorBody, ReasonResponse
from tests.orchestrator.helpers import (
    FakePlanner,
    FakeVerifier,
    ToolSwitch,
    orchestrator_stack,
    plan,
)

pytestmark = [pytest.mark.unit]

KEY = "k3y-0123456789abcdefghij"
DIAMOND = plan(
    ("s1", "calc", "48", []),
    ("s2", "calc", "s1 / 2", ["s1"]),
    ("s3", "calc", "s1 + s2", ["s1", "s2"]),
    reasoning="May is half of April; add both.",
)
SCRIPT = {
    "How many clips?": [[DIAMOND]],
    "Vote": [[plan(("s1", "calc", "6 * 7", [])), plan(("s1", "calc", "40 + 2", []))]],
    "Slow": [[plan(("s1", "sleep", "1.0", []))]],
}


@contextmanager
def stack(tmp_path: Path, planner: FakePlanner | None = None, **settings: Any) -> Iterator[str]:
    planner = planner or FakePlanner(script=SCRIPT)
    settings.setdefault("api_keys", {KEY: "acme"})
    with orchestrator_stack(tmp_path, planner, FakeVerifier(), ToolSwitch(), **settings) as url:
        yield url


def client(url: str, key: str = KEY) -> openai.OpenAI:
    # no retries: each test sees the first answer (the client retries 5xx and 429 itself)
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


def ask(c: openai.OpenAI, question: str = "How many clips?", **kw: Any) -> Any:
    kw.setdefault("extra_body", {"reason": {"use_cache": False}})
    return c.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": question}], **kw
    )


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    """The error body, checked to be OpenAI's shape exactly."""
    body = exc.response.json()
    OpenAIErrorBody.model_validate(body)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


# --------------------------------------------------------------------------- answers


def test_the_answer_is_the_content_and_the_pipeline_travels_beside_it(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        raw = client(url).chat.completions.with_raw_response.create(
            model=MODEL_ID,
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "How many clips?"},
            ],
            extra_body={"reason": {"use_cache": False}},
        )
    completion = raw.parse()
    assert completion.object == "chat.completion" and completion.model == MODEL_ID
    (choice,) = completion.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert choice.message.content == "72"  # the answer, and nothing else
    wire = ChatCompletion.model_validate(json.loads(raw.http_response.text))
    reason = wire.reason
    assert reason.answer == "72" and reason.verdict == "verified"
    assert reason.trace_id == raw.headers["x-trace-id"]
    assert completion.id == f"chatcmpl-{reason.trace_id}"
    assert [s.id for s in reason.steps] == ["s1", "s2", "s3"]
    # what clients that show reasoning show: the plan, every step, the verdict
    text = choice.message.model_extra["reasoning_content"]
    assert "May is half of April" in text and "s3 calc [ok" in text and "-> 72" in text
    assert f"verified, confidence {reason.confidence:.2f}" in text
    assert completion.model_extra["reason"]["confidence"] == reason.confidence


def test_reason_options_come_from_the_extra_body_and_n_plans_votes(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        completion = ask(
            client(url),
            "Vote",
            extra_body={"reason": {"n_plans": 2, "adaptive": False, "use_cache": False}},
        )
        again = ask(
            client(url),
            "Vote",
            extra_body={"reason": {"n_plans": 2, "adaptive": False, "use_cache": True}},
        )
    reason = ReasonResponse.model_validate(completion.model_extra["reason"])
    assert completion.choices[0].message.content == "42"
    assert reason.agreement is not None and (reason.agreement.plans, reason.agreement.agreeing) == (
        2,
        2,
    )
    assert len(completion.choices) == 1  # one choice, two plans
    assert "Vote: 2 of 2 agree" in completion.choices[0].message.model_extra["reasoning_content"]
    # use_cache goes through too: the first answer was not stored, so this is no hit
    assert again.model_extra["reason"]["cached"] is False


def test_the_answer_cache_is_the_reason_endpoints(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        r = httpx.post(
            f"{url}/reason",
            json={"question": "How many clips?"},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=30,
        )
        completion = ask(client(url), extra_body={})
    assert r.status_code == 200
    reason = completion.model_extra["reason"]
    assert reason["cached"] is True and reason["cached_trace_id"] == r.json()["trace_id"]
    assert completion.choices[0].message.content == "72"
    # a cached answer still says what it was made of
    assert "s3 calc" in completion.choices[0].message.model_extra["reasoning_content"]


def test_a_stream_sends_plans_and_steps_as_reasoning_then_the_answer(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        with client(url).chat.completions.with_streaming_response.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "How many clips?"}],
            stream=True,
            extra_body={"reason": {"use_cache": False}},
        ) as response:
            trace_id = response.headers["x-trace-id"]
            lines = [ln for ln in response.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [
        ChatCompletionChunk.model_validate_json(ln.removeprefix("data: ")) for ln in lines[:-1]
    ]
    assert {c.id for c in chunks} == {f"chatcmpl-{trace_id}"}
    assert chunks[0].choices[0].delta.role == "assistant"
    kinds = [next(k for k, v in c.reason if v is not None) for c in chunks if c.reason]
    assert kinds == ["round_start", "plan", "step", "step", "step", "round_end", "result"]
    reasoning = "".join(c.choices[0].delta.reasoning_content or "" for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content == "72"
    assert reasoning.index("Plan 1:") < reasoning.index("plan 1 s1 calc") < reasoning.index("s3")
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop" and last.reason.result.trace_id == trace_id
    # the answer comes after every step
    first_content = next(i for i, c in enumerate(chunks) if c.choices[0].delta.content)
    last_step = max(i for i, c in enumerate(chunks) if c.reason and c.reason.step)
    assert first_content > last_step


def test_the_openai_client_reads_the_stream(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        stream = ask(
            client(url),
            "Vote",
            stream=True,
            extra_body={"reason": {"n_plans": 2, "adaptive": False, "use_cache": False}},
        )
        chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    reasoning = "".join(
        c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks
    )
    assert content == "42"
    assert "plan 1 s1" in reasoning and "plan 2 s1" in reasoning  # both plans' steps
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].model_extra["reason"]["result"]["agreement"]["plans"] == 2


def test_a_cached_answer_streams_its_reasoning_whole(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        ask(client(url), extra_body={})
        chunks = list(ask(client(url), stream=True, extra_body={}))
    assert chunks[-1].model_extra["reason"]["result"]["cached"] is True
    reasoning = "".join(
        c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks
    )
    assert "s3 calc" in reasoning and "(cached)" in reasoning
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "72"


def test_models_names_the_pipeline_and_what_is_behind_it(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        models = client(url).models.list()
        raw = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert [m.id for m in models.data] == [MODEL_ID]
    listed = ModelList.model_validate(raw.json())
    meta = listed.data[0].metadata
    assert meta.planner is not None and meta.planner.model == "fake-planner"
    assert meta.verifier is not None and meta.verifier.model == "fake-verifier"
    assert "n_plans" in meta.extra_body["reason"] and "n_plans" in meta.n
    assert meta.extra_body["reason"]["n_plans"]["maximum"] == 8


def test_models_says_so_when_the_planner_does_not_name_its_model(tmp_path: Path) -> None:
    with stack(tmp_path, FakePlanner(script=SCRIPT, info=None)) as url:
        meta = (
            ModelList.model_validate(
                httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
            )
            .data[0]
            .metadata
        )
    assert meta.planner is None and meta.verifier is not None


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("field", "value", "param", "says"),
    [
        ("n", 2, "n", "reason.n_plans"),
        ("tools", [{"type": "function", "function": {"name": "f"}}], "tools", "own tools"),
        ("temperature", 0.2, "temperature", "sampling"),
        ("logprobs", True, "logprobs", "token probabilities"),
        ("response_format", {"type": "json_object"}, "response_format", "reason"),
        ("max_tokens", 16, "max_tokens", "not supported"),
        ("stream_options", {"include_usage": True}, "stream_options.include_usage", "usage"),
        ("user", "someone", "user", "tenant"),
    ],
)
def test_unsupported_fields_are_refused_by_name(
    tmp_path: Path, field: str, value: Any, param: str, says: str
) -> None:
    with stack(tmp_path) as url:
        with pytest.raises(openai.BadRequestError) as caught:
            ask(client(url), extra_body={field: value})
    error = error_of(caught.value)
    assert caught.value.status_code == 400
    assert (error["param"], error["type"], error["code"]) == (
        param,
        "invalid_request_error",
        "unsupported_parameter",
    )
    assert says in error["message"]


def test_neutral_values_of_unsupported_fields_are_taken(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        completion = ask(
            client(url),
            n=1,
            logprobs=False,
            response_format={"type": "text"},
            extra_body={"tools": [], "reason": {"use_cache": False}},
        )
    assert completion.choices[0].message.content == "72"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"reason": {"n_plans": 9}}, "reason.n_plans"),
        ({"reason": {"temperature": 1}}, "reason.temperature"),
        ({"messages": [{"role": "user", "content": "x" * 4001}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": "   "}]}, "messages.0.content"),
        ({"messages": [{"role": "tool", "content": "3", "tool_call_id": "c"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "messages.1.role",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:,"}}],
                    }
                ]
            },
            "messages.0.content",
        ),
    ],
)
def test_malformed_requests_are_400s_naming_the_field(
    tmp_path: Path, body: dict[str, Any], param: str
) -> None:
    request = {"model": MODEL_ID, "messages": [{"role": "user", "content": "q"}], **body}
    with stack(tmp_path) as url:
        r = httpx.post(
            f"{url}/v1/chat/completions", json=request, headers={"Authorization": f"Bearer {KEY}"}
        )
    assert r.status_code == 400, r.text
    error = OpenAIErrorBody.model_validate(r.json()).error
    assert error.param == param and error.type == "invalid_request_error", error


def test_text_parts_are_one_question(tmp_path: Path) -> None:
    parts = [{"type": "text", "text": "How many "}, {"type": "text", "text": "clips?"}]
    with stack(tmp_path) as url:
        completion = client(url).chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": parts}],
            extra_body={"reason": {"use_cache": False}},
        )
    assert completion.choices[0].message.content == "72"


def test_an_unknown_model_is_a_404(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        with pytest.raises(openai.NotFoundError) as caught:
            client(url).chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "q"}]
            )
    error = error_of(caught.value)
    assert (error["code"], error["param"]) == ("model_not_found", "model")


def test_a_bad_key_is_a_401_in_openais_shape_on_every_v1_route(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        with pytest.raises(openai.AuthenticationError) as chat:
            ask(client(url, key="wrong-key-0123456789"))
        with pytest.raises(openai.AuthenticationError) as models:
            client(url, key="wrong-key-0123456789").models.list()
        unknown = httpx.get(f"{url}/v1/nowhere")
        reason = httpx.post(f"{url}/reason", json={"question": "q"})
    for caught in (chat, models):
        error = error_of(caught.value)
        assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    assert unknown.status_code == 404 and OpenAIErrorBody.model_validate(unknown.json())
    # /reason keeps its own shape
    assert reason.status_code == 401
    assert ErrorBody.model_validate(reason.json()).error.type == "unauthorized"


def test_the_http_fronts_errors_take_openais_shape_under_v1(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        r = httpx.post(
            f"{url}/v1/chat/completions",
            content=b"model=reason-pipeline",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        bad_json = httpx.post(
            f"{url}/v1/chat/completions",
            content=b"{not json",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
        )
    assert r.status_code == 415
    assert OpenAIErrorBody.model_validate(r.json()).error.code == "unsupported_media_type"
    assert bad_json.status_code == 400
    assert OpenAIErrorBody.model_validate(bad_json.json()).error.type == "invalid_request_error"


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("stream", [False, True])
def test_a_planner_that_is_down_is_a_503_with_retry_after(tmp_path: Path, stream: bool) -> None:
    with stack(tmp_path, FakePlanner(script=SCRIPT, mode="error")) as url:
        with pytest.raises(openai.InternalServerError) as caught:
            response = ask(client(url), stream=stream)
            list(response)
    assert caught.value.status_code == 503
    assert int(caught.value.response.headers["retry-after"]) > 0
    error = error_of(caught.value)
    assert (error["type"], error["code"]) == ("server_error", "dependency_unavailable")


@pytest.mark.parametrize("stream", [False, True])
def test_the_deadline_bounds_a_request_to_a_planner_that_hangs(
    tmp_path: Path, stream: bool
) -> None:
    with stack(tmp_path, FakePlanner(script=SCRIPT, mode="hang")) as url:
        started = time.monotonic()
        with pytest.raises(openai.InternalServerError) as caught:
            list(ask(client(url), stream=stream, extra_body={"reason": {"deadline_s": 0.5}}))
        took = time.monotonic() - started
    assert caught.value.status_code == 503 and took < 0.5 + 1.5
    assert "did not answer within" in error_of(caught.value)["message"]


def test_a_slow_step_past_the_deadline_ends_the_stream_with_its_answer(tmp_path: Path) -> None:
    with stack(tmp_path) as url:
        started = time.monotonic()
        chunks = list(
            ask(
                client(url),
                "Slow",
                stream=True,
                extra_body={"reason": {"deadline_s": 0.4, "use_cache": False}},
            )
        )
        took = time.monotonic() - started
    result = chunks[-1].model_extra["reason"]["result"]
    assert took < 0.4 + 1.5
    assert result["steps"][0]["status"] == "timeout" and result["answer"] is None
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert not any(c.choices[0].delta.content for c in chunks)  # no answer, no content


def test_the_tenants_share_counts_v1_requests_and_streams_give_it_back(tmp_path: Path) -> None:
    with stack(tmp_path, tenant_max_in_flight=1) as url:
        # one slot: streams that ended gave theirs back
        for _ in range(2):
            assert list(ask(client(url), stream=True))[-1].choices[0].finish_reason == "stop"
        slow = threading.Thread(target=lambda: ask(client(url), "Slow"))
        slow.start()
        time.sleep(0.3)
        with pytest.raises(openai.RateLimitError) as caught:
            ask(client(url))
        slow.join()
    assert caught.value.status_code == 429
    error = error_of(caught.value)
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert caught.value.response.headers["retry-after"]
