"""The `reason` command: serve the three services, ask a question, look up a trace."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from cli.eval import eval_app
from cli.models import models_app
from orchestrator.traces import (
    TraceLookupError,
    build_view,
    fetch_trace_lines,
    flatten_ecs,
    read_trace,
)
from reason import DEFAULT_URL, Client, ConnectionFailed, ReasonError
from services.schemas import ReasonOptions, TraceSpan, TraceView
from services.settings import OrchestratorSettings, PlannerSettings, VerifierSettings
from services.tracing import is_trace_id

app = typer.Typer(
    help="Reasoning pipeline: planner, orchestrator and verifier.", no_args_is_help=True
)
console = Console()
err = Console(stderr=True)
app.add_typer(models_app, name="models", help="Pull and list the model catalog.")
app.add_typer(eval_app, name="eval", help="Evaluate the pipeline on a dataset and report.")

SERVICES = (("planner", 8001), ("verifier", 8002), ("orchestrator", 8000))


# --------------------------------------------------------------------------- serve


def service_command(name: str, host: str, port: int) -> list[str]:
    """One service under services.serve: uvicorn with the HTTP front's limits that only
    the server can enforce (header bytes as they arrive, header read time)."""
    return [
        sys.executable,
        "-m",
        "services.serve",
        name,
        "--host",
        host,
        "--port",
        str(port),
        "--timeout-graceful-shutdown",
        "5",
    ]


def start_services(
    host: str, log_dir: Path, env: dict[str, str] | None = None, ports: dict[str, int] | None = None
) -> dict[str, subprocess.Popen[bytes]]:
    """Start the three services as child processes, wired to each other."""
    ports = ports or {name: port for name, port in SERVICES}
    child_env = {**os.environ, **(env or {})}
    for prefix in ("PLANNER", "VERIFIER", "ORCH"):
        child_env.setdefault(f"{prefix}_LOG_DIR", str(log_dir))
    child_env.setdefault("ORCH_PLANNER_URL", f"http://{host}:{ports['planner']}")
    child_env.setdefault("ORCH_VERIFIER_URL", f"http://{host}:{ports['verifier']}")
    procs = {}
    for name, _ in SERVICES:
        procs[name] = subprocess.Popen(service_command(name, host, ports[name]), env=child_env)
    return procs


def wait_ready(
    urls: dict[str, str], timeout_s: float, procs: dict[str, subprocess.Popen[bytes]] | None = None
) -> dict[str, bool]:
    deadline = time.monotonic() + timeout_s
    ready = dict.fromkeys(urls, False)
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline and not all(ready.values()):
            for name, url in urls.items():
                if ready[name]:
                    continue
                if procs and procs[name].poll() is not None:
                    raise RuntimeError(f"{name} exited with code {procs[name].returncode}")
                try:
                    ready[name] = client.get(f"{url}/readyz").status_code == 200
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
    return ready


def stop_services(procs: dict[str, subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs.values():
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    log_dir: Path = typer.Option(Path("logs"), help="Where the services write their logs."),
    ready_timeout_s: float = typer.Option(600.0, help="How long to wait for readiness."),
) -> None:
    """Start planner (:8001), verifier (:8002) and orchestrator (:8000); Ctrl-C stops all.

    Ports come from PLANNER_PORT, VERIFIER_PORT and ORCH_PORT when set."""
    log_dir.mkdir(parents=True, exist_ok=True)
    ports = {
        "planner": PlannerSettings().port,
        "verifier": VerifierSettings().port,
        "orchestrator": OrchestratorSettings().port,
    }
    procs = start_services(host, log_dir, ports=ports)
    stopping = False

    def _terminate(*_: Any) -> None:
        raise KeyboardInterrupt

    # SIGINT too: a process started in the background of a non-interactive shell inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler of its own.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    try:
        urls = {name: f"http://{host}:{port}" for name, port in ports.items()}
        ready = wait_ready(urls, ready_timeout_s, procs)
        for name, ok in ready.items():
            console.print(f"{name:<13} {urls[name]}  {'[green]ready' if ok else '[red]not ready'}")
        console.print(f"POST {urls['orchestrator']}/reason   logs in {log_dir}/   Ctrl-C stops")
        while all(p.poll() is None for p in procs.values()):
            time.sleep(0.5)
        dead = [n for n, p in procs.items() if p.poll() is not None]
        err.print(f"[red]{', '.join(dead)} exited; stopping the others")
        raise typer.Exit(1)
    except KeyboardInterrupt:
        stopping = True
    except RuntimeError as exc:
        err.print(f"[red]{exc}")
        raise typer.Exit(1) from None
    finally:
        # A second Ctrl-C (or SIGTERM) while the services stop must not leave them running
        # without a parent: it kills them instead of waiting out their graceful stop.
        def _kill(*_: Any) -> None:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()

        signal.signal(signal.SIGTERM, _kill)
        signal.signal(signal.SIGINT, _kill)
        stop_services(procs)
        if stopping:
            console.print("stopped")


# --------------------------------------------------------------------------- ask


@app.command()
def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    url: str = typer.Option(DEFAULT_URL, envvar="REASON_URL"),
    api_key: str | None = typer.Option(None, envvar="REASON_API_KEY"),
    n_plans: int = typer.Option(1, min=1, max=8),
    n_prose: int = typer.Option(
        0, min=0, max=8, help="Chain-of-thought solutions that vote beside the plans."
    ),
    verify: bool = typer.Option(True, "--verify/--no-verify"),
    cache: bool = typer.Option(True, "--cache/--no-cache"),
    deadline_s: float = typer.Option(30.0, min=0.1, max=120.0),
    contributions: bool = typer.Option(
        False, "--contributions", help="Measure what each step contributes to the answer."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the raw response."),
) -> None:
    """Ask a running orchestrator and print the answer with its steps."""
    options = ReasonOptions(
        n_plans=n_plans,
        n_prose=n_prose,
        verify=verify,
        use_cache=cache,
        deadline_s=deadline_s,
        contributions=contributions,
    )
    try:
        with Client(url, api_key) as client:
            answer = client.ask(question, options)
    except ConnectionFailed as exc:
        err.print(f"[red]cannot reach the orchestrator at {url}: {escape(exc.message)}")
        raise typer.Exit(2) from None
    except ReasonError as exc:
        if as_json and exc.body is not None:
            console.print_json(data=exc.body.model_dump(mode="json", exclude_none=True))
        else:
            err.print(f"[red]{escape(str(exc))}")
        raise typer.Exit(1) from None
    data = answer.model_dump(mode="json")
    if as_json:
        console.print_json(data=data)
        return
    print_answer(data)


def _contribution(c: dict[str, Any] | None) -> str:
    """A step's contribution to the answer, in a word (services.schemas.StepContribution)."""
    if not c or c.get("contributes") is None:
        return "[dim]unknown"
    if c["contributes"]:
        return "yes"
    return "[yellow]no (unused)" if c.get("perturbed") == "unused" else "[yellow]no"


