"""The Elasticsearch trace lookup against recorded responses of the `_search` API.

The fixtures in `fixtures/` follow Elasticsearch 8's documented response bodies for
`POST /<index>/_search`, `POST /<index>/_pit` and `DELETE /_pit`, including its error
bodies. A fake cluster (httpx.MockTransport) serves them and checks every request the
lookup sends, so both sides of the protocol are asserted.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.traces import (
    InvalidTraceId,
    TraceLookupError,
    build_query,
    fetch_trace_lines,
    flatten_ecs,
)

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent / "fixtures" / "es"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
ES = "http://es.example:9200"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


class FakeCluster:
    """Answers with queued (status, body) pairs and records each request."""

    def __init__(self, *answers: tuple[int, Any]) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if not self.answers:
            raise AssertionError(f"unexpected request {request.method} {request.url}")
        status, body = self.answers.pop(0)
        if isinstance(body, (bytes, str)):
            return httpx.Response(status, content=body, headers={"content-type": "text/plain"})
        return httpx.Response(status, json=body)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)

    def body(self, i: int) -> dict[str, Any]:
        return json.loads(self.requests[i].content)


async def test_single_page_is_one_request_with_term_query_sorted_by_time() -> None:
    cluster = FakeCluster((200, fixture("search_single_page.json")))
    lines = await fetch_trace_lines(ES, TRACE, transport=cluster.transport)

    assert len(cluster.requests) == 1
    request = cluster.requests[0]
    assert request.method == "POST"
    assert request.url.path == "/reason-logs-*/_search"
    body = cluster.body(0)
    assert body["query"] == {"bool": {"filter": [{"term": {"trace.id": TRACE}}]}}
    assert body["sort"] == [{"@timestamp": {"order": "asc"}}]
    assert body["size"] == 1000
    assert "search_after" not in body and "pit" not in body
    assert "authorization" not in request.headers

    assert [line["service"]["name"] for line in lines] == [
        "orchestrator",
        "planner",
        "planner",
        "orchestrator",
        "orchestrator",
        "verifier",
        "orchestrator",
    ]
    assert all(line["trace"]["id"] == TRACE for line in lines)
    stamps = [line["@timestamp"] for line in lines]
    assert stamps == sorted(stamps)
    # _source documents are returned as they are, not the hit envelopes
    assert "_index" not in lines[0] and "sort" not in lines[0]


async def test_full_first_page_pages_through_a_point_in_time_with_search_after() -> None:
    page1, page2, page3 = (
        fixture("search_pit_page1.json"),
        fixture("search_pit_page2.json"),
        fixture("search_pit_page3.json"),
    )
    cluster = FakeCluster(
        (200, fixture("search_first_page_full.json")),
        (200, fixture("pit_open.json")),
        (200, page1),
        (200, page2),
        (200, page3),
        (200, fixture("pit_close.json")),
    )
    lines = await fetch_trace_lines(
        ES, TRACE, index="reason-logs-2025.03.14", size=3, transport=cluster.transport
    )

    methods_paths = [(r.method, r.url.path) for r in cluster.requests]
    assert methods_paths == [
        ("POST", "/reason-logs-2025.03.14/_search"),
        ("POST", "/reason-logs-2025.03.14/_pit"),
        ("POST", "/_search"),
        ("POST", "/_search"),
        ("POST", "/_search"),
        ("DELETE", "/_pit"),
    ]
    assert cluster.requests[1].url.params["keep_alive"] == "1m"
    opened_id = fixture("pit_open.json")["id"]

    first = cluster.body(2)
    assert first["pit"]["id"] == opened_id
    assert "search_after" not in first
    assert first["query"]["bool"]["filter"] == [{"term": {"trace.id": TRACE}}]
    second = cluster.body(3)
    # search_after carries the last hit's sort values, _shard_doc tiebreaker included
    assert second["search_after"] == page1["hits"]["hits"][-1]["sort"]
    assert second["pit"]["id"] == page1["pit_id"]
    third = cluster.body(4)
    assert third["search_after"] == page2["hits"]["hits"][-1]["sort"]
    # the refreshed PIT id from the previous page is the one used, and closed
    assert third["pit"]["id"] == page2["pit_id"] != opened_id
    assert cluster.body(5) == {"id": page3["pit_id"]}

    assert len(lines) == 7
    # every line once, in time order, across the three pages
    expected = fixture("search_single_page.json")["hits"]["hits"]
    assert lines == [hit["_source"] for hit in expected]


async def test_pit_is_closed_when_a_page_fails() -> None:
    cluster = FakeCluster(
        (200, fixture("search_first_page_full.json")),
        (200, fixture("pit_open.json")),
        (200, fixture("search_pit_page1.json")),
        (503, fixture("error_search_phase_503.json")),
        (200, fixture("pit_close.json")),
    )
    with pytest.raises(TraceLookupError, match=r"503.*search_phase_execution_exception"):
        await fetch_trace_lines(ES, TRACE, size=3, transport=cluster.transport)
    assert (cluster.requests[-1].method, cluster.requests[-1].url.path) == ("DELETE", "/_pit")


async def test_max_lines_refuses_a_partial_trace() -> None:
    cluster = FakeCluster(
        (200, fixture("search_first_page_full.json")),
        (200, fixture("pit_open.json")),
        (200, fixture("search_pit_page1.json")),
        (200, fixture("search_pit_page2.json")),
        (200, fixture("pit_close.json")),
    )
    with pytest.raises(TraceLookupError, match="more than 5 log lines"):
        await fetch_trace_lines(ES, TRACE, size=3, max_lines=5, transport=cluster.transport)


async def test_a_page_repeated_by_the_server_stops_instead_of_looping() -> None:
    page = fixture("search_pit_page1.json")
    cluster = FakeCluster(
        (200, fixture("search_first_page_full.json")),
        (200, fixture("pit_open.json")),
        (200, page),
        (200, page),
        (200, fixture("pit_close.json")),
    )
    with pytest.raises(TraceLookupError, match="same page twice"):
        await fetch_trace_lines(ES, TRACE, size=3, transport=cluster.transport)


async def test_empty_result_and_api_key_header() -> None:
    cluster = FakeCluster((200, fixture("search_empty.json")))
    lines = await fetch_trace_lines(
        "https://es.example:9243/",
        TRACE,
        api_key="VnVhQ2ZHY0JDZGJrUW0tZTVhT3g6dWkybHAyYXhUTm1zeWFrdzl0dk5udw==",
        transport=cluster.transport,
    )
    assert lines == []
    headers = cluster.requests[0].headers
    assert headers["authorization"].startswith("ApiKey VnVhQ2ZH")
    assert cluster.requests[0].url.scheme == "https"


async def test_path_prefix_of_a_proxied_cluster_is_kept() -> None:
    cluster = FakeCluster((200, fixture("search_empty.json")))
    await fetch_trace_lines("http://gw.example/es/", TRACE, transport=cluster.transport)
    assert cluster.requests[0].url.path == "/es/reason-logs-*/_search"


@pytest.mark.parametrize(
    ("status", "name", "pattern"),
    [
        (404, "error_index_not_found.json", r"404 .*index_not_found_exception: no such index"),
        (401, "error_security_401.json", r"401 .*security_exception: unable to authenticate"),
        (503, "error_search_phase_503.json", r"503 .*all shards failed"),
        (400, "error_field_not_sortable_400.json", r"400 .*search_phase_execution_exception"),
    ],
)
async def test_error_statuses_raise_with_elasticsearch_reason(
    status: int, name: str, pattern: str
) -> None:
    cluster = FakeCluster((status, fixture(name)))
    with pytest.raises(TraceLookupError, match=pattern):
        await fetch_trace_lines(ES, TRACE, transport=cluster.transport)


@pytest.mark.parametrize(
    ("answer", "pattern"),
    [
        ((200, fixture("search_shard_failure.json")), r"1 of 2 shards failed.*Node not connected"),
        ((200, fixture("search_timed_out.json")), "timed out"),
        ((200, "<html>gateway</html>"), "not JSON"),
        ((200, [1, 2]), "non-object"),
        ((200, {"acknowledged": True}), "no hits.hits"),
        ((200, {"hits": {"hits": [{"_id": "x"}]}}), "no _source"),
        ((502, "Bad Gateway"), "502 .*Bad Gateway"),
        ((301, ""), "redirect"),
    ],
)
async def test_malformed_or_partial_answers_raise(answer: tuple[int, Any], pattern: str) -> None:
    cluster = FakeCluster(answer)
    with pytest.raises(TraceLookupError, match=pattern):
        await fetch_trace_lines(ES, TRACE, transport=cluster.transport)


async def test_pit_without_sort_values_raises() -> None:
    page = fixture("search_pit_page1.json")
    for hit in page["hits"]["hits"]:
        del hit["sort"]
    cluster = FakeCluster(
        (200, fixture("search_first_page_full.json")),
        (200, fixture("pit_open.json")),
        (200, page),
        (200, fixture("pit_close.json")),
    )
    with pytest.raises(TraceLookupError, match="without sort values"):
        await fetch_trace_lines(ES, TRACE, size=3, transport=cluster.transport)


@pytest.mark.parametrize(
    "bad",
    [
        "4BF92F3577B34DA6A3CE929D0E0E4736",  # upper case
        "4bf92f3577b34da6a3ce929d0e0e473",  # 31 digits
        "4bf92f3577b34da6a3ce929d0e0e47366",
        "00000000000000000000000000000000",
        "4bf92f3577b34da6a3ce929d0e0e473g",
        '4bf92f3577b34da6" OR "1"="1aaaaa',
        "4bf92f3577b34da6a3ce929d0e0e4736\n",
        "",
    ],
)
async def test_invalid_trace_ids_never_reach_the_cluster(bad: str) -> None:
    cluster = FakeCluster()
    with pytest.raises(InvalidTraceId):
        await fetch_trace_lines(ES, bad, transport=cluster.transport)
    assert cluster.requests == []


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"index": "logs/../_cluster"}, "index"),
        ({"index": "logs?x=1"}, "index"),
        ({"size": 0}, "size"),
        ({"size": 10_001}, "size"),
        ({"api_key": "abc\r\nX-Evil: 1"}, "API key"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
async def test_bad_arguments_are_refused_before_any_request(
    kwargs: dict[str, Any], pattern: str
) -> None:
    cluster = FakeCluster()
    with pytest.raises(TraceLookupError, match=pattern):
        await fetch_trace_lines(ES, TRACE, transport=cluster.transport, **kwargs)
    assert cluster.requests == []


@pytest.mark.parametrize("url", ["es.example:9200", "ftp://es.example", "http://es?x=1", "http://"])
async def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(TraceLookupError):
        await fetch_trace_lines(url, TRACE, transport=FakeCluster().transport)


async def test_connection_refused_is_a_lookup_error_without_credentials() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # nothing listens on the port now
    with pytest.raises(TraceLookupError, match="cannot connect") as info:
        await fetch_trace_lines(f"http://elastic:s3cret@127.0.0.1:{port}", TRACE, timeout_s=2)
    assert "s3cret" not in str(info.value)
    assert f"127.0.0.1:{port}" in str(info.value)


async def test_a_server_that_never_answers_times_out() -> None:
    accepted = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read(1 << 16)  # read the request, answer nothing
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(TraceLookupError, match="did not answer in time"):
            await fetch_trace_lines(f"http://127.0.0.1:{port}", TRACE, timeout_s=0.3)
        assert accepted.is_set()
    finally:
        server.close()


async def test_real_http_round_trip_with_a_tiny_server() -> None:
    """The recorded single-page answer served over a real socket."""
    payload = (FIXTURES / "search_single_page.json").read_bytes()
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        seen.append(head + await reader.readexactly(length))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        lines = await fetch_trace_lines(f"http://127.0.0.1:{port}", TRACE, timeout_s=5)
    finally:
        server.close()
    assert len(lines) == 7
    assert seen[0].startswith(b"POST /reason-logs-*/_search HTTP/1.1")
    assert json.loads(seen[0].split(b"\r\n\r\n", 1)[1]) == build_query(TRACE, 1000)


def test_flatten_nested_and_dotted_give_the_same_keys() -> None:
    from_es = fixture("search_single_page.json")["hits"]["hits"][2]["_source"]
    flat = flatten_ecs(from_es)
    assert flat["trace.id"] == TRACE
    assert flat["service.name"] == "planner"
    assert flat["log.level"] == "info"
    assert flat["event.duration"] == 812000000
    assert flat["labels.input_hash"] == "9f2c1a"
    assert not any(isinstance(v, dict) for v in flat.values())

    # ecs-logging writes log.level and ecs.version dotted next to nested objects
    from_file = {
        "@timestamp": "2025-03-14T09:26:53.104Z",
        "log.level": "info",
        "message": "plan",
        "ecs.version": "1.6.0",
        "log": {"logger": "planner.app"},
        "service": {"name": "planner"},
        "trace": {"id": TRACE},
        "labels": {"tags": ["a", "b"]},
        "error": {},
    }
    flat_file = flatten_ecs(from_file)
    assert flat_file == {
        "@timestamp": "2025-03-14T09:26:53.104Z",
        "log.level": "info",
        "message": "plan",
        "ecs.version": "1.6.0",
        "log.logger": "planner.app",
        "service.name": "planner",
        "trace.id": TRACE,
        "labels.tags": ["a", "b"],
        "error": {},
    }
    for key in ("log.level", "ecs.version", "service.name", "trace.id", "log.logger"):
        assert flat[key] == flat_file[key]
