"""Drafts written in prose only: their program pass against their grammar transcription.

In the `draft` plan format a model sometimes solves the problem in words and writes no
code block. The planner used to transcribe such a draft into a JSON plan under the
grammar; it now first asks the model for the program of its own solution (a second,
unconstrained pass, `planner.prompting.program_messages`) and transcribes only a draft
that still gives no plan. This draws drafts as the planner does (first pass, served
temperature, `k` per question), keeps the prose-only ones and, for each, runs both
routes on the same draft: the transcription alone (before) and the planner's own
`_read_drafts` (now). Both plans are repaired as the planner repairs them and executed
with the orchestrator's executor and tools; the answers are labelled by the evaluation's
one rule, beside the prose's own last number.

    PLANNER_BACKEND=llamacpp PLANNER_MODEL=qwen2.5-coder-1.5b-instruct PLANNER_PLAN_FORMAT=draft \\
      python -m evals.prose_drafts --data evals/splits/gsm8k-train-dev.jsonl --offset 60 \\
        --limit 120 --out docs/benchmarks/prose-drafts/1.5b-dev.jsonl
    python -m evals.prose_drafts --summary docs/benchmarks/prose-drafts/1.5b-dev.jsonl

Drafts in prose only are few (about 4% of the first pass's drafts on the dev split), so
`--from-samples` gives the two routes a larger supply of prose on the same footing: each
question's greedy chain-of-thought solution from a pipeline sample file of GSM8K train,
read as if it were the draft.

One line per question (its prose drafts, possibly none); a rerun skips the questions
done. GSM8K train only: the dev split is where the planner's prompts are chosen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from evals.data import Item, ResultWriter, load_items
from evals.extract import extract_number, is_correct
from orchestrator.limits import ToolBudget
from planner.backends.base import GenerationRequest
from planner.drafts import DRAFT_STOP, DraftWithoutCode, plan_from_draft
from planner.prompting import build_messages, transcription_messages
from planner.repair import repair_plan
from planner.service import (
    MAX_TRANSCRIBED_CHARS,
    PlannerService,
    candidate_plan,
    check_python_steps,
)
from services.errors import PlanInvalid
from services.schemas import Plan, plan_json_schema
from services.settings import PlannerSettings
from services.toolspecs import DEFAULT_TOOLS, tool_names

EXECUTE_TIMEOUT_S = 60.0


def _right(answer: str | None, gold: float | int) -> bool:
    return is_correct(extract_number(answer), gold)


async def _execute(executor: Any, plan: Plan, gold: float | int) -> dict[str, Any]:
    plan, _ = repair_plan(plan)
    loop = asyncio.get_running_loop()
    execution = await executor.run(
        plan, deadline=loop.time() + EXECUTE_TIMEOUT_S, budget=ToolBudget(64)
    )
    return {
        "plan": plan.model_dump(),
        "answer": execution.answer,
        "right": _right(execution.answer, gold),
        "tools": sorted({s.tool for s in plan.steps}),
    }


async def _route(executor: Any, gold: float | int, make: Any, names: list[str]) -> dict[str, Any]:
    """One route from draft to executed plan; `make` returns a Plan, a plan's JSON text
    or a `PlanInvalid`."""
    started = time.perf_counter()
    candidate = await make()
    seconds = round(time.perf_counter() - started, 3)
    try:
        plan = candidate_plan(candidate, names)
    except PlanInvalid as exc:
        return {"seconds": seconds, "error": exc.message, "answer": None, "right": False}
    return {"seconds": seconds, "error": None, **await _execute(executor, plan, gold)}


async def study_item(
    service: PlannerService, executor: Any, item: Item, k: int, given: list[str] | None = None
) -> dict[str, Any]:
    """One question's prose-only drafts through both routes: drafts drawn as the planner
    draws them, or `given` ones (the model's own chain-of-thought solutions, a larger
    supply of prose than the drafts' few)."""
    settings = service.settings
    tools = list(DEFAULT_TOOLS)
    names = tool_names()
    first = GenerationRequest(
        messages=build_messages(item.question, tools, None, "draft"),
        json_schema=None,
        n=k,
        temperature=settings.temperature or 0.3,
        top_p=settings.top_p,
        max_tokens=settings.max_tokens,
        seed=settings.seed,
        stop=list(DRAFT_STOP),
        question=item.question,
        metadata={"attempt": 0},
    )
    drafts = given if given is not None else (await service.backend.generate(first)).texts
    one = replace(first, n=1)
    rows: list[dict[str, Any]] = []
    for j, text in enumerate(drafts):
        try:
            plan_from_draft(text, names)
            continue
        except DraftWithoutCode:
            pass
        except PlanInvalid:
            continue
        if len(text) > MAX_TRANSCRIBED_CHARS:  # refused by both routes alike
            continue

        async def transcribe(draft: str = text) -> Plan | str | PlanInvalid:
            request = replace(
                one,
                messages=transcription_messages(item.question, tools, draft),
                json_schema=plan_json_schema(names),
                temperature=0.0,
                stop=[],
                metadata={"transcription": 0},
            )
            generation = await service.backend.generate(request)
            return generation.texts[0] if generation.texts else ""

        async def served(draft: str = text) -> Plan | str | PlanInvalid:
            candidates, _ = await service._read_drafts(one, [draft], tools, None, names)
            return candidates[0]

        prose_answer = extract_number(text)
        program = await _route(executor, item.gold, served, names)
        rows.append(
            {
                "sample": j,
                "draft": text,
                "prose_answer": prose_answer,
                "prose_right": is_correct(prose_answer, item.gold),
                "transcription": await _route(executor, item.gold, transcribe, names),
                # the served route: the program pass, or the transcription when the
                # program pass gave no plan (then its plan is the transcription's)
                "program": program,
            }
        )
    return {
        "id": item.id,
        "gold": item.gold,
        "drafts": len(drafts),
        "model": service.backend.model,
        "prose": rows,
    }


def summary(paths: list[Path]) -> str:
    lines = [json.loads(x) for p in paths for x in p.read_text().splitlines() if x.strip()]
    last = {r["id"]: r for r in lines}
    drafts = sum(r["drafts"] for r in last.values())
    prose = [d for r in last.values() for d in r["prose"]]
    n = len(prose)

    def count(key: str, field: str) -> int:
        return sum(bool(d[key][field]) for d in prose)

    def mean_s(key: str) -> float:
        return sum(d[key]["seconds"] for d in prose) / n if n else 0.0

    out = [
        f"questions {len(last)}, drafts {drafts}, prose-only drafts {n}"
        + (f" ({100 * n / drafts:.1f}%)" if drafts else ""),
        "| route | plan made | answered | right | mean seconds of the pass |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in (
        ("transcription", "grammar transcription (before)"),
        ("program", "program pass, then transcription (now)"),
    ):
        made = sum(d[key]["error"] is None for d in prose)
        answered = sum(d[key]["answer"] is not None for d in prose)
        out.append(f"| {label} | {made} | {answered} | {count(key, 'right')} | {mean_s(key):.1f} |")
    out.append(
        f"| the prose's own last number (no plan) | | | {sum(d['prose_right'] for d in prose)} | |"
    )
    only_now = sum(d["program"]["right"] and not d["transcription"]["right"] for d in prose)
    only_before = sum(d["transcription"]["right"] and not d["program"]["right"] for d in prose)
    out.append(f"right only now: {only_now}; right only before: {only_before}")
    weak = [d for d in prose if _weak(d["program"].get("plan"))]
    if weak:  # lines written before the planner transcribed a weak program's draft
        right = sum((d["transcription"] if d in weak else d["program"])["right"] for d in prose)
        out.append(
            f"{len(weak)} program-route plans cannot answer (`check_python_steps`); the "
            f"planner transcribes their drafts instead, so the route as served is right {right}"
        )
    return "\n".join(out)


def _weak(plan: dict[str, Any] | None) -> bool:
    """A plan the planner would not take from a program pass (it transcribes the draft)."""
    if plan is None:
        return False
    try:
        check_python_steps(repair_plan(Plan.model_validate(plan))[0])
    except PlanInvalid:
        return True
    return False


async def run(args: argparse.Namespace) -> None:
    from planner.backends import create_backend
    from training.sample_pipeline import make_executor

    done: set[str] = set()
    if args.out.exists():
        done = {json.loads(x)["id"] for x in args.out.read_text().splitlines() if x.strip()}
    given: dict[str, list[str]] = {}
    if args.from_samples:
        items = []
        for line in args.from_samples.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["kind"] == "prose" and row["sample"] == 0 and row.get("solution"):
                if not row["dataset"].startswith("gsm8k-train"):
                    raise SystemExit("the study draws on GSM8K train only")
                items.append(
                    Item(row["id"], row["claim"]["question"], row["gold"], str(row["gold"]))
                )
                given[row["id"]] = [row["solution"]]
        items = [i for i in items[args.offset :][: args.limit] if i.id not in done]
    else:
        items = [
            i
            for i in load_items(args.data, offset=args.offset, limit=args.limit)
            if i.id not in done
        ]
    if not items:
        print(f"nothing to do: every question is in {args.out}", file=sys.stderr)
        return
    settings = PlannerSettings()
    if settings.plan_format != "draft" or settings.backend == "scripted":
        raise SystemExit("set PLANNER_PLAN_FORMAT=draft and a model backend (llamacpp)")
    service = PlannerService(create_backend(settings), settings)
    await service.load()
    if not service.ready:
        raise SystemExit(f"the planner model did not load: {service.load_error}")
    started = time.monotonic()
    try:
        async with AsyncExitStack() as stack:
            executor = await make_executor(stack)
            with ResultWriter(args.out) as writer:
                for index, item in enumerate(items, 1):
                    if args.max_seconds and time.monotonic() - started > args.max_seconds:
                        print("time is up; rerun to resume", file=sys.stderr)
                        break
                    row = await study_item(service, executor, item, args.k, given.get(item.id))
                    writer.write(row)
                    print(
                        f"[{index}/{len(items)}] {item.id}: {len(row['prose'])} prose drafts",
                        file=sys.stderr,
                    )
    finally:
        await service.backend.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("evals/splits/gsm8k-train-dev.jsonl"))
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--k", type=int, default=4, help="drafts per question")
    parser.add_argument(
        "--from-samples",
        type=Path,
        help="take each question's greedy chain-of-thought solution from this pipeline "
        "sample file (training/sample_pipeline.py, GSM8K train) as its prose draft",
    )
    parser.add_argument("--max-seconds", type=float, default=0, help="stop after (0: never)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--summary", type=Path, nargs="+", help="print the table of these files")
    args = parser.parse_args(argv)
    if args.summary:
        print(summary(args.summary))
        return 0
    if args.out is None:
        parser.error("--out is required to run the study")
    if not args.from_samples and ("test" in args.data.name or "svamp" in str(args.data)):
        parser.error("the study draws on GSM8K train only (test and SVAMP are for reporting)")
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    sys.exit(main())
