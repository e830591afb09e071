"""Generate verifier training data: claims with a TRUE/FALSE label, written as jsonl splits.

Kinds of claims (each record has `question`, `context`, `statement`, `label`, `kind`):
- templated arithmetic (`7 * 8 = 56`, "The sum of 12 and 30 is 42."), comparisons,
  percentages and unit conversions with random numbers; FALSE ones are near misses
  (off by one, off by ten, the result of another operation, swapped digits);
- GSM8K train items: the question with "The answer is <gold>." as TRUE and plausible
  wrong answers as FALSE (off by one, one operation swapped, an intermediate value), with
  the worked steps as context, written by `services.claims` exactly as the orchestrator
  writes an executed plan's claim (`s1 [calc] '48/2' -> '24'`);
- logic traps where the premise decides: the same claim is TRUE under one context and
  FALSE under another (affirming the consequent, "some" vs "all", reversed order).

GSM8K train items are split disjointly between train/val/test, so no question is seen in
training and evaluation; GSM8K test items feed only the separate `gsm8k_test` file.

    python -m training.data --out var/verifier-data --seed 7
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from evals import datasets as shipped
from services import claims
from services.arith import json_number
from services.claims import render_value

DEFAULT_DATASETS = shipped.ROOT


@dataclass
class Recipe:
    """Everything that decides the generated data; saved beside it and beside the adapter."""

    seed: int = 7  # random seed for every choice below
    n_train: int = 3000  # claims in the training split
    n_val: int = 300  # claims in the validation split (temperature fitting)
    n_test: int = 300  # claims in the held-out test split
    n_gsm8k_test: int = 300  # claims built from GSM8K test answers (reporting only)
    # Share of each kind of claim in train/val/test (normalised to 1).
    mix: dict[str, float] | None = None
    datasets_dir: str = str(DEFAULT_DATASETS)

    def __post_init__(self) -> None:
        if self.mix is None:
            self.mix = dict(DEFAULT_MIX)
        unknown = set(self.mix) - set(GENERATORS) - {"gsm8k"}
        if unknown:
            raise ValueError(f"unknown claim kinds in mix: {sorted(unknown)}")
        if any(v < 0 for v in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ValueError("mix weights must be >= 0 and not all zero")
        for name in ("n_train", "n_val", "n_test", "n_gsm8k_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")


DEFAULT_MIX = {
    "arith": 0.22,
    "compare": 0.10,
    "percent": 0.08,
    "units": 0.07,
    "gsm8k": 0.35,
    "logic": 0.18,
}


# --------------------------------------------------------------------------- numbers


_OPS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def calc(expr: str) -> Fraction:
    """Exact value of a GSM8K calculator annotation (+ - * / and parentheses only)."""

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported expression: {expr!r}")

    return ev(ast.parse(expr, mode="eval"))


def fmt(value: Fraction | int) -> str:
    """A number as people write it: integers plain, others as a short decimal."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.4f}".rstrip("0").rstrip(".")
    return text


def _near_miss(rng: random.Random, true_value: Fraction, alternatives: list[Fraction]) -> Fraction:
    """A plausible wrong value: off by one or ten, another operation's result, swapped digits."""
    choices: list[Fraction] = [true_value + 1, true_value - 1, true_value + 10, true_value - 10]
    choices += [a for a in alternatives if a != true_value]
    digits = fmt(true_value)
    if true_value.denominator == 1 and len(digits.lstrip("-")) >= 2:
        d = list(digits.lstrip("-"))
        i = rng.randrange(len(d) - 1)
        d[i], d[i + 1] = d[i + 1], d[i]
        swapped = Fraction(int("".join(d))) * (-1 if true_value < 0 else 1)
        choices.append(swapped)
    choices = [c for c in choices if c != true_value]
    return rng.choice(choices)


def _rand_int(rng: random.Random, hi: int = 999) -> int:
    return rng.choice([rng.randint(2, 20), rng.randint(2, 99), rng.randint(2, hi)])


# --------------------------------------------------------------------------- templates


Claim = dict[str, Any]


def _claim(
    kind: str, statement: str, label: bool, question: str | None = None, context: str = ""
) -> Claim:
    return {
        "question": question,
        "context": context,
        "statement": statement,
        "label": bool(label),
        "kind": kind,
    }


