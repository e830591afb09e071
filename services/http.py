"""HTTP client for calls between services: explicit timeouts, trace propagation, one
mapping of transport failures to `DependencyUnavailable`.

What another service answers is read like any untrusted input: within the call's time
budget in total (not per read), at most `max_response_bytes`, as strict JSON (no `NaN`
or `Infinity`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import structlog

from services import tracing
from services.errors import (
    DependencyUnavailable,
    InvalidRequest,
    PlanningFailed,
    ServiceError,
    Unplannable,
)

log = structlog.get_logger("http.client")


class UpstreamError(ServiceError):
    """The downstream service answered with an error body; its type and status are kept."""

    def __init__(self, service: str, status: int, error_type: str, message: str) -> None:
        super().__init__(f"{service}: {message}")
        self.status_code = status
        self.error_type = error_type
        self.service = service


MAX_RESPONSE_BYTES = 4_000_000
# A pooled connection is dropped after this much idle time, well inside the server's
# keep-alive (uvicorn closes an idle connection after 5 s). With the two equal, a request
# sent as the server's timer fires finds the connection closed under it.
KEEPALIVE_EXPIRY_S = 2.0
# What a keep-alive connection closed by the server as the request went out looks like.
_STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class ServiceClient:
    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        connect_timeout_s: float = 1.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
    ) -> None:
        self.name = name
        self._connect_timeout_s = connect_timeout_s
        self.max_response_bytes = max_response_bytes
        self._client = httpx.AsyncClient(
            base_url=base_url,
            timeout=httpx.Timeout(30.0, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=200,
                max_keepalive_connections=50,
                keepalive_expiry=keepalive_expiry_s,
            ),
        )

    async def post_json(self, path: str, body: dict[str, Any], *, timeout_s: float) -> Any:
        """POST JSON under `timeout_s` in total; raise `DependencyUnavailable` on transport
        failure, timeout or a 5xx, `UpstreamError` on a 4xx error body.

        A connection closed under the request (a keep-alive race, or a server restart) is
        retried once, on another connection, within the same `timeout_s`: the calls
        between the services (`/plan`, `/verify`) have no side effects.
        """
        return await self._call("POST", path, body, timeout_s)

    async def get_json(self, path: str, *, timeout_s: float) -> Any:
        """GET a JSON body, read and bounded as `post_json` reads its answer."""
        return await self._call("GET", path, None, timeout_s)

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float
    ) -> Any:
        started = time.perf_counter()
        timeout_s = max(timeout_s, 0.001)
        timeout = httpx.Timeout(timeout_s, connect=min(self._connect_timeout_s, timeout_s))
        try:
            # httpx's timeouts bound each read; this bounds the whole exchange
            async with asyncio.timeout(timeout_s):
                try:
                    status, content = await self._send(method, path, body, timeout)
                except _STALE_CONNECTION as exc:
                    log.warning(
                        f"{self.name} closed the connection under the request; retrying once",
                        **{
                            "event.action": f"call.{self.name}.retry",
                            "error.type": type(exc).__name__,
                        },
                    )
                    status, content = await self._send(method, path, body, timeout)
        except (httpx.TimeoutException, TimeoutError):
            raise DependencyUnavailable(
                f"{self.name} did not answer within {timeout_s:.2f}s", retry_after_s=2
            ) from None
        except httpx.HTTPError as exc:
            raise DependencyUnavailable(
                f"{self.name} is unreachable ({type(exc).__name__})", retry_after_s=5
            ) from None
        finally:
            log.debug(
                f"called {self.name}{path}",
                **{
                    "event.action": f"call.{self.name}",
                    "event.duration": int((time.perf_counter() - started) * 1e9),
                },
            )
        return self._decode(status, content)

    async def _send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        http_timeout: httpx.Timeout,
    ) -> tuple[int, bytes]:
        async with self._client.stream(
            method, path, json=body, headers=tracing.outgoing_headers(), timeout=http_timeout
        ) as response:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self.max_response_bytes:
                    raise DependencyUnavailable(
                        f"{self.name} answered with more than {self.max_response_bytes} bytes"
                    )
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)

    def _decode(self, status: int, content: bytes) -> Any:
        try:
            data = json.loads(content, parse_constant=_refuse_constant)
        except ValueError:
            data = None
        err = data.get("error") if isinstance(data, dict) else None
        err = err if isinstance(err, dict) else {}
        if status >= 400 and err.get("type") == PlanningFailed.error_type:
            # the question could not be planned: not the planner being down
            raise Unplannable(f"{self.name}: {str(err.get('message', 'no valid plan'))[:500]}")
        if status >= 500:
            message = _error_message(data) or f"HTTP {status}"
            raise DependencyUnavailable(f"{self.name} failed: {message}", retry_after_s=5)
        if status >= 400:
            if status in (400, 413, 422):
                raise InvalidRequest(
                    f"{self.name} refused the request: {err.get('message', status)}",
                    param=err.get("param"),
                )
            raise UpstreamError(
                self.name,
                status,
                str(err.get("type", "upstream_error")),
                str(err.get("message", f"HTTP {status}")),
            )
        if data is None:
            raise DependencyUnavailable(f"{self.name} answered with a non-JSON body")
        return data

    async def close(self) -> None:
        await self._client.aclose()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _error_message(data: Any) -> str | None:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("message"))
    return None
