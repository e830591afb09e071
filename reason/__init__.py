"""A typed Python client of the reasoning pipeline's orchestrator (reason/client.py).

from reason import Client

with Client("http://127.0.0.1:8000", api_key="...") as client:
    answer = client.ask("What is 17 * 23 + 4?", n_plans=3)
    print(answer.answer, answer.verdict, answer.confidence)
    for event in client.stream("What is 6 * 7?"):
        print(event)
"""

from reason.client import DEFAULT_URL, AsyncClient, Client, Event
from reason.errors import (
    APIError,
    ConnectionFailed,
    DeadlineExceeded,
    InvalidRequest,
    NotFound,
    PlanningFailed,
    ReasonError,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "DEFAULT_URL",
    "APIError",
    "AsyncClient",
    "Client",
    "ConnectionFailed",
    "DeadlineExceeded",
    "Event",
    "InvalidRequest",
    "NotFound",
    "PlanningFailed",
    "ReasonError",
    "ServerError",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
]