_OP_WORDS = {
    "+": [
        "The sum of {a} and {b} is {c}.",
        "{a} plus {b} equals {c}.",
        "Adding {a} and {b} gives {c}.",
    ],
    "-": [
        "{a} minus {b} is {c}.",
        "The difference between {a} and {b} is {c}.",
        "Subtracting {b} from {a} gives {c}.",
    ],
    "*": [
        "{a} times {b} is {c}.",
        "The product of {a} and {b} is {c}.",
        "{a} multiplied by {b} equals {c}.",
    ],
    "/": ["{a} divided by {b} is {c}.", "Dividing {a} by {b} gives {c}."],
}


def gen_arith(rng: random.Random) -> Claim:
    op = rng.choice("+-*/")
    a, b = _rand_int(rng), _rand_int(rng, 99)
    if op == "/":
        a = a * b if rng.random() < 0.8 else a  # mostly whole quotients
    if op == "-" and rng.random() < 0.7:
        a, b = max(a, b), min(a, b)
    value = calc(f"{a}{op}{b}")
    alternatives = [calc(f"{a}{o}{b}") for o in "+-*" if o != op]
    three = rng.random() < 0.35
    if three:
        op2, c = rng.choice("+-*"), _rand_int(rng, 50)
        expr = f"{a} {op} {b} {op2} {c}"
        value = calc(expr)
        alternatives = []
        for other in (f"({a} {op} {b}) {op2} {c}", f"{a} {op} ({b} {op2} {c})"):
            try:
                alternatives.append(calc(other))
            except ZeroDivisionError:
                continue
    label = rng.random() < 0.5
    shown = value if label else _near_miss(rng, value, alternatives)
    if not three and rng.random() < 0.5:
        statement = rng.choice(_OP_WORDS[op]).format(a=a, b=b, c=fmt(shown))
    else:
        expr = f"{a} {op} {b}" if not three else expr
        if rng.random() < 0.3:
            expr = expr.replace(" ", "")
        statement = rng.choice(
            ["{e} = {c}", "{e} = {c}.", "{e} equals {c}.", "{e} is {c}."]
        ).format(e=expr, c=fmt(shown))
    return _claim("arith", statement, label)


_CMP_WORDS = {
    ">": [
        "{a} is greater than {b}.",
        "{a} > {b}",
        "{a} is larger than {b}.",
        "{a} is more than {b}.",
    ],
    "<": ["{a} is less than {b}.", "{a} < {b}", "{a} is smaller than {b}."],
    ">=": ["{a} is at least {b}.", "{a} >= {b}"],
    "<=": ["{a} is at most {b}.", "{a} <= {b}"],
}
_CMP = {">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le}


def _rand_number(rng: random.Random) -> tuple[str, Fraction]:
    kind = rng.random()
    if kind < 0.5:
        n = rng.randint(0, 999)
        return str(n), Fraction(n)
    if kind < 0.8:
        n = Fraction(rng.randint(0, 9999), 100)
        return f"{float(n):.2f}", n
    num, den = rng.randint(1, 12), rng.randint(2, 12)
    return f"{num}/{den}", Fraction(num, den)


def gen_compare(rng: random.Random) -> Claim:
    op = rng.choice(list(_CMP))
    (ta, a), (tb, b) = _rand_number(rng), _rand_number(rng)
    if rng.random() < 0.3:  # close calls are the interesting ones
        tb, b = fmt(a + rng.choice([-1, 1]) * Fraction(1, 100)), a + 0
        b = Fraction(tb)
    if rng.random() < 0.1:
        tb, b = ta, a
    statement = rng.choice(_CMP_WORDS[op]).format(a=ta, b=tb)
    return _claim("compare", statement, _CMP[op](a, b))


def gen_percent(rng: random.Random) -> Claim:
    p = rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 50, 60, 75, 80, 120, 150])
    n = rng.choice([rng.randint(1, 40) * 10, rng.randint(2, 400), rng.randint(1, 20) * 20])
    value = Fraction(p * n, 100)
    label = rng.random() < 0.5
    form = rng.randrange(3)
    if form == 0:
        shown = (
            value
            if label
            else _near_miss(rng, value, [Fraction(n * 100, p) if p else value, value * 10])
        )
        statement = rng.choice(
            ["{p}% of {n} is {v}.", "{p} percent of {n} is {v}.", "{p}% of {n} = {v}"]
        ).format(p=p, n=n, v=fmt(shown))
    elif form == 1:
        new = n + value
        shown = new if label else _near_miss(rng, new, [n - value, n + p])
        statement = f"Increasing {n} by {p}% gives {fmt(shown)}."
    else:
        if value == 0:
            value = Fraction(1)
        shown_p = (
            p
            if label
            else rng.choice([q for q in (p + 5, p - 5, p * 2, p + 10) if q != p and q > 0])
        )
        statement = f"{fmt(value)} is {shown_p}% of {n}."
    return _claim("percent", statement, label)


