"""Read one request's log lines back from Elasticsearch.

Filebeat ships the services' ECS JSON log lines to Elasticsearch (compose profile
`elk`); `reason trace <trace_id> --es URL` calls `fetch_trace_lines` to get the lines
of one trace, oldest first, and renders them with the same code as the local log files
after `flatten_ecs`.

The query is a `term` filter on `trace.id` sorted by `@timestamp` (Elasticsearch
`_search` API). A trace normally fits in one page, answered by one request. When the
first page is full, the lookup starts again inside a point in time (PIT) and pages with
`search_after`: several lines of a request share a millisecond timestamp, so paging on
the timestamp alone could drop or repeat lines at a page boundary, and a PIT search
adds the `_shard_doc` tiebreaker that makes every sort key unique (Elasticsearch
reference, "Paginate search results"). The PIT is closed afterwards; if closing fails
it expires after its keep-alive.

Every failure (connection refused, timeout, an error status, a body that is not a
search response, shard failures that would make the trace silently incomplete) raises
`TraceLookupError` with a message fit for a terminal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx

__all__ = [
    "InvalidTraceId",
    "TraceLookupError",
    "build_query",
    "fetch_trace_lines",
    "flatten_ecs",
]

TRACE_ID_RE = re.compile(r"[0-9a-f]{32}")
# Index names and patterns: lowercase, wildcards, comma-separated lists, remote
# clusters (`cluster:index`). Nothing that could change the URL path or query.
INDEX_RE = re.compile(r"[a-z0-9.*][a-z0-9_.*,:+-]{0,254}")
API_KEY_RE = re.compile(r"[A-Za-z0-9+/=_:.-]{1,4096}")

MAX_PAGE_SIZE = 10_000  # Elasticsearch's default index.max_result_window
PIT_KEEP_ALIVE = "1m"  # each page request renews it


class TraceLookupError(Exception):
    """The trace could not be read from Elasticsearch."""


class InvalidTraceId(TraceLookupError, ValueError):
    """The argument is not a W3C trace id (32 lowercase hex digits, not all zero)."""


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
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[dict[str, Any]]:
    """Every log line of `trace_id` from Elasticsearch, oldest first, as `_source` dicts.

    `es_url` is the cluster's base URL (credentials may be given in it as
    `https://user:password@host:9200`, or as an encoded API key in `api_key`).
    `timeout_s` bounds each HTTP request. More than `max_lines` lines is refused rather
    than returned incomplete. `transport` replaces the network (tests).
    """
    if not isinstance(trace_id, str) or not TRACE_ID_RE.fullmatch(trace_id):
        raise InvalidTraceId(
            f"not a trace id: {_shorten(trace_id)!r} (expected 32 lowercase hex digits)"
        )
    if trace_id == "0" * 32:
        raise InvalidTraceId("the all-zero trace id is invalid (W3C trace context)")
    if not INDEX_RE.fullmatch(index):
        raise TraceLookupError(f"not an index name or pattern: {_shorten(index)!r}")
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise TraceLookupError(f"size must be 1..{MAX_PAGE_SIZE}, got {size}")
    if timeout_s <= 0:
        raise TraceLookupError(f"timeout_s must be positive, got {timeout_s}")
    base = _base_url(es_url)
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if api_key is not None:
        if not API_KEY_RE.fullmatch(api_key):
            raise TraceLookupError("the Elasticsearch API key has characters it cannot have")
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
        if len(hits) < size:
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
