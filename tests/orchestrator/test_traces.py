"""Reading a trace back from the services' log files, and nesting its lines into spans
(orchestrator.traces: the one owner `GET /traces/{id}` and `reason trace` share)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import traces
from orchestrator.traces import (
    InvalidTraceId,
    TraceLookupError,
    TraceReader,
    build_view,
    read_trace,
    tenant_lines,
)

pytestmark = pytest.mark.unit

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OTHER = "0af7651916cd43dd8448eb211c80319c"


def line(
    at: str, service: str, span: str, message: str, trace: str = TRACE, **fields: Any
) -> dict[str, Any]:
    """One ECS line as services.logging writes it (nested objects, dotted `log.level`)."""
    doc: dict[str, Any] = {
        "@timestamp": f"2026-12-02T05:40:{at}Z",
        "log.level": fields.pop("level", "info"),
        "message": message,
        "ecs.version": "1.6.0",
        "service": {"name": service},
        "trace": {"id": trace},
        "span": {"id": span},
    }
    if "parent" in fields:
        doc["parent"] = {"id": fields.pop("parent")}
    if "duration_ns" in fields:
        doc["event"] = {"kind": "request", "duration": fields.pop("duration_ns")}
    if "error" in fields:
        doc["error"] = {"message": fields.pop("error")}
    doc.update(fields)
    return doc


def write(path: Path, *docs: dict[str, Any] | str) -> None:
    with path.open("a") as f:
        for doc in docs:
            f.write((doc if isinstance(doc, str) else json.dumps(doc)) + "\n")


REQUEST = [
    # the orchestrator's request line is written when its request ends
    line("00.020", "orchestrator", "o1", "plan drawn"),
    line("00.900", "orchestrator", "o1", "POST /reason 200", duration_ns=950_000_000),
    line("00.400", "planner", "p1", "POST /plan 200", parent="o1", duration_ns=300_000_000),
    line("00.850", "verifier", "v1", "model down", parent="o1", level="warning", error="boom"),
    line("00.860", "verifier", "v1", "POST /verify 503", parent="o1", duration_ns=10_000_000),
]


# REQUEST's messages, oldest first
IN_TIME_ORDER = [
    "plan drawn",
    "POST /plan 200",
    "model down",
    "POST /verify 503",
    "POST /reason 200",
]


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    write(tmp_path / "orchestrator.jsonl", REQUEST[0], line("00.500", "orchestrator", "x", "other", trace=OTHER), REQUEST[1])  # fmt: skip
    write(tmp_path / "planner.jsonl", "not json " + TRACE, '["' + TRACE + '"]', REQUEST[2])
    write(tmp_path / "verifier.jsonl", *REQUEST[3:], '{"trace": {"id": "' + TRACE + '"')  # cut
    write(tmp_path / "notes.txt", json.dumps(REQUEST[0]))  # not a log file
    return tmp_path


def test_every_line_of_the_trace_from_every_file_in_time_order(logs: Path) -> None:
    lines = read_trace(logs, TRACE)
    assert [ln["message"] for ln in lines] == IN_TIME_ORDER
    assert all(ln["trace.id"] == TRACE for ln in lines)  # flattened, the other trace left
    assert read_trace(logs, "1" * 32) == []


def test_a_limit_keeps_the_earliest_lines(logs: Path) -> None:
    write(logs / "planner.jsonl", line("00.990", "planner", "p2", "late", parent="o1"))
    messages = [ln["message"] for ln in read_trace(logs, TRACE, limit=2)]
    assert messages == ["plan drawn", "POST /plan 200"]


@pytest.mark.parametrize("bad", ["", "xyz", TRACE.upper(), TRACE + "\n", "0" * 32, TRACE[:-1]])
def test_only_a_trace_id_is_looked_up(logs: Path, bad: str) -> None:
    with pytest.raises(InvalidTraceId):
        read_trace(logs, bad)


def test_a_line_too_long_to_be_ours_is_skipped_and_the_lines_after_it_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(traces, "MAX_LINE_BYTES", 2000, raising=False)
    monkeypatch.setattr(traces, "BLOCK_BYTES", 700, raising=False)  # lines across blocks
    huge = {**line("00.010", "orchestrator", "o1", "huge"), "padding": "x" * 5000}
    write(
        tmp_path / "orchestrator.jsonl",
        huge,
        REQUEST[0],
        {**huge, "message": "long", "padding": "y" * 1500},  # within the bound
        huge,
        REQUEST[1],
    )
    with (tmp_path / "orchestrator.jsonl").open("a") as f:
        f.write(json.dumps(line("00.950", "orchestrator", "o1", "last")))  # no newline
    assert [ln["message"] for ln in read_trace(tmp_path, TRACE)] == [
        "long",
        "plan drawn",
        "POST /reason 200",
        "last",
    ]


def test_a_scan_past_its_deadline_stops_with_a_lookup_error(tmp_path: Path) -> None:
    write(tmp_path / "orchestrator.jsonl", *REQUEST)
    with pytest.raises(TraceLookupError, match="took longer than"):
        read_trace(tmp_path, TRACE, deadline_s=-1)
    assert len(read_trace(tmp_path, TRACE, deadline_s=30)) == 5


async def test_the_reader_gives_up_when_the_files_take_too_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def slow(log_dir: Path, trace_id: str, **kw: Any) -> list[dict[str, Any]]:
        assert kw["deadline_s"] <= 0.2  # the scan is told its time
        raise TraceLookupError("reading the log files took longer than 0.2s")

    monkeypatch.setattr(traces, "read_trace", slow)
    with pytest.raises(TraceLookupError, match="took longer"):
        await TraceReader(tmp_path, scan_timeout_s=0.2).read(TRACE)


async def test_only_so_many_scans_of_the_files_run_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, most = 0, 0
    lock = threading.Lock()

    def scan(log_dir: Path, trace_id: str, **kw: Any) -> list[dict[str, Any]]:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.1)
        with lock:
            running -= 1
        return list(REQUEST)

    monkeypatch.setattr(traces, "read_trace", scan)
    reader = TraceReader(tmp_path)
    views = await asyncio.gather(*(reader.read(TRACE) for _ in range(6)))
    assert all(v is not None and v.lines == 5 for v in views)
    assert most == 2  # the event loop's other threads stay free for the tools
    # a lookup that cannot start within its time is a lookup error, not a wait
    hurried = TraceReader(tmp_path, scan_timeout_s=0.05)
    results = await asyncio.gather(*(hurried.read(TRACE) for _ in range(4)), return_exceptions=True)
    assert any(isinstance(r, TraceLookupError) for r in results)


def test_spans_nest_under_their_caller_with_times_from_the_trace_start() -> None:
    view = build_view(TRACE, REQUEST, source="files")
    assert view.lines == 5 and view.source == "files" and not view.truncated
    (root,) = view.spans
    assert (root.span_id, root.service, root.parent_id) == ("o1", "orchestrator", None)
    # the request line's duration puts the span's start before its first line
    assert root.start_ms == 0.0 and root.duration_ms == 950.0
    assert view.started == "2026-12-02T05:39:59.950000Z" and view.duration_ms == 950.0
    assert [c.span_id for c in root.children] == ["p1", "v1"]  # in the order they began
    planner, verifier = root.children
    assert planner.start_ms == 150.0 and planner.duration_ms == 300.0 and not planner.error
    assert verifier.error is True and root.error is False
    warning = verifier.lines[0]
    assert (warning.level, warning.error, warning.offset_ms) == ("warning", "boom", 900.0)
    assert warning.fields["error.message"] == "boom"  # every field, flattened
    assert [ln.message for ln in root.lines] == ["plan drawn", "POST /reason 200"]


def test_a_5xx_request_line_marks_its_span_as_failed() -> None:
    doc = line("00.100", "orchestrator", "o1", "POST /reason 500", duration_ns=1_000_000)
    doc["http"] = {"response": {"status_code": 500}}
    assert build_view(TRACE, [doc], source="files").spans[0].error is True


def test_parent_links_that_loop_or_point_outside_the_trace_leave_a_root() -> None:
    docs = [
        line("00.100", "a", "s1", "one", parent="s2"),
        line("00.200", "b", "s2", "two", parent="s1"),
        line("00.300", "c", "s3", "three", parent="gone"),
        line("00.400", "d", "s4", "self", parent="s4"),
    ]
    view = build_view(TRACE, docs, source="files")
    roots = {s.span_id: s for s in view.spans}
    # the loop is cut at the link that would close it: one of the two is shown inside the other
    assert set(roots) == {"s2", "s3", "s4"}
    assert [c.span_id for c in roots["s2"].children] == ["s1"]
    assert roots["s2"].children[0].children == []
    assert roots["s3"].parent_id == "gone"  # said by the line, shown as a root
    assert roots["s4"].children == []
    assert sum(len(s.lines) for s in [*view.spans, roots["s2"].children[0]]) == 4


def test_a_chain_of_parents_nests_only_so_deep() -> None:
    docs = [line("00.100", "svc", "s0", "0")]
    docs += [line("00.100", "svc", f"s{k}", str(k), parent=f"s{k - 1}") for k in range(1, 200)]
    view = build_view(TRACE, docs, source="files")
    depth, spans = 0, view.spans
    while spans:
        depth += 1
        spans = spans[0].children
    assert 1 < depth <= 40
    assert view.model_dump_json()  # serialises without running out of stack


def test_a_chain_listed_from_its_bottom_up_nests_only_so_deep_too() -> None:
    # each line names a parent that has not been seen yet
    docs = [line("00.100", "svc", f"s{k}", str(k), parent=f"s{k + 1}") for k in range(1500)]
    docs.append(line("00.100", "svc", "s1500", "top"))
    view = build_view(TRACE, docs, source="files")

    def deepest(spans: list[Any]) -> int:
        return 1 + max((deepest(s.children) for s in spans), default=0) if spans else 0

    assert deepest(view.spans) <= 32
    assert view.lines == 1501 and view.model_dump_json()


def test_lines_without_a_readable_time_come_last_without_offsets() -> None:
    docs = [line("00.100", "svc", "s1", "timed"), {**line("00.000", "svc", "s1", "odd")}]
    docs[1]["@timestamp"] = "yesterday"
    view = build_view(TRACE, docs, source="files")
    assert [(ln.message, ln.offset_ms) for ln in view.spans[0].lines] == [
        ("timed", 0.0),
        ("odd", None),
    ]


async def test_the_reader_reads_files_and_says_when_there_are_more(logs: Path) -> None:
    view = await TraceReader(logs).read(TRACE)
    assert view is not None and view.lines == 5 and not view.truncated
    capped = await TraceReader(logs, max_lines=3).read(TRACE)
    assert capped is not None and capped.lines == 3 and capped.truncated
    assert await TraceReader(logs).read(OTHER) is not None
    assert await TraceReader(logs).read("2" * 32) is None


async def test_the_reader_asks_elasticsearch_for_one_page_of_one_more_than_it_shows() -> None:
    sent: list[dict[str, Any]] = []

    def cluster(request: httpx.Request) -> httpx.Response:
        sent.append({"path": request.url.path, **json.loads(request.content)})
        size = sent[-1]["size"]
        hits = [{"_source": d, "sort": [k]} for k, d in enumerate(REQUEST)][:size]
        return httpx.Response(200, json={"timed_out": False, "hits": {"hits": hits}})

    reader = TraceReader(
        Path("/nonexistent"),
        es_url="http://es.example:9200",
        max_lines=3,
        transport=httpx.MockTransport(cluster),
    )
    view = await reader.read(TRACE)
    assert len(sent) == 1  # a full page is not paged through: it is cut
    assert sent[0]["path"] == "/reason-logs-*/_search" and sent[0]["size"] == 4
    assert view is not None and view.source == "elasticsearch"
    assert view.lines == 3 and view.truncated


async def test_an_unreachable_elasticsearch_is_a_lookup_error() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    reader = TraceReader(
        Path("."), es_url="http://es.example:9200", transport=httpx.MockTransport(down)
    )
    with pytest.raises(TraceLookupError, match="cannot connect"):
        await reader.read(TRACE)


def tagged(doc: dict[str, Any], tenant: str) -> dict[str, Any]:
    """`doc` as the orchestrator writes it with API keys: naming its request's tenant."""
    return {**doc, "labels": {**doc.get("labels", {}), "tenant": tenant}}


