"""Benchmark the orchestrator with scripted models and tools that sleep.

Starts the real planner and verifier services (scripted backends) and the real
orchestrator (with an extra `sleep` tool) as three processes, then measures:

- orchestration overhead per /reason (one trivial calc step, scripted models), P50/P99;
- a plan of 8 independent 100 ms steps plus a join: execute wall time / critical path;
- answer-cache hit P95 latency against a miss;
- 64 concurrent clients for 30 s: requests/s, errors (each failure's status, error type
  and message), orchestrator RSS before and after.

    python -m scripts.bench_orchestrator [--duration-s 30] [--clients 64]

The last line of output is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


def plan(*steps: tuple[str, str, str, list[str]]) -> dict[str, Any]:
    return {
        "reasoning": "benchmark plan",
        "steps": [{"id": i, "tool": t, "input": x, "depends_on": d} for i, t, x, d in steps],
        "answer_step": steps[-1][0],
    }


FANOUT = plan(
    *[(f"s{i}", "sleep", "0.1", []) for i in range(1, 9)],
    ("s9", "calc", "1", [f"s{i}" for i in range(1, 9)]),
)
SCRIPT = {"trivial": plan(("s1", "calc", "1+1", [])), "fanout": FANOUT}


def serve_orchestrator(port: int) -> None:
    """Child process: the real orchestrator app with the real tools plus `sleep`."""
    import uvicorn

    from orchestrator.app import create_app
    from orchestrator.tools import build_registry
    from orchestrator.tools.registry import Tool, ToolRegistry
    from services.schemas import ToolSpec
    from services.settings import OrchestratorSettings

    async def sleep(text: str, ctx: Any) -> float:
        await asyncio.sleep(float(text))
        return float(text)

    async def tools(settings: Any, cache: Any, stack: AsyncExitStack) -> ToolRegistry:
        registry = await build_registry(settings, cache, stack)
        registry.register(
            Tool(
                ToolSpec(name="sleep", description="sleep N seconds", input_format="seconds"),
                sleep,
                timeout_s=5,
            )
        )
        return registry

    app = create_app(OrchestratorSettings(), tools_factory=tools)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(round(q / 100 * (len(values) - 1)), len(values) - 1)]


def error_of(r: httpx.Response) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        return {"type": None, "message": r.text[:200]}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {"type": None, "message": r.text[:200]}


def failure(
    run_t0: float, t0: float, status: int | None, kind: str | None, message: str | None
) -> dict[str, Any]:
    return {
        "at_s": round(t0 - run_t0, 2),
        "latency_ms": round((time.perf_counter() - t0) * 1000, 1),
        "status": status,
        "type": kind,
        "message": (message or "")[:200],
    }


async def timed(client: httpx.AsyncClient, question: str, **options: Any) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = await client.post("/reason", json={"question": question, "options": options})
    elapsed = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    return elapsed, r.json()


async def measure(args: argparse.Namespace, orch_pid: int, base: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for _ in range(20):  # warm up
            await timed(client, "trivial", use_cache=False)
        lat, internal = [], []
        for _ in range(args.requests):
            ms, body = await timed(client, "trivial", use_cache=False)
            lat.append(ms)
            t = body["timings_ms"]
            internal.append(t["total"] - t["plan"] - t["verify"] - body["steps"][0]["latency_ms"])
        out["overhead_client_ms"] = {"p50": round(pct(lat, 50), 2), "p99": round(pct(lat, 99), 2)}
        out["overhead_internal_ms"] = {
            "p50": round(pct(internal, 50), 3),
            "p99": round(pct(internal, 99), 3),
        }

        ratios = []
        for _ in range(10):
            _, body = await timed(client, "fanout", use_cache=False, verify=False)
            assert all(s["status"] == "ok" for s in body["steps"]), body
            ratios.append(body["timings_ms"]["execute"] / 100.0)
        out["fanout_8x100ms"] = {
            "execute_over_critical_path_p50": round(pct(ratios, 50), 3),
            "max": round(max(ratios), 3),
        }

        misses, hits = [], []
        for i in range(args.requests):
            q = f"{i} + 1"  # the scripted planner makes a calc plan of an expression
            ms, body = await timed(client, q)
            misses.append(ms)
            ms, body = await timed(client, q)
            assert body["cached"], body
            hits.append(ms)
        out["cache_ms"] = {
            "hit_p50": round(pct(hits, 50), 2),
            "hit_p95": round(pct(hits, 95), 2),
            "miss_p50": round(pct(misses, 50), 2),
            "miss_p95": round(pct(misses, 95), 2),
        }

    rss_before = rss_mib(orch_pid)
    ok = 0
    failures: list[dict[str, Any]] = []
    run_t0 = time.perf_counter()
    stop_at = time.monotonic() + args.duration_s
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)

    async def client_loop(k: int, client: httpx.AsyncClient) -> None:
        nonlocal ok
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            t0 = time.perf_counter()
            try:
                r = await client.post(
                    "/reason",
                    json={"question": f"{k} + {n % 50}", "options": {"use_cache": n % 2 == 0}},
                )
            except httpx.HTTPError as exc:
                failures.append(failure(run_t0, t0, None, type(exc).__name__, str(exc)))
                continue
            if r.status_code == 200:
                ok += 1
            else:
                error = error_of(r)
                failures.append(
                    failure(run_t0, t0, r.status_code, error.get("type"), error.get("message"))
                )

    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        await asyncio.gather(*(client_loop(k, client) for k in range(args.clients)))
    elapsed = time.monotonic() - t0
    out["load"] = {
        "clients": args.clients,
        "duration_s": round(elapsed, 1),
        "requests_per_s": round(ok / elapsed, 1),
        "errors": len(failures),
        # every failed request: when (s into the run), HTTP status (null for a transport
        # error), error type (the error body's, or the exception's class) and message
        "failures": failures[:100],
        "failure_kinds": dict(Counter(f"{f['status']} {f['type']}" for f in failures)),
        "rss_mib_before": round(rss_before, 1),
        "rss_mib_after": round(rss_mib(orch_pid), 1),
    }
    return out


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve-orchestrator", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    if args.serve_orchestrator:
        serve_orchestrator(args.serve_orchestrator)
        return

    tmp = Path(tempfile.mkdtemp(prefix="bench-orch-"))
    print(f"service logs in {tmp}", file=sys.stderr)
    script = tmp / "plans.json"
    script.write_text(json.dumps(SCRIPT))
    ports = {"planner": free_port(), "verifier": free_port(), "orchestrator": free_port()}
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PLANNER_BACKEND": "scripted",
        "PLANNER_SCRIPT_PATH": str(script),
        "VERIFIER_BACKEND": "scripted",
        "PLANNER_LOG_DIR": str(tmp),
        "VERIFIER_LOG_DIR": str(tmp),
        "ORCH_LOG_DIR": str(tmp),
        "PLANNER_LOG_FORMAT": "json",
        "VERIFIER_LOG_FORMAT": "json",
        "ORCH_LOG_FORMAT": "json",
        "PLANNER_LOG_LEVEL": "WARNING",
        "VERIFIER_LOG_LEVEL": "WARNING",
        "ORCH_LOG_LEVEL": "WARNING",
        "ORCH_PLANNER_URL": f"http://127.0.0.1:{ports['planner']}",
        "ORCH_VERIFIER_URL": f"http://127.0.0.1:{ports['verifier']}",
        # every client here is one address, i.e. one tenant (no API keys): let that
        # tenant have all the load's clients in flight (the default share is 32)
        "ORCH_TENANT_MAX_IN_FLIGHT": str(max(args.clients, 32)),
    }
    quiet = {"stdout": subprocess.DEVNULL, "env": env, "cwd": REPO}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                f"{name}.app:app",
                "--port",
                str(ports[name]),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            **quiet,
        )
        for name in ("planner", "verifier")
    ]
    orch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scripts.bench_orchestrator",
            "--serve-orchestrator",
            str(ports["orchestrator"]),
        ],
        **quiet,
    )
    procs.append(orch)
    try:
        for name, proc in zip(("planner", "verifier", "orchestrator"), procs, strict=True):
            wait_ready(f"http://127.0.0.1:{ports[name]}", proc)
        figures = asyncio.run(measure(args, orch.pid, f"http://127.0.0.1:{ports['orchestrator']}"))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
    figures["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
