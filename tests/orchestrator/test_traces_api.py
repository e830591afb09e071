"""`GET /traces/{trace_id}`: the trace's lines as nested spans, behind `/reason`'s auth,
with the one error shape for a bad id (422), an unknown one (404) and a failing
Elasticsearch (503)."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from orchestrator.app import create_app, trace_reader
from orchestrator.cache import Cache
from orchestrator.tools.registry import ToolRegistry
from orchestrator.traces import TraceReader
from services.schemas import TraceView
from services.settings import OrchestratorSettings
from tests.orchestrator.test_traces import REQUEST, TRACE, write

pytestmark = pytest.mark.unit

KEY = "k" * 24


async def no_tools(s: OrchestratorSettings, cache: Cache, stack: AsyncExitStack) -> ToolRegistry:
    return ToolRegistry(cache)


def client(tmp_path: Path, traces: TraceReader | None = None, **settings: Any) -> TestClient:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    write(logs / "orchestrator.jsonl", *REQUEST[:2])
    write(logs / "planner.jsonl", REQUEST[2])
    write(logs / "verifier.jsonl", *REQUEST[3:])
    config = OrchestratorSettings(
        log_dir=tmp_path / "own", log_format="json", trace_log_dir=logs, **settings
    )
    return TestClient(create_app(config, tools_factory=no_tools, traces=traces))


def test_a_trace_is_its_spans_nested_from_the_log_files(tmp_path: Path) -> None:
    with client(tmp_path) as c:
        r = c.get(f"/traces/{TRACE}")
        upper = c.get(f"/traces/{TRACE.upper()}")
    assert r.status_code == 200, r.text
    view = TraceView.model_validate(r.json())
    assert (view.trace_id, view.source, view.lines, view.truncated) == (TRACE, "files", 5, False)
    (root,) = view.spans
    assert root.service == "orchestrator"
    assert [(s.service, s.error) for s in root.children] == [("planner", False), ("verifier", True)]
    assert upper.status_code == 200 and upper.json() == r.json()


@pytest.mark.parametrize("bad", ["xyz", "0" * 32, TRACE + "0", "g" * 32, "%20" + TRACE[3:]])
def test_a_bad_trace_id_is_a_validation_error(tmp_path: Path, bad: str) -> None:
    with client(tmp_path) as c:
        r = c.get(f"/traces/{bad}")
    assert r.status_code == 422
    body = r.json()
    assert body["error"]["type"] == "validation_error" and body["error"]["param"] == "trace_id"
    assert body["trace_id"] == r.headers["x-trace-id"]


def test_an_unknown_trace_is_not_found(tmp_path: Path) -> None:
    with client(tmp_path) as c:
        r = c.get(f"/traces/{'3' * 32}")
    assert r.status_code == 404
    assert r.json()["error"] == {
        "type": "not_found",
        "message": f"no log lines for trace {'3' * 32}",
        "param": "trace_id",
    }


def test_traces_want_the_same_key_as_reason(tmp_path: Path) -> None:
    with client(tmp_path, api_keys={KEY: "team-a"}) as c:
        missing = c.get(f"/traces/{TRACE}")
        wrong = c.get(f"/traces/{TRACE}", headers={"Authorization": "Bearer " + "x" * 24})
        right = c.get(f"/traces/{TRACE}", headers={"Authorization": f"Bearer {KEY}"})
        reason = c.post("/reason", json={"question": "q"})
    for r in (missing, wrong):
        assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"
    assert reason.status_code == 401
    assert right.status_code == 200 and right.json()["lines"] == 5
    # the key is never written to a log
    logged = "".join(p.read_text() for p in (tmp_path / "own").glob("*.jsonl"))
    assert "GET /traces/{trace_id} 401" in logged and KEY not in logged


def test_more_lines_than_shown_is_said(tmp_path: Path) -> None:
    with client(tmp_path, trace_max_lines=2) as c:
        view = c.get(f"/traces/{TRACE}").json()
    assert view["lines"] == 2 and view["truncated"] is True


def es_reader(handler: Any) -> TraceReader:
    return TraceReader(
        Path("/nonexistent"),
        es_url="http://es.example:9200",
        transport=httpx.MockTransport(handler),
    )


def test_with_elasticsearch_the_trace_comes_from_there(tmp_path: Path) -> None:
    def cluster(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["query"]["bool"]["filter"] == [
            {"term": {"trace.id": TRACE}}
        ]
        hits = [{"_source": d, "sort": [k]} for k, d in enumerate(REQUEST)]
        return httpx.Response(200, json={"hits": {"hits": hits}})

    with client(tmp_path, traces=es_reader(cluster)) as c:
        r = c.get(f"/traces/{TRACE}")
    assert r.status_code == 200 and r.json()["source"] == "elasticsearch"
    assert r.json()["lines"] == 5


def test_a_failing_elasticsearch_is_a_503_with_retry_after(tmp_path: Path) -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"type": "cluster_block_exception"}})

    with client(tmp_path, traces=es_reader(broken)) as c:
        r = c.get(f"/traces/{TRACE}")
    assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
    error = r.json()["error"]
    assert error["type"] == "dependency_unavailable"
    assert "cluster_block_exception" in error["message"] and "es.example" not in error["message"]


def test_the_settings_choose_where_traces_are_read(tmp_path: Path) -> None:
    files = trace_reader(OrchestratorSettings(log_dir=tmp_path, trace_es_url=""))
    assert (files.source, files.log_dir) == ("files", tmp_path)
    es = trace_reader(
        OrchestratorSettings(
            trace_es_url="https://reader:pw@es.internal:9200",
            trace_es_index="reason-logs-2026.*",
            trace_es_timeout_s=2,
            trace_max_lines=100,
        )
    )
    assert (es.source, es.es_index, es.timeout_s, es.max_lines) == (
        "elasticsearch",
        "reason-logs-2026.*",
        2,
        100,
    )
    # the URL's credentials are a secret in the settings: not in their repr
    assert "s3cr3t-pass" not in repr(
        OrchestratorSettings(trace_es_url="https://reader:s3cr3t-pass@es:9200")
    )
