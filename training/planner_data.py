"""The planner's fine-tuning data: its own right plans, by rejection sampling.

Input: sample files written by `training.sample_pipeline` (plans the serving planner drew
for GSM8K train questions, executed with the orchestrator's real tools, labelled against
the gold answer). The sampler never draws the dev split the answer calibrator is fitted
on, nor the questions the planner's prompts show, so neither reaches this data.

Every plan sample passes these rules in order, and the report counts what each removed:

1. `no_plan`: the planner made no valid plan (the sample has an error and no plan);
2. `wrong`: its executed answer is wrong or missing (`label` false);
3. `void`: it contains a void step, `orchestrator.contribution.void_steps`'s definition
   (a step that produced no value, being failed, timed out or skipped, or that no path to the
   answer step uses). Such a plan is dropped whole, never trimmed: its right answer
   does not make the rest of it a plan worth imitating;
4. `duplicate`: the same program as a plan already kept for the question (same steps,
   tools, inputs, dependencies and answer step; the free-text reasoning is not
   compared, so two wordings of one program count once).

What is kept is written as SFT examples (`question`, the plan as the planner's JSON,
`weight`), each question's examples in one split by a seeded hash of its id (`train`,
`val`), with `recipe.json` holding the rules' counts, the inputs and the split recipe.
Every kept plan has weight 1.0; down-weighting steps by their counterfactual contribution
(`orchestrator.contribution.contributions`, which reruns the tools) is not applied here.

    python -m training.planner_data --samples var/planner-samples/gsm8k-train.jsonl \\
        --out var/planner-sft
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.contribution import void_steps
from orchestrator.executor import Execution
from services.schemas import Plan, StepResult
from training.sample_pipeline import hash_share, read_samples

RULES = ("no_plan", "wrong", "void", "duplicate")
RECIPE = "planner-sft/1"  # bump when what an example holds, or how it is chosen, changes


@dataclass(frozen=True)
class Split:
    """How kept plans are split by question; saved in `recipe.json`."""

    seed: int = 11  # the hash of (seed, question id) decides a question's split
    val: float = 0.1  # share of questions whose plans go to val (early stopping)


def split_of(question_id: str, split: Split) -> str:
    return "val" if hash_share(split.seed, question_id) < split.val else "train"


def execution_of(sample: dict[str, Any]) -> Execution:
    """The executed plan a sample line records, as the orchestrator held it."""
    plan = Plan.model_validate(sample["plan"])
    return Execution(plan=plan, steps=[StepResult.model_validate(s) for s in sample["steps"]])


def program_key(plan: dict[str, Any]) -> str:
    """What makes two plans the same program: everything but the reasoning."""
    steps = [
        (s["id"], s["tool"], s["input"], sorted(s.get("depends_on") or [])) for s in plan["steps"]
    ]
    return json.dumps([steps, plan["answer_step"]], sort_keys=True)


def rejected_by(sample: dict[str, Any], kept_programs: set[str]) -> str | None:
    """The first rule that removes `sample`, or None when it is kept."""
    if sample.get("plan") is None:
        return "no_plan"
    if not sample["label"]:
        return "wrong"
    if void_steps(execution_of(sample)):
        return "void"
    if program_key(sample["plan"]) in kept_programs:
        return "duplicate"
    return None


def build(rows: Iterable[dict[str, Any]], split: Split) -> tuple[dict[str, list], dict[str, Any]]:
    """The kept examples by split, and the counts: plans seen, removed by each rule, kept,
    and questions with at least one kept plan."""
    removed: Counter[str] = Counter()
    programs: dict[str, set[str]] = {}
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    questions: set[str] = set()
    seen = 0
    for sample in rows:
        if sample["kind"] != "plan":
            continue
        seen += 1
        questions.add(sample["id"])
        kept = programs.setdefault(sample["id"], set())
        rule = rejected_by(sample, kept)
        if rule is not None:
            removed[rule] += 1
            continue
        kept.add(program_key(sample["plan"]))
        splits[split_of(sample["id"], split)].append(
            {
                "id": sample["id"],
                "sample": sample["sample"],
                "model": sample["model"],
                "plan_format": sample["plan_format"],
                "question": sample["claim"]["question"],
                "plan": sample["plan"],
                "weight": 1.0,
            }
        )
    n_kept = sum(len(v) for v in splits.values())
    counts = {
        "plans": seen,
        "removed": {rule: removed[rule] for rule in RULES},
        "kept": n_kept,
        "questions": len(questions),
        "questions_kept": len({e["id"] for v in splits.values() for e in v}),
        "by_split": {name: len(v) for name, v in splits.items()},
    }
    return splits, counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True, help="directory for the splits")
    parser.add_argument("--seed", type=int, default=Split.seed)
    parser.add_argument("--val", type=float, default=Split.val)
    args = parser.parse_args(argv)
    if not 0 <= args.val < 1:
        parser.error("--val must be in [0, 1)")
    missing = [str(p) for p in args.samples if not p.is_file()]
    if missing:
        parser.error(f"no such sample file: {', '.join(missing)}")
    rows = [r for path in args.samples for r in read_samples(path)]
    sources = {(r["model"], r["plan_format"]) for r in rows if r["kind"] == "plan"}
    if len(sources) > 1:
        parser.error(f"the samples mix models or plan formats: {sorted(sources)}")
    split = Split(seed=args.seed, val=args.val)
    splits, counts = build(rows, split)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, examples in splits.items():
        with (args.out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(e, ensure_ascii=False) + "\n" for e in examples)
    recipe = {
        "recipe": RECIPE,
        "samples": [str(p) for p in args.samples],
        "source": [list(s) for s in sorted(sources)],
        "split": asdict(split),
        "rules": list(RULES),
        **counts,
    }
    (args.out / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    print(json.dumps(counts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
