"""Run one service under uvicorn with the HTTP front's limits from its settings.

    python -m services.serve orchestrator [--host H] [--port P]

The app's middleware (services.app) bounds each request once uvicorn has parsed its
headers: header bytes (431), body size (413) and body read time (408), requests in
flight (503). This launcher adds what only the server can bound, before any of that,
with uvicorn's httptools protocol (`GuardedHttpToolsProtocol`):

- the bytes of a request's line and headers while they arrive: httptools has no limit
  and uvicorn buffers whatever a client sends (h11 has `h11_max_incomplete_event_size`,
  set to the same bound for whoever picks h11). The bound is `2 * max_header_bytes`, so
  a request the app would refuse with 431 still reaches the app and gets its error
  body, while a megabyte of headers is refused (431, connection closed) as it arrives;
- the time a connection may take to send its line and headers, from connecting or from
  its first byte of a next request (`header_read_timeout_s`, 408 and closed): uvicorn
  has no such timeout, so a connection that never finished its headers was held forever;
- open connections plus running requests (`max_connections`, uvicorn's
  `limit_concurrency`), and the keep-alive timeout (`keep_alive_timeout_s`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # uvicorn[standard]

from services import tracing
from services.settings import (
    CommonSettings,
    OrchestratorSettings,
    PlannerSettings,
    VerifierSettings,
)

SETTINGS: dict[str, type[CommonSettings]] = {
    "planner": PlannerSettings,
    "verifier": VerifierSettings,
    "orchestrator": OrchestratorSettings,
}


def _error_response(status: int, reason: str, error_type: str, message: str) -> bytes:
    body = json.dumps(
        {
            "error": {"type": error_type, "message": message},
            "trace_id": tracing.context_from_headers(None, None).trace_id,
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bound on the bytes and the time of each
    request's line and headers (the limit is the config's
    `h11_max_incomplete_event_size`, the timeout `header_read_timeout_s`)."""

    header_read_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_limit = self.config.h11_max_incomplete_event_size or 65_536
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head_timer is None and self._between_requests():
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        if self._count(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._count(len(name) + len(value)):
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        if not self._refused:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _count(self, n: int) -> bool:
        self._head_bytes += n
        if self._head_bytes > self._head_limit and not self._refused:
            self._refuse(
                431,
                "Request Header Fields Too Large",
                "request_header_too_large",
                f"request line and headers exceed {self._head_limit} bytes",
            )
        return not self._refused

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_read_timeout_s, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._between_requests() and not self.transport.is_closing():
            self._refuse(
                408,
                "Request Timeout",
                "request_timeout",
                f"request headers did not arrive within {self.header_read_timeout_s:g}s",
            )

    def _refuse(self, status: int, reason: str, error_type: str, message: str) -> None:
        self._refused = True
        self._disarm()
        self.logger.warning("refused a request: %s", message)
        if not self.transport.is_closing():
            self.transport.write(_error_response(status, reason, error_type, message))
            self.transport.close()


def uvicorn_config(app: Any, settings: CommonSettings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn config of a service: its host, port and HTTP-front limits."""
    protocol = type(
        "GuardedHttpTools",
        (GuardedHttpToolsProtocol,),
        {"header_read_timeout_s": settings.header_read_timeout_s},
    )
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "http": protocol,
        "h11_max_incomplete_event_size": 2 * settings.max_header_bytes,
        "limit_concurrency": settings.max_connections,
        "timeout_keep_alive": settings.keep_alive_timeout_s,
        "access_log": False,
        "timeout_graceful_shutdown": 5,
        **overrides,
    }
    return uvicorn.Config(app, **options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("service", choices=sorted(SETTINGS))
    parser.add_argument("--host", help="default: the service's HOST setting")
    parser.add_argument("--port", type=int, help="default: the service's PORT setting")
    parser.add_argument("--timeout-graceful-shutdown", type=int, default=5)
    args = parser.parse_args(argv)
    settings = SETTINGS[args.service]()
    overrides: dict[str, Any] = {"timeout_graceful_shutdown": args.timeout_graceful_shutdown}
    if args.host:
        overrides["host"] = args.host
    if args.port:
        overrides["port"] = args.port
    uvicorn.Server(uvicorn_config(f"{args.service}.app:app", settings, **overrides)).run()


if __name__ == "__main__":
    main()
