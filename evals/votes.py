"""Replays votes over programs and prose from the sampling study's result lines.

A `votes4x4` line keeps every vote of its item in the order drawn (`agreement.votes`:
four executed plans, then four chain-of-thought solutions, the first of them greedy).
Any vote over the first `p` plans and the first `q` solutions can be replayed from it,
the way the orchestrator counts: answers that mean the same number vote together
(`services.answers.answer_key`, the orchestrator's own), the most votes win, and a tie goes to the sample
drawn first (plans before solutions, as the orchestrator orders them; the verifier,
which breaks ties when asked, is left out). A replay is scored with the evaluation's
one extraction rule.

It reads the pipeline sampler's files too (`training/sample_pipeline.py`: each
question's plans, executed, and its solutions, the first greedy, drawn as the orchestrator
draws them), so the same table can be reported on the questions sampled there.

    python -m evals.votes docs/eval/dev/1.5b-votes4x4.jsonl
    python -m evals.votes training/samples/qwen2.5-coder-1.5b-instruct/gsm8k-test.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evals.extract import extract_number, is_correct
from evals.stats import wilson_interval
from services.answers import answer_key, numbers, vote_weight


@dataclass(frozen=True)
class VoteItem:
    id: str
    gold: int | float
    plans: tuple[str | None, ...]
    prose: tuple[str | None, ...]
    question: str = ""


def load(paths: Iterable[Path]) -> list[VoteItem]:
    """The last line of each item with every vote recorded (failed requests left out),
    or, from pipeline sample files, each question's samples in the order drawn."""
    last: dict[str, dict] = {}
    samples: dict[str, list[dict]] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                if "kind" in record and "sample" in record:
                    rows = samples.setdefault(record["id"], [])
                    if any(
                        (r["kind"], r["sample"]) == (record["kind"], record["sample"]) for r in rows
                    ):
                        raise ValueError(
                            f"{path}: {record['id']} has {record['kind']} sample "
                            f"{record['sample']} twice (two runs of one question?)"
                        )
                    rows.append(record)
                else:
                    last[record["id"]] = record
    items = [_from_samples(rows) for rows in samples.values()]
    for record in last.values():
        votes = (record.get("agreement") or {}).get("votes") or []
        if record.get("error") or not votes:
            continue
        items.append(
            VoteItem(
                id=record["id"],
                gold=record["gold"],
                plans=tuple(v["answer"] for v in votes if v["source"] == "plan"),
                prose=tuple(v["answer"] for v in votes if v["source"] == "prose"),
                question=record.get("question", ""),
            )
        )
    return items


def _from_samples(rows: list[dict]) -> VoteItem:
    def answers(kind: str) -> tuple[str | None, ...]:
        return tuple(
            r["answer"] for r in sorted(rows, key=lambda r: r["sample"]) if r["kind"] == kind
        )

    first = rows[0]
    question = next((r["claim"]["question"] for r in rows if r.get("claim")), "")
    return VoteItem(
        id=first["id"],
        gold=first["gold"],
        plans=answers("plan"),
        prose=answers("prose"),
        question=question,
    )


def tally(answers: Sequence[str | None], question: str = "") -> dict[str, tuple[float, str]]:
    """Each answer key's votes, each sample weighed as the orchestrator weighs it against
    `question` (`services.answers.vote_weight`), with the answer's text as first given;
    keys in the order first given."""
    votes: dict[str, tuple[float, str]] = {}
    for a in answers:
        k = answer_key(a)
        if k is not None:
            weight, text = votes.get(k, (0.0, a or ""))
            votes[k] = (weight + vote_weight(a, question), text)
    return votes


def winner(answers: Sequence[str | None], question: str = "") -> str | None:
    """The answer most of `answers` agree on (`tally`); a tie goes to the one given
    first."""
    votes = tally(answers, question)
    if not votes:
        return None
    order = list(votes)
    best = max(votes, key=lambda k: (votes[k][0], -order.index(k)))
    return votes[best][1]


def replay(item: VoteItem, p: int, q: int) -> str | None:
    return winner([*item.plans[:p], *item.prose[:q]], item.question)


def right(item: VoteItem, answer: str | None) -> bool:
    return is_correct(extract_number(answer), item.gold)


def served(item: VoteItem, p: int, q: int) -> tuple[str | None, int]:
    """What the orchestrator's adaptive sampling serves for `p` plans and `q` solutions,
    and how many samples it draws for it (`orchestrator.service.first_stage`): with both
    kinds, the first plan and the greedy solution, the rest only when those two disagree
    (then the vote of all); plans alone, a majority first and the rest only while the vote
    is open (`settled`; the answer is the full draw's)."""
    from orchestrator.service import first_stage, settled, two_stage

    first_p, first_q = first_stage(p, q)
    if two_stage(p, q):
        return staged(item, p, q, first_p, first_q)
    full = replay(item, p, q)
    first = (*item.plans[:first_p], *item.prose[:q])
    answers = [answer_key(a) for a in first]
    weights = [vote_weight(a, item.question) for a in first]
    return full, (first_p + q if first_p < p and settled(answers, p + q, weights) else p + q)


