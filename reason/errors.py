"""What the client raises: one exception per kind of failure, each with the error body the
orchestrator sent (`services.schemas.ErrorBody`), its trace id and its status."""

from __future__ import annotations

from typing import Any

from services.schemas import ErrorBody


class ReasonError(Exception):
    """Base of every client error. `trace_id` finds the request's log lines
    (`reason trace <id>`, `Client.trace`), when the orchestrator gave one."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        error_type: str | None = None,
        param: str | None = None,
        trace_id: str | None = None,
        retry_after_s: float | None = None,
        body: ErrorBody | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type
        self.param = param
        self.trace_id = trace_id
        self.retry_after_s = retry_after_s
        self.body = body

    def __str__(self) -> str:
        where = f" (trace {self.trace_id})" if self.trace_id else ""
        status = f"{self.status} " if self.status else ""
        kind = f"{self.error_type}: " if self.error_type else ""
        return f"{status}{kind}{self.message}{where}"


class ConnectionFailed(ReasonError):
    """The orchestrator could not be reached, or did not answer within the timeout."""


class APIError(ReasonError):
    """The orchestrator answered with an error."""


class InvalidRequest(APIError):
    """400, 413, 415, 422: the request can never succeed as sent."""


class Unauthorized(APIError):
    """401: a missing or wrong API key."""


class NotFound(APIError):
    """404: no such trace (or tool)."""


class PlanningFailed(APIError):
    """422 planning_failed: no valid plan could be made; rephrase the question."""


class TooManyRequests(APIError):
    """429: the tenant has its share of requests in flight."""


class Unavailable(APIError):
    """503: a dependency (the planner, Elasticsearch) is down, or the service is full."""


class DeadlineExceeded(APIError):
    """504: the request's deadline passed before a plan."""


class ServerError(APIError):
    """Any other 5xx."""


# By the body's type first (a stream's error event has no status of its own), then
# by the status.
_BY_TYPE: dict[str, type[APIError]] = {
    "planning_failed": PlanningFailed,
    "deadline_exceeded": DeadlineExceeded,
    "dependency_unavailable": Unavailable,
    "overloaded": Unavailable,
    "not_ready": Unavailable,
    "too_many_requests": TooManyRequests,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "validation_error": InvalidRequest,
    "invalid_request": InvalidRequest,
}
_BY_STATUS: dict[int, type[APIError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    408: InvalidRequest,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    429: TooManyRequests,
    431: InvalidRequest,
    503: Unavailable,
    504: DeadlineExceeded,
}


def api_error(
    status: int | None,
    data: Any,
    *,
    trace_id: str | None = None,
    retry_after_s: float | None = None,
) -> APIError:
    """The exception for an error answer: `data` its decoded JSON (anything: a proxy may
    answer in its own shape)."""
    try:
        body: ErrorBody | None = ErrorBody.model_validate(data)
    except ValueError:
        body = None
    code = status or 0
    if body is None:
        cls = _BY_STATUS.get(code, ServerError if code >= 500 else APIError)
        return cls(
            f"HTTP {status} without the service's error body",
            status=status,
            trace_id=trace_id,
            retry_after_s=retry_after_s,
        )
    found = _BY_TYPE.get(body.error.type) or _BY_STATUS.get(code)
    cls = found or (ServerError if code >= 500 else APIError)
    return cls(
        body.error.message,
        status=status,
        error_type=body.error.type,
        param=body.error.param,
        trace_id=body.trace_id or trace_id,
        retry_after_s=retry_after_s,
        body=body,
    )
