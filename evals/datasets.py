"""Where the shipped datasets are: `datasets/` at the repository root.

The one definition of their paths for the evaluation, the benchmarks, verifier training
data (`training.data`) and the tests; `datasets/README.md` gives each file's source,
licence and format. Each file is named by the dataset name `evals.data.dataset_name`
gives it (`gsm8k-test` for `gsm8k/test.norm.jsonl`), the name result lines carry.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "datasets"

# dataset name -> file, relative to the datasets folder
FILES = {
    "gsm8k-train": "gsm8k/train.norm.jsonl",
    "gsm8k-test": "gsm8k/test.norm.jsonl",
    "svamp": "svamp/svamp.norm.jsonl",
}


def path(name: str, root: Path = ROOT) -> Path:
    """The file of dataset `name` under `root` (the shipped folder by default)."""
    try:
        return root / FILES[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(FILES)}") from None


GSM8K_TRAIN = path("gsm8k-train")
GSM8K_TEST = path("gsm8k-test")
SVAMP = path("svamp")
