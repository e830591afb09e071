"""Benchmark the llama.cpp planner's batch engine against one-sample-at-a-time decoding.

Backends over the same model, one after the other: `sequential`
(`LlamaCppBackend(batching=False)`: one `create_chat_completion` per sample, one request
at a time; the path before the engine), `engine` (the default: `llamacpp_engine`) and,
with `--server-url`, `server`: the `openai` backend against llama.cpp's own server
(`llama-server`, built from the same llama.cpp source, started by the caller; it batches
over parallel slots and constrains with its GBNF grammar from `response_format`). Each
runs three phases on the same questions (a seeded sample of GSM8K train, few-shot items
excluded), with the service's prompt, schema, temperature, top_p and max_tokens:

- `n`: one request with n samples, for each n; wall time, completion tokens, decode
  tokens per second per sequence and in aggregate, prefill, grammar time per token;
- `clients`: C requests of n = 1 (C different questions) sent at once, against the same
  C sent one after another; plans per second both ways;
- `prefill`: the first request after loading (nothing cached) and a second one with
  another question; prompt tokens evaluated and prefill time of each.

Each measurement is one JSON line on stdout and appended to `--out`; a rerun skips what
`--out` already holds (same model, mode, phase, question and n), so a long run can be
resumed. The last line is a summary computed from `--out`.

    .venv/bin/python -m scripts.bench_planner_batch --model qwen2.5-coder-0.5b-instruct \\
        --questions 2 --n 1 2 5 8 --clients 4 --out var/bench_planner_batch.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from planner.backends.base import Generation, GenerationRequest
from planner.backends.llamacpp import LlamaCppBackend
from planner.prompting import build_messages
from scripts.bench_planner import is_valid, load_questions, rss_mib
from services.schemas import plan_json_schema
from services.settings import PlannerSettings
from services.toolspecs import DEFAULT_TOOLS, tool_names

REPO = Path(__file__).resolve().parents[1]

MODES = ("sequential", "engine", "server")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor()


def key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (
        record["model"],
        record["threads"],
        record.get("threads_batch", record["threads"]),
        record["mode"],
        record["phase"],
        record.get("question"),
        record.get("n"),
    )


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.done = {key(r) for r in self.records()}
        self.schema = plan_json_schema(tool_names())
        self.settings = PlannerSettings(
            backend="llamacpp",
            model=args.model,
            n_threads=args.threads,
            n_threads_batch=args.threads_batch or args.threads,
            max_tokens=args.max_tokens,
            seed=args.seed,
            max_batch=max(max(args.n), args.clients),
        )
        self.questions = load_questions(args.questions + args.clients, args.seed)
        self.base = {
            "benchmark": "planner_batch",
            "cpu": cpu_model(),
            "cpus": len(os.sched_getaffinity(0)),
            "model": args.model,
            "threads": args.threads,
            "threads_batch": args.threads_batch or args.threads,
            "temperature": args.temperature,
        }

    def records(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def request(self, question: str, n: int) -> GenerationRequest:
        return GenerationRequest(
            messages=build_messages(question, list(DEFAULT_TOOLS)),
            json_schema=self.schema,
            n=n,
            temperature=self.args.temperature,
            top_p=self.settings.top_p,
            max_tokens=self.args.max_tokens,
            seed=self.args.seed,
        )

    def emit(self, record: dict[str, Any]) -> None:
        record = {
            **self.base,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            **record,
        }
        with self.out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        self.done.add(key(record))
        print(json.dumps(record), flush=True)

    def wanted(
        self, mode: str, phase: str, question: str | None = None, n: int | None = None
    ) -> bool:
        record = {**self.base, "mode": mode, "phase": phase, "question": question, "n": n}
        return key(record) not in self.done

    async def run(self, mode: str) -> None:
        phases = self.args.phases
        todo = (
            ("prefill" in phases and self.wanted(mode, "prefill"))
            or ("clients" in phases and self.wanted(mode, "clients", n=self.args.clients))
            or any(
                self.wanted(mode, "n", item["id"], n)
                for item in self.questions[: self.args.questions]
                for n in self.args.n
            )
        )
        if not todo:
            return
        rss_before = rss_mib()
        backend: Any
        if mode == "server":
            from planner.backends.openai import OpenAIBackend

            backend = OpenAIBackend(
                self.settings.model_copy(
                    update={"openai_base_url": self.args.server_url, "openai_timeout_s": 600}
                )
            )
        else:
            backend = LlamaCppBackend(self.settings, batching=mode == "engine")
        await backend.load()
        loaded = {
            "rss_loaded_mib": round(rss_mib(), 1),
            "rss_before_load_mib": round(rss_before, 1),
        }
        try:
            if "prefill" in phases and self.wanted(mode, "prefill"):
                await self.prefill(backend, mode, loaded)
            if "n" in phases:
                await self.samples(backend, mode, loaded)
            if "clients" in phases and self.wanted(mode, "clients", n=self.args.clients):
                await self.clients(backend, mode, loaded)
        finally:
            await backend.close()

    async def prefill(self, backend: Any, mode: str, loaded: dict[str, Any]) -> None:
        first, second = self.questions[0], self.questions[1]
        figures = []
        for item in (first, second):
            started = time.perf_counter()
            generation = await backend.generate(self.request(item["question"], 1))
            stats = self.stats(backend, generation, time.perf_counter() - started)
            figures.append(
                {
                    "question": item["id"],
                    "wall_s": round(time.perf_counter() - started, 2),
                    "prompt_tokens": generation.cost().prompt_tokens,
                    "prompt_eval_tokens": stats.prompt_eval_tokens,
                    "prefix_cached_tokens": generation.cost().prefix_cached_tokens,
                    "prefill_s": round(stats.prompt_eval_s, 3),
                }
            )
        self.emit(
            {"mode": mode, "phase": "prefill", "cold": figures[0], "warm": figures[1], **loaded}
        )

    async def samples(self, backend: Any, mode: str, loaded: dict[str, Any]) -> None:
        for item in self.questions[: self.args.questions]:
            # The question's prompt once first, so every n finds the same cache.
            await backend.generate(self.request(item["question"], 1))
            for n in self.args.n:
                if not self.wanted(mode, "n", item["id"], n):
                    continue
                started = time.perf_counter()
                generation = await backend.generate(self.request(item["question"], n))
                wall = time.perf_counter() - started
                self.emit(
                    {
                        "mode": mode,
                        "phase": "n",
                        "question": item["id"],
                        "n": n,
                        "wall_s": round(wall, 2),
                    }
                    | self.figures(backend, generation, wall)
                    | {"rss_mib": round(rss_mib(), 1), "rss_peak_mib": round(rss_mib("VmHWM"), 1)}
                    | loaded
                )

    def figures(self, backend: Any, generation: Generation, wall: float) -> dict[str, Any]:
        stats = self.stats(backend, generation, wall)
        usage = generation.usage
        tokens = stats.completion_tokens
        decode_s = max(wall - stats.prompt_eval_s, 1e-9)
        per_seq = [c["completion_tokens"] for c in stats.per_completion]
        return {
            "completion_tokens": tokens,
            "prompt_eval_tokens": stats.prompt_eval_tokens,
            "prefill_s": round(stats.prompt_eval_s, 3),
            "decode_tok_s_aggregate": round(tokens / decode_s, 2),
            # Each sequence's tokens over the time the request decoded.
            "decode_tok_s_per_sequence": round(statistics.mean(per_seq) / decode_s, 2)
            if per_seq
            else 0.0,
            "constraint_ms_per_token": round(1000 * stats.constraint_s / max(tokens, 1), 3),
            "batch_size_max": usage.batch_size_max if usage else 1,
            "valid": sum(is_valid(t) for t in generation.texts),
            "distinct": len(set(generation.texts)),
        }

    @staticmethod
    def stats(backend: Any, generation: Generation, wall: float) -> Any:
        """The backend's own figures; for the server, what the client sees (the wall time
        includes prefill, and the prompt tokens are the server's count)."""
        if generation.stats is not None:
            return generation.stats
        return SimpleNamespace(
            completion_tokens=generation.completion_tokens,
            prompt_eval_tokens=generation.prompt_tokens,
            prompt_eval_s=0.0,
            constraint_s=0.0,
            per_completion=[],
        )

    async def clients(self, backend: Any, mode: str, loaded: dict[str, Any]) -> None:
        c = self.args.clients
        items = self.questions[-c:]
        await backend.generate(self.request(items[0]["question"], 1))  # warm the prefix
        started = time.perf_counter()
        for item in items:
            await backend.generate(self.request(item["question"], 1))
        one_by_one = time.perf_counter() - started
        started = time.perf_counter()
        generations = await asyncio.gather(
            *(backend.generate(self.request(item["question"], 1)) for item in items)
        )
        together = time.perf_counter() - started
        self.emit(
            {
                "mode": mode,
                "phase": "clients",
                "n": c,
                "one_client_s": round(one_by_one, 2),
                "concurrent_s": round(together, 2),
                "plans_per_s_one_client": round(c / one_by_one, 4),
                "plans_per_s_concurrent": round(c / together, 4),
                "speedup": round(one_by_one / together, 2),
                "completion_tokens": sum(g.completion_tokens for g in generations),
                "batch_size_max": max(
                    (g.usage.batch_size_max if g.usage else 1) for g in generations
                ),
                **loaded,
            }
        )

    def summary(self) -> dict[str, Any]:
        mine = [
            r
            for r in self.records()
            if key(r)[:3] == key({**self.base, "mode": "", "phase": ""})[:3]
        ]
        out: dict[str, Any] = {**self.base, "benchmark": "planner_batch_summary"}
        for mode in MODES:
            for n in self.args.n:
                walls = [
                    r["wall_s"]
                    for r in mine
                    if r["phase"] == "n" and r["mode"] == mode and r["n"] == n
                ]
                if walls:
                    out[f"{mode}_median_wall_s_n{n}"] = round(statistics.median(walls), 2)
            one = out.get(f"{mode}_median_wall_s_n1")
            for n in self.args.n:
                if one and f"{mode}_median_wall_s_n{n}" in out:
                    out[f"{mode}_x_n1_n{n}"] = round(out[f"{mode}_median_wall_s_n{n}"] / one, 2)
            for r in mine:
                if r["phase"] == "clients" and r["mode"] == mode:
                    out[f"{mode}_clients_speedup"] = r["speedup"]
        return out


def main(args: argparse.Namespace) -> None:
    bench = Bench(args)
    for mode in args.modes:
        asyncio.run(bench.run(mode))
    print(json.dumps(bench.summary()), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--n", type=int, nargs="+", default=[1, 2, 5, 8])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["sequential", "engine"])
    parser.add_argument(
        "--phases",
        nargs="+",
        choices=("prefill", "n", "clients"),
        default=["prefill", "n", "clients"],
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.3, help="the service default")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--threads-batch", type=int, default=None, help="default: --threads")
    parser.add_argument("--out", default="var/bench_planner_batch.jsonl")
    parser.add_argument("--server-url", default="http://127.0.0.1:8100/v1", help="llama-server")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
