"""Plan-format study: which way of asking for the plan gives right answers, and at what cost.

On the GSM8K train dev split (`evals/splits/gsm8k-train-dev.jsonl`, never test), for one
planner model loaded once in-process, every item is run in every arm:

- a plan format (`json`, `reasoning`, `draft`; planner.prompting): the planner service
  makes one plan (`n=1`, the service's own sampling settings), and the orchestrator's
  real tools execute it (python in the sandbox, calc, ...);
- `direct`: the same model answers with chain-of-thought (the evaluation's `direct`
  prompt, greedy), no tools.

A format arm may name how many of the prompt's worked examples it shows: `draft@8` is
the draft format with the first eight of `planner/prompts/fewshot.jsonl`; a bare format
shows the settings' default (`PLANNER_FEW_SHOT`).

The answer is scored with the evaluation's rule (evals.extract). Items run in chunks of
`--chunk` (10), every arm over one chunk before the next chunk, so a stopped run covers
nearly the same items in every arm, while the planner's cached prompt prefix (one per
format) is evaluated once per chunk and arm, not on every switch of arm. One JSON line per
(item, arm) is appended as it finishes; rerunning resumes.

    .venv/bin/python -m scripts.study_plan_format --model qwen2.5-coder-1.5b-instruct \
        --limit 60 --out docs/benchmarks/results/plan_format-1.5b.jsonl
    .venv/bin/python -m scripts.study_plan_format --report docs/benchmarks/results/plan_format-1.5b.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from evals.data import iter_results, load_items
from evals.extract import extract_number, is_correct
from evals.modes import DirectRunner
from evals.stats import percentile, wilson_interval
from planner.prompting import PLAN_FORMATS, PlanFormat, few_shot
from planner.service import PlannerService
from services.errors import ServiceError
from services.schemas import PlanRequest
from services.settings import OrchestratorSettings, PlannerSettings

REPO = Path(__file__).resolve().parents[1]

DEV = REPO / "evals" / "splits" / "gsm8k-train-dev.jsonl"
ARMS = (*PLAN_FORMATS, "direct")


def arm_spec(arm: str) -> tuple[PlanFormat | None, int | None]:
    """An arm's plan format and number of worked examples: `draft@8` is (draft, 8), a bare
    format (format, None: the settings' default), `direct` (None, None)."""
    if arm == "direct":
        return None, None
    fmt, at, shots = arm.partition("@")
    if fmt not in PLAN_FORMATS:
        raise ValueError(
            f"unknown arm {arm!r}: a plan format ({', '.join(PLAN_FORMATS)})[@N] or direct"
        )
    if not at:
        return fmt, None  # type: ignore[return-value]
    if not shots.isdigit() or not 0 <= int(shots) <= len(few_shot()):
        raise ValueError(f"{arm!r}: the number of examples is 0 to {len(few_shot())}")
    return fmt, int(shots)  # type: ignore[return-value]


def _arm(text: str) -> str:
    try:
        arm_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


async def make_executor(stack: AsyncExitStack) -> Any:
    from orchestrator.cache import MemoryCache
    from orchestrator.executor import PlanExecutor
    from orchestrator.tools import build_registry

    registry = await build_registry(OrchestratorSettings(), MemoryCache(), stack)
    return PlanExecutor(registry)


class Usage:
    """Wraps the backend to count what each arm's generations cost."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.name, self.model = backend.name, backend.model
        self.calls = 0
        self.completion_tokens = 0

    async def load(self) -> None:
        await self.backend.load()

    async def close(self) -> None:
        await self.backend.close()

    async def generate(self, request: Any) -> Any:
        generation = await self.backend.generate(request)
        self.calls += 1
        self.completion_tokens += generation.completion_tokens
        return generation

    def take(self) -> tuple[int, int]:
        out = (self.calls, self.completion_tokens)
        self.calls = self.completion_tokens = 0
        return out


async def run(args: argparse.Namespace) -> None:
    from planner.backends.llamacpp import LlamaCppBackend

    items = load_items(args.data, offset=args.offset, limit=args.limit)
    done = (
        {(r.get("arm"), r.get("id")) for r in iter_results(args.out)}
        if args.out.exists()
        else set()
    )
    settings = PlannerSettings(
        backend="llamacpp", model=args.model, n_threads=args.threads, seed=args.seed
    )
    backend = Usage(LlamaCppBackend(settings))
    await backend.load()
    services = {}
    for arm in args.arms:
        fmt, shots = arm_spec(arm)
        if fmt is not None:
            update: dict[str, Any] = {"plan_format": fmt}
            if shots is not None:
                update["few_shot"] = shots
            services[arm] = PlannerService(backend, settings.model_copy(update=update))
    for service in services.values():
        await service.load()  # the backend is loaded once; this marks each service ready
    direct = DirectRunner(backend, dataset="gsm8k-train-dev")
    meta = {"model": args.model, "machine": f"{platform.machine()} {platform.processor()}"}
    loop = asyncio.get_running_loop()
    async with AsyncExitStack() as stack:
        executor = await make_executor(stack)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        chunks = [items[i : i + args.chunk] for i in range(0, len(items), args.chunk)]
        for chunk, arm in ((c, a) for c in chunks for a in args.arms):
            for item in chunk:
                if (arm, item.id) in done:
                    continue
                backend.take()
                started = time.perf_counter()
                record: dict[str, Any] = {
                    "arm": arm,
                    "mode": arm,
                    "id": item.id,
                    "gold": item.gold,
                    **meta,
                }
                if arm == "direct":
                    result = await direct(item)
                    record.update(answer=result["answer_text"], predicted=result["predicted"])
                else:
                    try:
                        response = await services[arm].plan(PlanRequest(question=item.question))
                        plan = response.plans[0]
                        execution = await executor.run(plan, deadline=loop.time() + 30)
                        record.update(
                            answer=execution.answer,
                            predicted=extract_number(execution.answer),
                            steps=[s.status for s in execution.steps],
                            plan=plan.model_dump(),
                        )
                    except ServiceError as exc:
                        record.update(answer=None, predicted=None, error=exc.message)
                record["correct"] = is_correct(record["predicted"], item.gold)
                record["seconds"] = round(time.perf_counter() - started, 3)
                record["calls"], record["completion_tokens"] = backend.take()
                with args.out.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
                print(
                    f"{item.id} {arm:9s} {'ok ' if record['correct'] else 'bad'} "
                    f"{record['seconds']:6.1f}s {record['completion_tokens']:4d} tok",
                    flush=True,
                )
    await backend.close()


def report(paths: list[Path], arms: Sequence[str] = ARMS) -> str:
    """The table over the items every one of `arms` ran (an arm stopped early would
    otherwise shrink every arm's sample to its own)."""
    rows = [r for p in paths for r in iter_results(p) if r["arm"] in arms]
    by_arm: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_arm.setdefault(r["arm"], {})[r["id"]] = r
    common = set.intersection(*(set(v) for v in by_arm.values())) if by_arm else set()
    # paired against `direct` when it ran, else against the first of `arms` that ran
    baseline = "direct" if "direct" in by_arm else next((a for a in arms if a in by_arm), "")
    lines = [
        f"Items run in every arm: {len(common)}.",
        "",
        "| arm | right | accuracy [Wilson 95%] | seconds P50 / P95 | tokens (mean) | "
        f"model calls (mean) | vs {baseline} (+rescued / −lost) |",
        "|---|---|---|---|---|---|---|",
    ]
    base = by_arm.get(baseline, {})
    for arm in dict.fromkeys([*arms, *by_arm]):
        if arm not in by_arm:
            continue
        got = [by_arm[arm][i] for i in sorted(common)]
        right = sum(r["correct"] for r in got)
        lo, hi = wilson_interval(right, len(got))
        secs = [r["seconds"] for r in got]
        tokens = sum(r["completion_tokens"] for r in got) / max(len(got), 1)
        calls = sum(r["calls"] for r in got) / max(len(got), 1)
        if base and arm != baseline:
            up = sum(by_arm[arm][i]["correct"] and not base[i]["correct"] for i in common)
            down = sum(base[i]["correct"] and not by_arm[arm][i]["correct"] for i in common)
            paired = f"+{up} / −{down}"
        else:
            paired = ""
        lines.append(
            f"| {arm} | {right}/{len(got)} | {100 * right / max(len(got), 1):.1f}% "
            f"[{100 * lo:.1f}, {100 * hi:.1f}] | {percentile(secs, 50):.1f} / "
            f"{percentile(secs, 95):.1f} | {tokens:.0f} | {calls:.2f} | {paired} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--data", type=Path, default=DEV)
    parser.add_argument("--offset", type=int, default=0, help="skip this many items first")
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument(
        "--arms", nargs="+", type=_arm, default=list(ARMS), help="FORMAT[@EXAMPLES] or direct"
    )
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "var" / "plan_format.jsonl")
    parser.add_argument(
        "--report", type=Path, nargs="+", help="print the table of these runs (over --arms)"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.report:
        print(report(arguments.report, arguments.arms))
    else:
        asyncio.run(run(arguments))
