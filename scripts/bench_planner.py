"""Benchmark the planner on GSM8K train questions.

For one backend and model it measures: load time and resident memory; schema-valid
plans (the model's first completion, and after the service's validation + retry);
plans per second; decode tokens per second with the plan grammar and without it (the
cost of constraining); and how often the plan's answer is right when its steps are run
by the orchestrator's real tools (python in the sandbox, calc, ...).

Questions are a seeded sample of GSM8K train, without the few-shot examples. The last
line of output is one JSON object with the figures.

    .venv/bin/python -m scripts.bench_planner --model qwen2.5-coder-0.5b-instruct --limit 200
    .venv/bin/python -m scripts.bench_planner --backend openai --model SERVED_NAME \
        --openai-base-url http://127.0.0.1:8100/v1 --concurrency 8

With the openai backend the server decodes; timings are the client's (each request's
wall time), and throughput is all completion tokens over the run's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dataclasses
import json
import os
import platform
import random
import time
from contextlib import AsyncExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from evals.datasets import GSM8K_TRAIN
from planner.backends import create_backend
from planner.backends.base import Generation, GenerationRequest
from planner.prompting import build_messages, few_shot
from planner.service import PlannerService
from services.arith import numbers_close, parse_number
from services.errors import DependencyUnavailable, PlanInvalid, PlanningFailed
from services.plans import parse_plan
from services.schemas import PlanRequest, plan_json_schema
from services.settings import OrchestratorSettings, PlannerSettings
from services.toolspecs import DEFAULT_TOOLS, tool_names

REPO = Path(__file__).resolve().parents[1]

DATASET = GSM8K_TRAIN


def rss_mib(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def load_questions(limit: int, seed: int) -> list[dict[str, Any]]:
    shots = {example.get("question") for example in few_shot()}
    items = [json.loads(line) for line in DATASET.read_text().split("\n") if line.strip()]
    items = [item for item in items if item["question"] not in shots]
    return random.Random(seed).sample(items, min(limit, len(items)))


# The calls made for the question being planned in the current task (questions run
# concurrently with --concurrency, each in its own task and so its own context).
_question_calls: contextvars.ContextVar[list[tuple[Generation, Any]]] = contextvars.ContextVar(
    "question_calls"
)


class Recorder:
    """Wraps a backend and keeps every generation with its timing stats: the backend's own
    (llama.cpp measures prefill and the grammar) or, for a backend that reports none (an
    OpenAI-compatible server), the call's wall time, prefill included."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.name = backend.name
        self.model = backend.model
        self.calls: list[tuple[Generation, Any]] = []

    async def load(self) -> None:
        await self.backend.load()
        self.model = self.backend.model

    async def close(self) -> None:
        await self.backend.close()

    async def generate(self, request: GenerationRequest) -> Generation:
        return (await self.measure(request))[0]

    async def measure(self, request: GenerationRequest) -> tuple[Generation, Any]:
        started = time.perf_counter()
        generation = await self.backend.generate(request)
        wall = time.perf_counter() - started
        stats = generation.stats or SimpleNamespace(
            completion_tokens=generation.completion_tokens, wall_s=wall, prompt_eval_s=0.0
        )
        call = (generation, stats)
        self.calls.append(call)
        if (question := _question_calls.get(None)) is not None:
            question.append(call)
        return call


def is_valid(text: str) -> bool:
    try:
        parse_plan(text, tool_names())
    except PlanInvalid:
        return False
    return True


def decode_rate(stats: list[Any]) -> tuple[float, int, float]:
    tokens = sum(s.completion_tokens for s in stats)
    seconds = sum(s.wall_s - s.prompt_eval_s for s in stats)
    return (tokens / seconds if seconds > 0 else 0.0), tokens, seconds


async def make_executor(stack: AsyncExitStack) -> Any:
    from orchestrator.cache import MemoryCache
    from orchestrator.executor import PlanExecutor
    from orchestrator.tools import build_registry

    registry = await build_registry(OrchestratorSettings(), MemoryCache(), stack)
    return PlanExecutor(registry)


