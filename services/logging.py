"""Logging configured once per process: ECS JSON lines to `logs/<service>.jsonl` and stdout.

On a terminal stdout gets a readable console rendering instead; the file always gets
ECS JSON. Every line carries `service.name` and, inside a request, `trace.id` and
`span.id` from the active trace context; on the orchestrator, with API keys configured,
every line of a request also carries its tenant (`labels.tenant`, bound by `bind_tenant`
with `structlog.contextvars`), which is what the trace lookup checks a caller against.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import Any, Literal

import structlog
from ecs_logging import StructlogFormatter
from structlog.typing import EventDict

from services import tracing

_ecs = StructlogFormatter()

# The ECS field that names the tenant of a request's lines: the tenant's name from
# ORCH_API_KEYS' values, never the key (orchestrator.traces reads it back).
TENANT_FIELD = "labels.tenant"


class _Sink:
    """Writes the ECS line to the service's log file and renders stdout's copy."""

    def __init__(self, path: Path | None, console: bool) -> None:
        self._lock = threading.Lock()
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8", buffering=1)
        self._console = structlog.dev.ConsoleRenderer(colors=True) if console else None

    def __call__(self, logger: Any, method: str, event_dict: EventDict) -> str:
        pretty = str(self._console(logger, method, dict(event_dict))) if self._console else None
        line = _ecs(logger, method, dict(event_dict))
        if self._file is not None:
            with self._lock:
                self._file.write(line + "\n")
        return pretty if pretty is not None else line

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


_sink: _Sink | None = None


def _add_trace(_: Any, __: str, event_dict: EventDict) -> EventDict:
    ctx = tracing.current()
    if ctx is not None:
        event_dict.setdefault("trace.id", ctx.trace_id)
        event_dict.setdefault("span.id", ctx.span_id)
        if ctx.parent_span_id:
            event_dict.setdefault("parent.id", ctx.parent_span_id)
    return event_dict


def bind_tenant(tenant: str) -> None:
    """Every later line of the current request (its context, and the tasks it starts)
    names `tenant`, the canonical request line included."""
    structlog.contextvars.bind_contextvars(**{TENANT_FIELD: tenant})


def _drop_none(_: Any, __: str, event_dict: EventDict) -> EventDict:
    return {k: v for k, v in event_dict.items() if v is not None}


def configure_logging(
    service_name: str,
    *,
    log_dir: Path | None = Path("logs"),
    level: str = "INFO",
    fmt: Literal["auto", "json", "console"] = "auto",
) -> None:
    global _sink
    if _sink is not None:
        _sink.close()
    console = fmt == "console" or (fmt == "auto" and sys.stdout.isatty())
    path = log_dir / f"{service_name}.jsonl" if log_dir is not None else None
    _sink = _Sink(path, console)

    def _service(_: Any, __: str, event_dict: EventDict) -> EventDict:
        event_dict.setdefault("service.name", service_name)
        return event_dict

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_trace,
            _service,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            _drop_none,
            _sink,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=False,
    )
    # Library loggers (uvicorn, httpx) go to stderr, warnings and above only.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=True)
