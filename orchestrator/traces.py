"""Read one request's log lines back: from the services' log files or from Elasticsearch.

Every service writes ECS JSON lines to `<log dir>/<service>.jsonl` (services.logging),
each line of a request carrying its `trace.id`; Filebeat ships the same lines to
Elasticsearch (compose profile `elk`). This module is the one owner of reading them
back: `GET /traces/{trace_id}` on the orchestrator (through `TraceReader`) and the
`reason trace` command both use it, and both show the lines as `build_view` nests them:
one span per service request, children under the span that called them.

Files: `read_trace` scans the `*.jsonl` files for the id (a byte search of each block
read, then a JSON parse of the lines that hold it). Each file is appended in time
order, so the first `limit` matching lines of every file hold the trace's earliest
`limit` lines. A scan is bounded: no line longer than `MAX_LINE_BYTES` is held (nor
read as part of the trace), and a scan past its `deadline_s` stops with
`TraceLookupError`. The files are never opened by a name from a request: the id is
only searched for.

Elasticsearch: a `term` filter on `trace.id` sorted by `@timestamp` (Elasticsearch
`_search` API). A trace normally fits in one page, answered by one request. When the
first page is full, the lookup starts again inside a point in time (PIT) and pages with
`search_after`: several lines of a request share a millisecond timestamp, so paging on
the timestamp alone could drop or repeat lines at a page boundary, and a PIT search
adds the `_shard_doc` tiebreaker that makes every sort key unique (Elasticsearch
reference, "Paginate search results"). The PIT is closed afterwards; if closing fails
it expires after its keep-alive. Every failure (connection refused, timeout, an error
status, a body that is not a search response, shard failures that would make the trace
silently incomplete) raises `TraceLookupError` with a message fit for a terminal.

Tenants: with API keys configured the orchestrator's lines of a request name its
tenant (`labels.tenant`, services.logging), and `GET /traces/{trace_id}` shows a caller
only its own requests (`tenant_lines`): the orchestrator spans whose lines name the
caller's tenant and no other, and the planner and verifier spans they called. A trace
id is chosen by whoever sends `traceparent`, so one trace may hold the requests of
several tenants: each sees its own and nothing of the others'. `reason trace` (an
operator reading the files or the cluster directly) sees every line.

What a log line holds is data, not markup: whoever shows it escapes it (the console
builds its DOM from text nodes).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Literal

import httpx

from services.logging import TENANT_FIELD
from services.schemas import TraceLine, TraceSpan, TraceView
from services.tracing import is_trace_id

__all__ = [
    "InvalidTraceId",
    "TraceLookupError",
    "TraceReader",
    "build_query",
    "build_view",
    "fetch_trace_lines",
    "flatten_ecs",
    "read_trace",
    "tenant_lines",
]

# Index names and patterns: lowercase, wildcards, comma-separated lists, remote
# clusters (`cluster:index`). Nothing that could change the URL path or query.
INDEX_RE = re.compile(r"[a-z0-9.*][a-z0-9_.*,:+-]{0,254}")
API_KEY_RE = re.compile(r"[A-Za-z0-9+/=_:.-]{1,4096}")

MAX_PAGE_SIZE = 10_000  # Elasticsearch's default index.max_result_window
PIT_KEEP_ALIVE = "1m"  # each page request renews it
# Spans nest this deep at most (a request's spans are two or three deep: orchestrator,
# then planner or verifier); a deeper chain of parent links is shown from its top.
MAX_SPAN_DEPTH = 32
# Reading the log files: the bytes read at once, the longest line kept (a longer one is
# not one of ours: services.logging writes a line of at most a few kilobytes, and a
# corrupt or foreign file must not be held in memory whole), and the scans of the files
# one orchestrator runs at once: each holds a thread of the event loop's default
# executor, which the SQL tool and the sandbox's source checks use too.
BLOCK_BYTES = 1 << 20
MAX_LINE_BYTES = 1 << 20
MAX_CONCURRENT_SCANS = 2
# The service whose lines name the tenant of a request (services.logging.bind_tenant).
TENANT_SERVICE = "orchestrator"


class TraceLookupError(Exception):
    """The trace could not be read from Elasticsearch."""


class InvalidTraceId(TraceLookupError, ValueError):
    """The argument is not a W3C trace id (32 lowercase hex digits, not all zero:
    services.tracing.is_trace_id)."""


def check_trace_id(trace_id: object) -> str:
    """`trace_id` when it is a trace id, else `InvalidTraceId` saying what one is."""
    if not isinstance(trace_id, str) or not is_trace_id(trace_id):
        if trace_id == "0" * 32:
            raise InvalidTraceId("the all-zero trace id is invalid (W3C trace context)")
        raise InvalidTraceId(
            f"not a trace id: {_shorten(trace_id)!r} (expected 32 lowercase hex digits)"
        )
    return trace_id


def _check_index_and_key(index: str, api_key: str | None) -> None:
    """Nothing that could change the request's path, query or headers."""
    if not INDEX_RE.fullmatch(index):
        raise TraceLookupError(f"not an index name or pattern: {_shorten(index)!r}")
    if api_key is not None and not API_KEY_RE.fullmatch(api_key):
        raise TraceLookupError("the Elasticsearch API key has characters it cannot have")


