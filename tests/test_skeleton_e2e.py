"""End to end over real HTTP: the three services started as `reason serve` starts them."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app as cli_app
from orchestrator.traces import read_trace
from services.schemas import ReasonResponse, TraceView
from tests.conftest import Stack, make_stack

pytestmark = [pytest.mark.integration]


def reason(stack: Stack, body: object, **kw: object) -> httpx.Response:
    return httpx.post(f"{stack.url('orchestrator')}/reason", json=body, timeout=30, **kw)


def test_reason_answers_and_one_trace_id_joins_all_three_logs(stack: Stack) -> None:
    r = reason(stack, {"question": "What is 17 * 23 + 4?", "options": {"use_cache": False}})
    assert r.status_code == 200, r.text
    body = ReasonResponse.model_validate(r.json())
    assert body.answer == "395"
    assert body.verdict == "verified"
    assert body.steps[0].tool == "calc" and body.steps[0].status == "ok"
    assert r.headers["x-trace-id"] == body.trace_id
    time.sleep(0.3)  # log lines are flushed per line; give the other processes a moment
    lines = read_trace(stack.log_dir, body.trace_id)
    services = {line["service.name"] for line in lines}
    assert services == {"orchestrator", "planner", "verifier"}
    # one canonical request line per service, each with status and duration
    canonical = [ln for ln in lines if ln.get("event.kind") == "request"]
    assert sorted(ln["service.name"] for ln in canonical) == ["orchestrator", "planner", "verifier"]
    assert all(
        ln["http.response.status_code"] == 200 and ln["event.duration"] > 0 for ln in canonical
    )
    # the downstream spans are children of the orchestrator's span
    orch_span = next(ln["span.id"] for ln in canonical if ln["service.name"] == "orchestrator")
    assert {ln.get("parent.id") for ln in canonical if ln["service.name"] != "orchestrator"} == {
        orch_span
    }
    # one step line for the calc step, with hashes of input and output
    steps = [ln for ln in lines if ln.get("event.kind") == "step"]
    assert len(steps) == 1 and steps[0]["labels.tool"] == "calc"
    assert steps[0]["labels.input_hash"] and steps[0]["labels.output_hash"]

    result = CliRunner().invoke(cli_app, ["trace", body.trace_id, "--log-dir", str(stack.log_dir)])
    assert result.exit_code == 0, result.output
    for name in ("orchestrator", "planner", "verifier"):
        assert name in result.output
    assert body.trace_id in result.output


def test_the_orchestrator_reads_a_trace_back_as_nested_spans(stack: Stack) -> None:
    r = reason(stack, {"question": "What is 3 * 3?", "options": {"use_cache": False}})
    trace_id = r.json()["trace_id"]
    time.sleep(0.3)
    got = httpx.get(f"{stack.url('orchestrator')}/traces/{trace_id}")
    assert got.status_code == 200, got.text
    view = TraceView.model_validate(got.json())
    assert view.source == "files" and view.lines == len(read_trace(stack.log_dir, trace_id))
    (root,) = view.spans
    assert root.service == "orchestrator" and root.duration_ms and root.duration_ms > 0
    assert sorted(c.service or "" for c in root.children) == ["planner", "verifier"]
    assert any(ln.message == "POST /reason 200" for ln in root.lines)


def test_incoming_traceparent_is_kept_and_forwarded(stack: Stack) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    r = reason(
        stack,
        {"question": "2 + 2", "options": {"use_cache": False}},
        headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
    )
    assert r.status_code == 200
    assert r.json()["trace_id"] == trace_id == r.headers["x-trace-id"]
    time.sleep(0.3)
    services = {ln["service.name"] for ln in read_trace(stack.log_dir, trace_id)}
    assert services == {"orchestrator", "planner", "verifier"}


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": "00-zzzz-00f067aa0ba902b7-01"},
        {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
        {"traceparent": "00-" + "a" * 200},
        {"x-request-id": "x" * 500},
        {"x-request-id": "abc\tdef"},
        {"x-request-id": "<script>alert(1)</script>"},
    ],
)
def test_malformed_trace_headers_are_replaced_not_echoed(stack: Stack, headers: dict) -> None:
    r = httpx.post(f"{stack.url('planner')}/plan", json={"question": "1+1"}, headers=headers)
    assert r.status_code == 200
    new_id = r.headers["x-trace-id"]
    assert len(new_id) == 32 and new_id not in json.dumps(headers)
    assert "x-request-id" not in r.headers
    time.sleep(0.2)
    logged = (stack.log_dir / "planner.jsonl").read_text()
    for value in headers.values():
        assert value not in logged


def test_crlf_in_request_id_cannot_inject_headers(stack: Stack) -> None:
    # h11 refuses CR/LF in header values on the client side; send raw bytes instead.
    import socket

    host, port = "127.0.0.1", stack.ports["planner"]
    body = b'{"question": "1+1"}'
    raw = (
        b"POST /plan HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"X-Request-ID: abc\rSet-Cookie: evil=1\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert b"evil" not in data.split(b"\r\n\r\n", 1)[0].lower()
    assert data.startswith(b"HTTP/1.1 4") or b"x-request-id" not in data.lower()


def test_client_request_id_is_echoed_when_safe(stack: Stack) -> None:
    r = httpx.post(
        f"{stack.url('planner')}/plan",
        json={"question": "1+1"},
        headers={"x-request-id": "req-123.abc"},
    )
    assert r.headers["x-request-id"] == "req-123.abc"


def test_orchestrator_metrics_count_requests_steps_and_cache(stack: Stack) -> None:
    reason(stack, {"question": "What is 5 * 5?"})
    reason(stack, {"question": "What is 5 * 5?"})  # the second is an answer-cache hit
    text = httpx.get(f"{stack.url('orchestrator')}/metrics").text
    for name in (
        'reason_requests_total{cached="true"',
        'reason_requests_total{cached="false"',
        'tool_calls_total{source="tool",status="ok",tool="calc"}',
        'cache_operations_total{cache="answer",op="get",result="hit"}',
        "reason_stage_duration_seconds_bucket",
        "tool_call_duration_seconds_bucket",
        'http_request_duration_seconds_bucket{le="0.005",route="/reason",service="orchestrator"}',
    ):
        assert name in text, name


def test_health_ready_and_metrics(stack: Stack) -> None:
    for name in ("planner", "verifier", "orchestrator"):
        assert httpx.get(f"{stack.url(name)}/healthz").json()["status"] == "ok"
        ready = httpx.get(f"{stack.url(name)}/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        metrics = httpx.get(f"{stack.url(name)}/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "http_requests_total" in metrics.text


def test_planner_down_gives_503_with_retry_after_within_deadline(tmp_path) -> None:
    s = make_stack(tmp_path).start()
    try:
        s.kill("planner")
        started = time.monotonic()
        r = reason(s, {"question": "What is 1 + 1?", "options": {"deadline_s": 3}})
        assert time.monotonic() - started < 3.5
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) > 0
        err = r.json()
        assert err["error"]["type"] == "dependency_unavailable"
        assert err["trace_id"] == r.headers["x-trace-id"]
        assert "planner" in err["error"]["message"]

        s.kill("verifier")
        assert httpx.get(f"{s.url('orchestrator')}/readyz").status_code == 503
        assert httpx.get(f"{s.url('orchestrator')}/healthz").status_code == 200
    finally:
        s.stop()


def test_verifier_down_gives_unverified_answer(tmp_path) -> None:
    s = make_stack(tmp_path).start()
    try:
        s.kill("verifier")
        started = time.monotonic()
        r = reason(s, {"question": "What is 6 * 7?", "options": {"deadline_s": 5}})
        assert time.monotonic() - started < 5.5
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["answer"] == "42"
        assert body["verdict"] == "unverified"
    finally:
        s.stop()


def ask(stack: Stack, question: str) -> dict:
    r = reason(stack, {"question": question, "options": {"use_cache": False}})
    assert r.status_code == 200, r.text
    return r.json()


def test_values_flow_from_calc_into_the_python_sandbox(stack: Stack) -> None:
    body = ask(stack, "chain through python")
    assert [s["status"] for s in body["steps"]] == ["ok", "ok"]
    assert body["answer"] == "43"


def test_real_tools_answer_and_refuse(stack: Stack) -> None:
    assert ask(stack, "how many countries are in the sample database?")["answer"]
    assert ask(stack, "capital of France")["answer"] == "Paris"
    for question in ("read a file", "drop a table"):
        body = ask(stack, question)
        assert body["answer"] is None and body["steps"][0]["status"] == "error"
