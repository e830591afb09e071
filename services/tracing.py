"""W3C trace context: parse, generate and forward `traceparent`.

The trace id of a request lives in a context variable for the duration of the request so
that log lines and outgoing calls pick it up without being passed it explicitly.
"""

from __future__ import annotations

import re
import secrets
from contextvars import ContextVar
from dataclasses import dataclass

_TRACEPARENT_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_HEX32_RE = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class TraceContext:
    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    request_id: str | None = None

    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-01"


_current: ContextVar[TraceContext | None] = ContextVar("trace_context", default=None)


def new_trace_id() -> str:
    return secrets.token_hex(16)


def new_span_id() -> str:
    return secrets.token_hex(8)


def parse_traceparent(header: str | None) -> tuple[str, str] | None:
    """Return (trace_id, parent_span_id) of a valid version-00 header, else None."""
    if not header or len(header) > 55:
        return None
    match = _TRACEPARENT_RE.match(header.strip().lower())
    if not match:
        return None
    trace_id, span_id, _flags = match.groups()
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id


def clean_request_id(header: str | None) -> str | None:
    """A client request id is kept only if short and made of safe characters."""
    if header and _REQUEST_ID_RE.match(header):
        return header
    return None


def context_from_headers(traceparent: str | None, request_id: str | None) -> TraceContext:
    rid = clean_request_id(request_id)
    parsed = parse_traceparent(traceparent)
    if parsed:
        trace_id, parent = parsed
    else:
        parent = None
        trace_id = rid.lower() if rid and _HEX32_RE.match(rid.lower()) else new_trace_id()
    return TraceContext(trace_id, new_span_id(), parent, rid)


def is_trace_id(value: object) -> bool:
    """A W3C trace id: 32 lowercase hex digits, not all zero (the id every log line and
    `X-Trace-Id` carries; the one definition the trace lookups check against)."""
    return isinstance(value, str) and bool(_HEX32_RE.fullmatch(value)) and value != "0" * 32


def current() -> TraceContext | None:
    return _current.get()


def current_trace_id() -> str:
    ctx = _current.get()
    return ctx.trace_id if ctx else ""


def activate(ctx: TraceContext) -> object:
    return _current.set(ctx)


def deactivate(token: object) -> None:
    _current.reset(token)  # type: ignore[arg-type]


def outgoing_headers() -> dict[str, str]:
    """Headers that carry the current trace to a downstream service."""
    ctx = _current.get()
    if ctx is None:
        return {}
    headers = {"traceparent": ctx.traceparent()}
    if ctx.request_id:
        headers["x-request-id"] = ctx.request_id
    return headers
