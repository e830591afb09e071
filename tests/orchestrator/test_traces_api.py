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
from orchestrator.traces import TraceReader, read_trace
from services.schemas import TraceView
from services.settings import OrchestratorSettings
from tests.orchestrator.helpers import PASSTHROUGH_CALIBRATOR
from tests.orchestrator.test_stream_events import (
    DIAMOND,
    ScriptedPlanner,
    ScriptedVerifier,
    registry,
)
from tests.orchestrator.test_traces import REQUEST, TRACE, tagged, write

pytestmark = pytest.mark.unit

KEY = "k" * 24


async def no_tools(s: OrchestratorSettings, cache: Cache, stack: AsyncExitStack) -> ToolRegistry:
    return ToolRegistry(cache)


def client(
    tmp_path: Path,
    traces: TraceReader | None = None,
    *,
    tenant: str | None = None,
    **settings: Any,
) -> TestClient:
    """The orchestrator over the lines of REQUEST; `tenant`: its orchestrator lines name
    that tenant, as they are written with API keys."""
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    orchestrator = REQUEST[:2] if tenant is None else [tagged(d, tenant) for d in REQUEST[:2]]
    write(logs / "orchestrator.jsonl", *orchestrator)
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
    with client(tmp_path, tenant="team-a", api_keys={KEY: "team-a"}) as c:
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
    assert "Elasticsearch" in error["message"]
    # the cluster's own words go to the log, for the operator
    assert "cluster_block_exception" not in error["message"]
    assert "cluster_block_exception" in (tmp_path / "own" / "orchestrator.jsonl").read_text()


def test_a_lookup_error_tells_the_client_neither_the_clusters_address_nor_its_text(
    tmp_path: Path,
) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    with client(tmp_path, traces=es_reader(down)) as c:
        r = c.get(f"/traces/{TRACE}")
    assert r.status_code == 503
    assert "es.example" not in r.text and "Errno" not in r.text
    assert r.json()["error"]["message"] == (
        "trace lookup failed: Elasticsearch could not be read in full; retry shortly"
    )
    logged = (tmp_path / "own" / "orchestrator.jsonl").read_text()
    assert "cannot connect to Elasticsearch at http://es.example:9200" in logged


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


# --------------------------------------------------------------------------- tenants