_UNITS = [
    ("km", "m", 1000),
    ("m", "cm", 100),
    ("kg", "g", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("feet", "inches", 12),
    ("dollars", "cents", 100),
    ("liters", "milliliters", 1000),
    ("weeks", "days", 7),
    ("dozen", "items", 12),
]


def gen_units(rng: random.Random) -> Claim:
    big, small, factor = rng.choice(_UNITS)
    amount = Fraction(
        rng.choice([rng.randint(1, 20), rng.randint(1, 40) * 5]), rng.choice([1, 1, 2, 4])
    )
    value = amount * factor
    label = rng.random() < 0.5
    shown = value if label else _near_miss(rng, value, [amount * factor * 10, amount * factor / 10])
    if rng.random() < 0.5:
        statement = f"{fmt(amount)} {big} is {fmt(shown)} {small}."
    else:
        statement = f"{fmt(shown)} {small} equals {fmt(amount)} {big}."
    return _claim("units", statement, label)


# --------------------------------------------------------------------------- logic traps

_NAMES = [
    "Ana",
    "Ben",
    "Chen",
    "Dara",
    "Eli",
    "Fatima",
    "Goran",
    "Hana",
    "Ivo",
    "Jun",
    "Kofi",
    "Lea",
]
_CATEGORIES = [
    ("birds in the aviary", "can fly", "a bird in the aviary"),
    ("students in the class", "passed the test", "a student in the class"),
    ("boxes on the shelf", "are empty", "a box on the shelf"),
    ("cars in the lot", "are red", "a car in the lot"),
    ("apples in the basket", "are ripe", "an apple in the basket"),
]
_RULES = [
    ("it rains", "the street is wet", "It rained.", "The street is wet."),
    ("the alarm rings", "Maya wakes up", "The alarm rang.", "Maya woke up."),
    ("the store is open", "the lights are on", "The store is open.", "The lights are on."),
    ("a number is divisible by 4", "it is even", "12 is divisible by 4.", "12 is even."),
]
_RELATIONS = ["taller than", "older than", "faster than", "heavier than"]


def gen_logic(rng: random.Random) -> Claim:
    form = rng.randrange(5)
    if form == 0:  # quantifiers: all vs some vs no
        group, prop, member = rng.choice(_CATEGORIES)
        name = rng.choice(_NAMES)
        quant = rng.choice(["All", "Some", "No"])
        thing = member.split(" ", 1)[1]
        context = f"{quant} {group} {prop}. The one {name} picked is {member}."
        statement = f"The {thing.split(' ')[0]} {name} picked {_singular(prop)}."
        return _claim("logic", statement, quant == "All", context=context)
    if form == 1:  # modus ponens vs affirming the consequent
        cond, cons, fact_cond, fact_cons = rng.choice(_RULES)
        if rng.random() < 0.5:
            context = f"If {cond}, then {cons}. {fact_cond}"
            return _claim("logic", fact_cons, True, context=context)
        context = f"If {cond}, then {cons}. {fact_cons}"
        return _claim(
            "logic",
            f"It follows that: {fact_cond[0].lower()}{fact_cond[1:]}",
            False,
            context=context,
        )
    if form == 2:  # transitive order
        a, b, c = rng.sample(_NAMES, 3)
        rel = rng.choice(_RELATIONS)
        context = f"{a} is {rel} {b}. {b} is {rel} {c}."
        if rng.random() < 0.5:
            return _claim("logic", f"{a} is {rel} {c}.", True, context=context)
        return _claim("logic", f"{c} is {rel} {a}.", False, context=context)
    if form == 3:  # the premise's numbers decide
        name = rng.choice(_NAMES)
        have, give = rng.randint(5, 60), rng.randint(1, 4)
        item = rng.choice(["apples", "stickers", "marbles", "books"])
        verb = rng.choice(["gives away", "receives"])
        after = have - give if verb == "gives away" else have + give
        context = f"{name} has {have} {item}. {name} {verb} {give} {item}."
        label = rng.random() < 0.5
        shown = (
            after
            if label
            else rng.choice([have, have + give if verb == "gives away" else have - give])
        )
        return _claim("logic", f"{name} now has {shown} {item}.", label, context=context)
    # negation in the premise
    name = rng.choice(_NAMES)
    place = rng.choice(["the library", "the park", "the office", "school"])
    day = rng.choice(["Monday", "Tuesday", "Friday", "Sunday"])
    negated = rng.random() < 0.5
    context = f"On {day}, {name} {'did not go' if negated else 'went'} to {place}."
    return _claim("logic", f"{name} went to {place} on {day}.", not negated, context=context)


def _singular(prop: str) -> str:
    return {"are empty": "is empty", "are red": "is red", "are ripe": "is ripe"}.get(prop, prop)


# --------------------------------------------------------------------------- GSM8K claims

_ANNOTATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>")


def gsm8k_steps(solution: str) -> list[tuple[str, Fraction]]:
    """The calculator steps of a worked GSM8K solution, as (expression, exact value)."""
    steps = []
    for expr, _shown in _ANNOTATION.findall(solution):
        expr = expr.replace("x", "*").replace(",", "").strip()
        try:
            steps.append((expr, calc(expr)))
        except (ValueError, SyntaxError, ZeroDivisionError):
            continue
    return steps


def plan_steps(steps: list[tuple[str, Fraction]]) -> list[claims.Step]:
    """Calculator steps as a plan's executed steps `s1, s2, ...`, the last one answering."""
    return [
        # the calc tool's value, shown as a served step shows it
        claims.Step(id=f"s{k}", tool="calc", input=expr, output=render_value(json_number(value)))
        for k, (expr, value) in enumerate(steps, 1)
    ]


def render_context(steps: list[tuple[str, Fraction]], reasoning: str = "") -> str:
    """Steps as the context of an executed plan's claim (`services.claims`):

    Plan: <reasoning>
    Steps:
    s1 [calc] '48/2' -> '24'
    answer_step: s1
    """
    return claims.plan_context(reasoning, plan_steps(steps), f"s{len(steps)}")


def gsm8k_claim(
    kind: str, question: str, answer: Fraction, label: bool, context: str = ""
) -> Claim:
    """A claim about a GSM8K question's answer, written as the orchestrator writes one."""
    claim = claims.answer_claim(question, fmt(answer), context)
    return _claim(kind, claim["statement"], label, claim["question"], claim["context"])


def solution_reasoning(solution: str) -> str:
    """The first sentence of a worked solution, without its calculator annotations."""
    first = _ANNOTATION.sub("", solution.split("\n", 1)[0])
    return first.split(". ")[0][:160].strip()


def _swap_one_op(rng: random.Random, expr: str) -> str | None:
    positions = [m.start() for m in re.finditer(r"(?<=[\d)\s])[-+*/](?=[\s\d(])", expr)]
    if not positions:
        return None
    i = rng.choice(positions)
    new_op = rng.choice([o for o in "+-*/" if o != expr[i]])
    return expr[:i] + new_op + expr[i + 1 :]


def gen_gsm8k(rng: random.Random, item: dict[str, Any]) -> list[Claim]:
    """One TRUE claim (the gold answer) and one FALSE claim (a plausible wrong answer)."""
    question, gold = item["question"], Fraction(item["answer"])
    steps = gsm8k_steps(item.get("solution", ""))
    why = solution_reasoning(item.get("solution", ""))
    consistent = bool(steps) and steps[-1][1] == gold
    with_context = consistent and rng.random() < 0.6
    made = [
        gsm8k_claim(
            "gsm8k_gold",
            question,
            gold,
            True,
            context=render_context(steps, why) if with_context else "",
        )
    ]
    wrongs: list[tuple[str, Fraction, str]] = [("gsm8k_offbyone", gold + rng.choice([-1, 1]), "")]
    if consistent:
        wrongs.append(
            (
                "gsm8k_offbyone",
                gold + rng.choice([-1, 1]),
                render_context(steps, why) if rng.random() < 0.5 else "",
            )
        )
        swapped = _swap_one_op(rng, steps[-1][0])
        if swapped is not None:
            try:
                value = calc(swapped)
                if (
                    value != gold
                    and value >= 0
                    and (value.denominator == 1 or gold.denominator != 1)
                ):
                    ctx = render_context([*steps[:-1], (swapped, value)], why)
                    wrongs += [("gsm8k_wrongop", value, ctx), ("gsm8k_wrongop", value, "")]
            except (ValueError, SyntaxError, ZeroDivisionError):
                pass
        for k, (_, value) in enumerate(steps[:-1]):
            if value != gold:
                ctx = render_context(steps[: k + 1], why)
                wrongs += [("gsm8k_intermediate", value, ctx), ("gsm8k_intermediate", value, "")]
    kind, value, ctx = rng.choice(wrongs)
    made.append(gsm8k_claim(kind, question, value, False, context=ctx))
    return made


# --------------------------------------------------------------------------- assembly

GENERATORS: dict[str, Callable[[random.Random], Claim]] = {
    "arith": gen_arith,
    "compare": gen_compare,
    "percent": gen_percent,
    "units": gen_units,
    "logic": gen_logic,
}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _split(
    rng: random.Random, n: int, mix: dict[str, float], gsm_items: list[dict[str, Any]]
) -> list[Claim]:
    total = sum(mix.values())
    counts = {k: round(n * v / total) for k, v in mix.items()}
    rows: list[Claim] = []
    for kind, count in counts.items():
        if kind == "gsm8k":
            pool = list(gsm_items)
            rng.shuffle(pool)
            made: list[Claim] = []
            for item in pool:
                if len(made) >= count:
                    break
                made += gen_gsm8k(rng, item)
            rows += made[:count]
        else:
            rows += [GENERATORS[kind](rng) for _ in range(count)]
    rng.shuffle(rows)
    return rows


def generate(recipe: Recipe) -> dict[str, list[Claim]]:
    """All splits, deterministically from the recipe."""
    rng = random.Random(recipe.seed)
    datasets = Path(recipe.datasets_dir)
    assert recipe.mix is not None
    gsm_train = read_jsonl(shipped.path("gsm8k-train", datasets)) if recipe.mix.get("gsm8k") else []
    rng.shuffle(gsm_train)
    cut1, cut2 = int(len(gsm_train) * 0.8), int(len(gsm_train) * 0.9)
    splits = {
        "train": _split(rng, recipe.n_train, recipe.mix, gsm_train[:cut1]),
        "val": _split(rng, recipe.n_val, recipe.mix, gsm_train[cut1:cut2]),
        "test": _split(rng, recipe.n_test, recipe.mix, gsm_train[cut2:]),
    }
    if recipe.n_gsm8k_test:
        gsm_test = read_jsonl(shipped.path("gsm8k-test", datasets))
        splits["gsm8k_test"] = _split(rng, recipe.n_gsm8k_test, {"gsm8k": 1.0}, gsm_test)
    for rows in splits.values():
        for k, row in enumerate(rows):
            row["id"] = k
    return splits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output directory for the jsonl splits"
    )
    parser.add_argument("--seed", type=int, default=Recipe.seed)
    parser.add_argument("--n-train", type=int, default=Recipe.n_train)
    parser.add_argument("--n-val", type=int, default=Recipe.n_val)
    parser.add_argument("--n-test", type=int, default=Recipe.n_test)
    parser.add_argument("--n-gsm8k-test", type=int, default=Recipe.n_gsm8k_test)
    parser.add_argument("--datasets-dir", type=Path, default=DEFAULT_DATASETS)
    args = parser.parse_args(argv)
    recipe = Recipe(
        seed=args.seed,
        n_train=args.n_train,
        n_val=args.n_val,
        n_test=args.n_test,
        n_gsm8k_test=args.n_gsm8k_test,
        datasets_dir=str(args.datasets_dir),
    )
    splits = generate(recipe)
    for name, rows in splits.items():
        write_jsonl(args.out / f"{name}.jsonl", rows)
    summary = {
        name: {
            "n": len(rows),
            "true": sum(r["label"] for r in rows),
            "kinds": dict(Counter(r["kind"] for r in rows)),
        }
        for name, rows in splits.items()
    }
    (args.out / "recipe.json").write_text(
        json.dumps({"recipe": asdict(recipe), "summary": summary}, indent=2) + "\n"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
