#!/usr/bin/env python
"""Entry point of the evaluation harness; same commands as `reason eval`.

    python -m scripts.eval run --data datasets/gsm8k/test.norm.jsonl \
        --mode plan --out var/eval/gsm8k-plan.jsonl --limit 200
    python -m scripts.eval report var/eval/*.jsonl --out-dir docs/eval
    python -m scripts.eval routing var/eval/*.jsonl
"""

from __future__ import annotations

from cli.eval import eval_app

if __name__ == "__main__":
    eval_app(prog_name="eval")
