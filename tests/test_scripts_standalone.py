"""The benchmark and evaluation scripts run as modules from the repository root
(`python -m scripts.NAME`) with neither pytest nor the tests importable, as in the
environment `scripts/run.sh` makes, and none of them edits `sys.path`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "scripts").glob("*.py") if p.stem not in ("__init__",))
# Scripts that import nothing of the project and run as files (the images call them so).
STANDALONE = {"prepare_models", "lock_requirements", "bench_reason_latency"}


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s not in STANDALONE])
def test_a_script_runs_as_a_module_without_pytest_or_the_tests(name: str) -> None:
    source = (ROOT / "scripts" / f"{name}.py").read_text()
    assert "sys.path" not in source
    assert "from tests" not in source and "import tests" not in source
    probe = (
        "import runpy, sys; sys.modules['pytest'] = None; sys.modules['tests'] = None; "
        f"sys.argv = ['{name}', '--help']; runpy.run_module('scripts.{name}', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()
