"""Compare planner runs (with and without an adapter) on the same questions.

Input: sample files of `training.sample_pipeline` run with one plan per question
(`--plans 1 --prose 0`), greedy (`PLANNER_TEMPERATURE=0`), one file per arm, same
questions, same prompts. For each arm: executed-plan accuracy (the plan's executed
answer right by the evaluation's rule), plans made (every plan on the wire is
schema-valid: the planner returns none it could not validate, so a question without a
plan is counted, not a schema failure), void steps per plan
(`orchestrator.contribution.void_steps`), and seconds per question (P50, P95: the plan's
generation and execution). Against the first arm: the paired counts and the exact
McNemar p over the questions both arms answered.

    python -m training.planner_eval var/planner-eval/base-test.jsonl \\
        var/planner-eval/lora-test.jsonl --out docs/benchmarks/results/planner-lora-test.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evals.stats import percentile, wilson_interval
from orchestrator.contribution import void_steps
from training.compare import mcnemar_p
from training.planner_data import execution_of
from training.sample_pipeline import read_samples


def first_plans(path: Path) -> dict[str, dict[str, Any]]:
    """Each question's first plan sample in a file."""
    rows: dict[str, dict[str, Any]] = {}
    for row in read_samples(path):
        if row["kind"] == "plan" and row["sample"] == 0:
            rows.setdefault(row["id"], row)
    return rows


def arm(rows: dict[str, dict[str, Any]], ids: list[str]) -> dict[str, Any]:
    picked = [rows[i] for i in ids]
    right = sum(bool(r["label"]) for r in picked)
    planned = [r for r in picked if r.get("plan") is not None]
    voids = [len(void_steps(execution_of(r))) for r in planned]
    seconds = [float(r["seconds"]) for r in picked if r.get("seconds") is not None]
    low, high = wilson_interval(right, len(picked))
    models = sorted({r["model"] for r in picked})
    return {
        "model": models[0] if len(models) == 1 else models,
        "questions": len(picked),
        "right": right,
        "accuracy": round(right / max(1, len(picked)), 4),
        "wilson95": [round(low, 4), round(high, 4)],
        "with_plan": len(planned),
        "void_steps_per_plan": round(statistics.fmean(voids), 4) if voids else None,
        "plans_with_void_steps": sum(v > 0 for v in voids),
        "steps_per_plan": round(statistics.fmean(len(r["plan"]["steps"]) for r in planned), 3)
        if planned
        else None,
        "seconds_p50": round(percentile(seconds, 50), 2) if seconds else None,
        "seconds_p95": round(percentile(seconds, 95), 2) if seconds else None,
        "seconds_mean": round(statistics.fmean(seconds), 2) if seconds else None,
    }


def compare(paths: Sequence[Path]) -> dict[str, Any]:
    runs = [first_plans(p) for p in paths]
    ids = sorted(set.intersection(*(set(r) for r in runs)), key=lambda i: (len(i), i))
    arms = [arm(r, ids) for r in runs]
    report: dict[str, Any] = {
        "files": [str(p) for p in paths],
        "common_questions": len(ids),
        "arms": arms,
    }
    base = runs[0]
    for k, other in enumerate(runs[1:], start=1):
        only_base = sum(base[i]["label"] and not other[i]["label"] for i in ids)
        only_other = sum(other[i]["label"] and not base[i]["label"] for i in ids)
        a, b = arms[0], arms[k]
        report.setdefault("against_first", []).append(
            {
                "arm": k,
                "points": round(100 * (b["accuracy"] - a["accuracy"]), 2),
                "only_first_right": only_base,
                "only_this_right": only_other,
                "mcnemar_p": round(mcnemar_p(only_base, only_other), 4),
                "seconds_p50_ratio": round(b["seconds_p50"] / a["seconds_p50"], 3)
                if a["seconds_p50"] and b["seconds_p50"]
                else None,
            }
        )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, nargs="+", help="one sample file per arm")
    parser.add_argument("--out", type=Path, help="write the report here as JSON")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.samples if not p.is_file()]
    if missing:
        parser.error(f"no such sample file: {', '.join(missing)}")
    report = compare(args.samples)
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
