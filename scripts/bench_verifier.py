"""Verifier benchmark: latency per claim (single and batch) and the exact checks' record.

    .venv/bin/python -m scripts.bench_verifier --data var/verifier-data --n 48

Latency uses the model backend as served (tokenize, one forward pass, calibration; the
runtime and model of the VERIFIER_* settings) on
claims from the held-out test split; the symbolic part runs `verifier.symbolic.check`
over the test and GSM8K-test splits and counts how many claims it decides and how many
of those it gets right. The last line of output is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from services.settings import VerifierSettings
from verifier import symbolic
from verifier.backends import create_backend
from verifier.backends.base import Claim
from verifier.backends.model import ModelVerifier

REPO = Path(__file__).resolve().parents[1]
# the held-out splits scored for the symbolic record, where the data directory has them
# (training.data writes both; pipeline claims from training.sample_pipeline only test)
SPLITS = ("test", "gsm8k_test")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def symbolic_record(rows: list[dict]) -> dict:
    decided = right = 0
    for r in rows:
        result = symbolic.check(r["statement"], r.get("context") or "", r.get("question"))
        if result is not None and result.decisive:
            decided += 1
            right += result.verdict == bool(r["label"])
    return {"n": len(rows), "decided": decided, "right": right, "wrong": decided - right}


async def latency(backend: ModelVerifier, claims: list[Claim], batch: int) -> dict:
    single_ms, batch_ms = [], []
    for c in claims:
        t = time.perf_counter()
        await backend.score([c])
        single_ms.append((time.perf_counter() - t) * 1000)
    for k in range(0, len(claims) - batch + 1, batch):
        t = time.perf_counter()
        await backend.score(claims[k : k + batch])
        batch_ms.append((time.perf_counter() - t) * 1000)
    per_claim = [ms / batch for ms in batch_ms]
    return {
        "single_ms_p50": round(statistics.median(single_ms), 1),
        "single_ms_p99": round(percentile(single_ms, 99), 1),
        f"batch{batch}_call_ms_p50": round(statistics.median(batch_ms), 1),
        f"batch{batch}_call_ms_p99": round(percentile(batch_ms, 99), 1),
        f"batch{batch}_per_claim_ms_p50": round(statistics.median(per_claim), 1),
        f"batch{batch}_per_claim_ms_p99": round(percentile(per_claim, 99), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--n", type=int, default=48, help="claims timed one by one")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--no-model", action="store_true", help="symbolic figures only")
    args = parser.parse_args()
    splits = [s for s in SPLITS if (args.data / f"{s}.jsonl").exists()]
    if "test" not in splits:
        parser.error(f"{args.data} has no test.jsonl (the claims timed)")
    figures: dict = {
        "data": str(args.data),
        "symbolic": {s: symbolic_record(read_jsonl(args.data / f"{s}.jsonl")) for s in splits},
    }
    if not args.no_model:
        # the served backend for the environment's VERIFIER_* settings (model, runtime)
        backend = create_backend(VerifierSettings(backend="model"))
        assert isinstance(backend, ModelVerifier)
        figures["model"] = backend.settings.base_model
        figures["runtime"] = backend.runtime
        t = time.perf_counter()
        asyncio.run(backend.load())
        figures["load_s"] = round(time.perf_counter() - t, 1)
        figures["gguf_type"] = getattr(backend, "gguf_type", None)  # the llamacpp runtime's
        rows = read_jsonl(args.data / "test.jsonl")[: args.n]
        claims = [Claim(r["statement"], r.get("context") or "", r.get("question")) for r in rows]
        figures["latency"] = asyncio.run(latency(backend, claims, args.batch))
        figures["latency"]["claims"] = len(claims)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
