"""Fit the calibration (temperature, and by default a bias) on the held-out validation split
and write calibration.json.

The adapter's raw score is the logit difference z = logit(TRUE) - logit(FALSE); serving
reports sigmoid(z / T + b) and the verdict it implies (TRUE from 0.5). T and b are chosen
to minimise the negative log-likelihood of the validation labels.

Methods:
- `temperature+bias` (default): T and b. T alone scales confidence around 0.5 and cannot
  correct a model that says TRUE more (or less) often than claims are true; b can, and
  so it may also move a verdict whose raw score sat near the boundary.
- `temperature`: b = 0; confidence changes, the verdict never does.

    python -m training.calibrate --base-model DIR --adapter verifier/adapters/NAME \\
        --data var/verifier-data
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from training.data import read_jsonl
from training.metrics import fit_temperature, fit_temperature_bias, report
from training.scoring import load_model, load_tokenizer, prompt_format, score_rows, set_threads

METHODS = {
    "temperature": "temperature_scaling",
    "temperature+bias": "temperature_scaling_with_bias",
}


def fit(logits: list[float], labels: list[bool], method: str) -> tuple[float, float]:
    """(T, b) by `method`, a key of METHODS.

    Refuses a split whose claims are all TRUE or all FALSE: it says nothing about how
    confidence relates to truth, and a bias fitted to it would turn every verdict one way.
    """
    n_true = sum(labels)
    if n_true in (0, len(labels)):
        raise ValueError(
            f"cannot calibrate on {len(labels)} claims that are all "
            f"{'TRUE' if n_true else 'FALSE'}; use a split with both labels (a larger --limit)"
        )
    if method == "temperature":
        return fit_temperature(logits, labels), 0.0
    if method == "temperature+bias":
        return fit_temperature_bias(logits, labels)
    raise ValueError(f"unknown calibration method {method!r}; one of {sorted(METHODS)}")


def calibrate(
    base_model: str,
    adapter: str | None,
    data_dir: str,
    split: str = "val",
    threads: int = 1,
    limit: int | None = None,
    method: str = "temperature+bias",
) -> dict[str, object]:
    set_threads(threads)
    rows = read_jsonl(Path(data_dir) / f"{split}.jsonl")[:limit]
    tokenizer = load_tokenizer(base_model)
    model = load_model(base_model, adapter)
    logits = score_rows(model, tokenizer, rows, prompt_format(adapter), progress=True)
    labels = [bool(r["label"]) for r in rows]
    temperature, bias = fit(logits, labels, method)
    return {
        "method": METHODS[method],
        "temperature": round(temperature, 6),
        "bias": round(bias, 6),
        "fitted_on": f"{Path(data_dir).name}/{split}.jsonl",
        "n": len(rows),
        "before": report(logits, labels, 1.0),
        "after": report(logits, labels, round(temperature, 6), round(bias, 6)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-model", required=True, help="base model directory")
    parser.add_argument("--adapter", required=True, help="adapter directory (output goes here)")
    parser.add_argument("--data", required=True, help="directory with val.jsonl")
    parser.add_argument("--split", default="val")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="first N claims of the split")
    parser.add_argument(
        "--method", choices=sorted(METHODS), default="temperature+bias", help="see above"
    )
    args = parser.parse_args(argv)
    result = calibrate(
        args.base_model,
        args.adapter,
        args.data,
        args.split,
        args.threads,
        args.limit,
        args.method,
    )
    (Path(args.adapter) / "calibration.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
