"""Choosing among the pipeline's samples: majority vote against the verifier's ranking.

For each question of sample files written by `training.sample_pipeline` (for reporting:
GSM8K test questions, which no training or calibration saw), the first `k` samples as
the orchestrator would draw them (plans first, then worked solutions, each in sample
order) are answered four ways:

- `first`: the first sample alone (one plan, before any replanning);
- `majority`: the answer most samples agree on, a tie to the one drawn first (the
  orchestrator's vote without the verifier);
- `best`: the answer of the sample the verifier scores highest (verifier-ranked best-of-k);
- `weighted`: the answer whose samples' verifier probabilities sum highest;

and `oracle` counts questions where some sample is right (the headroom of any choice).
Each distinct claim is scored once by the verifier's model (base model with or without
the adapter; the adapter's `calibration.json` turns its logit into a probability, as the
verifier service's model method does; the service's symbolic checks, which decide some
claims before the model, are left out) and AUROC, ECE and Brier are reported over those
claims.

    python -m training.rerank --samples training/samples/qwen2.5-coder-1.5b-instruct/gsm8k-test.jsonl \\
        --base-model ~/.cache/reason/models/smollm2-135m-instruct/hf \\
        --adapter verifier/adapters/smollm2-135m-instruct --k 5
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evals.data import iter_records
from evals.votes import winner
from services.answers import answer_key
from training.metrics import auroc, brier, calibrated, ece

ClaimKey = tuple[str, str, str]
Scorer = Callable[[list[dict[str, str]]], list[float]]  # claims -> P(claim is right)

KIND_ORDER = {"plan": 0, "prose": 1}  # as the orchestrator lists a round's samples


def claim_key(claim: dict[str, str]) -> ClaimKey:
    return (claim["question"], claim["statement"], claim["context"])


def by_question(
    rows: Sequence[dict[str, Any]], k: int, kinds: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """The first `k` samples of each question, in the order the orchestrator draws them;
    questions with fewer than `k` samples of these kinds are left out."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] in kinds:
            grouped.setdefault(r["id"], []).append(r)
    out = {}
    for qid, samples in grouped.items():
        samples.sort(key=lambda s: (KIND_ORDER.get(s["kind"], 9), s["sample"]))
        if len(samples) >= k:
            out[qid] = samples[:k]
    return out


def choose(samples: list[dict[str, Any]], prob: dict[ClaimKey, float]) -> dict[str, Any]:
    """The sample each rule serves (None when no sample has an answer)."""

    def p(s: dict[str, Any]) -> float:
        return prob[claim_key(s["claim"])] if s["claim"] is not None else -1.0

    answered = [s for s in samples if s["answer"] is not None]
    if not answered:
        return dict.fromkeys(("first", "majority", "best", "weighted"))
    question = next((s["claim"]["question"] for s in samples if s["claim"] is not None), "")
    voted = winner([s["answer"] for s in samples], question)  # the orchestrator's vote
    totals: dict[str, float] = {}
    for s in answered:
        key = answer_key(s["answer"])
        if key is not None:
            totals[key] = totals.get(key, 0.0) + p(s)
    top = max(totals.values())
    heavy = next(s for s in answered if totals.get(answer_key(s["answer"]) or "") == top)
    return {
        "first": samples[0],
        "majority": next(s for s in answered if s["answer"] == voted),
        "best": max(answered, key=p),  # max keeps the first of equal scores
        "weighted": heavy,
    }


def rerank(
    rows: Sequence[dict[str, Any]], scorer: Scorer, k: int, kinds: Sequence[str]
) -> dict[str, Any]:
    questions = by_question(rows, k, kinds)
    claims: dict[ClaimKey, dict[str, Any]] = {}
    for samples in questions.values():
        for s in samples:
            if s["claim"] is not None:
                claims.setdefault(claim_key(s["claim"]), s)
    keys = list(claims)
    probs = scorer([claims[key]["claim"] for key in keys])
    prob = dict(zip(keys, probs, strict=True))
    right = dict.fromkeys(("first", "majority", "best", "weighted", "oracle"), 0)
    for samples in questions.values():
        for rule, s in choose(samples, prob).items():
            right[rule] += bool(s is not None and s["label"])
        right["oracle"] += any(s["label"] for s in samples)
    labels = [bool(claims[key]["label"]) for key in keys]
    n = len(questions)
    return {
        "questions": n,
        "k": k,
        "kinds": list(kinds),
        "right": right,
        "accuracy": {rule: round(c / n, 4) if n else None for rule, c in right.items()},
        "claims": len(keys),
        "claims_right": sum(labels),
        "auroc": round(auroc(probs, labels), 4) if 0 < sum(labels) < len(labels) else None,
        "ece": round(ece(probs, labels), 4) if labels else None,
        "brier": round(brier(probs, labels), 4) if labels else None,
    }


def model_scorer(base_model: str, adapter: str | None, threads: int = 1) -> Scorer:
    """The verifier's model as the service's model method runs it: logit(TRUE) -
    logit(FALSE), through the adapter's calibration (temperature and bias) when it has
    one."""
    from training.evaluate import read_calibration
    from training.scoring import load_model, load_tokenizer, prompt_format, score_rows, set_threads

    set_threads(threads)
    model = load_model(base_model, adapter)
    tokenizer = load_tokenizer(base_model)
    fmt = prompt_format(adapter)
    temperature, bias = 1.0, 0.0
    if adapter is not None and (Path(adapter) / "calibration.json").exists():
        temperature, bias, _ = read_calibration(Path(adapter) / "calibration.json")

    def score(claims: list[dict[str, str]]) -> list[float]:
        logits = score_rows(model, tokenizer, claims, fmt, progress=True)
        return [calibrated(z, temperature, bias) for z in logits]

    return score


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=Path, nargs="+", required=True)
    parser.add_argument("--base-model", required=True, help="transformers model directory")
    parser.add_argument("--adapter", default=None, help="LoRA adapter directory (none: untrained)")
    parser.add_argument("--k", type=int, default=5, help="samples per question (the first k)")
    parser.add_argument("--kinds", nargs="+", default=["plan"], choices=sorted(KIND_ORDER))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the report here (JSON)")
    args = parser.parse_args(argv)
    if args.k < 1:
        parser.error("--k must be at least 1")
    rows = [r for path in args.samples for r in iter_records(path, "id", "label")]
    result = rerank(
        rows, model_scorer(args.base_model, args.adapter, args.threads), args.k, args.kinds
    )
    result.update(
        base_model=args.base_model, adapter=args.adapter, samples=[str(p) for p in args.samples]
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
