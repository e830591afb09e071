"""Fit temperature scaling on the held-out validation split and write calibration.json.

The adapter's raw score is the logit difference z = logit(TRUE) - logit(FALSE); serving
reports sigmoid(z / T). T is chosen to minimise the negative log-likelihood of the
validation labels (it changes confidence, never the verdict at threshold 0.5).

    python -m training.calibrate --base-model DIR --adapter verifier/adapters/NAME \\
        --data var/verifier-data
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from training.data import read_jsonl
from training.metrics import fit_temperature, report
from training.scoring import load_model, load_tokenizer, prompt_format, score_rows, set_threads


def calibrate(
    base_model: str,
    adapter: str | None,
    data_dir: str,
    split: str = "val",
    threads: int = 1,
    limit: int | None = None,
) -> dict[str, object]:
    set_threads(threads)
    rows = read_jsonl(Path(data_dir) / f"{split}.jsonl")[:limit]
    tokenizer = load_tokenizer(base_model)
    model = load_model(base_model, adapter)
    logits = score_rows(model, tokenizer, rows, prompt_format(adapter), progress=True)
    labels = [bool(r["label"]) for r in rows]
    temperature = fit_temperature(logits, labels)
    return {
        "method": "temperature_scaling",
        "temperature": round(temperature, 6),
        "fitted_on": f"{Path(data_dir).name}/{split}.jsonl",
        "n": len(rows),
        "before": report(logits, labels, 1.0),
        "after": report(logits, labels, temperature),
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
    args = parser.parse_args(argv)
    result = calibrate(
        args.base_model, args.adapter, args.data, args.split, args.threads, args.limit
    )
    (Path(args.adapter) / "calibration.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