def build_query(trace_id: str, size: int) -> dict[str, Any]:
    """The `_search` body for one page of a trace, without pagination fields."""
    return {
        "size": size,
        "query": {"bool": {"filter": [{"term": {"trace.id": trace_id}}]}},
        "sort": [{"@timestamp": {"order": "asc"}}],
        "track_total_hits": False,
    }


def flatten_ecs(doc: Mapping[str, Any], *, prefix: str = "") -> dict[str, Any]:
    """Nested ECS objects to dotted keys: `{"trace": {"id": x}}` -> `{"trace.id": x}`.

    Keys that are already dotted (ecs-logging writes `log.level` that way, next to a
    nested `log` object) are kept and joined the same way, so a line read from a log
    file and the same line read back from Elasticsearch flatten to the same dict.
    Lists are values and are kept as they are.
    """
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten_ecs(value, prefix=name))
        else:
            flat[name] = value
    return flat


async def fetch_trace_lines(
    es_url: str,
    trace_id: str,
    *,
    index: str = "reason-logs-*",
    size: int = 1000,
    api_key: str | None = None,
    timeout_s: float = 10,
    max_lines: int = 100_000,
    paginate: bool = True,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[dict[str, Any]]:
    """Every log line of `trace_id` from Elasticsearch, oldest first, as `_source` dicts.

    `es_url` is the cluster's base URL (credentials may be given in it as
    `https://user:password@host:9200`, or as an encoded API key in `api_key`).
    `timeout_s` bounds each HTTP request. More than `max_lines` lines is refused rather
    than returned incomplete; with `paginate=False` the first page alone is returned
    (the earliest `size` lines: a caller that asks for one more than it shows knows
    whether there are more). `transport` replaces the network (tests).
    """
    check_trace_id(trace_id)
    _check_index_and_key(index, api_key)
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise TraceLookupError(f"size must be 1..{MAX_PAGE_SIZE}, got {size}")
    if timeout_s <= 0:
        raise TraceLookupError(f"timeout_s must be positive, got {timeout_s}")
    base = _base_url(es_url)
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"ApiKey {api_key}"

    async with httpx.AsyncClient(
        base_url=base,
        headers=headers,
        timeout=httpx.Timeout(timeout_s),
        transport=transport,
        follow_redirects=False,
    ) as client:
        body = build_query(trace_id, size)
        first = await _request(client, "POST", f"/{index}/_search", json=body)
        hits = _hits(first)
        if len(hits) < size or not paginate:
            return [_source(hit) for hit in hits]
        return await _paginate(client, index, body, size, max_lines)


async def _paginate(
    client: httpx.AsyncClient,
    index: str,
    body: dict[str, Any],
    size: int,
    max_lines: int,
) -> list[dict[str, Any]]:
    opened = await _request(client, "POST", f"/{index}/_pit", params={"keep_alive": PIT_KEEP_ALIVE})
    pit_id = opened.get("id")
    if not isinstance(pit_id, str) or not pit_id:
        raise TraceLookupError("Elasticsearch opened a point in time without an id")
    lines: list[dict[str, Any]] = []
    search_after: list[Any] | None = None
    try:
        while True:
            page_body = dict(body)
            page_body["pit"] = {"id": pit_id, "keep_alive": PIT_KEEP_ALIVE}
            if search_after is not None:
                page_body["search_after"] = search_after
            # With a PIT the index is part of the PIT, not of the path.
            page = await _request(client, "POST", "/_search", json=page_body)
            new_pit = page.get("pit_id")
            if isinstance(new_pit, str) and new_pit:
                pit_id = new_pit  # Elasticsearch may hand back a refreshed id
            hits = _hits(page)
            lines.extend(_source(hit) for hit in hits)
            if len(lines) > max_lines:
                raise TraceLookupError(
                    f"trace has more than {max_lines} log lines; refusing to return part of it"
                )
            if len(hits) < size:
                return lines
            last_sort = hits[-1].get("sort")
            if not isinstance(last_sort, list) or not last_sort:
                raise TraceLookupError("Elasticsearch returned a hit without sort values")
            if last_sort == search_after:
                raise TraceLookupError("Elasticsearch returned the same page twice")
            search_after = last_sort
    finally:
        await _close_pit(client, pit_id)


async def _close_pit(client: httpx.AsyncClient, pit_id: str) -> None:
    try:
        await client.request("DELETE", "/_pit", json={"id": pit_id})
    except httpx.HTTPError:
        pass  # the PIT expires after PIT_KEEP_ALIVE anyway


async def _request(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    *,
    json: Any = None,
    params: dict[str, str] | None = None,
) -> dict[str, Any]:
    where = _display_url(client.base_url)
    try:
        response = await client.request(method, path, json=json, params=params)
    except httpx.TimeoutException as exc:
        raise TraceLookupError(f"Elasticsearch at {where} did not answer in time") from exc
    except httpx.ConnectError as exc:
        raise TraceLookupError(f"cannot connect to Elasticsearch at {where}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise TraceLookupError(f"request to Elasticsearch at {where} failed: {exc}") from exc
    if response.status_code >= 400:
        raise TraceLookupError(
            f"Elasticsearch answered {response.status_code} to {method} {path}: "
            f"{_error_reason(response)}"
        )
    if response.status_code >= 300:
        raise TraceLookupError(
            f"Elasticsearch answered {response.status_code} (redirect) to {method} {path}; "
            "give the cluster's own URL"
        )
    try:
        data = response.json()
    except ValueError as exc:
        raise TraceLookupError(
            f"Elasticsearch answered {method} {path} with something that is not JSON: "
            f"{_shorten(response.text)!r}"
        ) from exc
    if not isinstance(data, dict):
        raise TraceLookupError(f"Elasticsearch answered {method} {path} with a non-object")
    return data


def _hits(page: dict[str, Any]) -> list[dict[str, Any]]:
    if page.get("timed_out") is True:
        raise TraceLookupError("the search timed out in Elasticsearch; the trace may be incomplete")
    shards = page.get("_shards")
    if isinstance(shards, dict) and isinstance(shards.get("failed"), int) and shards["failed"] > 0:
        reasons = [
            str(f.get("reason", {}).get("reason", f.get("reason")))
            for f in shards.get("failures", [])
            if isinstance(f, dict)
        ]
        detail = "; ".join(reasons[:3]) or "no reason given"
        raise TraceLookupError(
            f"{shards['failed']} of {shards.get('total', '?')} shards failed, "
            f"so the trace would be incomplete: {detail}"
        )
    outer = page.get("hits")
    inner = outer.get("hits") if isinstance(outer, dict) else None
    if not isinstance(inner, list) or not all(isinstance(h, dict) for h in inner):
        raise TraceLookupError(
            "Elasticsearch's answer has no hits.hits list; not a search response"
        )
    return inner


def _source(hit: dict[str, Any]) -> dict[str, Any]:
    source = hit.get("_source")
    if not isinstance(source, dict):
        raise TraceLookupError(
            f"hit {_shorten(str(hit.get('_id')))} has no _source; is _source disabled on the index?"
        )
    return source


def _error_reason(response: httpx.Response) -> str:
    """The `error.type: error.reason` of an Elasticsearch error body, or the raw text."""
    try:
        body = response.json()
    except ValueError:
        return _shorten(response.text) or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        kind = error.get("type", "error")
        reason = error.get("reason") or ""
        causes = error.get("root_cause")
        if not reason and isinstance(causes, list) and causes and isinstance(causes[0], dict):
            reason = causes[0].get("reason", "")
        return _shorten(f"{kind}: {reason}" if reason else str(kind))
    if isinstance(error, str):
        return _shorten(error)
    return _shorten(response.text) or response.reason_phrase


def _base_url(es_url: str) -> httpx.URL:
    try:
        url = httpx.URL(es_url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise TraceLookupError(f"not a URL: {_shorten(str(es_url))!r}") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise TraceLookupError(f"Elasticsearch URL must be http(s)://host[:port]: {url.host!r}")
    if url.query or url.fragment:
        raise TraceLookupError("Elasticsearch URL must not carry a query or fragment")
    # Keep a path prefix (a cluster behind a reverse proxy at /es), drop the trailing slash.
    return url.copy_with(path=url.path.rstrip("/") or "/")


def _display_url(url: httpx.URL) -> str:
    """The URL without credentials, for messages."""
    port = f":{url.port}" if url.port else ""
    path = url.path.rstrip("/")
    return f"{url.scheme}://{url.host}{port}{path}"


def _shorten(value: object, limit: int = 200) -> str:
    text = str(value).replace("\r", " ").replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


# --------------------------------------------------------------------------- log files


def read_trace(
    log_dir: Path,
    trace_id: str,
    *,
    limit: int | None = None,
    deadline_s: float | None = None,
) -> list[dict[str, Any]]:
    """Every log line of one trace from the services' log files (`*.jsonl`), flattened
    (`flatten_ecs`) and ordered by time; with `limit`, the earliest `limit` of them.
    `deadline_s` bounds the scan (seconds; past it, `TraceLookupError`)."""
    check_trace_id(trace_id)
    give_up = None if deadline_s is None else time.monotonic() + deadline_s

    def expired() -> None:
        if give_up is not None and time.monotonic() > give_up:
            raise TraceLookupError(
                f"reading the log files took longer than {deadline_s:g}s; the trace is not shown"
            )

    lines: list[dict[str, Any]] = []
    needle = trace_id.encode()
    for path in sorted(log_dir.glob("*.jsonl")):
        expired()
        found = 0
        try:
            f = path.open("rb")
        except OSError:
            continue  # a file rotated away between the listing and the open
        with f:
            for raw in _lines_with(f, needle, expired):
                try:
                    doc = json.loads(raw)
                except ValueError:
                    continue  # a line cut short by a crash, or not ours
                if not isinstance(doc, dict):
                    continue
                flat = flatten_ecs(doc)
                if flat.get("trace.id") != trace_id:
                    continue
                lines.append(flat)
                found += 1
                if limit is not None and found >= limit:
                    break  # the file is in time order: the rest are later
    lines.sort(key=_sort_key)
    return lines if limit is None else lines[:limit]


def _lines_with(f: BinaryIO, needle: bytes, expired: Callable[[], None]) -> Iterator[bytes]:
    """The lines of `f` that hold `needle`, read a block at a time; a line longer than
    `MAX_LINE_BYTES` is skipped without being held. `expired` is asked before each
    block (it raises when the scan has run out of time)."""
    tail = b""  # the start of a line the next block goes on with
    skipping = False  # inside a line too long to keep
    while True:
        expired()
        block = f.read(BLOCK_BYTES)
        if not block:
            break
        if skipping:
            newline = block.find(b"\n")
            if newline < 0:
                continue
            block, skipping = block[newline + 1 :], False
        data = tail + block
        last = data.rfind(b"\n")
        complete, tail = data[: last + 1], data[last + 1 :]
        if len(tail) > MAX_LINE_BYTES:
            tail, skipping = b"", True
        at = complete.find(needle)
        while at >= 0:
            begin = complete.rfind(b"\n", 0, at) + 1
            end = complete.find(b"\n", at)
            if end - begin <= MAX_LINE_BYTES:
                yield complete[begin:end]
            at = complete.find(needle, end + 1)
    if needle in tail:
        yield tail  # the last line, without its newline


def _sort_key(doc: Mapping[str, Any]) -> tuple[float, str]:
    return (_epoch(_time(doc)), str(doc.get("@timestamp")))


def _epoch(when: datetime | None) -> float:
    return when.timestamp() if when is not None else float("inf")  # no time: last


# --------------------------------------------------------------------------- spans


def _time(doc: Mapping[str, Any]) -> datetime | None:
    stamp = doc.get("@timestamp")
    if not isinstance(stamp, str) or len(stamp) > 40:
        return None
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return when if when.tzinfo is not None else None  # naive times cannot be compared


def _duration_ms(doc: Mapping[str, Any]) -> float | None:
    """ECS `event.duration` (nanoseconds) in ms; None when absent or not a number."""
    value = doc.get("event.duration")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return round(value / 1e6, 3)


def _text(value: Any, limit: int = 4000) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def _is_error(doc: Mapping[str, Any]) -> bool:
    status = doc.get("http.response.status_code")
    return (
        str(doc.get("log.level", "")).lower() in ("error", "critical")
        or bool(doc.get("error.message") or doc.get("error.type"))
        or (isinstance(status, int) and not isinstance(status, bool) and status >= 500)
    )


@dataclass
class _Span:
    span_id: str
    parent_id: str | None
    docs: list[dict[str, Any]]


def build_view(
    trace_id: str,
    docs: Iterable[Mapping[str, Any]],
    *,
    source: Literal["files", "elasticsearch"],
    truncated: bool = False,
) -> TraceView:
    """The trace's lines grouped by span (`span.id`), each span under its parent
    (`parent.id`) when that span is in the trace, with times relative to the trace's
    start. A span's start is its request line's time less its duration (the canonical
    request line is logged when the request ends), else its first line's. Parent links
    that would make a cycle are dropped (lines are data: they may say anything)."""
    ordered = sorted((flatten_ecs(d) for d in docs), key=_sort_key)
    spans: dict[str, _Span] = {}
    for doc in ordered:
        sid = _text(doc.get("span.id"), 64) or "-"
        span = spans.setdefault(sid, _Span(sid, None, []))
        span.docs.append(doc)
        parent = _text(doc.get("parent.id"), 64)
        if span.parent_id is None and parent and parent != sid:
            span.parent_id = parent
    parent_of: dict[str, str | None] = {}
    for sid, span in spans.items():
        p = span.parent_id if span.parent_id in spans else None
        seen = {sid}
        cursor = p
        while cursor is not None:  # would the link close a loop, or nest past all reason?
            if cursor in seen or len(seen) > MAX_SPAN_DEPTH:
                p = None
                break
            seen.add(cursor)
            cursor = parent_of.get(cursor)
        parent_of[sid] = p
    _bound_depth(parent_of)

    starts: dict[str, datetime | None] = {}
    ends: dict[str, datetime | None] = {}
    for sid, span in spans.items():
        times = [t for t in (_time(d) for d in span.docs) if t is not None]
        start = min(times, default=None)
        for d in span.docs:
            when, dur = _time(d), _duration_ms(d)
            if d.get("event.kind") == "request" and when is not None and dur is not None:
                begun = datetime.fromtimestamp(when.timestamp() - dur / 1000, tz=when.tzinfo)
                start = begun if start is None else min(start, begun)
        starts[sid], ends[sid] = start, max(times, default=None)
    known = [t for t in starts.values() if t is not None]
    t0 = min(known, default=None)
    t_end = max([t for t in ends.values() if t is not None], default=None)

    def offset(when: datetime | None) -> float | None:
        if when is None or t0 is None:
            return None
        return round((when - t0).total_seconds() * 1000, 3)

    def line(doc: dict[str, Any]) -> TraceLine:
        return TraceLine(
            timestamp=_text(doc.get("@timestamp"), 64),
            offset_ms=offset(_time(doc)),
            service=_text(doc.get("service.name"), 200),
            level=_text(doc.get("log.level"), 32),
            message=_text(doc.get("message")),
            duration_ms=_duration_ms(doc),
            error=_text(doc.get("error.message") or doc.get("error.type")),
            fields=doc,
        )

    def span_view(sid: str) -> TraceSpan:
        span = spans[sid]
        request = next((d for d in span.docs if d.get("event.kind") == "request"), None)
        duration = _duration_ms(request) if request is not None else None
        if duration is None and starts[sid] is not None and ends[sid] is not None:
            duration = offset(ends[sid]) - offset(starts[sid])  # type: ignore[operator]
        return TraceSpan(
            span_id=sid,
            parent_id=span.parent_id,
            service=next(
                (s for s in (_text(d.get("service.name"), 200) for d in span.docs) if s), None
            ),
            start_ms=offset(starts[sid]),
            duration_ms=None if duration is None else round(duration, 3),
            error=any(_is_error(d) for d in span.docs),
            lines=[line(d) for d in span.docs],
            children=[span_view(c) for c in children.get(sid, [])],
        )

    children: dict[str, list[str]] = {}
    for sid, p in parent_of.items():
        if p is not None:
            children.setdefault(p, []).append(sid)
    for kids in children.values():
        kids.sort(key=lambda c: _epoch(starts[c]))
    roots = [sid for sid, p in parent_of.items() if p is None]
    return TraceView(
        trace_id=trace_id,
        source=source,
        lines=len(ordered),
        truncated=truncated,
        started=t0.isoformat().replace("+00:00", "Z") if t0 is not None else None,
        duration_ms=offset(t_end) if t_end is not None else None,
        spans=[span_view(sid) for sid in roots],
    )


def _bound_depth(parent_of: dict[str, str | None]) -> None:
    """Cut the links (acyclic by now) that would nest a span more than MAX_SPAN_DEPTH
    deep: the span below the cut starts a tree of its own. The check as links are made
    sees only the spans already linked, so a chain listed from its bottom up would
    otherwise nest as deep as it is long (past the recursion limit of the view)."""
    depth: dict[str, int] = {}
    for sid in parent_of:
        chain: list[str] = []
        cursor: str | None = sid
        while cursor is not None and cursor not in depth:
            chain.append(cursor)
            cursor = parent_of[cursor]
        level = depth[cursor] if cursor is not None else 0
        for span in reversed(chain):  # from the top down
            level += 1
            if level > MAX_SPAN_DEPTH:
                parent_of[span], level = None, 1
            depth[span] = level


# --------------------------------------------------------------------------- tenants


def tenant_lines(docs: Iterable[Mapping[str, Any]], tenant: str) -> list[dict[str, Any]]:
    """The lines of `docs` (one trace) that belong to `tenant`'s requests, flattened.

    An orchestrator span is the tenant's when its lines name the tenant
    (`labels.tenant`) and no other; its lines that name none (written before the key
    was checked) are the span's all the same. Any other span (planner, verifier) is
    the tenant's when the nearest orchestrator span above it, by `parent.id`, is: the
    orchestrator is their only caller, and it is the one that sends them its span. A
    span that reaches no orchestrator span of the trace, or whose orchestrator lines
    name no tenant or several, is nobody's. A client can name any parent in its
    `traceparent`, but its request is its own orchestrator span: naming another's
    span as its parent puts nothing of that span in its view."""
    flat = [flatten_ecs(d) for d in docs]
    parent: dict[str, str] = {}
    named: dict[str, set[Any]] = {}  # orchestrator span -> the tenants its lines name
    for doc in flat:
        sid = doc.get("span.id")
        if not isinstance(sid, str):
            continue
        up = doc.get("parent.id")
        if isinstance(up, str) and up != sid:
            parent.setdefault(sid, up)
        if doc.get("service.name") == TENANT_SERVICE:
            tenants = named.setdefault(sid, set())
            if doc.get(TENANT_FIELD) is not None:
                tenants.add(doc.get(TENANT_FIELD))
    own = {sid for sid, tenants in named.items() if tenants == {tenant}}

    def owner_is_tenant(sid: str) -> bool:
        cursor: str | None = sid
        for _ in range(MAX_SPAN_DEPTH + 1):
            if cursor is None:
                return False
            if cursor in named:  # the nearest orchestrator span decides
                return cursor in own
            cursor = parent.get(cursor)
        return False

    keep = {sid for sid in {d.get("span.id") for d in flat} if isinstance(sid, str)}
    keep = {sid for sid in keep if owner_is_tenant(sid)}
    return [d for d in flat if d.get("span.id") in keep]


# --------------------------------------------------------------------------- reader


class TraceReader:
    """Reads a trace for `GET /traces/{trace_id}`: from Elasticsearch when `es_url` is
    set, else from the log files in `log_dir`; at most `max_lines` lines (the earliest),
    the view saying when there were more. The settings are checked here, at startup:
    a bad index name or API key fails the service's start, not every lookup."""

    def __init__(
        self,
        log_dir: Path,
        *,
        es_url: str | None = None,
        es_index: str = "reason-logs-*",
        es_api_key: str | None = None,
        timeout_s: float = 5.0,
        scan_timeout_s: float = 10.0,
        max_lines: int = 5000,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if es_url is not None:
            _base_url(es_url)
        _check_index_and_key(es_index, es_api_key)
        if not 1 <= max_lines < MAX_PAGE_SIZE:
            raise TraceLookupError(f"max_lines must be 1..{MAX_PAGE_SIZE - 1}, got {max_lines}")
        if scan_timeout_s <= 0:
            raise TraceLookupError(f"scan_timeout_s must be positive, got {scan_timeout_s}")
        self.scan_timeout_s = scan_timeout_s
        self._scans = asyncio.Semaphore(MAX_CONCURRENT_SCANS)
        self.log_dir = log_dir
        self.es_url = es_url
        self.es_index = es_index
        self._es_api_key = es_api_key
        self.timeout_s = timeout_s
        self.max_lines = max_lines
        self._transport = transport

    @property
    def source(self) -> Literal["files", "elasticsearch"]:
        return "elasticsearch" if self.es_url else "files"

    async def read(self, trace_id: str, *, tenant: str | None = None) -> TraceView | None:
        """The trace's view, or None when no line carries the id. With `tenant`, only the
        lines of that tenant's requests (`tenant_lines`), and None when it has none: a
        trace of others is as unknown as one nobody wrote. Raises `InvalidTraceId`, and
        `TraceLookupError` when Elasticsearch fails."""
        check_trace_id(trace_id)
        if self.es_url:
            docs = await fetch_trace_lines(
                self.es_url,
                trace_id,
                index=self.es_index,
                size=self.max_lines + 1,
                api_key=self._es_api_key,
                timeout_s=self.timeout_s,
                paginate=False,
                transport=self._transport,
            )
        else:
            docs = await self._scan(trace_id)
        truncated = len(docs) > self.max_lines
        docs = docs[: self.max_lines]
        if tenant is not None:
            docs = tenant_lines(docs, tenant)
        if not docs:
            return None
        return build_view(trace_id, docs, source=self.source, truncated=truncated)

    async def _scan(self, trace_id: str) -> list[dict[str, Any]]:
        """The files, read in a thread (a large log must not stall the event loop), at
        most `MAX_CONCURRENT_SCANS` at once, waiting and reading within
        `scan_timeout_s` together: a thread cannot be cancelled, so the scan itself
        stops at the deadline."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.scan_timeout_s):
                await self._scans.acquire()
        except TimeoutError:
            raise TraceLookupError(
                f"no scan of the log files could start within {self.scan_timeout_s:g}s "
                "(others are running)"
            ) from None
        try:
            left = self.scan_timeout_s - (time.monotonic() - started)
            return await asyncio.to_thread(
                read_trace,
                self.log_dir,
                trace_id,
                limit=self.max_lines + 1,
                deadline_s=max(left, 0.001),
            )
        finally:
            self._scans.release()
