"""`scripts/eval_dev.sh` refuses an EVAL_START that leaves it no items, before it starts
anything (no services, no output folder)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "eval_dev.sh"


@pytest.mark.parametrize("start", ["30", "31"])
def test_a_start_at_or_past_n_is_refused(tmp_path: Path, start: str) -> None:
    out = tmp_path / "run" / "out.jsonl"
    env = {**os.environ, "EVAL_START": start, "EVAL_LOGS": str(tmp_path / "logs")}
    done = subprocess.run(
        ["bash", str(SCRIPT), "plan", "30", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert f"EVAL_START ({start}) must be below N (30)" in done.stderr
    assert not (tmp_path / "logs").exists() and not out.parent.exists()
