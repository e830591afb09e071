#!/usr/bin/env python
"""Entry point of the evaluation harness; same commands as `reason eval`.

    python scripts/eval.py run --data ../shared/datasets/gsm8k/test.norm.jsonl \
        --mode plan --out var/eval/gsm8k-plan.jsonl --limit 200
    python scripts/eval.py report var/eval/*.jsonl --out-dir docs/eval
    python scripts/eval.py routing var/eval/*.jsonl
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.eval import eval_app

if __name__ == "__main__":
    eval_app(prog_name="eval")
