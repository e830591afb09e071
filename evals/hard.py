"""A GSM-Hard-style split drawn from GSM8K **train**: one number of each question made
large, the answer recomputed from the question's own worked solution.

GSM-Hard (Gao et al., PAL, 2023) replaced a number of each GSM8K **test** question with a
large one and recomputed the answer with a program; it is where executed programs beat
chain-of-thought most. It is built on test questions, so nothing may be tuned on it here.
This split is built the same way from train questions, so that routing, vote rules and
thresholds can be measured on large numbers without touching GSM8K test:

- a GSM8K solution marks each calculation `<<48/2=24>>`; every annotation of the question
  must evaluate exactly (`services.arith.evaluate`) to the result it states, and the last
  one to the question's answer, or the question is skipped (GSM8K's slips and roundings);
- the number replaced is a whole number of at least 3 written once in the question (not
  a percentage, not part of a decimal, a fraction, a time or a thousands-separated
  number), of a value no other number of the question and no result of its solution has,
  not a value solutions use as a unit (12, 60, 100, ...: `UNIT_VALUES`), and an operand
  of some annotation; it becomes a random integer of 4 to 7 digits (seeded
  per question);
- the annotations are evaluated again in order, every operand of the replaced value or of
  an earlier result that changed taking its new value (a result that changes may not
  have a unit's value or one the question states); the new last result is the answer
  (an integer, or a decimal when a division no longer comes out whole, as in GSM-Hard);
  a question whose new answer is negative (a count or a price the change broke: "9415312
  less than half as many trees as 60") is skipped.

What it cannot see: an operand that has the replaced number's value but another meaning
(a constant 12 months beside a question's 12 eggs) takes the new value too, so a few
golds are wrong, as in GSM-Hard itself. Each item names its source question (`source`)
and the replacement (`replaced`).

    python -m evals.hard --n 200 --out evals/splits/gsm8k-train-hard.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Iterable
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path
from typing import Any

from evals.datasets import GSM8K_TRAIN
from services.arith import ArithError, evaluate, parse_number

DEV_SPLIT = Path(__file__).resolve().parent / "splits" / "gsm8k-train-dev.jsonl"
ANNOTATION_RE = re.compile(r"<<([^<>=]+)=([^<>]+)>>")
OPERAND_RE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
# a whole number of the question: not glued to a letter, a decimal point, a thousands
# comma, a fraction's slash or a time's colon on either side, nor followed by a percent
QUESTION_INT_RE = re.compile(r"(?<![\w.,/:$-])(\d+)(?![\w.,/:%]|\s*%|\s*percent)")
ANY_NUMBER_RE = re.compile(r"\d+(?:[.,]\d+)*")
NEW_DIGITS = (4, 7)  # the replacement's digits, at least and at most
MAX_ANSWER = Fraction(10) ** 15  # past this the gold says little about reasoning
# values solutions use as units (a dozen, a week, an hour, a percent, a year): an operand
# of such a value may be the unit, not the number or result of that value, so neither the
# replaced number nor a result that changes may have one
UNIT_VALUES = frozenset(Fraction(v) for v in (2, 3, 4, 7, 10, 12, 24, 30, 52, 60, 100, 365, 1000))


def annotations(solution: str) -> list[tuple[str, Fraction]] | None:
    """The solution's calculations as (expression, stated result), or None when one
    does not evaluate exactly to what it states."""
    found = []
    for expr, stated in ANNOTATION_RE.findall(solution):
        result = parse_number(stated.strip().replace(",", ""))
        if "," in expr or result is None:
            return None
        try:
            value = evaluate(expr)
        except ArithError:
            return None
        if not isinstance(value, Fraction) or value != result:
            return None
        found.append((expr, result))
    return found or None


def _operands(expr: str) -> list[tuple[int, int, Fraction]]:
    spans = []
    for m in OPERAND_RE.finditer(expr):
        value = parse_number(m.group())
        if value is not None:
            spans.append((m.start(), m.end(), value))
    return spans


def recompute(
    calcs: list[tuple[str, Fraction]],
    old: Fraction,
    new: Fraction,
    taken: frozenset[Fraction] = frozenset(),
) -> Fraction | None:
    """The last result with every operand of value `old` read as `new`, and every
    operand that is an earlier result read as that result's new value; None when a
    calculation no longer evaluates (a division by zero), two values would clash, or a
    result that changes has a value in `taken` (a unit, or a number the question states:
    an operand of that value may not be the result)."""
    changed: dict[Fraction, Fraction] = {old: new}
    result: Fraction | None = None
    for expr, stated in calcs:
        names: dict[str, Fraction] = {}
        parts, last = [], 0
        for k, (start, end, value) in enumerate(_operands(expr)):
            if value in changed:
                parts.append(expr[last:start])
                parts.append(f"n{k}")
                names[f"n{k}"] = changed[value]
                last = end
        parts.append(expr[last:])
        try:
            value = evaluate("".join(parts), names)
        except ArithError:
            return None
        if not isinstance(value, Fraction):
            return None
        if value != stated:
            if stated in taken or (stated in changed and changed[stated] != value):
                return None  # one old value, two meanings or two new ones: ambiguous
            changed[stated] = value
        result = value
    return result


def harden(item: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
    """`item` with one number made large and its answer recomputed, or None (rules in the
    module's docstring)."""
    calcs = annotations(item.get("solution", ""))
    answer = parse_number(str(item["answer"]))
    if calcs is None or answer is None or calcs[-1][1] != answer:
        return None
    question = item["question"]
    every = [parse_number(n.replace(",", "")) for n in ANY_NUMBER_RE.findall(question)]
    results = {r for _, r in calcs}
    operands = {v for expr, _ in calcs for _, _, v in _operands(expr)}
    candidates = []
    for m in QUESTION_INT_RE.finditer(question):
        value = Fraction(int(m.group(1)))
        usable = value >= 3 and value not in UNIT_VALUES and every.count(value) == 1
        if usable and value not in results and value in operands:
            candidates.append((m, value))
    if not candidates:
        return None
    m, old = rng.choice(candidates)
    new = Fraction(rng.randint(10 ** (NEW_DIGITS[0] - 1), 10 ** NEW_DIGITS[1] - 1))
    gold = recompute(calcs, old, new, UNIT_VALUES | {v for v in every if v is not None})
    if gold is None or gold == answer or gold < 0 or gold > MAX_ANSWER:
        return None  # a negative count or price is a question the change broke
    text = question[: m.start(1)] + str(new) + question[m.end(1) :]
    return {
        "id": f"{item['id'].replace('gsm8k-train', 'gsm8k-train-hard')}",
        "question": text,
        "answer": _gold_text(gold),
        "source": item["id"],
        "replaced": {"old": str(old), "new": str(new)},
    }


def _gold_text(value: Fraction) -> str:
    """The gold as the datasets write it: an integer, or a decimal rounded to 12 places,
    trailing zeros dropped (the evaluation compares within 1e-6)."""
    if value.denominator == 1:
        return str(value.numerator)
    with localcontext() as ctx:
        ctx.prec = 60
        decimal = Decimal(value.numerator) / Decimal(value.denominator)
        return f"{decimal:.12f}".rstrip("0").rstrip(".")


def _ids(paths: Iterable[Path]) -> set[str]:
    ids: set[str] = set()
    for path in paths:
        for line in path.read_text(encoding="utf-8").split("\n"):  # not splitlines: U+2028
            if line.strip():
                ids.add(str(json.loads(line)["id"]))
    return ids


def build(
    items: Iterable[dict[str, Any]], n: int, seed: int, exclude: set[str], shown: set[str]
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The first `n` items that harden, in the source's order, each with its own seeded
    generator (an item's replacement does not depend on which items came before it), and
    how many source items were skipped for each reason."""
    out: list[dict[str, Any]] = []
    skipped = {"excluded": 0, "shown as an example": 0, "no usable number or solution": 0}
    for item in items:
        if len(out) >= n:
            break
        if item["id"] in exclude:
            skipped["excluded"] += 1
            continue
        if item["question"] in shown:
            skipped["shown as an example"] += 1
            continue
        hard = harden(item, random.Random(f"{seed}:{item['id']}"))
        if hard is None:
            skipped["no usable number or solution"] += 1
            continue
        out.append(hard)
    return out, skipped


def shown_questions() -> set[str]:
    """Questions the planner's prompts show as worked examples: never a source."""
    from planner.prompting import few_shot
    from planner.prose import prose_prompt

    return {e["question"] for e in few_shot()} | {q for q, _ in prose_prompt().examples}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=GSM8K_TRAIN, help="GSM8K train items")
    parser.add_argument("--n", type=int, default=200, help="items to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--exclude",
        type=Path,
        nargs="*",
        default=[DEV_SPLIT],
        help="files whose item ids are never a source (default: the GSM8K train dev split)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    items = (
        json.loads(line)
        for line in args.data.read_text(encoding="utf-8").split("\n")
        if line.strip()
    )
    if any(i.startswith("gsm8k-test") for i in _ids([args.data])):
        raise SystemExit(f"{args.data}: GSM8K test is for reporting; build from train")
    hard, skipped = build(items, args.n, args.seed, _ids(args.exclude), shown_questions())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(h) + "\n" for h in hard), encoding="utf-8")
    whole = sum(1 for h in hard if "." not in h["answer"])
    print(
        json.dumps(
            {"written": len(hard), "whole_answers": whole, "skipped": skipped, "out": str(args.out)}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