def staged(item: VoteItem, p: int, q: int, first_p: int, first_q: int) -> tuple[str | None, int]:
    """Early stopping on agreement with another first stage: the first `first_p` plans
    and `first_q` solutions, the answer when they all agree, else the vote of all `p`
    plans and `q` solutions (how the first stage of `first_stage` was chosen)."""
    from orchestrator.service import unanimous

    first = [*item.plans[:first_p], *item.prose[:first_q]]
    if unanimous([answer_key(a) for a in first], first_p + first_q):
        return winner(first, item.question), first_p + first_q
    return replay(item, p, q), p + q


def margin(answers: Sequence[str | None], question: str = "") -> float:
    """The leading answer's votes less the runner-up's (`tally`; 0 for a tie at the top,
    the leader's whole vote when it stands alone)."""
    weights = sorted((w for w, _ in tally(answers, question).values()), reverse=True)
    leader, runner_up = [*weights, 0.0, 0.0][:2]
    return leader - runner_up


def escalated(
    item: VoteItem, stages: Sequence[tuple[int, int]], open_margin: float
) -> tuple[str | None, int]:
    """Sampling in stages (cumulative plans and solutions per stage, the last one all of
    them): the first stage stops when its samples are unanimous (`staged`); a later stage
    stops when the leader is more than `open_margin` votes ahead of the runner-up (0:
    only a tie goes on). Returns the served answer and the samples drawn."""
    from orchestrator.service import unanimous

    p, q = stages[0]
    first = [*item.plans[:p], *item.prose[:q]]
    if len(stages) == 1 or unanimous([answer_key(a) for a in first], p + q):
        return winner(first, item.question), p + q
    for k, (p, q) in enumerate(stages[1:], 2):
        answers = [*item.plans[:p], *item.prose[:q]]
        if k == len(stages) or margin(answers, item.question) > open_margin:
            return winner(answers, item.question), p + q
    raise AssertionError("unreachable: the last stage always answers")


def drawn(item: VoteItem, p: int, q: int) -> int:
    """Samples the orchestrator's adaptive sampling draws for `p` plans and `q` solutions."""
    return served(item, p, q)[1]


def table(items: list[VoteItem], max_p: int = 4, max_q: int = 4) -> list[dict]:
    rows = []
    for p in range(max_p + 1):
        for q in range(max_q + 1):
            if p + q == 0:
                continue
            usable = [i for i in items if len(i.plans) >= p and len(i.prose) >= q]
            k = sum(right(i, replay(i, p, q)) for i in usable)
            low, high = wilson_interval(k, len(usable))
            adaptive = [served(i, p, q) for i in usable]
            mean_drawn = sum(n for _, n in adaptive) / max(len(usable), 1)
            rows.append(
                {
                    "plans": p,
                    "prose": q,
                    "items": len(usable),
                    "right": k,
                    "right_served": sum(
                        right(i, a) for i, (a, _) in zip(usable, adaptive, strict=True)
                    ),
                    "ci": (low, high),
                    "drawn": round(mean_drawn, 2),
                }
            )
    return rows


def whole_weighting(items: list[VoteItem], p: int, q: int) -> dict[str, int]:
    """What `services.answers.vote_weight` does to the vote over the first `p` plans and
    `q` solutions: right answers with it and without it (every answer counting 1), the
    answers it changed, by whether they became right or wrong, and the samples it weighed
    down (and how many of those were right)."""
    keys = ("weighed", "plain", "changed", "won", "lost", "samples", "down", "down_right")
    out = dict.fromkeys(keys, 0)
    for item in items:
        answers = [*item.plans[:p], *item.prose[:q]]
        for a in answers:
            if a is None:
                continue
            out["samples"] += 1
            if vote_weight(a, item.question) < 1:
                out["down"] += 1
                out["down_right"] += right(item, a)
        weighed, plain = winner(answers, item.question), winner(answers)
        out["weighed"] += right(item, weighed)
        out["plain"] += right(item, plain)
        if answer_key(weighed) != answer_key(plain):
            out["changed"] += 1
            out["won"] += right(item, weighed) and not right(item, plain)
            out["lost"] += right(item, plain) and not right(item, weighed)
    return out


def largest_number(question: str) -> float:
    """The largest number the question states (0 when none)."""
    values = [extract_number(n) for n in numbers(question)]
    return max((abs(float(v)) for v in values if v is not None), default=0.0)


def routed(
    items: list[VoteItem], big: float, large: tuple[int, int], small: tuple[int, int]
) -> int:
    """Right answers of a router by the question's numbers: the `large` (plans, prose)
    vote where a number of at least `big` appears, the `small` one elsewhere."""
    return sum(
        right(i, replay(i, *(large if largest_number(i.question) >= big else small))) for i in items
    )


