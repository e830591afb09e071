"""`reason trace`: one request's log lines from the log files, as a tree of spans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.orchestrator.test_traces import IN_TIME_ORDER, REQUEST, SHARED, TRACE, write

pytestmark = pytest.mark.unit


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    write(tmp_path / "orchestrator.jsonl", *REQUEST[:2])
    write(tmp_path / "planner.jsonl", REQUEST[2])
    write(tmp_path / "verifier.jsonl", *REQUEST[3:])
    return tmp_path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["trace", *args], terminal_width=200)
    return result.exit_code, result.output


def test_the_tree_nests_the_callees_under_the_orchestrators_span(logs: Path) -> None:
    code, out = run(TRACE, "--log-dir", str(logs))
    assert code == 0, out
    rows = out.splitlines()
    assert f"trace {TRACE}" in rows[0] and "(5 lines)" in rows[0]
    at = {
        name: next(i for i, r in enumerate(rows) if name in r)
        for name in ("span o1", "span p1", "span v1")
    }
    assert at["span o1"] < at["span p1"] < at["span v1"]
    indent = {name: len(rows[i]) - len(rows[i].lstrip("│ ├└─")) for name, i in at.items()}
    assert indent["span p1"] == indent["span v1"] > indent["span o1"]  # children of o1
    assert "950.0 ms" in rows[at["span o1"]] and "boom" in out


def test_uppercase_ids_are_read_and_json_prints_every_line_oldest_first(logs: Path) -> None:
    code, out = run(TRACE.upper(), "--log-dir", str(logs), "--json")
    assert code == 0, out
    lines = [json.loads(row) for row in out.splitlines()]
    assert [ln["message"] for ln in lines] == IN_TIME_ORDER
    assert all(ln["trace.id"] == TRACE for ln in lines)


def test_markup_in_a_log_line_is_printed_as_text(tmp_path: Path) -> None:
    doc = {**REQUEST[0], "message": "[bold red]not markup[/] <script>"}
    write(tmp_path / "orchestrator.jsonl", doc)
    code, out = run(TRACE, "--log-dir", str(tmp_path))
    assert code == 0 and "[bold red]not markup[/] <script>" in out


@pytest.mark.parametrize("bad", ["xyz", "0" * 32])
def test_a_bad_id_exits_2_and_an_unknown_one_exits_1(logs: Path, bad: str) -> None:
    assert run(bad, "--log-dir", str(logs))[0] == 2
    code, out = run("5" * 32, "--log-dir", str(logs))
    assert code == 1 and "no log lines" in out


def test_the_operator_sees_every_tenants_lines(tmp_path: Path) -> None:
    # what GET /traces/{id} shows each tenant apart, `reason trace` shows whole
    write(tmp_path / "orchestrator.jsonl", *SHARED)
    code, out = run(TRACE, "--log-dir", str(tmp_path), "--json")
    assert code == 0, out
    lines = [json.loads(row) for row in out.splitlines()]
    assert len(lines) == len(SHARED)
    assert {ln.get("labels.tenant") for ln in lines} == {None, "team-a", "team-b"}


def test_url_reads_the_trace_from_a_running_orchestrator(
    logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from tests.orchestrator.helpers import FakePlanner, FakeVerifier, orchestrator_stack

    own = tmp_path_factory.mktemp("orchestrator-own")  # its own lines, apart from the trace's
    with orchestrator_stack(own, FakePlanner(), FakeVerifier(), trace_log_dir=logs) as url:
        code, out = run(TRACE, "--url", url)
        json_code, json_out = run(TRACE, "--url", url, "--json")
        missing = run("5" * 32, "--url", url)
    assert code == 0, out
    assert f"trace {TRACE}" in out and "span o1" in out and "span p1" in out and "boom" in out
    assert json_code == 0, json_out
    # the in-process server's own log lines go to the same captured stdout, as nested ECS
    rows = [json.loads(row) for row in json_out.splitlines() if row.startswith("{")]
    lines = [row for row in rows if "trace.id" in row]  # the command prints flattened fields
    assert [ln["message"] for ln in lines] == IN_TIME_ORDER
    assert missing[0] == 1 and "not_found" in missing[1]
    from tests.conftest import free_port

    unreachable = run(TRACE, "--url", f"http://127.0.0.1:{free_port()}")
    assert unreachable[0] == 2 and "cannot reach" in unreachable[1]
