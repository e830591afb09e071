"""What each replanning rule gains per second spent, from one run with every rule on.

Run a pipeline mode on the GSM8K train dev split with every rule configured and one
replan allowed (`ORCH_REPLAN_ON='["no_answer","rejected","low_agreement"]'
ORCH_MAX_REPLANS=1`): a request whose first round has any reason to replan runs a second
round, and its result line keeps both rounds (`replanning`: each round's answer,
calibrated confidence, verdict, agreement, the reasons it was worth another round, and
its wall time). From those lines each rule is replayed on its own, paired per item:

- without replanning, the first round's answer is served;
- with rule R alone, an item whose first round had reason R is served the more trusted
  of its two rounds, as the orchestrator chooses (an answer over none, not rejected over
  rejected, then the calibrated confidence, then the share of samples agreeing); every
  other item keeps its first round, and costs nothing more.

The gain is the right answers R adds (right after, wrong before) less those it loses,
and its cost the second rounds' wall time. One caveat: the second round is drawn with
the feedback of the first reason in the order `no_answer`, `rejected`, `low_agreement`,
so for an item with two reasons the replay of the later one uses the earlier one's
feedback. A round's answer is read from the response's summary of it, cut to 200
characters like every vote. A line with more than two rounds is refused.

    python -m evals.replans docs/eval/dev/1.5b-replan-study.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evals.data import load_results
from evals.extract import extract_number, is_correct
from services.schemas import REPLAN_REASONS

RULES = REPLAN_REASONS  # the orchestrator's, in its order


def trust(summary: dict[str, Any]) -> tuple[bool, bool, float, float]:
    """The orchestrator's order of rounds (orchestrator.service.Outcome.trust)."""
    return (
        summary["answer"] is not None,
        summary["verdict"] != "rejected",
        float(summary["confidence"]),
        summary["agreeing"] / max(summary["samples"], 1),
    )


def right(summary: dict[str, Any], gold: float | int) -> bool:
    return is_correct(extract_number(summary["answer"]), gold)


def replay(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per rule: items it replans, right answers gained and lost, seconds spent."""
    answered = [r for r in records if r.get("error") is None]
    base = 0
    rules = {rule: {"replanned": 0, "gained": 0, "lost": 0, "seconds": 0.0} for rule in RULES}
    for r in answered:
        rounds = r.get("replanning") or []
        first_right = right(rounds[0], r["gold"]) if rounds else bool(r["correct"])
        base += first_right
        if len(rounds) < 2:
            continue
        if len(rounds) > 2:
            raise ValueError(
                f"item {r['id']} ran {len(rounds)} rounds: replay needs a run with one "
                "replan at most (ORCH_MAX_REPLANS=1)"
            )
        first, second = rounds
        served = max(first, second, key=trust)  # max keeps the first of equals
        delta = int(right(served, r["gold"])) - int(first_right)
        for rule in first["replan_reasons"]:
            stats = rules[rule]
            stats["replanned"] += 1
            stats["gained"] += delta > 0
            stats["lost"] += delta < 0
            stats["seconds"] += second["ms"] / 1000
    n = len(answered)
    for stats in rules.values():
        net = stats["gained"] - stats["lost"]
        stats["seconds"] = round(stats["seconds"], 1)
        stats["net"] = net
        stats["accuracy"] = round((base + net) / n, 4) if n else None
        stats["right_per_100s"] = (
            round(100 * net / stats["seconds"], 3) if stats["seconds"] else None
        )
    return {
        "items": n,
        "failed": len(records) - n,
        "without_replanning": {"right": base, "accuracy": round(base / n, 4) if n else None},
        "served_with_every_rule": sum(bool(r["correct"]) for r in answered),
        "rules": rules,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    records = load_results(args.paths)
    if not records:
        print("no result lines", file=sys.stderr)
        return 1
    try:
        print(json.dumps(replay(records), indent=2))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
