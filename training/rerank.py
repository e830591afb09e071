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

Two more rules replay the orchestrator's rounds with one plan each (`n_plans=1`, up to
`--rounds` rounds), taking the samples as the successive rounds' plans:

- `plan`: replanning only a round with no answer (the default `replan_on`);
- `plan+verify`: replanning a round with no answer or one the verifier rejects (its
  calibrated probability under `--threshold`, the verifier service's threshold); when
  every round is rejected, the answer the verifier trusted most is served, as the
  orchestrator serves it.

The replay is an approximation of the served modes in two ways the report states: a
sample file's plans are independent draws at the sampling temperature, where the
service's first plan is greedy and a replan sees the failed attempt as feedback; and
the verifier's own verdict stands in for the served one (where the answer calibrator
can overrule it). Both modes see the same samples, so the difference between them is
the verifier's alone. `samples_drawn` reports what each costs in plans.

Each distinct claim is scored once by the verifier's model (base model with or without
the adapter; the adapter's `calibration.json` turns its logit into a probability, as the
verifier service's model method does; the service's symbolic checks, which decide some
claims before the model, are left out) and AUROC, ECE and Brier are reported over those
claims.

The report lists every question's samples with their probabilities (`items`), and
`--scores-from` replays a report's probabilities instead of running the model again (the
rules and thresholds change, the scores do not).

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

SampleKey = tuple[str, str, int]  # (question id, kind, sample index)

KIND_ORDER = {"plan": 0, "prose": 1}  # as the orchestrator lists a round's samples
VOTE_RULES = ("first", "majority", "best", "weighted")
ROUND_RULES = ("plan", "plan+verify")
ROUNDS = 3  # the orchestrator's default: one round and two replans (ORCH_MAX_REPLANS=2)
THRESHOLD = 0.5  # the verifier service's default (VERIFIER_THRESHOLD)


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


def sample_key(sample: dict[str, Any]) -> SampleKey:
    return (sample["id"], sample["kind"], sample["sample"])


def choose(samples: list[dict[str, Any]], p: Callable[[dict[str, Any]], float]) -> dict[str, Any]:
    """The sample each vote rule serves (None when no sample has an answer); `p` is a
    sample's probability (-1 for one without a claim)."""
    answered = [s for s in samples if s["answer"] is not None]
    if not answered:
        return dict.fromkeys(VOTE_RULES)
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


def replay_rounds(
    samples: list[dict[str, Any]],
    p: Callable[[dict[str, Any]], float],
    threshold: float = THRESHOLD,
    rounds: int = ROUNDS,
) -> dict[str, tuple[dict[str, Any] | None, int]]:
    """What each round rule serves and how many plans it drew: successive samples are the
    successive rounds' plans (see the module's docstring for what this leaves out)."""
    drawn = samples[:rounds]
    plan, plan_drawn = None, len(drawn)
    for n, s in enumerate(drawn, 1):
        if s["answer"] is not None:
            plan, plan_drawn = s, n
            break
    verified, verify_drawn = None, len(drawn)
    for n, s in enumerate(drawn, 1):
        if s["answer"] is not None and p(s) >= threshold:
            verified, verify_drawn = s, n
            break
    else:  # every round rejected or without an answer: the most trusted answer
        answered = [s for s in drawn if s["answer"] is not None]
        verified = max(answered, key=p) if answered else None
    return {"plan": (plan, plan_drawn), "plan+verify": (verified, verify_drawn)}


def rerank(
    rows: Sequence[dict[str, Any]],
    scorer: Scorer | None,
    k: int,
    kinds: Sequence[str],
    *,
    threshold: float = THRESHOLD,
    rounds: int = ROUNDS,
    saved: dict[SampleKey, float] | None = None,
) -> dict[str, Any]:
    """The report over the first `k` samples of each question; the probabilities come from
    `scorer` (each distinct claim scored once) or, when given, from `saved` (a previous
    report's, by sample)."""
    if not 1 <= rounds <= k:
        raise ValueError(f"rounds must be between 1 and k ({k}), not {rounds}")
    questions = by_question(rows, k, kinds)
    claims: dict[ClaimKey, dict[str, Any]] = {}
    for samples in questions.values():
        for s in samples:
            if s["claim"] is not None:
                claims.setdefault(claim_key(s["claim"]), s)
    keys = list(claims)
    if saved is not None:
        missing = [sk for sk in (sample_key(claims[key]) for key in keys) if sk not in saved]
        if missing:
            raise ValueError(f"{len(missing)} samples have no saved score, e.g. {missing[0]}")
        probs = [saved[sample_key(claims[key])] for key in keys]
    elif scorer is not None:
        probs = scorer([claims[key]["claim"] for key in keys])
    else:
        raise ValueError("a scorer or saved scores are needed")
    prob = dict(zip(keys, probs, strict=True))

    def p(s: dict[str, Any]) -> float:
        return prob[claim_key(s["claim"])] if s["claim"] is not None else -1.0

    right = dict.fromkeys((*VOTE_RULES, *ROUND_RULES, "oracle"), 0)
    drawn = dict.fromkeys(ROUND_RULES, 0)
    items = []
    for qid, samples in questions.items():
        for rule, s in choose(samples, p).items():
            right[rule] += bool(s is not None and s["label"])
        for rule, (s, n) in replay_rounds(samples, p, threshold, rounds).items():
            right[rule] += bool(s is not None and s["label"])
            drawn[rule] += n
        right["oracle"] += any(s["label"] for s in samples)
        items.append(
            {
                "id": qid,
                "samples": [
                    {
                        "kind": s["kind"],
                        "sample": s["sample"],
                        "answer": s["answer"],
                        "label": bool(s["label"]),
                        "p": round(p(s), 6) if s["claim"] is not None else None,
                    }
                    for s in samples
                ],
            }
        )
    labels = [bool(claims[key]["label"]) for key in keys]
    n = len(questions)
    return {
        "questions": n,
        "k": k,
        "kinds": list(kinds),
        "rounds": rounds,
        "threshold": threshold,
        "right": right,
        "accuracy": {rule: round(c / n, 4) if n else None for rule, c in right.items()},
        "samples_drawn": {rule: round(c / n, 3) if n else None for rule, c in drawn.items()},
        "claims": len(keys),
        "claims_right": sum(labels),
        "auroc": round(auroc(probs, labels), 4) if 0 < sum(labels) < len(labels) else None,
        "ece": round(ece(probs, labels), 4) if labels else None,
        "brier": round(brier(probs, labels), 4) if labels else None,
        "items": items,
    }


