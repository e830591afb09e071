"""The client for calls between services reads another service's answer like untrusted
input (bounded in size and in total time, strict JSON), retries once a connection that
was closed under the request, and tells "cannot plan this" from "the planner is down"."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from structlog.testing import capture_logs

from services.errors import DependencyUnavailable, Unplannable
from services.http import ServiceClient

pytestmark = [pytest.mark.unit]

Handler = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)


def response(body: bytes, status: str = "200 OK") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def answering(body: bytes, status: str = "200 OK") -> Handler:
    async def handler(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response(body, status))
        await writer.drain()

    return handler


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[str]:
    """A raw HTTP server on 127.0.0.1; `handler` gets the connection's number."""
    count = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        try:
            await handler(count, reader, writer)
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.close()


async def test_a_connection_closed_under_the_request_is_retried_once() -> None:
    async def handler(n: int, reader, writer) -> None:
        await read_request(reader)
        if n == 1:
            return  # closes without answering, as a server whose keep-alive just expired
        writer.write(response(b'{"ok": true}'))
        await writer.drain()

    async with server(handler) as url:
        client = ServiceClient("planner", url)
        try:
            with capture_logs() as logs:
                assert await client.post_json("/plan", {"q": 1}, timeout_s=5) == {"ok": True}
        finally:
            await client.close()
    assert any("retrying once" in e["event"] for e in logs)


async def test_a_server_that_keeps_closing_is_unavailable_after_one_retry() -> None:
    attempts = 0

    async def handler(n: int, reader, writer) -> None:
        nonlocal attempts
        attempts += 1
        await read_request(reader)

    async with server(handler) as url:
        client = ServiceClient("planner", url)
        try:
            with pytest.raises(DependencyUnavailable, match="unreachable"):
                await client.post_json("/plan", {}, timeout_s=5)
        finally:
            await client.close()
    assert attempts == 2


async def test_an_oversized_answer_is_refused() -> None:
    big = json.dumps({"plans": ["x" * 5_000_000]}).encode()
    async with server(answering(big)) as url:
        client = ServiceClient("planner", url)
        try:
            with pytest.raises(DependencyUnavailable, match="more than 4000000 bytes"):
                await client.post_json("/plan", {}, timeout_s=5)
        finally:
            await client.close()


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
async def test_json_constants_that_are_not_json_are_refused(literal: bytes) -> None:
    async with server(answering(b'{"confidence": ' + literal + b"}")) as url:
        client = ServiceClient("verifier", url)
        try:
            with pytest.raises(DependencyUnavailable, match="non-JSON"):
                await client.post_json("/verify", {}, timeout_s=5)
        finally:
            await client.close()


async def test_a_trickling_answer_is_bounded_by_the_total_timeout() -> None:
    body = b'{"ok": "' + b"x" * 20 + b'"}'

    async def handler(n: int, reader, writer) -> None:
        await read_request(reader)
        writer.write(response(body)[: -len(body)])
        for i in range(len(body)):  # a byte every 0.2 s: each read is quick, the whole is not
            writer.write(body[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0.2)

    async with server(handler) as url:
        client = ServiceClient("planner", url)
        try:
            started = time.monotonic()
            with pytest.raises(DependencyUnavailable, match=r"did not answer within 1\.00s"):
                await client.post_json("/plan", {}, timeout_s=1.0)
            assert time.monotonic() - started < 3  # the trickle takes 4.8 s
        finally:
            await client.close()


@pytest.mark.parametrize("status", ["502 Bad Gateway", "422 Unprocessable Content"])
async def test_planning_failed_is_unplannable_not_unavailable(status: str) -> None:
    error = {"error": {"type": "planning_failed", "message": "no valid plan"}, "trace_id": "0" * 32}
    async with server(answering(json.dumps(error).encode(), status)) as url:
        client = ServiceClient("planner", url)
        try:
            with pytest.raises(Unplannable, match="no valid plan") as info:
                await client.post_json("/plan", {}, timeout_s=5)
        finally:
            await client.close()
    assert info.value.status_code == 422 and info.value.retry_after_s is None


async def test_get_json_reads_an_answer_as_post_json_does() -> None:
    requests: list[bytes] = []

    async def handler(n: int, reader, writer) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        body = b'{"model": "m"}' if n == 1 else b'{"model": NaN}'
        writer.write(response(body))
        await writer.drain()

    async with server(handler) as url:
        client = ServiceClient("planner", url)
        try:
            assert await client.get_json("/info", timeout_s=5) == {"model": "m"}
            with pytest.raises(DependencyUnavailable, match="non-JSON"):
                await client.get_json("/info", timeout_s=5)
        finally:
            await client.close()
    assert requests[0].startswith(b"GET /info HTTP/1.1")
    assert b"content-length" not in requests[0].lower()