def escalation_table(
    items: list[VoteItem], max_p: int, max_q: int
) -> list[tuple[str, int, float, int]]:
    """A third stage over the served two (`orchestrator.service.first_stage`: the first
    plan and the greedy solution, then four plans and three solutions): every plan and
    solution drawn when the second stage's leader is at most `open_margin` votes ahead.
    Rows: (rule, right, mean samples drawn, items that drew the third stage)."""
    rows = []
    schedules: list[tuple[str, list[tuple[int, int]], float]] = [
        ("two stages, 4 plans + 3 solutions (served)", [(1, 1), (4, 3)], 0.0),
        (f"two stages, {max_p} plans + {max_q} solutions", [(1, 1), (max_p, max_q)], 0.0),
    ]
    for m in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0):
        schedules.append(
            (
                f"three stages, to {max_p} + {max_q} when the margin is <= {m:g}",
                [(1, 1), (4, 3), (max_p, max_q)],
                m,
            )
        )
    for label, stages, m in schedules:
        got = [escalated(i, stages, m) for i in items]
        third = sum(n == max_p + max_q for _, n in got) if len(stages) == 3 else 0
        rows.append(
            (
                label,
                sum(right(i, a) for i, (a, _) in zip(items, got, strict=True)),
                sum(n for _, n in got) / max(len(items), 1),
                third,
            )
        )
    return rows


def print_escalation(items: list[VoteItem], max_p: int, max_q: int) -> None:
    print(f"\nmore samples only when the vote stays open ({len(items)} items):")
    print("| rule | right | drawn (mean) | items that drew the third stage |")
    print("|---|---:|---:|---:|")
    for label, k, mean, third in escalation_table(items, max_p, max_q):
        print(f"| {label} | {k}/{len(items)} | {mean:.2f} | {third} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    items = load(args.paths)
    if not items:
        print("no item with recorded votes", file=sys.stderr)
        return 1
    # the votes every item can replay (files of different draws: the smaller of each)
    max_p = min(len(i.plans) for i in items)
    max_q = min(len(i.prose) for i in items)
    print(f"{len(items)} items\n")
    print(
        "| plans | prose | samples | right, all drawn | accuracy | Wilson 95% "
        "| right, adaptive (served) | drawn (adaptive, mean) |"
    )
    print("|---:|---:|---:|---:|---:|---|---:|---:|")
    for row in table(items, max_p, max_q):
        n = row["items"]
        low, high = row["ci"]
        print(
            f"| {row['plans']} | {row['prose']} | {row['plans'] + row['prose']} | "
            f"{row['right']}/{n} | {100 * row['right'] / n:.1f}% | "
            f"{100 * low:.1f}–{100 * high:.1f} | {row['right_served']}/{n} | {row['drawn']:.2f} |"
        )
    full = [i for i in items if len(i.plans) >= max_p and len(i.prose) >= max_q]
    if max_p >= 2 and max_q >= 2:
        p, q = min(max_p, 4), min(max_q, 3)
        print(f"\nearly stop on agreement, {p} plans and {q} solutions:")
        print("| first plans | first solutions | right | drawn (mean) | stopped early (right) |")
        print("|---:|---:|---:|---:|---|")
        for first_p, first_q in ((1, 1), (1, 2), (2, 1), (2, 2)):
            got = [staged(i, p, q, first_p, first_q) for i in full]
            stopped = [
                (i, a) for i, (a, n) in zip(full, got, strict=True) if n == first_p + first_q
            ]
            print(
                f"| {first_p} | {first_q} | "
                f"{sum(right(i, a) for i, (a, _) in zip(full, got, strict=True))}/{len(full)} | "
                f"{sum(n for _, n in got) / len(full):.2f} | "
                f"{len(stopped)} ({sum(right(i, a) for i, a in stopped)}) |"
            )

    if max_p > 4 or max_q > 3:
        print_escalation(full, max_p, max_q)

    def weighing(label: str, items: list[VoteItem], p: int, q: int) -> None:
        w = whole_weighting(items, p, q)
        print(
            f"\nwhole-number weighting ({label}): {w['weighed']}/{len(items)} right with it, "
            f"{w['plain']}/{len(items)} without; it changed {w['changed']} answers: "
            f"{w['won']} became right, {w['lost']} wrong; it weighed down {w['down']} of "
            f"{w['samples']} answers, {w['down_right']} of them right"
        )

    if max_p + max_q >= 2:
        p, q = min(max_p, 4), min(max_q, 3)
        weighing(f"{p} plans and {q} solutions, all drawn", full, p, q)
    # a served run's items drew what adaptive sampling drew: every recorded vote
    most_p, most_q = max(len(i.plans) for i in items), max(len(i.prose) for i in items)
    if (most_p, most_q) != (max_p, max_q):
        weighing("every vote each item recorded", items, most_p, most_q)
    oracle = sum(any(right(i, a) for a in (*i.plans, *i.prose)) for i in full)
    print(f"\nsome sample right (the headroom of any vote or router): {oracle}/{len(full)}")
    for big in (100, 1000, 10000):
        large = sum(largest_number(i.question) >= big for i in full)
        k = routed(full, big, (1, 0), (0, 1))
        print(
            f"router, one sample: a plan where a number >= {big} appears "
            f"({large} items), else the greedy solution: {k}/{len(full)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
