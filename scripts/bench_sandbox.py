"""Per-call overhead of the Python sandbox for trivial code, against a fresh interpreter.

    .venv/bin/python -m scripts.bench_sandbox [--calls 300] [--fresh-calls 60] [--workers 2]

Measures, for `1 + 1`:
- pool: `Sandbox.run` end to end (static check, job to a pre-started worker, fork of a
  confined child, result back as JSON), sequential calls after a warm-up;
- fresh_python_c: `python -c "print(1 + 1)"` spawned per call (site imported), the
  naive way to isolate code in a process;
- fresh_python_isolated: the same with `-I -S` (no site), the cheapest fresh spawn.
Also reports the CPU time per call of all processes involved (`cpu_ms_per_call`), which
unlike the latency does not depend on how busy the machine is.
Prints a table, then one JSON object with the figures as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import sys
import time
from typing import Any

from orchestrator.sandbox import Sandbox, SandboxSettings

TARGET_P50_MS = 10.0


def summarize(samples_ms: list[float]) -> dict[str, float]:
    if not samples_ms:
        return {"n": 0}
    ordered = sorted(samples_ms)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return {
        "n": len(ordered),
        "p50_ms": round(pct(50), 2),
        "p90_ms": round(pct(90), 2),
        "p99_ms": round(pct(99), 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
        "min_ms": round(ordered[0], 2),
    }


def cpu_seconds() -> float:
    """CPU time of this process and of every reaped descendant (workers, job children)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


async def pool_session(calls: int, workers: int) -> tuple[list[float], dict[str, Any], float]:
    """Start a pool, run `calls` calls after a warm-up, close it; return latencies and CPU."""
    cpu_before = cpu_seconds()
    sandbox = Sandbox(SandboxSettings(workers=workers))
    await sandbox.start()
    samples = []
    try:
        for _ in range(20):  # warm-up
            await sandbox.run("1 + 1", {}, 5.0)
        for _ in range(calls):
            started = time.perf_counter()
            outcome = await sandbox.run("1 + 1", {}, 5.0)
            samples.append((time.perf_counter() - started) * 1000)
            if outcome.result != 2:
                raise SystemExit(f"sandbox gave a wrong answer: {outcome}")
        layers = sandbox.layers
    finally:
        await sandbox.close()  # reaps the workers, so their CPU time is counted
    return samples, layers, cpu_seconds() - cpu_before


async def bench_pool(calls: int, workers: int) -> tuple[dict[str, float], dict[str, Any]]:
    samples, layers, cpu_with = await pool_session(calls, workers)
    _, _, cpu_without = await pool_session(0, workers)
    summary = summarize(samples)
    # CPU time per call, all processes together (service side, worker, job child): the
    # cost that does not depend on how busy the machine is. Linux accounts CPU time in
    # ticks, so this is an average over the calls, not exact per call.
    summary["cpu_ms_per_call"] = round(max(cpu_with - cpu_without, 0.0) / calls * 1000, 2)
    return summary, layers


async def bench_fresh(calls: int, flags: list[str]) -> dict[str, float]:
    samples = []
    cpu_before = cpu_seconds()
    for _ in range(calls):
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *flags,
            "-c",
            "print(1 + 1)",
            stdout=asyncio.subprocess.PIPE,
            env={},
        )
        out, _ = await proc.communicate()
        samples.append((time.perf_counter() - started) * 1000)
        if out.strip() != b"2":
            raise SystemExit(f"fresh interpreter gave a wrong answer: {out!r}")
    summary = summarize(samples)
    summary["cpu_ms_per_call"] = round((cpu_seconds() - cpu_before) / calls * 1000, 2)
    return summary


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="sandbox calls measured")
    parser.add_argument("--fresh-calls", type=int, default=40, help="fresh spawns measured")
    parser.add_argument("--workers", type=int, default=2, help="pre-started workers")
    args = parser.parse_args()

    load_before = os.getloadavg()
    pool, layers = await bench_pool(args.calls, args.workers)
    fresh = await bench_fresh(args.fresh_calls, [])
    fresh_isolated = await bench_fresh(args.fresh_calls, ["-I", "-S"])
    load_after = os.getloadavg()

    print(
        f"{'variant':<24}{'n':>6}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'mean ms':>10}"
        f"{'cpu ms':>10}"
    )
    for name, row in (
        ("pool (Sandbox.run)", pool),
        ("fresh python -c", fresh),
        ("fresh python -I -S -c", fresh_isolated),
    ):
        print(
            f"{name:<24}{row['n']:>6}{row['p50_ms']:>10}{row['p90_ms']:>10}"
            f"{row['p99_ms']:>10}{row['mean_ms']:>10}{row['cpu_ms_per_call']:>10}"
        )
    print(f"layers: {layers}")
    print(
        json.dumps(
            {
                "benchmark": "sandbox_overhead",
                "code": "1 + 1",
                "pool": pool,
                "fresh_python_c": fresh,
                "fresh_python_isolated": fresh_isolated,
                "target_p50_ms": TARGET_P50_MS,
                "pool_meets_target": pool["p50_ms"] < TARGET_P50_MS,
                "speedup_p50_vs_fresh": round(fresh["p50_ms"] / pool["p50_ms"], 1),
                "layers": layers,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load_avg_1m": [round(load_before[0], 2), round(load_after[0], 2)],
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