# one trace id, used by two tenants: team-a's request (o1, calling p1 and v1), then
# team-b's (o2, calling p2), which named team-a's span as its parent in `traceparent`;
# a request refused before its key was read (o3, names no tenant); a planner span whose
# caller is not in the trace (p9); an orchestrator span naming two tenants (o4)
SHARED = [
    REQUEST[0],  # o1's first line, written before the line that names the tenant
    tagged(REQUEST[1], "team-a"),
    *REQUEST[2:],
    tagged(line("01.000", "orchestrator", "o2", "POST /reason 200", parent="o1"), "team-b"),
    line("01.100", "planner", "p2", "POST /plan 200", parent="o2"),
    line("01.200", "orchestrator", "o3", "POST /reason 401"),
    line("01.300", "planner", "p9", "POST /plan 200", parent="gone"),
    tagged(line("01.400", "orchestrator", "o4", "one"), "team-a"),
    tagged(line("01.500", "orchestrator", "o4", "two"), "team-b"),
]


def spans_of(docs: list[dict[str, Any]]) -> list[str]:
    return sorted({d["span.id"] for d in docs})


def test_a_tenant_sees_its_own_requests_and_what_they_called_only() -> None:
    mine = tenant_lines(SHARED, "team-a")
    assert spans_of(mine) == ["o1", "p1", "v1"]
    assert [d["message"] for d in mine] == [d["message"] for d in REQUEST]  # all five
    theirs = tenant_lines(SHARED, "team-b")
    assert spans_of(theirs) == ["o2", "p2"]  # naming o1 as its parent showed none of o1
    assert not any(d.get("labels.tenant") == "team-a" for d in theirs)
    assert tenant_lines(SHARED, "team-c") == []
    assert tenant_lines(REQUEST, "team-a") == []  # lines that name no tenant: nobody's
    # team-b's request is a root of its own view: its parent is not in it
    view = build_view(TRACE, theirs, source="files")
    assert [(s.span_id, s.parent_id, [c.span_id for c in s.children]) for s in view.spans] == [
        ("o2", "o1", ["p2"])
    ]


