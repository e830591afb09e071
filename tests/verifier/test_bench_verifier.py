"""The verifier benchmark's symbolic record runs on pipeline claim splits, which hold a
`test.jsonl` and no `gsm8k_test.jsonl`, and refuses a directory without the timed split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def bench(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scripts.bench_verifier", "--data", str(data), "--no-model"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_symbolic_record_covers_only_the_splits_a_directory_has(tmp_path: Path) -> None:
    rows = [
        {"statement": "2 + 3 = 5", "context": "", "question": None, "label": True},
        {"statement": "2 + 3 = 6", "context": "", "question": None, "label": False},
    ]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = bench(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.splitlines()[-1])
    assert list(figures["symbolic"]) == ["test"]
    record = figures["symbolic"]["test"]
    assert record["n"] == 2
    assert record["decided"] == 2 and record["wrong"] == 0


def test_a_directory_without_the_test_split_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "gsm8k_test.jsonl").write_text("")
    done = bench(tmp_path)
    assert done.returncode == 2
    assert "test.jsonl" in done.stderr
