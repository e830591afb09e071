"""The HTTP front every service is built with: body size (413, chunked or not), body read
time (408), header bytes (431), requests in flight (503), a client that went away (499),
each answered in the one error body with a trace id and before the handler runs.

The ASGI tests drive the app directly with real chunked bodies; the live tests run
uvicorn on 127.0.0.1 and talk to it over a raw socket, both the way `python -m uvicorn`
serves the app (the app's own limits) and through `services.serve`, which adds the
limits only the server can enforce (header bytes as they arrive, header read time).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from services.app import cancel_on_disconnect, create_service_app
from services.settings import CommonSettings, HttpLimits
from tests.conftest import free_port
from tests.orchestrator.helpers import ServerThread

LIMITS = HttpLimits(
    max_body_bytes=2048, max_header_bytes=16_384, body_read_timeout_s=0.5, max_in_flight=2
)


def make_app(calls: list[str], limits: HttpLimits = LIMITS) -> FastAPI:
    app = create_service_app(name="front", limits=limits)

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        calls.append("echo")
        return {"keys": sorted(body)}

    @app.post("/slow")
    async def slow(request: Request) -> Any:
        calls.append("slow")
        return await cancel_on_disconnect(request, asyncio.sleep(30))

    @app.get("/block")
    async def block() -> dict[str, bool]:
        calls.append("block")
        await asyncio.sleep(1.5)
        return {"done": True}

    return app


def assert_error(body: bytes | str, error_type: str) -> None:
    data = json.loads(body)
    assert data["error"]["type"] == error_type, data
    assert len(data["trace_id"]) == 32


# ------------------------------------------------------------------ ASGI, chunked bodies


async def chunks(n: int, size: int) -> AsyncIterator[bytes]:
    yield b'{"a": "'
    for _ in range(n):
        yield b"x" * size
    yield b'"}'


async def post_chunked(app: FastAPI, n: int, size: int) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
        return await client.post(
            "/echo", content=chunks(n, size), headers={"Content-Type": "application/json"}
        )


@pytest.mark.unit
async def test_a_chunked_body_over_the_limit_is_413() -> None:
    calls: list[str] = []
    r = await post_chunked(make_app(calls), n=10, size=1000)
    assert r.status_code == 413, r.text
    assert "content-length" not in r.request.headers  # it really was chunked
    assert_error(r.content, "payload_too_large")
    assert r.headers["connection"] == "close"
    assert calls == []


@pytest.mark.unit
async def test_a_chunked_body_under_the_limit_reaches_the_handler() -> None:
    calls: list[str] = []
    r = await post_chunked(make_app(calls), n=3, size=500)
    assert r.status_code == 200 and r.json() == {"keys": ["a"]} and calls == ["echo"]


async def asgi_call(
    app: FastAPI, path: str, headers: list[tuple[bytes, bytes]], messages: list[dict]
) -> tuple[int | None, bytes]:
    """Drive the app with the given receive messages (then wait for a disconnect); the
    response's status (None when nothing was sent) and body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 80),
    }
    queue = list(messages)
    sent: list[dict] = []

    async def receive() -> dict:
        if queue:
            message = queue.pop(0)
            if message.get("delay"):
                await asyncio.sleep(message["delay"])
            return {k: v for k, v in message.items() if k != "delay"}
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), None)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


JSON = (b"content-type", b"application/json")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("length", "status", "error_type"),
    [
        ("²", 400, "invalid_request"),  # str.isdigit() says yes, int() says no
        ("1" * 5000, 413, "payload_too_large"),  # past int()'s 4300-digit limit
        ("99999999999999999999", 413, "payload_too_large"),
        ("12abc", 400, "invalid_request"),
    ],
)
async def test_a_bad_content_length_is_the_callers_fault(length, status, error_type) -> None:
    calls: list[str] = []
    headers = [JSON, (b"content-length", length.encode("latin-1"))]
    got, body = await asgi_call(make_app(calls), "/echo", headers, [])
    assert got == status, body
    assert_error(body, error_type)
    assert calls == []


@pytest.mark.unit
async def test_a_client_that_goes_away_gets_a_499_in_the_error_shape() -> None:
    calls: list[str] = []
    messages = [
        {"type": "http.request", "body": b"{}", "more_body": False},
        {"type": "http.disconnect", "delay": 0.2},
    ]
    status, body = await asgi_call(make_app(calls), "/slow", [JSON], messages)
    assert status == 499 and calls == ["slow"]
    assert_error(body, "client_closed")


@pytest.mark.unit
async def test_a_client_that_goes_away_while_sending_its_body_is_not_served() -> None:
    calls: list[str] = []
    messages = [
        {"type": "http.request", "body": b'{"a"', "more_body": True},
        {"type": "http.disconnect"},
    ]
    status, _ = await asgi_call(make_app(calls), "/echo", [JSON], messages)
    assert status is None  # nobody to answer
    assert calls == []


# ------------------------------------------------------------------ live uvicorn


@contextmanager
def live(launcher: str, calls: list[str], **settings: Any) -> Iterator[int]:
    config = CommonSettings(
        host="127.0.0.1",
        port=free_port(),
        max_body_bytes=2048,
        body_read_timeout_s=0.5,
        header_read_timeout_s=0.5,
        **settings,
    )
    app = make_app(calls, config.http_limits())
    if launcher == "uvicorn":  # as `python -m uvicorn service.app:app` serves it
        uv = uvicorn.Config(app, host=config.host, port=config.port, log_level="warning")
    else:
        from services.serve import uvicorn_config

        uv = uvicorn_config(app, config, log_level="warning")
    with ServerThread(app, config=uv) as server:
        yield server.port


