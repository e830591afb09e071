"""Write the GSM8K train dev split: the items prompts, plan formats, thresholds and
calibrators are chosen on (GSM8K test and SVAMP are for reporting only).

A seeded sample of GSM8K train without the items any prompt shows as an example (the
planner's few-shot plans and the `direct` mode's worked answers). The committed file is
what this script writes; a test holds the two equal.

    python -m scripts.make_dev_split            # writes evals/splits/gsm8k-train-dev.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from evals.datasets import GSM8K_TRAIN
from planner.prompting import few_shot
from planner.prose import prose_prompt

REPO = Path(__file__).resolve().parents[1]

TRAIN = GSM8K_TRAIN
OUT = REPO / "evals" / "splits" / "gsm8k-train-dev.jsonl"
SEED = 20261201
SIZE = 300
EXAMPLES_WHEN_DRAWN = 3


def dev_split(train: Path = TRAIN, size: int = SIZE, seed: int = SEED) -> list[dict[str, str]]:
    # The plan prompt's examples when the split was drawn: its first three. Examples
    # added since are outside the split (its test checks), and must not move it.
    shown = {e["question"] for e in few_shot()[:EXAMPLES_WHEN_DRAWN]} | {
        q for q, _ in prose_prompt().examples
    }
    rows = [json.loads(line) for line in train.read_text(encoding="utf-8").split("\n") if line]
    pool = [r for r in rows if r["question"] not in shown]
    return [
        {"id": r["id"], "question": r["question"], "answer": r["answer"]}
        for r in random.Random(seed).sample(pool, size)
    ]


def render(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(dev_split()), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
