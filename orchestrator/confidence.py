"""The served confidence: a calibrated probability that the answer is right.

It is computed from what the request itself observed (`Signals`): how many of the served
round's plans agree with the answer, how many were drawn, whether every step of the
served plan ran, and the verifier's score when it was asked. A calibrator maps them to a
probability with a logistic model fitted on pipeline runs over the GSM8K train dev split
(`training/fit_confidence.py`), shipped as a small versioned JSON artifact. The artifact
holds two models over the same runs: one that uses the verifier's score, and one for
requests that did not ask the verifier (or whose verifier did not answer).

`verified` is reserved for answers whose calibrated confidence reaches the artifact's
threshold, chosen on the dev split for precision.

The model is five weights and a bias: applying it is a dot product, so the orchestrator
needs no numerical library for it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from services.schemas import Signals

FEATURES = ("agreement", "log_plans", "complete", "verifier_logit", "rounds")
ARTIFACT_FORMAT = "answer-confidence/1"
LOGIT_LIMIT = 8.0  # verifier scores of exactly 0 or 1 stay finite


class CalibratorError(ValueError):
    """An artifact that cannot be used; the message names the file and the field."""


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return max(-LOGIT_LIMIT, min(LOGIT_LIMIT, math.log(p / (1 - p))))


def features(signals: Signals) -> dict[str, float]:
    return {
        "agreement": signals.agreement,
        "log_plans": math.log(max(signals.plans, 1)),
        "complete": 1.0 if signals.complete else 0.0,
        "verifier_logit": 0.0 if signals.verifier is None else _logit(signals.verifier),
        "rounds": float(signals.rounds - 1),
    }


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@dataclass(frozen=True)
class Logistic:
    weights: dict[str, float]
    bias: float

    def probability(self, x: dict[str, float]) -> float:
        return _sigmoid(self.bias + sum(w * x[name] for name, w in self.weights.items()))


@dataclass(frozen=True)
class Calibrator:
    version: str
    with_verifier: Logistic
    without_verifier: Logistic
    threshold: float  # `verified` needs at least this calibrated confidence (1: never)
    fitted_for: dict[str, Any]  # the planner model and plan format of the runs

    def confidence(self, signals: Signals, answered: bool) -> float:
        """P(answer is right) for an answered request; 0 when there is no answer."""
        if not answered:
            return 0.0
        model = self.without_verifier if signals.verifier is None else self.with_verifier
        return model.probability(features(signals))

    @classmethod
    def from_dict(cls, data: Any, source: str = "artifact") -> Calibrator:
        def fail(why: str) -> CalibratorError:
            return CalibratorError(f"{source}: {why}")

        if not isinstance(data, dict) or data.get("format") != ARTIFACT_FORMAT:
            raise fail(f"not an {ARTIFACT_FORMAT} artifact")
        models = {}
        for name in ("with_verifier", "without_verifier"):
            model = data.get(name)
            if not isinstance(model, dict):
                raise fail(f"{name} is missing")
            weights = model.get("weights")
            bias = model.get("bias")
            if not isinstance(weights, dict) or not set(weights) <= set(FEATURES):
                raise fail(f"{name}.weights must map features of {FEATURES} to numbers")
            values = [*weights.values(), bias]
            if not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                for v in values
            ):
                raise fail(f"{name}: weights and bias must be finite numbers")
            models[name] = Logistic({k: float(v) for k, v in weights.items()}, float(values[-1]))
        threshold = data.get("threshold")
        if (
            not isinstance(threshold, int | float)
            or isinstance(threshold, bool)
            or not 0 < threshold <= 1
        ):
            raise fail("threshold must be a number in (0, 1] (1: nothing is verified)")
        fitted_for = data.get("fitted_for", {})
        if not isinstance(fitted_for, dict):
            raise fail("fitted_for must be an object")
        return cls(
            version=str(data.get("version", "")),
            with_verifier=models["with_verifier"],
            without_verifier=models["without_verifier"],
            threshold=float(threshold),
            fitted_for=fitted_for,
        )

    @classmethod
    def load(cls, path: Path | None = None) -> Calibrator:
        """The artifact at `path`, or the one shipped with the orchestrator."""
        shipped = resources.files("orchestrator.calibration").joinpath("answer-confidence.json")
        source = (
            str(path) if path is not None else "orchestrator/calibration/answer-confidence.json"
        )
        try:
            text = (path or shipped).read_text(encoding="utf-8")
        except OSError as exc:
            raise CalibratorError(f"{source}: cannot read ({exc.strerror})") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CalibratorError(f"{source}: not JSON ({exc})") from None
        return cls.from_dict(data, source)
