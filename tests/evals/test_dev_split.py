"""The GSM8K train dev split is what its script writes, and holds no item a prompt shows
or a report scores."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from evals.datasets import GSM8K_TEST, GSM8K_TRAIN

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SPLIT = REPO / "evals" / "splits" / "gsm8k-train-dev.jsonl"


def load_script():
    spec = importlib.util.spec_from_file_location(
        "make_dev_split", REPO / "scripts" / "make_dev_split.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_the_committed_split_is_the_scripts_output_and_apart_from_test() -> None:
    script = load_script()
    assert script.TRAIN == GSM8K_TRAIN
    assert SPLIT.read_text(encoding="utf-8") == script.render(script.dev_split())
    rows = [json.loads(line) for line in SPLIT.read_text(encoding="utf-8").split("\n") if line]
    assert len(rows) == script.SIZE == len({r["id"] for r in rows})
    assert all(r["id"].startswith("gsm8k-train-") for r in rows)
    test = {
        json.loads(line)["question"]
        for line in GSM8K_TEST.read_text(encoding="utf-8").split("\n")
        if line
    }
    from planner.prompting import few_shot
    from planner.prose import prose_prompt

    shown = {e["question"] for e in few_shot()} | {q for q, _ in prose_prompt().examples}
    assert not {r["question"] for r in rows} & (test | shown)
