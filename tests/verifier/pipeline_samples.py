"""Claims the pipeline sampler stored (built by the orchestrator's claim function), for the
tests of the adapter trained on them."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "training" / "samples" / "qwen2.5-coder-1.5b-instruct" / "gsm8k-train-draft.jsonl"


def pipeline_claims(n: int) -> list[dict[str, str]]:
    """The first `n` stored claims of a right and a wrong sample each, as the sampler
    wrote them."""
    right: list[dict[str, str]] = []
    wrong: list[dict[str, str]] = []
    for line in SAMPLES.read_text().splitlines():
        row = json.loads(line)
        if row["claim"] is not None:
            (right if row["label"] else wrong).append(row["claim"])
        if len(right) >= n and len(wrong) >= n:
            break
    return right[:n] + wrong[:n]
