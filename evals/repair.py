"""Replays sampled plans as written and as the planner now repairs them.

The pipeline sampler's files (`training/sample_pipeline.py`) hold every plan a question
drew, with the steps it ran. This executes each plan twice with the orchestrator's own
executor and tools (python in the sandbox, calc, SQL, lookup): as the model wrote it and
after `planner.repair.repair_plan`, and labels both answers by the evaluation's one rule.
What it reports per file: plans, plans the repair changed, and how many answer and are
right each way; with `--by-question`, the same for the first plan of each question (what
`plan` with n = 1 would have answered).

    python -m evals.repair training/samples/qwen2.5-coder-1.5b-instruct/gsm8k-train-draft.jsonl

The plans run off the tool cache and within the executor's per-step limits; a plan
whose repair changes nothing is run once and counted the same both ways.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from evals.extract import extract_number, is_correct
from orchestrator.limits import ToolBudget
from planner.repair import repair_plan
from services.schemas import Plan

EXECUTE_TIMEOUT_S = 60.0


def _right(answer: str | None, gold: Any) -> bool:
    return is_correct(extract_number(answer), gold)


def read_rows(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


async def replay(path: Path, rows: list[dict[str, Any]], executor: Any) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    first: Counter[str] = Counter()
    changed_examples: list[dict[str, Any]] = []
    seen_questions: set[str] = set()
    loop = asyncio.get_running_loop()
    for row in rows:
        if row.get("kind") != "plan" or not row.get("plan"):
            continue
        plan = Plan.model_validate(row["plan"])
        fixed, repairs = repair_plan(plan)
        budget = ToolBudget(64)
        written = await executor.run(plan, deadline=loop.time() + EXECUTE_TIMEOUT_S, budget=budget)
        after = (
            await executor.run(fixed, deadline=loop.time() + EXECUTE_TIMEOUT_S, budget=budget)
            if repairs
            else written
        )
        outcome = {
            "written_answered": written.answer is not None,
            "written_right": _right(written.answer, row["gold"]),
            "repaired_answered": after.answer is not None,
            "repaired_right": _right(after.answer, row["gold"]),
        }
        counts["plans"] += 1
        counts["repaired"] += bool(repairs)
        for key, value in outcome.items():
            counts[key] += value
        if row["id"] not in seen_questions:  # the question's first plan: `plan`, n = 1
            seen_questions.add(row["id"])
            first["questions"] += 1
            first["repaired"] += bool(repairs)
            for key, value in outcome.items():
                first[key] += value
        if repairs and outcome["written_right"] != outcome["repaired_right"]:
            changed_examples.append(
                {"id": row["id"], "sample": row["sample"], "right_after": outcome["repaired_right"]}
            )
    return {
        "file": str(path),
        "plans": dict(counts),
        "first_plans": dict(first),
        "changed": changed_examples,
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| file | plans | repaired | answered: written → repaired | right: written → repaired |",
        "|---|---:|---:|---|---|",
    ]
    for r in results:
        for label, c, total in (
            ("every plan", r["plans"], r["plans"].get("plans", 0)),
            ("first plan of each question", r["first_plans"], r["first_plans"].get("questions", 0)),
        ):
            lines.append(
                f"| {Path(r['file']).name} ({label}) | {total} | {c.get('repaired', 0)} | "
                f"{c.get('written_answered', 0)} → {c.get('repaired_answered', 0)} | "
                f"{c.get('written_right', 0)} → {c.get('repaired_right', 0)} |"
            )
    return "\n".join(lines)


async def main_async(files: dict[Path, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    from training.sample_pipeline import make_executor

    async with AsyncExitStack() as stack:
        executor = await make_executor(stack)
        return [await replay(path, rows, executor) for path, rows in files.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="pipeline sample files")
    parser.add_argument("--out", type=Path, help="write the counts as JSON here too")
    args = parser.parse_args(argv)
    results = asyncio.run(main_async({path: read_rows(path) for path in args.files}))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(table(results))
    return 0


if __name__ == "__main__":
    import structlog

    # the tools' log lines (one per step) go to stderr: stdout is the table
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    sys.exit(main())