KEY_B = "b" * 24
TENANTS = {KEY: "team-a", KEY_B: "team-b"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def reasoning(tmp_path: Path, **settings: Any) -> Any:
    """The orchestrator answering /reason on scripted peers, its log lines in `tmp_path`
    (where its trace lookups read them)."""

    async def tools(s: OrchestratorSettings, cache: Cache, stack: AsyncExitStack) -> ToolRegistry:
        return registry(cache)

    config = OrchestratorSettings(
        log_dir=tmp_path,
        log_format="json",
        confidence_calibrator=PASSTHROUGH_CALIBRATOR,
        **settings,
    )
    app = create_app(config, tools_factory=tools)

    class Started:
        def __enter__(self) -> TestClient:
            self.client = TestClient(app).__enter__()
            app.state.reason.planner = ScriptedPlanner({"q": [[DIAMOND]]})
            app.state.reason.verifier = ScriptedVerifier()
            return self.client

        def __exit__(self, *exc: object) -> None:
            self.client.__exit__(*exc)

    return Started()


def logged(tmp_path: Path, trace_id: str) -> list[dict[str, Any]]:
    return read_trace(tmp_path, trace_id)


def every_line(view: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def walk(span: dict[str, Any]) -> None:
        found.extend({**ln, "span_id": span["span_id"]} for ln in span["lines"])
        for child in span["children"]:
            walk(child)

    for span in view["spans"]:
        walk(span)
    return found


ASK = {"question": "q", "options": {"use_cache": False}}
STREAM = {"Accept": "text/event-stream"}


def test_with_keys_every_orchestrator_line_of_a_request_names_its_tenant(tmp_path: Path) -> None:
    with reasoning(tmp_path, api_keys=TENANTS) as c:
        plain = c.post("/reason", json=ASK, headers=bearer(KEY))
        streamed = c.post("/reason?events=all", json=ASK, headers={**bearer(KEY_B), **STREAM})
    assert plain.status_code == 200 and streamed.status_code == 200
    for response, tenant in ((plain, "team-a"), (streamed, "team-b")):
        lines = logged(tmp_path, response.headers["x-trace-id"])
        canonical = [ln for ln in lines if ln.get("event.kind") == "request"]
        steps = [ln for ln in lines if ln.get("event.kind") == "step"]
        assert len(canonical) == 1 and len(steps) == 3
        assert {ln.get("labels.tenant") for ln in lines} == {tenant}  # every line, the name
        assert steps[0]["labels.tool"] == "calc"  # beside the step's own labels
    text = (tmp_path / "orchestrator.jsonl").read_text()
    assert KEY not in text and KEY_B not in text  # never the key


def test_without_keys_the_lines_name_no_tenant_and_any_caller_reads_any_trace(
    tmp_path: Path,
) -> None:
    with reasoning(tmp_path) as c:
        r = c.post("/reason", json=ASK)
        view = c.get(f"/traces/{r.headers['x-trace-id']}")
    lines = logged(tmp_path, r.headers["x-trace-id"])
    assert lines and not any("labels.tenant" in ln for ln in lines)
    assert view.status_code == 200 and view.json()["lines"] == len(lines)


def test_a_tenant_cannot_read_another_tenants_trace(tmp_path: Path) -> None:
    with reasoning(tmp_path, api_keys=TENANTS) as c:
        trace_id = c.post("/reason", json=ASK, headers=bearer(KEY)).headers["x-trace-id"]
        mine = c.get(f"/traces/{trace_id}", headers=bearer(KEY))
        theirs = c.get(f"/traces/{trace_id}", headers=bearer(KEY_B))
        unknown = c.get(f"/traces/{'3' * 32}", headers=bearer(KEY_B))
    assert mine.status_code == 200
    assert mine.json()["lines"] == len(logged(tmp_path, trace_id))
    # the same answer as for a trace nobody wrote: it says nothing of team-a's request
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"] == {
        **unknown.json()["error"],
        "message": unknown.json()["error"]["message"].replace("3" * 32, trace_id),
    }


def test_a_trace_id_reused_through_traceparent_shows_each_tenant_its_own_lines(
    tmp_path: Path,
) -> None:
    with reasoning(tmp_path, api_keys=TENANTS) as c:
        trace_id = c.post("/reason", json=ASK, headers=bearer(KEY)).headers["x-trace-id"]
        first = c.get(f"/traces/{trace_id}", headers=bearer(KEY)).json()
        (a_span,) = first["spans"]
        # team-b takes team-a's trace id, and names team-a's span as its parent
        traceparent = f"00-{trace_id}-{a_span['span_id']}-01"
        reused = c.post(
            "/reason?events=all",
            json=ASK,
            headers={**bearer(KEY_B), **STREAM, "traceparent": traceparent},
        )
        assert reused.headers["x-trace-id"] == trace_id
        a_view = c.get(f"/traces/{trace_id}", headers=bearer(KEY)).json()
        b_view = c.get(f"/traces/{trace_id}", headers=bearer(KEY_B)).json()
    everything = logged(tmp_path, trace_id)
    by_tenant = {
        t: [ln for ln in everything if ln.get("labels.tenant") == t] for t in TENANTS.values()
    }
    assert by_tenant["team-a"] and by_tenant["team-b"]
    # team-a's view is as it was: none of team-b's lines came into it
    assert a_view["lines"] == first["lines"] == len(by_tenant["team-a"])
    assert {ln["fields"].get("labels.tenant") for ln in every_line(a_view)} == {"team-a"}
    # team-b sees its own request, as a root (its parent is not its to see), and nothing
    # of team-a's: not a line, not the span
    assert b_view["lines"] == len(by_tenant["team-b"])
    b_lines = every_line(b_view)
    assert {ln["fields"].get("labels.tenant") for ln in b_lines} == {"team-b"}
    assert a_span["span_id"] not in {ln["span_id"] for ln in b_lines}
    assert [(s["parent_id"], s["children"]) for s in b_view["spans"]] == [(a_span["span_id"], [])]