def print_answer(data: dict[str, Any]) -> None:
    colour = {"verified": "green", "rejected": "red"}.get(data["verdict"], "yellow")
    console.print(
        f"[bold]{data.get('answer')}[/bold]  [{colour}]{data['verdict']}[/{colour}] "
        f"confidence {data['confidence']:.2f}" + ("  (cached)" if data.get("cached") else "")
    )
    agreement = data.get("agreement")
    if agreement:
        votes = ", ".join(
            f"{v['source']} {_clip(str(v['answer']), 20)}" for v in agreement.get("votes", [])
        )
        console.print(
            f"[dim]{agreement['agreeing']} of {agreement['plans']} votes agree"
            + (f": {votes}" if votes else "")
        )
    for k, r in enumerate(data.get("replanning") or [], 1):  # a request that replanned
        why = f" (replanned: {r['replan_for']})" if r.get("replan_for") else ""
        outcome = (
            f"failed: {r['error']}"
            if r.get("error")
            else f"{_clip(str(r['answer']), 20)} {r['verdict']} {r['confidence']:.2f}, "
            f"{r['agreeing']} of {r['samples']} agree"
        )
        console.print(f"[dim]round {k}{why}: {outcome}, {r['ms']:.0f} ms")
    if data.get("solution"):  # an answer only the chain-of-thought solutions gave
        console.print(f"[dim]worked solution:[/dim]\n{data['solution']['text']}")
    if data.get("plan"):
        console.print(f"[dim]plan: {data['plan']['reasoning']}")
    steps = data.get("steps", [])
    measured = any(s.get("contribution") for s in steps)  # the option `contributions`
    columns = ["step", "tool", "status", "source", "input", "output / error", "ms"]
    table = Table(*columns, *(["contributes"] if measured else []))
    for s in steps:
        style = "green" if s["status"] == "ok" else "yellow" if s["status"] == "fallback" else "red"
        row = [
            s["id"],
            s["tool"],
            f"[{style}]{s['status']}",
            s.get("source", ""),
            _clip(s["input"]),
            _clip(s.get("output") or s.get("error") or ""),
            f"{s.get('latency_ms', 0):.1f}",
        ]
        if measured:
            row.append(_contribution(s.get("contribution")))
        table.add_row(*row)
    console.print(table)
    t = data.get("timings_ms", {})
    console.print(
        f"[dim]trace {data['trace_id']}  plan {t.get('plan', 0):.0f} ms  "
        + (f"solve {t['solve']:.0f} ms  " if t.get("solve") else "")
        + f"execute {t.get('execute', 0):.0f} ms  verify {t.get('verify', 0):.0f} ms  "
        + (f"contribute {t['contribute']:.0f} ms  " if t.get("contribute") else "")
        + f"total {t.get('total', 0):.0f} ms"
    )


