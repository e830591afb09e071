"""Benchmark one plan request with n samples: decoded one after the other, and as a batch.

For each question (a seeded sample of GSM8K train, few-shot items excluded) and each n,
the same `GenerationRequest` (the service's prompt, schema, temperature, top_p, seed and
max_tokens) goes through the llama.cpp backend twice: sequentially (`batched=False`, the
old path) and as one batch (`batched=True`). The question's prompt is evaluated once
first, so both find it in the KV cache and the figures compare decoding; prefill is
reported apart. Each run prints one JSON object; the last line is a summary with the
median wall time per n and mode, and how many batched completions were identical to the
sequential completion with the same seed (see `planner/backends/batch_decode.py` for
why they can differ).

    .venv/bin/python scripts/bench_planner_batch.py --model qwen2.5-coder-0.5b-instruct \
        --questions 3 --n 1 2 5 8 --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_planner import is_valid, load_questions  # noqa: E402

from planner.backends.base import GenerationRequest  # noqa: E402
from planner.backends.llamacpp import LlamaCppBackend  # noqa: E402
from planner.prompting import build_messages  # noqa: E402
from services.schemas import plan_json_schema  # noqa: E402
from services.settings import PlannerSettings  # noqa: E402
from services.toolspecs import DEFAULT_TOOLS, tool_names  # noqa: E402


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor()


def main(args: argparse.Namespace) -> None:
    settings = PlannerSettings(
        backend="llamacpp",
        model=args.model,
        n_threads=args.threads,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    backend = LlamaCppBackend(settings, max_batch=max(args.n))
    asyncio.run(backend.load())
    schema = plan_json_schema(tool_names())
    cancel = threading.Event()
    runs: list[dict[str, Any]] = []
    base = {
        "benchmark": "planner_batch",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "cpus": len(os.sched_getaffinity(0)),
        "model": args.model,
        "threads": args.threads,
        "temperature": args.temperature,
    }
    for item in load_questions(args.questions, args.seed):
        messages = build_messages(item["question"], list(DEFAULT_TOOLS))

        def request(
            n: int, max_tokens: int = args.max_tokens, messages: list = messages
        ) -> GenerationRequest:
            return GenerationRequest(
                messages=messages,
                json_schema=schema,
                n=n,
                temperature=args.temperature,
                top_p=settings.top_p,
                max_tokens=max_tokens,
                seed=args.seed,
            )

        backend.batched = False
        backend._generate(request(1, 1), cancel)  # the prompt into the KV cache
        prefill = backend.last_stats
        for n in args.n:
            texts: dict[str, list[str]] = {}
            for mode in ("sequential", "batched"):
                backend.batched = mode == "batched"
                load = os.getloadavg()[0]
                started = time.perf_counter()
                generation = backend._generate(request(n), cancel)
                wall = time.perf_counter() - started
                stats = backend.last_stats
                texts[mode] = generation.texts
                run = {
                    **base,
                    "question": item["id"],
                    "prompt_tokens": prefill.prompt_eval_tokens,
                    "prompt_prefill_s": round(prefill.prompt_eval_s, 2),
                    "n": n,
                    "mode": mode,
                    "wall_s": round(wall, 2),
                    "completion_tokens": stats.completion_tokens,
                    "aggregate_tok_s": round(stats.completion_tokens / wall, 2),
                    "batch_sizes": stats.batch_sizes,
                    "constraint_ms_per_token": round(
                        1000 * stats.constraint_s / max(stats.completion_tokens, 1), 3
                    ),
                    "valid": sum(is_valid(t) for t in generation.texts),
                    "distinct": len(set(generation.texts)),
                    "loadavg_1m": round(load, 2),
                }
                if mode == "batched":
                    same = [
                        a == b for a, b in zip(texts["sequential"], texts["batched"], strict=True)
                    ]
                    run["identical_to_sequential"] = sum(same)
                    # The first differing character of each sequence that diverged.
                    run["first_difference_at_char"] = [
                        next(
                            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                            min(len(a), len(b)),
                        )
                        for a, b, ok in zip(
                            texts["sequential"], texts["batched"], same, strict=True
                        )
                        if not ok
                    ]
                runs.append(run)
                print(json.dumps(run), flush=True)
    asyncio.run(backend.close())
    summary: dict[str, Any] = {
        **base,
        "benchmark": "planner_batch_summary",
        "questions": args.questions,
    }
    for n in args.n:
        for mode in ("sequential", "batched"):
            walls = [r["wall_s"] for r in runs if r["n"] == n and r["mode"] == mode]
            summary[f"median_wall_s_n{n}_{mode}"] = round(statistics.median(walls), 2)
        same = [
            r["identical_to_sequential"] for r in runs if r["n"] == n and r["mode"] == "batched"
        ]
        summary[f"identical_n{n}"] = f"{sum(same)}/{n * len(same)}"
    one = summary.get("median_wall_s_n1_sequential")
    for n in args.n:
        for mode in ("sequential", "batched"):
            key = f"median_wall_s_n{n}_{mode}"
            if one:
                summary[f"x_n1_n{n}_{mode}"] = round(summary[key] / one, 2)
    print(json.dumps(summary), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--n", type=int, nargs="+", default=[1, 2, 5, 8])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.3, help="the service default")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