def correct(answer: str | None, gold: str) -> bool:
    if answer is None:
        return False
    value = parse_number(answer.strip().strip('"'))
    return value is not None and numbers_close(value, gold, rel_tol=1e-6, abs_tol=1e-6)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    openai = (
        {
            "openai_base_url": args.openai_base_url,
            "openai_model": args.model,
            "openai_timeout_s": args.openai_timeout_s,
        }
        if args.backend == "openai"
        else {}
    )
    settings = PlannerSettings(
        backend=args.backend,
        model=args.model,
        **openai,
        n_threads=args.threads,
        grammar_engine=args.grammar_engine,
        max_tokens=args.max_tokens,
        seed=args.seed,
        max_attempts=args.max_attempts,
        **({"temperature": args.temperature} if args.temperature is not None else {}),
    )
    questions = load_questions(args.limit, args.seed)
    if args.records:
        Path(args.records).write_text("")  # noqa: ASYNC240 (before any work starts)
    load_avg_start = os.getloadavg()
    recorder = Recorder(create_backend(settings))
    service = PlannerService(recorder, settings)
    rss_before = rss_mib()
    started = time.perf_counter()
    await service.load()
    load_s = time.perf_counter() - started
    if not service.ready:
        raise SystemExit(f"model failed to load: {service.load_error}")
    rss_loaded = rss_mib()
    model_name = recorder.model or settings.model
    print(f"loaded {model_name} in {load_s:.1f} s, RSS {rss_loaded:.0f} MiB", flush=True)

    records: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        executor = await make_executor(stack) if args.execute else None
        loop = asyncio.get_running_loop()
        plan_seconds = 0.0
        gate = asyncio.Semaphore(args.concurrency)
        out_of_time = False

        async def one(item: dict[str, Any]) -> None:
            nonlocal plan_seconds, out_of_time
            async with gate:
                if out_of_time or (
                    args.time_budget_s and time.perf_counter() - started > args.time_budget_s
                ):
                    out_of_time = True
                    return
                calls: list[tuple[Generation, Any]] = []
                _question_calls.set(calls)
                t0 = time.perf_counter()
                plan = None
                error = None
                failed = False
                try:
                    response = await service.plan(PlanRequest(question=item["question"]))
                    plan = response.plans[0]
                except PlanningFailed as exc:
                    error = exc.message
                except DependencyUnavailable as exc:
                    # The backend failed (a timeout, a server error): not the plan's fault,
                    # so it is kept apart from invalid plans (`backend_errors`).
                    error = f"{exc.error_type}: {exc.message}"
                    failed = True
                elapsed = time.perf_counter() - t0
                plan_seconds += elapsed
                record: dict[str, Any] = {
                    "id": item["id"],
                    "gold": item["answer"],
                    "seconds": round(elapsed, 3),
                    "attempts": len(calls),
                    "first_valid": is_valid(calls[0][0].texts[0]) if calls else False,
                    "valid": plan is not None,
                    "error": error,
                    "backend_error": failed,
                    "answer": None,
                    "correct": False,
                }
                if plan is not None and executor is not None:
                    execution = await executor.run(plan, deadline=loop.time() + args.exec_timeout_s)
                    record["answer"] = execution.answer
                    record["correct"] = correct(execution.answer, item["answer"])
                    record["steps"] = [s.status for s in execution.steps]
                if args.keep_plans:
                    record["plan"] = plan.model_dump() if plan else None
                records.append(record)
                if args.records:
                    with Path(args.records).open("a") as fh:  # noqa: ASYNC230 (tiny append)
                        fh.write(json.dumps(record) + "\n")
                done = sum(r["correct"] for r in records)
                print(
                    f"[{len(records)}/{len(questions)}] {item['id']} {elapsed:.1f}s "
                    f"attempts={len(calls)} valid={record['valid']} "
                    f"answer={record['answer']!r} gold={item['answer']} "
                    f"correct={done}/{len(records)}",
                    flush=True,
                )

        phase_started = time.perf_counter()
        await asyncio.gather(*(one(item) for item in questions))
        phase_s = time.perf_counter() - phase_started
        if out_of_time:
            print(f"time budget reached after {len(records)} questions", flush=True)
        constrained_stats = [stats for _, stats in recorder.calls]

    # Cost of constraining: the same prompts decoded with the configured grammar engine,
    # with llama.cpp's GBNF sampler (when that is not the configured one) and without a
    # grammar, interleaved per question so that machine load hits all of them alike.
    unconstrained: dict[str, Any] = {}
    backend = recorder.backend
    k = min(args.unconstrained, len(questions))
    if k:
        schema = plan_json_schema(tool_names())
        has_engines = hasattr(backend, "grammar_engine")
        engine = settings.grammar_engine if has_engines else "schema"
        variants = [engine, *(["gbnf"] if has_engines and engine != "gbnf" else []), None]
        paired: dict[str | None, list[Any]] = {v: [] for v in variants}
        valid: dict[str | None, int] = {v: 0 for v in variants}
        requests = [
            GenerationRequest(
                messages=build_messages(item["question"], list(DEFAULT_TOOLS)),
                json_schema=schema,
                temperature=settings.temperature,
                top_p=settings.top_p,
                max_tokens=settings.max_tokens,
                seed=settings.seed,
            )
            for item in questions[:k]
        ]

        def use(variant: str | None) -> None:
            if has_engines:
                backend.grammar_engine = variant or engine

        async def decode(variant: str | None, request: GenerationRequest) -> None:
            # The unconstrained variant is the same request without its schema: free text.
            if variant is None:
                request = dataclasses.replace(request, json_schema=None)
            async with gate:
                generation, stats = await recorder.measure(request)
            paired[variant].append(stats)
            valid[variant] += is_valid(generation.texts[0])

        if args.concurrency == 1:
            # One request at a time: interleave the variants per question, so that
            # machine load hits all of them alike.
            for request in requests:
                for variant in variants:
                    use(variant)
                    await decode(variant, request)
        else:
            # Requests in flight together share the server's batch: one phase per
            # variant (the switch is the backend's, not the request's).
            for variant in variants:
                use(variant)
                await asyncio.gather(*(decode(variant, r) for r in requests))
        if has_engines:
            backend.grammar_engine = engine
        c_rate, c_tokens, _ = decode_rate(paired[engine])
        u_rate, u_tokens, _ = decode_rate(paired[None])
        unconstrained = {
            "unconstrained_questions": k,
            "constrained_decode_tok_s": round(c_rate, 2),
            "unconstrained_decode_tok_s": round(u_rate, 2),
            "constrained_slowdown_pct": round(100 * (1 - c_rate / u_rate), 1) if u_rate else None,
            "constrained_completion_tokens": c_tokens,
            "unconstrained_completion_tokens": u_tokens,
            "constrained_schema_valid_pct": round(100 * valid[engine] / k, 1),
            "unconstrained_schema_valid_pct": round(100 * valid[None] / k, 1),
        }
        if "gbnf" in paired and engine != "gbnf":
            g_rate, g_tokens, _ = decode_rate(paired["gbnf"])
            unconstrained |= {
                "gbnf_decode_tok_s": round(g_rate, 2),
                "gbnf_slowdown_pct": round(100 * (1 - g_rate / u_rate), 1) if u_rate else None,
                "gbnf_completion_tokens": g_tokens,
                "gbnf_schema_valid_pct": round(100 * valid["gbnf"] / k, 1),
            }
    await service.backend.close()

    n = len(records)
    rate, tokens, _ = decode_rate(constrained_stats)
    # With several requests in flight, per-request rates undercount what the server
    # delivers: throughput is all completion tokens over the phase's wall time.
    throughput = {
        "concurrency": args.concurrency,
        "phase_wall_s": round(phase_s, 1),
        "throughput_plans_per_s": round(n / phase_s, 3) if phase_s else None,
        "throughput_decode_tok_s": round(tokens / phase_s, 2) if phase_s else None,
    }
    figures: dict[str, Any] = {
        "benchmark": "planner",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {platform.processor() or ''} cpus={_cpus()}".strip(),
        "backend": settings.backend,
        "model": model_name,
        **({"endpoint": settings.openai_base_url} if settings.backend == "openai" else {}),
        "questions": n,
        "questions_requested": len(questions),
        "sample": f"GSM8K train, random.Random({args.seed}).sample, few-shot items excluded",
        "temperature": settings.temperature,
        "max_attempts": settings.max_attempts,
        "threads": settings.n_threads or _cpus(),
        "loadavg_1m_start_end": [round(load_avg_start[0], 1), round(os.getloadavg()[0], 1)],
        "load_s": round(load_s, 2),
        "rss_before_load_mib": round(rss_before),
        "rss_loaded_mib": round(rss_loaded),
        "rss_peak_mib": round(rss_mib("VmHWM")),
        "schema_valid_first_try_pct": round(
            100 * sum(r["first_valid"] for r in records) / max(n, 1), 1
        ),
        "schema_valid_pct": round(100 * sum(r["valid"] for r in records) / max(n, 1), 1),
        "backend_errors": sum(r["backend_error"] for r in records),
        "mean_attempts": round(sum(r["attempts"] for r in records) / max(n, 1), 2),
        "plans_per_s": round(n / plan_seconds, 3) if plan_seconds else None,
        "seconds_per_plan": round(plan_seconds / max(n, 1), 2),
        "decode_tok_s": round(rate, 2),
        **throughput,
        "completion_tokens": tokens,
        "grammar_engine": settings.grammar_engine if settings.backend == "llamacpp" else None,
        "constraint_ms_per_token": round(
            1000 * sum(getattr(s, "constraint_s", 0.0) for s in constrained_stats) / tokens, 3
        )
        if tokens and settings.backend == "llamacpp"
        else None,
        "executed": bool(args.execute),
        "answer_accuracy_pct": round(100 * sum(r["correct"] for r in records) / max(n, 1), 1)
        if args.execute
        else None,
        **unconstrained,
    }
    return figures


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="llamacpp", choices=["llamacpp", "vllm", "openai"])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--limit", type=int, default=200, help="questions (the issue asks 200)")
    parser.add_argument("--seed", type=int, default=0, help="sample and sampling seed")
    parser.add_argument("--temperature", type=float, default=None, help="default: settings")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads")
    parser.add_argument(
        "--openai-base-url",
        default="http://127.0.0.1:8100/v1",
        help="backend openai: the endpoint; --model is the served model name",
    )
    parser.add_argument("--openai-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--max-attempts", type=int, default=3, help="the service's attempts per question"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="questions in flight (llama.cpp runs one generation at a time whatever this is)",
    )
    parser.add_argument(
        "--grammar-engine", choices=["xgrammar", "gbnf"], default="xgrammar", help="llama.cpp"
    )
    parser.add_argument(
        "--unconstrained",
        type=int,
        default=20,
        help="questions decoded with the grammar, with GBNF and without a grammar (0 to skip)",
    )
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=0,
        help="stop starting new questions after this long (0: no limit); figures cover "
        "the questions actually run",
    )
    parser.add_argument("--no-execute", dest="execute", action="store_false")
    parser.add_argument("--exec-timeout-s", type=float, default=10.0)
    parser.add_argument("--records", help="write one JSON line per question here")
    parser.add_argument("--keep-plans", action="store_true", help="include plans in --records")
    return parser.parse_args(argv)


if __name__ == "__main__":
    result = asyncio.run(main(parse_args()))
    print(json.dumps(result))
