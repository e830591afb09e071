"""Every metric the three services export follows Prometheus' conventions: a unit in the
name of what is measured in one, `_total` on counters, no label that takes a value from
a request (question text, trace id, tenant, key, client address), and label values that
stay bounded however hostile the client or the service upstream."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

import orchestrator.app
import orchestrator.sandbox.sandbox
import planner.app
import planner.backends.llamacpp_engine
import verifier.app
from orchestrator.service import REQUEST_ERRORS
from services.app import create_service_app
from services.errors import DependencyUnavailable, error_label, error_types
from services.http import UpstreamError

pytestmark = pytest.mark.unit

assert orchestrator.app and orchestrator.sandbox.sandbox and planner.app and verifier.app
# vLLM's own names, kept so that one dashboard reads vLLM and the llama.cpp engine
# alike (docs/operations.md): vLLM names this histogram `_total`.
VLLM_EXCEPTIONS = {"vllm:iteration_tokens_total"}
# What a label must never be: each takes a value from a request.
FORBIDDEN_LABELS = {
    "question",
    "trace_id",
    "trace",
    "span_id",
    "tenant",
    "key",
    "api_key",
    "user",
    "client",
    "address",
    "path",
    "url",
    "input",
    "answer",
}
# Time units other than seconds, and sizes other than bytes, in a name.
WRONG_UNITS = re.compile(r"_(ms|millis|milliseconds|us|ns|minutes|hours|kb|mb|kib|mib)(_|$)")


def families() -> list:
    text = _exposition()
    return list(text_string_to_metric_families(text))


def _exposition() -> str:
    from prometheus_client import generate_latest

    return generate_latest(REGISTRY).decode()


def ours(family) -> bool:  # the services' metrics, not the client library's process ones
    return not family.name.startswith(("python_", "process_"))


def test_counters_end_in_total_and_times_are_in_seconds() -> None:
    text = _exposition()
    names = {f.name for f in families() if ours(f)}
    assert {"http_requests", "reason_requests", "tool_calls"} <= names  # parsed, no _total
    for family in families():
        if not ours(family):
            continue
        if family.type == "counter":
            # the exposition names counters with _total (the parser strips it)
            assert f"# TYPE {family.name}_total counter" in text, family.name
        else:
            assert not family.name.endswith("_total") or family.name in VLLM_EXCEPTIONS, (
                f"{family.name}: a {family.type} named like a counter"
            )
        assert not WRONG_UNITS.search(family.name), family.name
        if family.type == "histogram" and any(
            word in family.name for word in ("latency", "duration", "time")
        ):
            assert family.name.endswith("_seconds"), family.name


def test_no_label_takes_a_value_from_the_request() -> None:
    for family in families():
        if not ours(family):
            continue
        metric = REGISTRY._names_to_collectors.get(
            family.name
        ) or REGISTRY._names_to_collectors.get(family.name + "_total")
        labels = set(getattr(metric, "_labelnames", ()))
        assert not labels & FORBIDDEN_LABELS, (family.name, labels)


def test_an_unheard_of_method_is_counted_as_other() -> None:
    app = create_service_app(name="labels-test")
    client = TestClient(app)
    for method in ("FROB1", "FROB2", "GET"):
        client.request(method, "/nowhere")
    text = _exposition()
    seen = set(re.findall(r'http_requests_total\{[^}]*service="labels-test"[^}]*\}', text))
    methods = {re.search(r'method="([^"]*)"', s).group(1) for s in seen}
    assert methods == {"GET", "other"}, seen


def test_an_upstream_error_type_is_bounded_in_labels() -> None:
    hostile = UpstreamError("planner", 418, "question: what is 6*7 " + "x" * 40, "teapot")
    assert error_label(hostile) == "upstream_error"
    assert error_label(DependencyUnavailable("down")) == "dependency_unavailable"
    assert {"deadline_exceeded", "planning_failed", "too_many_requests"} <= error_types()


async def test_a_failed_reason_request_is_counted_by_its_error_type() -> None:
    from orchestrator.service import ReasonService
    from services.schemas import ReasonRequest

    class DownPlanner:
        async def post_json(self, *a, **kw):
            raise DependencyUnavailable("planner is unreachable")

        async def get_json(self, *a, **kw):
            raise DependencyUnavailable("planner is unreachable")

    from orchestrator.cache import MemoryCache
    from orchestrator.tools.calc import calc
    from orchestrator.tools.registry import Tool, ToolRegistry
    from services import toolspecs

    cache = MemoryCache(max_entries=10)
    registry = ToolRegistry(cache)
    registry.register(Tool(toolspecs.CALC, calc, timeout_s=1.0))
    before = REQUEST_ERRORS.labels("dependency_unavailable")._value.get()
    service = ReasonService(
        planner=DownPlanner(),  # type: ignore[arg-type]
        verifier=DownPlanner(),  # type: ignore[arg-type]
        registry=registry,
        cache=cache,
    )
    with pytest.raises(DependencyUnavailable):
        await service.reason(ReasonRequest(question="What is 2 + 2?"))
    assert REQUEST_ERRORS.labels("dependency_unavailable")._value.get() == before + 1