def _clip(text: str, n: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


# --------------------------------------------------------------------------- trace


def trace_tree(view: TraceView) -> Tree:
    """The trace as a tree: one branch per span, nested as `build_view` nests them."""
    root = Tree(f"[bold]trace {view.trace_id}[/bold]  ({view.lines} lines)")

    def add(holder: Tree, span: TraceSpan) -> None:
        took = f"  {span.duration_ms:.1f} ms" if span.duration_ms is not None else ""
        branch = holder.add(
            f"[cyan]{escape(span.service or '?')}[/cyan] span {escape(span.span_id)}{took}"
        )
        for line in span.lines:
            colour = {"error": "red", "warning": "yellow"}.get(line.level or "", "white")
            dur = f"  {line.duration_ms:.1f} ms" if line.duration_ms is not None else ""
            err_msg = f"  [red]{escape(line.error)}[/red]" if line.error else ""
            branch.add(
                f"{escape(line.timestamp or '')}  [{colour}]{escape(line.level or 'info'):<7}"
                f"[/{colour}] {escape(line.message or '')}{dur}{err_msg}"
            )
        for child in span.children:
            add(branch, child)

    for span in view.spans:
        add(root, span)
    if view.truncated:
        root.add(f"[yellow]more lines than the {view.lines} shown")
    return root


@app.command()
def trace(
    trace_id: str = typer.Argument(..., help="32 hex characters, as in X-Trace-Id."),
    log_dir: Path = typer.Option(Path("logs"), help="Directory of the services' *.jsonl logs."),
    es: str | None = typer.Option(None, "--es", help="Elasticsearch URL to read instead."),
    es_index: str = typer.Option("reason-logs-*", help="Index pattern in Elasticsearch."),
    url: str | None = typer.Option(
        None, "--url", help="A running orchestrator to ask instead (GET /traces/{trace_id})."
    ),
    api_key: str | None = typer.Option(None, envvar="REASON_API_KEY", help="With --url."),
    as_json: bool = typer.Option(False, "--json", help="Print the lines as JSON."),
) -> None:
    """Print every log line of one request from all three services, as a tree."""
    trace_id = trace_id.strip().lower()
    if not is_trace_id(trace_id):
        err.print("[red]a trace id is 32 hexadecimal characters, not all zero")
        raise typer.Exit(2)
    if url:
        view = _trace_over_http(url, api_key, trace_id)
        if as_json:
            for span_line in _span_lines(view.spans):
                print(json.dumps(span_line))
            return
        console.print(trace_tree(view))
        return
    if es:
        try:
            docs = asyncio.run(fetch_trace_lines(es, trace_id, index=es_index))
        except TraceLookupError as exc:
            err.print(f"[red]{escape(str(exc))}")
            raise typer.Exit(1) from None
        lines = [flatten_ecs(d) for d in docs]
    else:
        lines = read_trace(log_dir, trace_id)
    if not lines:
        err.print(f"no log lines for trace {trace_id}")
        raise typer.Exit(1)
    if as_json:
        for doc in lines:  # both lookups give them oldest first
            print(json.dumps(doc))
        return
    view = build_view(trace_id, lines, source="elasticsearch" if es else "files")
    console.print(trace_tree(view))


def _trace_over_http(url: str, api_key: str | None, trace_id: str) -> TraceView:
    try:
        with Client(url, api_key) as client:
            return client.trace(trace_id)
    except ConnectionFailed as exc:
        err.print(f"[red]cannot reach the orchestrator at {url}: {escape(exc.message)}")
        raise typer.Exit(2) from None
    except ReasonError as exc:
        err.print(f"[red]{escape(str(exc))}")
        raise typer.Exit(1) from None


def _span_lines(spans: list[TraceSpan]) -> list[dict[str, Any]]:
    """Every line of the spans (children included) as its flattened fields, oldest first."""
    lines: list[tuple[float, dict[str, Any]]] = []

    def walk(span: TraceSpan) -> None:
        for line in span.lines:
            lines.append((line.offset_ms if line.offset_ms is not None else 0.0, line.fields))
        for child in span.children:
            walk(child)

    for span in spans:
        walk(span)
    return [fields for _, fields in sorted(lines, key=lambda pair: pair[0])]


# --------------------------------------------------------------------------- db


db_app = typer.Typer(help="The SQL tool's sample database.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("init")
def db_init(
    dsn: str = typer.Option(
        ...,
        envvar="REASON_ADMIN_DSN",
        help="Admin DSN, e.g. postgresql://postgres@127.0.0.1/postgres",
    ),
    reader_password: str | None = typer.Option(
        None, envvar="REASON_READER_PASSWORD", help="Password for the read-only role."
    ),
) -> None:
    """Create the reason_data schema, its sample data and the read-only reason_reader role."""
    from orchestrator.provisioning import init_database

    for warning in asyncio.run(init_database(dsn, reader_password)):
        console.print(f"[yellow]warning:[/yellow] {warning}")
    console.print("reason_data schema, sample data and role reason_reader are ready")
