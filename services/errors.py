"""One error model for every service, and one mapper from it to the error body.

`ServiceError` subclasses are expected failures with a status and a machine-readable
type. Anything else reaching the handler is our bug: it is logged with its stack and
answered as a generic 500 body without the stack.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    status_code = 500
    error_type = "internal_error"
    default_retry_after_s: int | None = None  # errors worth retrying later set this

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after_s = (
            retry_after_s if retry_after_s is not None else self.default_retry_after_s
        )


class InvalidRequest(ServiceError):
    """The caller's fault: the request can never succeed as sent."""

    status_code = 400
    error_type = "invalid_request"


class ValidationFailed(InvalidRequest):
    status_code = 422
    error_type = "validation_error"


class UnsupportedParameter(InvalidRequest):
    """A request field this endpoint knows of but does not support (the OpenAI-compatible
    API's fields the pipeline has no meaning for): refused, never silently ignored."""

    error_type = "unsupported_parameter"


class Unauthorized(ServiceError):
    status_code = 401
    error_type = "unauthorized"


class NotFound(ServiceError):
    status_code = 404
    error_type = "not_found"


class ModelNotFound(NotFound):
    error_type = "model_not_found"


class MethodNotAllowed(ServiceError):
    status_code = 405
    error_type = "method_not_allowed"


class UnsupportedMediaType(ServiceError):
    status_code = 415
    error_type = "unsupported_media_type"


class PayloadTooLarge(ServiceError):
    status_code = 413
    error_type = "payload_too_large"


class RequestTimeout(ServiceError):
    """The client did not send its request body within the body-read timeout."""

    status_code = 408
    error_type = "request_timeout"


class TooManyRequests(ServiceError):
    """The caller (its tenant) is over its share of concurrent work. Retry later."""

    status_code = 429
    error_type = "too_many_requests"
    default_retry_after_s = 1


class HeadersTooLarge(ServiceError):
    status_code = 431
    error_type = "request_header_too_large"


class ClientClosed(ServiceError):
    """The client went away before the answer was ready (nginx's 499); nobody reads it,
    but the log line and the metrics record it."""

    status_code = 499
    error_type = "client_closed"


class Overloaded(ServiceError):
    """This service has as many requests in flight as it is configured to take."""

    status_code = 503
    error_type = "overloaded"
    default_retry_after_s = 1


class DependencyUnavailable(ServiceError):
    """A service we call is down, slow or answered garbage. Retry later."""

    status_code = 503
    error_type = "dependency_unavailable"
    default_retry_after_s = 5


class NotReady(DependencyUnavailable):
    """This service cannot serve yet (model loading or failed to load)."""

    error_type = "not_ready"


class DeadlineExceeded(ServiceError):
    status_code = 504
    error_type = "deadline_exceeded"


class PlanInvalid(ServiceError):
    """The model produced a plan that fails the schema or DAG checks (retry or replan)."""

    status_code = 502
    error_type = "plan_invalid"


class PlanningFailed(ServiceError):
    """Every bounded attempt to produce a valid plan failed (the planner's answer: its
    model did not produce a valid plan, 502)."""

    status_code = 502
    error_type = "planning_failed"


class Unplannable(PlanningFailed):
    """The orchestrator's answer when no valid plan could be made for the question: the
    planner gave up after its bounded attempts, or every plan it returned failed
    validation. Not a dependency being down, so no `Retry-After`; asking the same
    question again is unlikely to help, rephrasing it may."""

    status_code = 422


def error_types() -> frozenset[str]:
    """Every error type a ServiceError subclass defines (those defined so far)."""
    types: set[str] = set()
    todo: list[type[ServiceError]] = [ServiceError]
    while todo:
        cls = todo.pop()
        types.add(cls.error_type)
        todo.extend(cls.__subclasses__())
    return frozenset(types)


def error_label(exc: ServiceError) -> str:
    """`exc`'s type as a metric label: a type some ServiceError class defines, else
    "upstream_error". An error another service answered keeps that service's type, which
    is whatever its body said, and a label takes every value it is ever given."""
    return exc.error_type if exc.error_type in error_types() else "upstream_error"


def error_body(exc: ServiceError, trace_id: str) -> dict[str, Any]:
    detail: dict[str, Any] = {"type": exc.error_type, "message": exc.message}
    if exc.param is not None:
        detail["param"] = exc.param
    return {"error": detail, "trace_id": trace_id}


def error_headers(exc: ServiceError) -> dict[str, str]:
    if exc.retry_after_s is not None:
        return {"Retry-After": str(exc.retry_after_s)}
    return {}


# The OpenAI-compatible API's error shape, `{"error": {"message", "type", "param",
# "code"}}`: OpenAI's `type` by status, our error type as `code` (except where OpenAI
# has a code of its own for the same thing), and a malformed field a 400, as OpenAI
# answers it, where /reason says 422.
_OPENAI_CODES = {"unauthorized": "invalid_api_key", "too_many_requests": "rate_limit_exceeded"}


def openai_error(exc: ServiceError, trace_id: str) -> tuple[int, dict[str, Any]]:
    """The status and body of `exc` on the OpenAI-compatible routes (`/v1/*`); the trace
    id travels in the X-Trace-Id header."""
    status = 400 if isinstance(exc, ValidationFailed) else exc.status_code
    if status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    code = _OPENAI_CODES.get(exc.error_type, error_label(exc))
    detail = {"message": exc.message, "type": kind, "param": exc.param, "code": code}
    return status, {"error": detail}
