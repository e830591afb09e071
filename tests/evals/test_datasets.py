"""The datasets ship inside the repository, and every reader finds them through
`evals.datasets`: the Python readers import its paths, and every dataset file a script or
a document names is one of its files, so a checkout with nothing beside it is complete."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from evals import datasets
from evals.data import dataset_name, load_items

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
ITEMS = {"gsm8k-train": 7473, "gsm8k-test": 1319, "svamp": 1000}
# Not scanned: caches and environments, and what runs recorded (result lines, and the
# committed adapter's training records, which name the folder that run read).
SKIP_DIRS = {".git", "var", "logs", "__pycache__", ".pytest_cache", ".mypy_cache"}
SKIP_DIRS |= {".ruff_cache", ".hypothesis", "node_modules"}
RECORDED = {REPO / "verifier" / "adapters"}
NAMED = re.compile(r"(?<![\w.-])datasets/([\w./-]+?\.jsonl)")
OUTSIDE = ("/".join(("..", "shared")), "/".join(("shared", "datasets")))


def test_every_dataset_is_shipped_with_its_licence_under_the_name_results_carry() -> None:
    assert set(datasets.FILES) == set(ITEMS)
    for name, count in ITEMS.items():
        file = datasets.path(name)
        assert file.parent.parent == datasets.ROOT == REPO / "datasets"
        assert dataset_name(file) == name
        assert len(load_items(file)) == count
        assert (file.parent / "LICENSE").read_text().startswith("MIT License")
    assert (datasets.GSM8K_TRAIN, datasets.GSM8K_TEST, datasets.SVAMP) == tuple(
        datasets.path(n) for n in ("gsm8k-train", "gsm8k-test", "svamp")
    )
    assert (datasets.ROOT / "README.md").is_file()


def test_a_dataset_under_another_root_and_an_unknown_one() -> None:
    assert datasets.path("svamp", Path("/data")) == Path("/data/svamp/svamp.norm.jsonl")
    with pytest.raises(KeyError, match="gsm8k-train, gsm8k-test, svamp"):
        datasets.path("gsm8k")


def test_verifier_training_data_reads_the_shipped_datasets() -> None:
    from training import data

    assert data.DEFAULT_DATASETS == datasets.ROOT
    assert data.Recipe().datasets_dir == str(datasets.ROOT)


def _text_files() -> list[Path]:
    found = []
    for top, dirs, files in os.walk(REPO):
        here = Path(top)
        dirs[:] = [
            d
            for d in dirs
            if d not in SKIP_DIRS and not d.startswith(".venv") and here / d not in RECORDED
        ]
        found += [here / f for f in files if not f.endswith((".jsonl", ".png", ".pyc"))]
    return found


def test_scripts_and_documents_name_only_shipped_dataset_files() -> None:
    named: dict[str, list[str]] = {}
    outside = []
    for file in _text_files():
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        where = str(file.relative_to(REPO))
        for rel in NAMED.findall(text):
            named.setdefault(rel, []).append(where)
        if any(needle in text for needle in OUTSIDE):
            outside.append(where)
    assert not outside, f"read data from outside the repository: {outside}"
    assert set(named) - set(datasets.FILES.values()) == set(), named
    # the shell scripts and the docs that show commands are among the readers scanned
    users = {w for ws in named.values() for w in ws}
    assert {"docs/eval/run_full.sh", "scripts/bench_reason_latency.sh", "README.md"} <= users
