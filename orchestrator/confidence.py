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

A calibrator is fitted for one planner model: the same signals mean more from a stronger
model. The orchestrator ships one per model it was fitted for (`Calibrators`) and picks,
for each request, the one fitted for the model that planned it (plan and solve responses
name it), so that switching the planner's model is one setting.

The model is five weights and a bias: applying it is a dot product, so the orchestrator
needs no numerical library for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from services.schemas import Signals

SHIPPED_DEFAULT = "answer-confidence.json"  # the embedded default model's
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
        """The artifact at `path`, or the embedded default model's, shipped with the
        orchestrator."""
        if path is None:
            return cls.load_shipped(SHIPPED_DEFAULT)
        return cls._read(path, str(path))

    @classmethod
    def load_shipped(cls, name: str) -> Calibrator:
        """The artifact `name` shipped in orchestrator/calibration/."""
        shipped = resources.files("orchestrator.calibration").joinpath(name)
        return cls._read(shipped, f"orchestrator/calibration/{name}")

    @classmethod
    def _read(cls, file: Any, source: str) -> Calibrator:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise CalibratorError(f"{source}: cannot read ({exc.strerror})") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CalibratorError(f"{source}: not JSON ({exc})") from None
        return cls.from_dict(data, source)


@dataclass(frozen=True)
class Calibrators:
    """The calibrators the orchestrator serves with: one for each planner model one was
    fitted for, and a default for a model none was (its confidences are then another
    model's, and /readyz says so)."""

    default: Calibrator
    by_model: Mapping[str, Calibrator] = field(default_factory=dict)

    def pick(self, model: str | None) -> Calibrator:
        """The calibrator fitted for `model`, else the default."""
        return self.by_model.get(model, self.default) if model else self.default

    def fitted_for(self, model: str) -> bool | None:
        """Whether a calibrator was fitted for `model`; None when the default names no
        model (nothing to compare)."""
        if model in self.by_model:
            return True
        return None if not self.default.fitted_for.get("planner_models") else False

    @property
    def version(self) -> str:
        """Every calibrator's version: a refit of any changes confidences and verdicts."""
        return "+".join(
            sorted({self.default.version, *(c.version for c in self.by_model.values())})
        )

    @classmethod
    def of(cls, calibrators: list[Calibrator], default: Calibrator) -> Calibrators:
        by_model: dict[str, Calibrator] = {}
        for calibrator in calibrators:
            for model in calibrator.fitted_for.get("planner_models") or []:
                if model in by_model and by_model[model] is not calibrator:
                    raise CalibratorError(
                        f"two calibrators are fitted for {model}: "
                        f"{by_model[model].version} and {calibrator.version}"
                    )
                by_model[str(model)] = calibrator
        return cls(default=default, by_model=by_model)

    @classmethod
    def load(cls, path: Path | None = None) -> Calibrators:
        """The operator's artifact at `path`, for every model (it is theirs to fit), or
        every artifact shipped with the orchestrator, the embedded default's the default."""
        if path is not None:
            only = Calibrator.load(path)
            return cls.of([only], default=only)
        shipped = resources.files("orchestrator.calibration")
        names = sorted(
            entry.name
            for entry in shipped.iterdir()
            if entry.name.startswith("answer-confidence") and entry.name.endswith(".json")
        )
        loaded = {name: Calibrator.load_shipped(name) for name in names}
        if SHIPPED_DEFAULT not in loaded:
            raise CalibratorError(f"orchestrator/calibration/{SHIPPED_DEFAULT}: missing")
        return cls.of(list(loaded.values()), default=loaded[SHIPPED_DEFAULT])