def test_a_chain_of_callees_that_loops_belongs_to_nobody() -> None:
    docs = [
        tagged(line("00.100", "orchestrator", "o1", "POST /reason 200"), "team-a"),
        line("00.200", "planner", "p1", "x", parent="p2"),
        line("00.300", "planner", "p2", "y", parent="p1"),
    ]
    assert spans_of(tenant_lines(docs, "team-a")) == ["o1"]


async def test_the_reader_shows_a_tenant_its_lines_and_none_when_it_has_none(
    tmp_path: Path,
) -> None:
    for doc in SHARED:
        write(tmp_path / f"{doc['service']['name']}.jsonl", doc)
    reader = TraceReader(tmp_path)
    everything = await reader.read(TRACE)
    assert everything is not None and everything.lines == len(SHARED)
    mine = await reader.read(TRACE, tenant="team-a")
    assert mine is not None and mine.lines == 5
    assert [s.span_id for s in mine.spans] == ["o1"]
    assert await reader.read(TRACE, tenant="team-c") is None  # as unknown as "2" * 32
    assert await reader.read("2" * 32, tenant="team-a") is None


@pytest.mark.parametrize(
    "kw",
    [
        {"es_url": "ftp://es.example"},
        {"es_index": "logs/../_all"},
        {"es_api_key": "bad key\n"},
        {"max_lines": 0},
        {"max_lines": 10_000},
    ],
)
def test_the_reader_refuses_bad_settings_at_startup(kw: dict[str, Any]) -> None:
    with pytest.raises(TraceLookupError):
        TraceReader(Path("."), **kw)
