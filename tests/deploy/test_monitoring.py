"""Monitoring, checked without Prometheus or Grafana running: the dashboard
(deploy/grafana/reason-pipeline.json) names only metrics the services really export
(read from the live /metrics of the three services on the scripted models, after
requests that exercise every path, and of a planner with the llama.cpp engine for the
engine's vLLM-named metrics); every query parses (promtool); the Prometheus and Grafana
provisioning agree with compose and the dashboard; the Kubernetes scrape config selects
the three Services."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import REPO, Stack, free_port, make_stack

DASHBOARD = REPO / "deploy" / "grafana" / "reason-pipeline.json"
PROVISIONING = REPO / "deploy" / "grafana" / "provisioning"
PROMETHEUS = REPO / "deploy" / "prometheus" / "prometheus.yml"
SERVICES = {"orchestrator": 8000, "planner": 8001, "verifier": 8002}
# PromQL words that look like a metric name: keywords and modifiers.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
KEYWORDS |= {"and", "or", "unless", "offset", "inf", "nan"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries() -> list[tuple[int, str, str]]:
    """(panel id, refId, expr) of every query of the dashboard."""
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["id"], target["refId"], target["expr"]))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label
    matchers, grouping clauses and ranges are taken out, less functions and keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    names = set()
    # not the unit of a duration or number (`5m`, `1e3`)
    for match in re.finditer(r"(?<![\w.:])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[match.end() :].lstrip().startswith("("):
            continue  # a function
        if match.group(0).lower() not in KEYWORDS:
            names.add(match.group(0))
    return names


def dashboard_metrics() -> set[str]:
    return set().union(*(metric_names(expr) for _, _, expr in queries()))


def exported(text: str) -> tuple[set[str], set[str]]:
    """The series names a /metrics exposition declares (a histogram's _bucket, _sum and
    _count too), and those it has samples of."""
    declared, sampled = set(), set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            declared.add(name)
            if kind in ("histogram", "summary"):
                declared |= {f"{name}_sum", f"{name}_count"}
            if kind == "histogram":
                declared.add(f"{name}_bucket")
        elif line and not line.startswith("#"):
            sampled.add(re.match(r"[^{\s]+", line).group(0))  # type: ignore[union-attr]
    return declared | sampled, sampled


# --------------------------------------------------------------------------- the file


@pytest.mark.unit
def test_the_extractor_finds_metrics_and_nothing_else() -> None:
    expr = (
        'sum by (le, stage) (rate(reason_stage_duration_seconds_bucket{stage!="x"}[$__rate_interval]))'
        " / ignoring (a) sum(vllm:num_requests_waiting) and on (b) up offset 5m"
    )
    assert metric_names(expr) == {
        "reason_stage_duration_seconds_bucket",
        "vllm:num_requests_waiting",
        "up",
    }


@pytest.mark.unit
def test_the_dashboard_covers_what_the_issue_asks_for_and_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] == "reason-pipeline" and board["panels"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    datasource = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    uid = datasource["datasources"][0]["uid"]
    for panel in board["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(t["expr"].strip() and t["datasource"]["uid"] == uid for t in panel["targets"])
    names = dashboard_metrics()
    # requests and errors by verdict, stage latency, cache hits, planner tokens and queue,
    # sandbox and SQL outcomes
    for needed in (
        "reason_requests_total",
        "reason_request_errors_total",
        "reason_stage_duration_seconds_bucket",
        "cache_operations_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_requests_waiting",
        "sandbox_jobs_total",
        "tool_refusals_total",
        "tool_calls_total",
    ):
        assert needed in names, needed
    # no query groups by a label that takes a value from a request
    for _, _, expr in queries():
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            assert not {g.strip() for g in group.split(",")} & {"tenant", "trace_id", "question"}


@pytest.mark.unit
def test_every_dashboard_metric_is_documented() -> None:
    operations = (REPO / "docs" / "operations.md").read_text()
    for name in dashboard_metrics():
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert f"`{family}`" in operations, f"{family} is not listed in docs/operations.md"


@pytest.mark.unit
def test_compose_mounts_what_the_provisioning_reads() -> None:
    doc = yaml.safe_load((REPO / "compose.yaml").read_text())
    grafana, prometheus = doc["services"]["grafana"], doc["services"]["prometheus"]
    assert grafana["profiles"] == prometheus["profiles"] == ["monitoring"]
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "reason.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert mounts[f"{path}/{DASHBOARD.name}"] == "./deploy/grafana/reason-pipeline.json"
    assert mounts["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    assert (
        "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro"
        in (prometheus["volumes"])
    )
    for service in (grafana, prometheus):  # like Kibana: on the host's loopback only
        assert all(p.startswith("127.0.0.1:") for p in service["ports"])
    assert "GRAFANA_ADMIN_PASSWORD:?" in grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    datasource = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    # Prometheus scrapes each service where compose exposes it
    config = yaml.safe_load(PROMETHEUS.read_text())
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]
    }
    for name, port in SERVICES.items():
        assert targets[name] == [f"{name}:{port}"]
        assert str(port) in doc["services"][name].get("expose", []) or name == "orchestrator"


@pytest.mark.unit
def test_kubernetes_scrapes_the_three_services() -> None:
    objects = {}
    for path in sorted((REPO / "deploy" / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "kind" in doc and doc["kind"] != "Kustomization":
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    monitor = yaml.safe_load((REPO / "deploy/k8s/monitoring/servicemonitor.yaml").read_text())
    assert (
        monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
    )
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    kustomize = yaml.safe_load((REPO / "deploy/k8s/monitoring/kustomization.yaml").read_text())
    assert kustomize["resources"] == ["servicemonitor.yaml"]
    for name, port in SERVICES.items():
        service = objects[("Service", name)]
        assert selector.items() <= service["metadata"]["labels"].items(), name
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == [
            service["metadata"]["namespace"]
        ]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, name
        pod = objects[("Deployment", name)]["spec"]["template"]
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        assert annotations["prometheus.io/port"] == str(port)
        assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == port


# --------------------------------------------------------------------------- promtool


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool not found (Debian's `prometheus` package; scripts/test.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.mark.integration
def test_prometheus_config_is_valid(promtool: str) -> None:
    out = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.integration
def test_every_dashboard_query_parses(promtool: str, tmp_path: Path) -> None:
    rules = [
        {
            # Grafana's interval variable, as Prometheus would see it substituted
            "record": f"dashboard:panel_{panel}_{ref.lower()}",
            "expr": expr.replace("$__rate_interval", "5m"),
        }
        for panel, ref, expr in queries()
    ]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(rules)} rules found" in out.stdout
    # and a broken query is caught
    path.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "d", "rules": [{"record": "x", "expr": "sum(rate(x[5m])"}]}]}
        )
    )
    broken = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True)
    assert broken.returncode != 0


# --------------------------------------------------------------------------- live /metrics


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The three services on the scripted models, for this module only: the session's
    stack would outlive it, and its processes (sandbox workers among them) would then be
    below the test process while the sandbox's tests count what is left behind."""
    s = make_stack(tmp_path_factory.mktemp("monitoring-stack")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def engine_planner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A planner on the llama.cpp backend with no model pulled: it serves /metrics (the
    engine's vLLM-named metrics are declared at import) and is never ready."""
    tmp = tmp_path_factory.mktemp("engine-planner")
    port = free_port()
    env = {
        **os.environ,
        "PLANNER_BACKEND": "llamacpp",
        "REASON_CACHE_DIR": str(tmp / "cache"),
        "PLANNER_LOG_DIR": str(tmp),
        "PLANNER_LOG_FORMAT": "json",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.serve",
            "planner",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the llama.cpp planner did not start")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


# Requests that take every path the dashboard shows: a calc answer and its cache hit, a
# python step, a python step the sandbox refuses, an SQL query, one the policy refuses,
# a chat completion.
QUESTIONS = [
    "What is 17 * 23 + 4?",
    "What is 17 * 23 + 4?",
    "chain through python",
    "read a file",
    "how many countries are in the sample database?",
    "drop a table",
]
# Series the requests above must have given a sample (not only declared).
SAMPLED = {
    "reason_requests_total",
    "reason_stage_duration_seconds_bucket",
    "reason_plans_drawn_total",
    "http_requests_total",
    "http_request_duration_seconds_bucket",
    "tool_calls_total",
    "tool_call_duration_seconds_bucket",
    "tool_refusals_total",
    "cache_operations_total",
    "sandbox_jobs_total",
    "sandbox_workers_live",
    "planner_plans_total",
    "planner_generation_seconds_bucket",
    "verifier_verdicts_total",
}


@pytest.mark.integration
def test_the_dashboard_names_only_metrics_the_services_export(
    stack: Stack, engine_planner: str
) -> None:
    orchestrator = stack.url("orchestrator")
    for question in QUESTIONS:
        r = httpx.post(f"{orchestrator}/reason", json={"question": question}, timeout=60)
        assert r.status_code == 200, r.text
    chat = httpx.post(
        f"{orchestrator}/v1/chat/completions",
        json={
            "model": "reason-pipeline",
            "messages": [{"role": "user", "content": "What is 2 * 21?"}],
        },
        timeout=60,
    )
    assert chat.status_code == 200, chat.text
    declared: set[str] = set()
    sampled: set[str] = set()
    where: dict[str, str] = {}
    for name, url in [
        *((n, stack.url(n)) for n in ("orchestrator", "planner", "verifier")),
        ("llama.cpp planner", engine_planner),
    ]:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        names, samples = exported(text)
        declared |= names
        sampled |= samples
        where.update(dict.fromkeys(names, name))
    missing = sorted(dashboard_metrics() - declared)
    assert not missing, f"the dashboard queries metrics no service exports: {missing}"
    assert SAMPLED <= sampled, sorted(SAMPLED - sampled)
    assert where["vllm:num_requests_waiting"] == "llama.cpp planner"
    # the sandbox counted the refused job, the SQL policy the refused query
    text = httpx.get(f"{orchestrator}/metrics", timeout=10).text
    assert re.search(r'sandbox_jobs_total\{category="[a-z_]+",status="refused"\} [1-9]', text)
    assert re.search(r'tool_refusals_total\{category="sql_write",tool="sql"\} [1-9]', text)
    assert re.search(r'reason_requests_total\{cached="true",verdict="verified"\} [1-9]', text)
