"""Replay the served two-stage vote with the verifier choosing among the leading answers.

Reads a `training.rerank` report (every sample's verifier probability, `items`) and the
sample file it scored (`training.sample_pipeline`: plans and solutions in the order
drawn), and replays `/reason`'s two stages for four plans and three solutions (the first
plan and the greedy solution; the rest only when those disagree). The vote is counted as
the orchestrator counts it (`services.answers.answer_key`, `vote_weight`); among the
answers within `margin` votes of the leader, the one whose best sample the verifier
scores highest is served (`none`: the plain vote, a tie to the answer drawn first; `0`:
the verifier breaks exact ties, as the orchestrator does).

    python -m scripts.replay_tie_break docs/eval/dev/rerank/8x8-qwen05-llamacpp.json \
        docs/eval/dev/1.5b-draft-samples-8x8.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evals.extract import extract_number, is_correct
from evals.votes import tally, winner
from orchestrator.service import unanimous
from services.answers import answer_key

MARGINS = (None, 0.0, 0.5, 1.0, 2.0)


def choose(samples: list[dict], question: str, margin: float | None, plans: int, prose: int):
    by_kind = {
        kind: sorted((s for s in samples if s["kind"] == kind), key=lambda s: s["sample"])
        for kind in ("plan", "prose")
    }
    first = [*by_kind["plan"][:1], *by_kind["prose"][:1]]
    if unanimous([answer_key(s["answer"]) for s in first], 2):
        return first[0]["answer"], False
    drawn = [*by_kind["plan"][:plans], *by_kind["prose"][:prose]]
    votes = tally([d["answer"] for d in drawn], question)
    if not votes:
        return None, False
    best_p: dict[str, float] = {}
    for d in drawn:
        k = answer_key(d["answer"])
        if k is not None:
            best_p[k] = max(best_p.get(k, 0.0), d.get("p") or 0.0)
    order = list(votes)  # first drawn first
    plain = str(answer_key(winner([d["answer"] for d in drawn], question)))  # votes: one at least
    if margin is None:
        return votes[plain][1], False
    top = votes[plain][0]
    near = [k for k in order if votes[k][0] >= top - margin - 1e-9]
    chosen = max(near, key=lambda k: (best_p[k], votes[k][0], -order.index(k)))
    return votes[chosen][1], chosen != plain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="training.rerank --out, with items")
    parser.add_argument("samples", type=Path, help="the sample file it scored")
    parser.add_argument("--plans", type=int, default=4)
    parser.add_argument("--prose", type=int, default=3)
    args = parser.parse_args(argv)
    questions: dict[str, dict] = {}
    for line in args.samples.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            questions.setdefault(row["id"], row)
    items = json.loads(args.report.read_text(encoding="utf-8"))["items"]
    print("| margin | right | answers the verifier changed |")
    print("|---|---:|---:|")
    for margin in MARGINS:
        right = changed = 0
        for item in items:
            row = questions[item["id"]]
            question = (row.get("claim") or {}).get("question", "")
            answer, moved = choose(item["samples"], question, margin, args.plans, args.prose)
            right += is_correct(extract_number(answer), row["gold"])
            changed += moved
        label = "plain vote" if margin is None else f"{margin:g}"
        print(f"| {label} | {right}/{len(items)} | {changed} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