def exchange(port: int, data: bytes, wait_s: float = 8.0) -> tuple[bytes, float]:
    """Send `data`, read until the server closes (or `wait_s`); the reply and its time."""
    started = time.monotonic()
    out: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        try:
            sock.sendall(data)
            while chunk := sock.recv(65536):
                out.append(chunk)
        except TimeoutError:
            out.append(b"<no close>")
        except (ConnectionResetError, BrokenPipeError):
            pass
    return b"".join(out), time.monotonic() - started


def split(reply: bytes) -> tuple[int, bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


LAUNCHERS = ["uvicorn", "services.serve"]


@pytest.mark.integration
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_body_that_never_arrives_is_answered_408_and_closed(launcher) -> None:
    calls: list[str] = []
    with live(launcher, calls) as port:
        head = (
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        reply, took = exchange(port, head)
        assert not reply.endswith(b"<no close>"), reply
        status, body = split(reply)
        assert status == 408 and took < 5  # the bound is 0.5 s; generous for a busy box
        assert_error(body, "request_timeout")
        assert calls == []


@pytest.mark.integration
@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("size", [20_000, 1_000_000])
def test_large_headers_are_refused_before_the_handler(launcher, size) -> None:
    calls: list[str] = []
    with live(launcher, calls) as port:
        data = (
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\nX-Big: " + b"a" * size + b"\r\n\r\n{}"
        )
        reply, _ = exchange(port, data)
        assert not reply.endswith(b"<no close>")
        if reply:  # refused with a 431 in the error shape, or the connection just closed
            status, body = split(reply)
            assert status == 431
            assert_error(body, "request_header_too_large")
        assert calls == []
        # and a normal request on a new connection is served
        ok, _ = exchange(
            port,
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\nConnection: close\r\n\r\n{}",
        )
        assert split(ok)[0] == 200 and calls == ["echo"]


@pytest.mark.integration
def test_headers_that_never_finish_are_cut_off_by_the_launcher() -> None:
    calls: list[str] = []
    with live("services.serve", calls) as port:
        reply, took = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: 1")
        assert not reply.endswith(b"<no close>") and took < 5
        if reply:
            status, body = split(reply)
            assert status == 408
            assert_error(body, "request_timeout")
        # a connection that sends nothing at all is closed too
        reply, took = exchange(port, b"")
        assert not reply.endswith(b"<no close>") and took < 5


@pytest.mark.integration
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_requests_past_the_in_flight_limit_get_503_and_probes_still_answer(launcher) -> None:
    calls: list[str] = []
    with live(launcher, calls, max_in_flight=1) as port:
        base = f"http://127.0.0.1:{port}"

        async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                first = asyncio.create_task(client.get("/block"))
                await asyncio.sleep(0.5)
                second = await client.get("/block")
                health = await client.get("/healthz")
                return await first, second, health

        first, second, health = asyncio.run(scenario())
        assert first.status_code == 200
        assert second.status_code == 503 and int(second.headers["retry-after"]) >= 1
        assert_error(second.content, "overloaded")
        assert health.status_code == 200
        assert calls == ["block"]


@contextmanager
def served_like_reason_serve(tmp_path: Any, **env: str) -> Iterator[int]:
    """The verifier as `reason serve` (and `scripts/run.sh`, and the tests' Stack) runs it."""
    import os
    import subprocess

    from cli.main import service_command, stop_services, wait_ready

    port = free_port()
    child_env = {**os.environ, "VERIFIER_LOG_DIR": str(tmp_path), **env}
    proc = subprocess.Popen(service_command("verifier", "127.0.0.1", port), env=child_env)
    try:
        ready = wait_ready({"verifier": f"http://127.0.0.1:{port}"}, 30, {"verifier": proc})
        assert ready["verifier"]
        yield port
    finally:
        stop_services({"verifier": proc})


@pytest.mark.integration
def test_a_service_started_like_reason_serve_refuses_a_megabyte_of_headers(tmp_path) -> None:
    with served_like_reason_serve(tmp_path, VERIFIER_HEADER_READ_TIMEOUT_S="30") as port:
        big = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n"
        for tail in (b"\r\n", b"X-More: 1"):  # headers complete, and still arriving
            reply, took = exchange(port, big + tail, wait_s=8)
            assert not reply.endswith(b"<no close>") and took < 8
            if reply:  # a 431 in the error shape, or the connection just closed
                status, body = split(reply)
                assert status == 431
                assert_error(body, "request_header_too_large")
        ok, _ = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert split(ok)[0] == 200


@pytest.mark.integration
def test_a_service_started_like_reason_serve_cuts_off_headers_that_never_finish(
    tmp_path,
) -> None:
    with served_like_reason_serve(tmp_path, VERIFIER_HEADER_READ_TIMEOUT_S="0.5") as port:
        reply, took = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: 1", wait_s=8)
        assert not reply.endswith(b"<no close>") and took < 5
        if reply:
            status, body = split(reply)
            assert status == 408
            assert_error(body, "request_timeout")
