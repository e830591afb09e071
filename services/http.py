"""HTTP client for calls between services: explicit timeouts, trace propagation, one
mapping of transport failures to `DependencyUnavailable`."""

from __future__ import annotations

import time
from typing import Any

import httpx
import structlog

from services import tracing
from services.errors import DependencyUnavailable, InvalidRequest, ServiceError

log = structlog.get_logger("http.client")


class UpstreamError(ServiceError):
    """The downstream service answered with an error body; its type and status are kept."""

    def __init__(self, service: str, status: int, error_type: str, message: str) -> None:
        super().__init__(f"{service}: {message}")
        self.status_code = status
        self.error_type = error_type
        self.service = service


class ServiceClient:
    def __init__(self, name: str, base_url: str, *, connect_timeout_s: float = 1.0) -> None:
        self.name = name
        self._connect_timeout_s = connect_timeout_s
        self._client = httpx.AsyncClient(
            base_url=base_url,
            timeout=httpx.Timeout(30.0, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
        )

    async def post_json(self, path: str, body: dict[str, Any], *, timeout_s: float) -> Any:
        """POST JSON under `timeout_s` in total; raise `DependencyUnavailable` on transport
        failure, timeout or a 5xx, `UpstreamError` on a 4xx error body."""
        started = time.perf_counter()
        timeout_s = max(timeout_s, 0.001)
        timeout = httpx.Timeout(timeout_s, connect=min(self._connect_timeout_s, timeout_s))
        try:
            response = await self._client.post(
                path, json=body, headers=tracing.outgoing_headers(), timeout=timeout
            )
        except httpx.TimeoutException:
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
        return self._decode(response)

    def _decode(self, response: httpx.Response) -> Any:
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code >= 500:
            message = _error_message(data) or f"HTTP {response.status_code}"
            raise DependencyUnavailable(f"{self.name} failed: {message}", retry_after_s=5)
        if response.status_code >= 400:
            err = (data or {}).get("error", {}) if isinstance(data, dict) else {}
            if response.status_code in (400, 413, 422):
                raise InvalidRequest(
                    f"{self.name} refused the request: {err.get('message', response.status_code)}",
                    param=err.get("param"),
                )
            raise UpstreamError(
                self.name,
                response.status_code,
                str(err.get("type", "upstream_error")),
                str(err.get("message", f"HTTP {response.status_code}")),
            )
        if data is None:
            raise DependencyUnavailable(f"{self.name} answered with a non-JSON body")
        return data

    async def close(self) -> None:
        await self._client.aclose()


def _error_message(data: Any) -> str | None:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("message"))
    return None
