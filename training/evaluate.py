"""Evaluate the verifier: untrained vs LoRA, uncalibrated vs calibrated.

For each model (the base model alone, and with the adapter) and each split (the held-out
generated test split, claims from GSM8K test answers), reports accuracy, ECE (15
equal-width bins), Brier score and AUROC, with T = 1 and with the temperature fitted on
the validation split (the adapter's `calibration.json`; the untrained model gets its own
fit, by the same method, on the same split, so both are compared fairly). The exact (symbolic) checks are
measured by `scripts/bench_verifier.py`, since training code imports no service code.

    python -m training.evaluate --base-model DIR --adapter verifier/adapters/NAME \\
        --data var/verifier-data --out verifier/adapters/NAME/metrics.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from training.calibrate import METHODS, fit
from training.data import read_jsonl
from training.metrics import report
from training.scoring import load_model, load_tokenizer, prompt_format, score_rows, set_threads


def read_calibration(path: Path) -> tuple[float, float, str]:
    """(T, b, method) from a calibration.json; files without a bias are temperature-only."""
    cal = json.loads(path.read_text())
    names = {v: k for k, v in METHODS.items()}
    stored = cal.get("method", METHODS["temperature"])
    if stored not in names:
        raise ValueError(f"{path}: unknown calibration method {stored!r}")
    return float(cal["temperature"]), float(cal.get("bias", 0.0)), names[stored]


def _by_kind(
    rows: list[dict[str, Any]], logits: list[float], temperature: float, bias: float
) -> dict[str, Any]:
    kinds: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        kinds.setdefault(r["kind"], []).append(i)
    return {
        k: report(
            [logits[i] for i in idx], [bool(rows[i]["label"]) for i in idx], temperature, bias
        )["accuracy"]
        for k, idx in sorted(kinds.items())
    }


def evaluate(
    base_model: str,
    adapter: str | None,
    data_dir: str,
    splits: list[str],
    threads: int = 1,
    limit: int | None = None,
    untrained: bool = True,
    scores_out: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Metrics per model and split; per-claim logits go into `scores_out` when given."""
    set_threads(threads)
    tokenizer = load_tokenizer(base_model)
    adapter_cal = Path(adapter, "calibration.json") if adapter else None
    # the adapter's own fit, read once; the untrained model is fitted by the same method
    stored = read_calibration(adapter_cal) if adapter_cal and adapter_cal.exists() else None
    data = {s: read_jsonl(Path(data_dir) / f"{s}.jsonl")[:limit] for s in ["val", *splits]}
    results: dict[str, Any] = {}
    models = ([("untrained", None)] if untrained or not adapter else []) + (
        [("lora", adapter)] if adapter else []
    )
    for name, adapter_dir in models:
        model = load_model(base_model, adapter_dir)
        fmt = prompt_format(adapter)  # the same prompt for both models
        started = time.perf_counter()
        fitted = adapter_dir is not None and stored is not None
        # the validation split is scored only when a temperature must be fitted here,
        # or when it is one of the splits reported
        needed = [s for s in data if s != "val" or not fitted or s in splits]
        scored = {s: score_rows(model, tokenizer, data[s], fmt, progress=True) for s in needed}
        seconds = time.perf_counter() - started
        if fitted and stored is not None:
            temperature, bias, _ = stored
        else:
            val_labels = [bool(r["label"]) for r in data["val"]]
            method = stored[2] if stored else "temperature+bias"
            temperature, bias = fit(scored["val"], val_labels, method)
        entry: dict[str, Any] = {"temperature": round(temperature, 6), "bias": round(bias, 6)}
        for split in splits:
            labels = [bool(r["label"]) for r in data[split]]
            entry[split] = {
                "uncalibrated": report(scored[split], labels, 1.0),
                "calibrated": report(scored[split], labels, temperature, bias),
                "accuracy_by_kind": _by_kind(data[split], scored[split], temperature, bias),
            }
        n_scored = sum(len(data[s]) for s in needed)
        entry["seconds_per_claim"] = round(seconds / max(n_scored, 1), 4)
        results[name] = entry
        if scores_out is not None:
            scores_out[name] = {
                "temperature": temperature,
                "bias": bias,
                **{
                    split: [
                        {"id": r.get("id"), "kind": r["kind"], "label": bool(r["label"]), "z": z}
                        for r, z in zip(data[split], scored[split], strict=True)
                    ]
                    for split in splits
                },
            }
        del model
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-model", required=True)
    parser.add_argument(
        "--adapter", default=None, help="adapter directory; omit for untrained only"
    )
    parser.add_argument("--data", required=True)
    parser.add_argument("--splits", nargs="+", default=["test", "gsm8k_test"])
    parser.add_argument("--limit", type=int, default=None, help="first N claims of each split")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--untrained",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also score the base model alone (--no-untrained: only the adapter)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the metrics JSON here")
    parser.add_argument(
        "--scores-out",
        type=Path,
        default=None,
        help="write every claim's logit difference z (per model and split) here, "
        "for paired comparisons between runs",
    )
    args = parser.parse_args(argv)
    scores: dict[str, Any] | None = {} if args.scores_out else None
    result: dict[str, Any] = {
        "models": evaluate(
            args.base_model,
            args.adapter,
            args.data,
            args.splits,
            args.threads,
            args.limit,
            args.untrained,
            scores,
        )
    }
    if args.scores_out and scores is not None:
        args.scores_out.parent.mkdir(parents=True, exist_ok=True)
        args.scores_out.write_text(json.dumps(scores) + "\n")
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
