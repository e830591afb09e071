"""The `reason` command: serve starts and stops the three services; ask prints a table."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app as cli_app
from tests.conftest import REPO, Stack, free_port

pytestmark = [pytest.mark.integration]


def test_serve_starts_three_services_and_ctrl_c_stops_them(
    tmp_path, python: list[str] | None = None
) -> None:
    ports = {"PLANNER_PORT": free_port(), "VERIFIER_PORT": free_port(), "ORCH_PORT": free_port()}
    env = {
        **os.environ,
        **{k: str(v) for k, v in ports.items()},
        "PLANNER_BACKEND": "scripted",
        "VERIFIER_BACKEND": "scripted",
        "ORCH_REDIS_URL": "",
        "ORCH_DATABASE_URL": "",
    }
    proc = subprocess.Popen(
        [*(python or [sys.executable, "-m", "cli"]), "serve", "--log-dir", str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{ports['ORCH_PORT']}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        r = httpx.post(f"{url}/reason", json={"question": "What is 3 * 4?"}, timeout=30)
        assert r.json()["answer"] == "12"
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        pids = [int(p) for p in children.stdout.split()]
        assert len(pids) == 3
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        assert "stopped" in out
        for pid in pids:
            assert (
                not os.path.exists(f"/proc/{pid}")
                or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
            )
    finally:
        if proc.poll() is None:
            survivors = subprocess.run(
                ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
            )
            proc.kill()
            for pid in survivors.stdout.split():  # never leave the services running
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def test_serve_stops_on_ctrl_c_even_when_started_with_sigint_ignored(tmp_path) -> None:
    # A background job of a non-interactive shell (`cmd &` in a script, CI) starts with
    # SIGINT ignored; Ctrl-C (SIGINT) must still stop the services.
    probe = (
        "import signal, sys, runpy; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "sys.argv = ['reason'] + sys.argv[1:]; runpy.run_module('cli', run_name='__main__')"
    )
    test_serve_starts_three_services_and_ctrl_c_stops_them(tmp_path, [sys.executable, "-c", probe])


def test_a_second_signal_while_the_services_stop_kills_them_instead_of_orphaning_them(
    tmp_path,
) -> None:
    """Services slow to stop (a model server mid-generation) get their grace; a second
    SIGTERM or Ctrl-C during it kills them: `reason serve` never exits leaving them."""
    probe = (
        "import subprocess, sys, runpy\n"
        "import cli.main as m\n"
        "import os, time\n"
        "tmp = sys.argv[1]\n"
        "slow = 'import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        'open(sys.argv[1], "w").close(); time.sleep(120)\'\n'
        "def start(host, log_dir, ports):\n"
        "    marks = {n: os.path.join(tmp, n + '.ignoring') for n in ports}\n"
        "    procs = {n: subprocess.Popen([sys.executable, '-c', slow, marks[n]]) for n in ports}\n"
        "    while not all(os.path.exists(m) for m in marks.values()):\n"
        "        time.sleep(0.02)  # each ignores SIGTERM before the test sends one\n"
        "    print('pids', *[p.pid for p in procs.values()], flush=True)\n"
        "    return procs\n"
        "m.start_services = start\n"
        "m.wait_ready = lambda urls, timeout_s, procs: {n: True for n in urls}\n"
        "sys.argv = ['reason', 'serve', '--log-dir', sys.argv[1]]\n"
        "runpy.run_module('cli', run_name='__main__')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", probe, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("pids"):
                pids = [int(p) for p in line.split()[1:]]
            if "Ctrl-C stops" in line:
                break
        assert len(pids) == 3
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the services ignore it: the stop waits out their grace
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
        for pid in pids:
            assert (
                not os.path.exists(f"/proc/{pid}")
                or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
            ), f"service {pid} outlived reason serve"
    finally:
        proc.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_ask_prints_answer_and_steps(stack: Stack) -> None:
    result = CliRunner().invoke(
        cli_app, ["ask", "What is 6 * 7?", "--url", stack.url("orchestrator")]
    )
    assert result.exit_code == 0, result.output
    assert "42" in result.output and "verified" in result.output
    assert "calc" in result.output and "s1" in result.output


def test_ask_reports_errors_and_unreachable_service(stack: Stack) -> None:
    r = CliRunner().invoke(cli_app, ["ask", "x" * 4001, "--url", stack.url("orchestrator")])
    assert r.exit_code == 1 and "validation_error" in r.output
    r = CliRunner().invoke(cli_app, ["ask", "hi", "--url", f"http://127.0.0.1:{free_port()}"])
    assert r.exit_code == 2 and "cannot reach" in r.output


def test_trace_rejects_bad_ids_and_reports_unknown_ones(tmp_path) -> None:
    r = CliRunner().invoke(cli_app, ["trace", "not-a-trace", "--log-dir", str(tmp_path)])
    assert r.exit_code == 2
    r = CliRunner().invoke(cli_app, ["trace", "a" * 32, "--log-dir", str(tmp_path)])
    assert r.exit_code == 1 and "no log lines" in r.output


def test_an_answer_only_prose_gave_is_printed_with_its_solution_and_the_vote(
    monkeypatch,
) -> None:
    import io

    from rich.console import Console

    import cli.main as main

    out = io.StringIO()
    monkeypatch.setattr(main, "console", Console(file=out, width=200))
    main.print_answer(
        {
            "trace_id": "t" * 32,
            "answer": "72",
            "verdict": "unverified",
            "confidence": 0.4,
            "plan": None,
            "steps": [],
            "solution": {"text": "48 + 24 = 72.\nThe answer is 72.", "answer": "72"},
            "agreement": {
                "plans": 3,
                "agreeing": 2,
                "rounds": 1,
                "votes": [
                    {"source": "plan", "answer": "96"},
                    {"source": "prose", "answer": "72"},
                    {"source": "prose", "answer": "72"},
                ],
            },
            "timings_ms": {
                "plan": 10.0,
                "solve": 12.0,
                "execute": 1.0,
                "verify": 0.0,
                "total": 13.0,
            },
        }
    )
    text = out.getvalue()
    assert "2 of 3 votes agree: plan 96, prose 72, prose 72" in text
    assert "48 + 24 = 72." in text and "solve 12 ms" in text


def test_every_round_of_a_request_that_replanned_is_printed(monkeypatch) -> None:
    import io

    from rich.console import Console

    import cli.main as main

    out = io.StringIO()
    monkeypatch.setattr(main, "console", Console(file=out, width=200))
    summary = {"samples": 1, "agreeing": 1, "replan_reasons": [], "error": None}
    main.print_answer(
        {
            "trace_id": "t" * 32,
            "answer": "6",
            "verdict": "verified",
            "confidence": 0.9,
            "plan": None,
            "steps": [],
            "replanning": [
                {
                    **summary,
                    "replan_for": None,
                    "answer": "5",
                    "verdict": "rejected",
                    "confidence": 0.2,
                    "replan_reasons": ["rejected"],
                    "ms": 1200.0,
                },
                {
                    **summary,
                    "replan_for": "rejected",
                    "answer": "6",
                    "verdict": "verified",
                    "confidence": 0.9,
                    "ms": 900.0,
                },
                {
                    **summary,
                    "replan_for": "rejected",
                    "answer": None,
                    "verdict": "unverified",
                    "confidence": 0.0,
                    "samples": 0,
                    "agreeing": 0,
                    "ms": 40.0,
                    "error": "planning_failed",
                },
            ],
            "timings_ms": {"total": 2140.0},
        }
    )
    text = out.getvalue()
    assert "round 1: 5 rejected 0.20, 1 of 1 agree, 1200 ms" in text
    assert "round 2 (replanned: rejected): 6 verified 0.90, 1 of 1 agree, 900 ms" in text
    assert "round 3 (replanned: rejected): failed: planning_failed, 40 ms" in text


def test_each_kind_of_contribution_is_printed_in_a_word(monkeypatch) -> None:
    import io

    from rich.console import Console

    import cli.main as main

    out = io.StringIO()
    monkeypatch.setattr(main, "console", Console(file=out, width=200))

    def step(sid: str, perturbed: str, removed: str, contributes: bool | None) -> dict:
        return {
            "id": sid,
            "tool": "calc",
            "status": "ok",
            "source": "tool",
            "input": "1",
            "output": "1",
            "latency_ms": 1.0,
            "contribution": {
                "perturbed": perturbed,
                "removed": removed,
                "contributes": contributes,
            },
        }

    main.print_answer(
        {
            "trace_id": "t" * 32,
            "answer": "1",
            "verdict": "unverified",
            "confidence": 0.5,
            "plan": None,
            "steps": [
                step("s1", "changed", "failed", True),
                step("s2", "same", "same", False),
                step("s3", "unused", "unused", False),
                step("s4", "unknown", "unknown", None),
            ],
            "timings_ms": {"total": 5.0, "contribute": 3.0},
        }
    )
    rows = {line.split()[1]: line for line in out.getvalue().splitlines() if " s" in line[:6]}
    assert rows["s1"].rstrip(" │").endswith("yes")
    assert rows["s2"].rstrip(" │").endswith("no")
    assert rows["s3"].rstrip(" │").endswith("no (unused)")
    assert rows["s4"].rstrip(" │").endswith("unknown")


def test_ask_shows_what_each_step_contributes_when_asked(stack: Stack) -> None:
    url = stack.url("orchestrator")
    wide = {"COLUMNS": "200"}
    plain = CliRunner().invoke(cli_app, ["ask", "What is 6 * 7?", "--url", url], env=wide)
    asked = CliRunner().invoke(
        cli_app, ["ask", "What is 6 * 7?", "--url", url, "--contributions"], env=wide
    )
    assert plain.exit_code == 0 and asked.exit_code == 0, asked.output
    assert "contributes" not in plain.output
    header = next(line for line in asked.output.splitlines() if "contributes" in line)
    row = next(line for line in asked.output.splitlines() if " s1 " in line)
    assert header.rstrip(" ┃│").endswith("contributes")  # the last column
    assert "yes" in row  # the one step is the answer: the answer depends on it
    assert "contribute" in asked.output.splitlines()[-1]  # its time, beside the others
