"""Verification logic: exact symbolic checks first, the model where they do not apply."""

from __future__ import annotations

import time

import structlog
from prometheus_client import Counter

from services.errors import NotReady
from services.model_host import ModelHost
from services.schemas import VerifyMethod, VerifyRequest, VerifyResponse
from services.settings import VerifierSettings
from verifier import symbolic
from verifier.backends.base import Claim, VerifierBackend

log = structlog.get_logger("verifier")

VERDICTS = Counter("verifier_verdicts_total", "Verdicts given", ["method", "verdict"])


class VerifierService(ModelHost):
    backend: VerifierBackend

    def __init__(self, backend: VerifierBackend, settings: VerifierSettings) -> None:
        super().__init__(backend)
        self.settings = settings

    async def verify_many(self, items: list[VerifyRequest]) -> list[VerifyResponse]:
        started = time.perf_counter()
        checks = [symbolic.check(i.statement, i.context, i.question) for i in items]
        need_model = [k for k, c in enumerate(checks) if c is None or not c.decisive]
        scores: dict[int, float] = {}
        if need_model:
            if not self.ready:
                raise NotReady(f"verifier model not ready: {self.load_error or 'loading'}")
            claims = [
                Claim(items[k].statement, items[k].context, items[k].question) for k in need_model
            ]
            for k, p in zip(need_model, await self.backend.score(claims), strict=True):
                scores[k] = min(max(p, 0.0), 1.0)
        elapsed_ms = (time.perf_counter() - started) * 1000
        results = []
        method: VerifyMethod
        for k, check in enumerate(checks):
            if check is not None and check.decisive:
                verdict, confidence = check.verdict, check.confidence
                method = "both" if k in scores else "symbolic"
            else:
                # confidence is the calibrated probability that the claim is true; when
                # the symbolic checks passed but cannot settle the claim, the model decides
                confidence = scores[k]
                verdict = confidence >= self.settings.threshold
                method = "model" if check is None else "both"
            VERDICTS.labels(method, str(verdict).lower()).inc()
            results.append(
                VerifyResponse(
                    verdict=verdict,
                    confidence=round(confidence, 6),
                    method=method,
                    latency_ms=elapsed_ms,
                )
            )
        return results
