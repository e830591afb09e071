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

Each runtime of the verifier's model gets its own fit, on its own scores:
`--runtime transformers` (the default) writes `calibration.json`, `--runtime llamacpp`
(the catalog GGUF with the adapter's `adapter.gguf`; no --base-model needed) writes
`calibration-llamacpp.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from training.data import read_jsonl
from training.metrics import fit_temperature, fit_temperature_bias, report
from training.scoring import CALIBRATION_FILES, RUNTIMES, score_with

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
    base_model: str | None,
    adapter: str | None,
    data_dir: str,
    split: str | list[str] = "val",
    threads: int = 1,
    limit: int | None = None,
    method: str = "temperature+bias",
    runtime: str = "transformers",
    gguf_type: str = "auto",
) -> dict[str, object]:
    splits = [split] if isinstance(split, str) else list(split)
    rows = [r for name in splits for r in read_jsonl(Path(data_dir) / f"{name}.jsonl")][:limit]
    logits, scored_by = score_with(runtime, base_model, adapter, rows, threads, gguf_type)
    labels = [bool(r["label"]) for r in rows]
    temperature, bias = fit(logits, labels, method)
    return {
        "method": METHODS[method],
        **scored_by,
        "temperature": round(temperature, 6),
        "bias": round(bias, 6),
        "fitted_on": "+".join(f"{Path(data_dir).name}/{name}.jsonl" for name in splits),
        "n": len(rows),
        "before": report(logits, labels, 1.0),
        "after": report(logits, labels, round(temperature, 6), round(bias, 6)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-model", help="base model directory (the transformers runtime)")
    parser.add_argument("--runtime", choices=RUNTIMES, default="transformers", help="see above")
    parser.add_argument(
        "--gguf-type",
        choices=("auto", "source", "bf16", "q8_0"),
        default="auto",
        help="llamacpp runtime: the tensor type, as VERIFIER_GGUF_TYPE",
    )
    parser.add_argument("--adapter", required=True, help="adapter directory (output goes here)")
    parser.add_argument("--data", required=True, help="directory with val.jsonl")
    parser.add_argument(
        "--split",
        nargs="+",
        default=["val"],
        help="the held-out split(s) to fit on, pooled (e.g. val test: every claim of the "
        "questions training never saw)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="first N claims of the split")
    parser.add_argument(
        "--method", choices=sorted(METHODS), default="temperature+bias", help="see above"
    )
    args = parser.parse_args(argv)
    if args.runtime == "transformers" and args.base_model is None:
        parser.error("--runtime transformers needs --base-model")
    result = calibrate(
        args.base_model,
        args.adapter,
        args.data,
        args.split,
        args.threads,
        args.limit,
        args.method,
        args.runtime,
        args.gguf_type,
    )
    (Path(args.adapter) / CALIBRATION_FILES[args.runtime]).write_text(
        json.dumps(result, indent=2) + "\n"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