def saved_scores(report: dict[str, Any]) -> dict[SampleKey, float]:
    """A report's probabilities by sample, for replaying it without the model."""
    return {
        (item["id"], s["kind"], s["sample"]): s["p"]
        for item in report["items"]
        for s in item["samples"]
        if s["p"] is not None
    }


def model_scorer(
    base_model: str | None, adapter: str | None, threads: int = 1, runtime: str = "transformers"
) -> tuple[Scorer, dict[str, Any]]:
    """The verifier's model as the service's model method runs it on `runtime`:
    logit(TRUE) - logit(FALSE), through the adapter's calibration for that runtime
    (temperature and bias) when it has one; and what scored, filled in once it has
    (the runtime, and on llamacpp the GGUF's tensor type)."""
    from training.evaluate import read_calibration
    from training.scoring import CALIBRATION_FILES, score_with

    temperature, bias = 1.0, 0.0
    calibration = Path(adapter) / CALIBRATION_FILES[runtime] if adapter is not None else None
    if calibration is not None and calibration.exists():
        temperature, bias, _ = read_calibration(calibration)

    scored_by: dict[str, Any] = {"runtime": runtime}

    def score(claims: list[dict[str, str]]) -> list[float]:
        logits, by = score_with(runtime, base_model, adapter, claims, threads)
        scored_by.update(by)
        return [calibrated(z, temperature, bias) for z in logits]

    return score, scored_by


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=Path, nargs="+", required=True)
    parser.add_argument("--base-model", help="transformers model directory")
    parser.add_argument(
        "--runtime",
        choices=("transformers", "llamacpp"),
        default="transformers",
        help="what runs the verifier's model (llamacpp: the catalog GGUF and adapter.gguf)",
    )
    parser.add_argument("--adapter", default=None, help="LoRA adapter directory (none: untrained)")
    parser.add_argument("--k", type=int, default=5, help="samples per question (the first k)")
    parser.add_argument("--kinds", nargs="+", default=["plan"], choices=sorted(KIND_ORDER))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help="rounds of the replayed plan modes (<= k)"
    )
    parser.add_argument(
        "--threshold", type=float, default=THRESHOLD, help="the verifier's accept threshold"
    )
    parser.add_argument(
        "--scores-from", type=Path, help="a previous report whose probabilities to replay"
    )
    parser.add_argument("--out", type=Path, help="also write the report here (JSON)")
    args = parser.parse_args(argv)
    if args.k < 1:
        parser.error("--k must be at least 1")
    with_model = args.base_model is not None or args.runtime == "llamacpp"
    if with_model == (args.scores_from is not None):
        parser.error("give --base-model (score with the model) or --scores-from (replay)")
    rows = [r for path in args.samples for r in iter_records(path, "id", "label")]
    if args.scores_from is not None:
        previous = json.loads(args.scores_from.read_text())
        if "items" not in previous:
            parser.error(f"{args.scores_from} has no per-sample scores (items)")
        scorer, saved = None, saved_scores(previous)
        base_model, adapter = previous.get("base_model"), previous.get("adapter")
        scored_by = {k: previous[k] for k in ("runtime", "gguf_type") if k in previous}
    else:
        scorer, scored_by = model_scorer(args.base_model, args.adapter, args.threads, args.runtime)
        saved, base_model, adapter = None, args.base_model, args.adapter
    try:
        result = rerank(
            rows,
            scorer,
            args.k,
            args.kinds,
            threshold=args.threshold,
            rounds=args.rounds,
            saved=saved,
        )
    except ValueError as exc:
        parser.error(str(exc))
    result.update(
        base_model=base_model,
        adapter=adapter,
        **scored_by,
        samples=[str(p) for p in args.samples],
        scores_from=str(args.scores_from) if args.scores_from else None,
    )
    text = json.dumps(result, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "items"}, indent=2))
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
