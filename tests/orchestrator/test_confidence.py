"""The served confidence: the calibrator artifact, its fit on dev-split runs, and how
`/reason` turns signals into `confidence` and `verdict`."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from statistics import NormalDist

import httpx
import pytest

from orchestrator.cache import MemoryCache
from orchestrator.confidence import ARTIFACT_FORMAT, Calibrator, CalibratorError, Calibrators
from orchestrator.service import ReasonService
from orchestrator.traces import flatten_ecs
from services.schemas import ReasonRequest, Signals
from services.settings import PlannerSettings, VerifierSettings
from tests.orchestrator.helpers import (
    PASSTHROUGH_CALIBRATOR,
    FakePlanner,
    FakeVerifier,
    orchestrator_stack,
    plan,
    running_orchestrator,
)
from tests.orchestrator.test_stream_events import ScriptedPlanner, ScriptedVerifier, registry
from training.fit_confidence import choose_threshold, cross_validated, fit_models
from training.fit_confidence import main as fit
from verifier.backends import resolve_runtime

ARTIFACT = {
    "format": "answer-confidence/1",
    "version": "t",
    "with_verifier": {"weights": {"agreement": 6.0, "verifier_logit": 0.5}, "bias": -3.0},
    "without_verifier": {"weights": {"agreement": 6.0}, "bias": -3.0},
    "threshold": 0.9,
}


def signals(**kw) -> Signals:
    return Signals(**{"agreement": 1.0, "plans": 5, "complete": True, **kw})


# --------------------------------------------------------------------------- artifact


@pytest.mark.unit
def test_the_passthrough_artifact_serves_the_verifier_score() -> None:
    c = Calibrator.load(PASSTHROUGH_CALIBRATOR)
    assert c.confidence(signals(verifier=0.83), answered=True) == pytest.approx(0.83)
    assert c.confidence(signals(), answered=True) == 0.5
    assert c.confidence(signals(verifier=0.99), answered=False) == 0.0


@pytest.mark.unit
def test_agreement_and_the_verifier_move_the_confidence() -> None:
    c = Calibrator.from_dict(ARTIFACT)
    low = c.confidence(signals(agreement=0.4, verifier=0.5), answered=True)
    high = c.confidence(signals(agreement=1.0, verifier=0.5), answered=True)
    assert low < high
    assert c.confidence(signals(verifier=1.0), answered=True) > high  # finite at 1.0
    assert math.isfinite(c.confidence(signals(verifier=0.0), answered=True))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"format": "other"}, "not an answer-confidence/1"),
        ({"with_verifier": None}, "with_verifier is missing"),
        ({"without_verifier": {"weights": {"shoe_size": 1.0}, "bias": 0}}, "weights must map"),
        ({"with_verifier": {"weights": {"agreement": float("nan")}, "bias": 0}}, "finite"),
        ({"with_verifier": {"weights": {"agreement": True}, "bias": 0}}, "finite"),
        ({"threshold": 0}, "threshold"),
        ({"threshold": "0.9"}, "threshold"),
        ({"threshold": True}, "threshold"),
        ({"fitted_for": ["x"]}, "fitted_for"),
    ],
)
def test_a_bad_artifact_is_refused_with_its_reason(change: dict, why: str) -> None:
    with pytest.raises(CalibratorError, match=why):
        Calibrator.from_dict({**ARTIFACT, **change})


@pytest.mark.unit
def test_a_missing_or_broken_artifact_file_names_itself(tmp_path: Path) -> None:
    with pytest.raises(CalibratorError, match=r"nope\.json: cannot read"):
        Calibrator.load(tmp_path / "nope.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(CalibratorError, match=r"broken\.json: not JSON"):
        Calibrator.load(broken)


@pytest.mark.unit
def test_the_shipped_artifact_is_for_the_default_planner() -> None:
    shipped = Calibrator.load()
    assert 0 < shipped.threshold <= 1
    defaults = PlannerSettings()
    assert defaults.model in shipped.fitted_for["planner_models"]
    assert shipped.fitted_for["plan_format"] == defaults.plan_format
    # its verifier weight was fitted on the scores of the verifier served by default
    verifier = VerifierSettings(backend="model")
    served = f"{verifier.base_model}/{resolve_runtime(verifier)}"
    assert shipped.fitted_for["verifier"] == served


# --------------------------------------------------------------------------- fit


@pytest.mark.unit
@pytest.mark.parametrize(
    ("probs", "labels", "expected"),
    [
        ([0.9, 0.8, 0.7, 0.6], [True, True, False, True], 0.8),
        ([0.9, 0.8], [False, False], 1.0),  # no point reaches the precision
        ([0.9, 0.9, 0.5], [True, True, True], 0.5),
    ],
)
def test_the_threshold_is_the_lowest_that_keeps_the_precision(
    probs: list[float], labels: list[bool], expected: float
) -> None:
    assert choose_threshold(probs, labels, 0.9) == expected


@pytest.mark.unit
def test_the_threshold_covers_a_minimum_of_answers() -> None:
    probs, labels = [0.99, 0.8, 0.7, 0.6], [True, False, True, False]
    assert choose_threshold(probs, labels, 0.9) == 0.99
    assert choose_threshold(probs, labels, 0.9, min_covered=2) == 1.0


@pytest.mark.unit
def test_a_bounded_threshold_leaves_out_a_margin_that_only_just_keeps_the_precision() -> None:
    """45 dev answers: 30 right at 0.9, then 8 of 10 at 0.8 and 3 of 5 at 0.7. Down to 0.7
    41 of 45 are right (91%), so the observed share takes 0.7, where 4 of the last 15
    are wrong; the share's one-sided 90% Wilson lower bound stays above 0.9 only at
    0.9."""
    probs = [0.9] * 30 + [0.8] * 10 + [0.7] * 5
    labels = [True] * 38 + [False] * 2 + [True] * 3 + [False] * 2
    assert choose_threshold(probs, labels, 0.9) == 0.7
    z = NormalDist().inv_cdf(0.9)
    assert choose_threshold(probs, labels, 0.9, z=z) == 0.9
    assert choose_threshold(probs[:10], labels[:10], 0.9, z=z) == 1.0  # 10 of 10: too few


def dev_lines(n: int = 200, seed: int = 0, dataset: str = "gsm8k-train-dev") -> list[dict]:
    """Synthetic dev-split lines where agreement predicts correctness."""
    rng = random.Random(seed)
    lines = []
    for k in range(n):
        agreeing = rng.randint(1, 5)
        right = rng.random() < 0.1 + 0.18 * agreeing
        lines.append(
            {
                "id": f"gsm8k-train-{k}",
                "dataset": dataset,
                "mode": "plan+verify+sc5",
                "model": "llamacpp:qwen2.5-coder-1.5b-instruct",
                "answer_text": "7",
                "correct": right,
                "error": None,
                "signals": {
                    "agreement": agreeing / 5,
                    "plans": 5,
                    "complete": True,
                    "verifier": rng.uniform(0.2, 0.6),
                    "rounds": 1,
                },
            }
        )
    return lines


@pytest.mark.unit
def test_the_fit_learns_agreement_and_keeps_the_precision(tmp_path: Path) -> None:
    """Fitted on one sample of synthetic runs, judged on another: agreement carries the
    signal, the confidence is calibrated there, and `verified` keeps most of its
    precision."""
    results = tmp_path / "dev.jsonl"
    results.write_text("".join(json.dumps(line) + "\n" for line in dev_lines(400)))
    out = tmp_path / "artifact.json"
    argv = [str(results), "--plan-format", "json", "--out", str(out), "--precision", "0.8"]
    artifact = fit([*argv, "--verifier", "qwen2.5-coder-0.5b-instruct/llamacpp"])
    calibrator = Calibrator.load(out)
    assert artifact["fitted_for"]["verifier"] == "qwen2.5-coder-0.5b-instruct/llamacpp"
    assert artifact["with_verifier"]["weights"]["agreement"] > 0
    assert artifact["fitted_for"]["plan_format"] == "json"
    # the model of the runs, as the orchestrator looks it up (backend prefix dropped)
    assert artifact["fitted_for"]["planner_models"] == ["qwen2.5-coder-1.5b-instruct"]
    assert artifact["fitted_for"]["modes"] == ["plan+verify+sc5"]
    held_out = dev_lines(2000, seed=1)
    probs = [calibrator.confidence(Signals(**line["signals"]), answered=True) for line in held_out]
    labels = [line["correct"] for line in held_out]
    from training.metrics import ece

    assert ece(probs, labels) < 0.05
    verified = [y for p, y in zip(probs, labels, strict=True) if p >= calibrator.threshold]
    assert calibrator.threshold < 1 and verified
    # chosen on held-out folds with a lower bound, the precision holds on new runs
    assert sum(verified) / len(verified) >= 0.8
    # the threshold is the bounded rule's over the held-out confidences of the scored lines
    rows = [(Signals(**line["signals"]), bool(line["correct"])) for line in dev_lines(400)]
    l2s = {
        name: artifact["dev_metrics"][name]["l2"] for name in ("with_verifier", "without_verifier")
    }
    held = cross_validated(rows, l2s, 10, 0)
    assert artifact["threshold"] == choose_threshold(
        held, [y for _, y in rows], 0.8, 5, NormalDist().inv_cdf(0.9)
    )
    assert artifact["dev_metrics"]["threshold"]["chosen_on"] == "cross_validated"
    in_sample = fit([str(results), "--plan-format", "json", "--out", str(out), "--folds", "0"])
    assert in_sample["dev_metrics"]["threshold"]["chosen_on"] == "in-sample"
    with pytest.raises(SystemExit):
        fit([str(results), "--plan-format", "json", "--out", str(out), "--bound", "0.3"])


@pytest.mark.unit
def test_the_dev_metrics_hold_a_cross_validated_estimate(tmp_path: Path) -> None:
    """With as many folds as rows, each row's held-out confidence is the one of the
    calibrator fitted on every other row; the estimate is reported beside the in-sample
    one and is no better than it on a small sample."""
    lines = dev_lines(40)
    rows = [(Signals(**line["signals"]), bool(line["correct"])) for line in lines]
    l2s = {"with_verifier": 0.3, "without_verifier": 0.3}
    held = cross_validated(rows, l2s, folds=len(rows))
    for k in (0, 17):
        models, _ = fit_models(rows[:k] + rows[k + 1 :], l2s=l2s)
        alone = Calibrator.from_dict(
            {"format": ARTIFACT_FORMAT, "version": "t", "threshold": 1.0, **models}
        )
        assert held[k] == pytest.approx(alone.confidence(rows[k][0], answered=True))
    results = tmp_path / "dev.jsonl"
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = [str(results), "--plan-format", "json", "--out", str(tmp_path / "a.json"), "--l2", "0.3"]
    metrics = fit(argv)["dev_metrics"]
    cv = metrics["cross_validated"]
    assert (cv["folds"], cv["seed"]) == (10, 0)
    assert cv["brier"] >= metrics["brier"]
    assert "cross_validated" not in fit([*argv, "--folds", "0"])["dev_metrics"]


@pytest.mark.unit
def test_the_fit_refuses_lines_that_are_not_the_dev_split(tmp_path: Path) -> None:
    results = tmp_path / "test.jsonl"
    results.write_text("".join(json.dumps(line) + "\n" for line in dev_lines(dataset="gsm8k-test")))
    with pytest.raises(SystemExit, match="not the train dev split"):
        fit([str(results), "--plan-format", "json", "--out", str(tmp_path / "a.json")])


# --------------------------------------------------------------------------- per model


def fitted(version: str, model: str, **change) -> Calibrator:
    return Calibrator.from_dict(
        {**ARTIFACT, "version": version, "fitted_for": {"planner_models": [model]}, **change}
    )


@pytest.mark.unit
def test_each_planner_model_is_given_the_calibrator_fitted_for_it() -> None:
    a, b = fitted("a", "model-a"), fitted("b", "model-b")
    calibrators = Calibrators.of([a, b], default=a)
    assert calibrators.pick("model-b") is b and calibrators.pick("model-a") is a
    assert calibrators.pick("model-c") is a and calibrators.pick(None) is a
    assert calibrators.fitted_for("model-b") is True
    assert calibrators.fitted_for("model-c") is False
    assert calibrators.version == "a+b"  # the answer cache's key changes with either
    unnamed = Calibrator.from_dict(ARTIFACT)  # names no model: nothing to compare
    assert Calibrators.of([unnamed], default=unnamed).fitted_for("model-c") is None
    with pytest.raises(CalibratorError, match="two calibrators are fitted for model-a"):
        Calibrators.of([a, fitted("a2", "model-a")], default=a)


@pytest.mark.unit
def test_the_shipped_calibrators_name_their_models_and_the_default_models_is_the_default() -> None:
    shipped = Calibrators.load()
    assert shipped.default == Calibrator.load()
    default_model = PlannerSettings().model
    assert shipped.pick(default_model) is shipped.default
    for model, calibrator in shipped.by_model.items():
        assert model in calibrator.fitted_for["planner_models"]
    # an operator's artifact is the one for every model
    own = Calibrators.load(PASSTHROUGH_CALIBRATOR)
    assert own.pick(default_model) is own.default and own.pick("x") is own.default


class NamedPlanner(ScriptedPlanner):
    """Plans from a script, as the planner serving `model`."""

    def __init__(self, script: dict, model: str) -> None:
        super().__init__(script)
        self.model = model  # its /plan responses and GET /info name it


@pytest.mark.unit
@pytest.mark.parametrize(
    ("model", "logit"),
    [("model-a", 3.0), ("model-b", 1.0), ("another", 3.0)],  # another: the default's
)
async def test_the_confidence_is_calibrated_for_the_model_that_planned(
    model: str, logit: float
) -> None:
    a = fitted("a", "model-a")
    b = fitted("b", "model-b", without_verifier={"weights": {"agreement": 2.0}, "bias": -1.0})
    service = ReasonService(
        planner=NamedPlanner({"q": [[plan(("s1", "calc", "2+2", []))]]}, model),
        verifier=ScriptedVerifier(),
        registry=registry(),
        cache=MemoryCache(),
        calibrator=Calibrators.of([a, b], default=a),
    )
    request = ReasonRequest.model_validate(
        {"question": "q", "options": {"verify": False, "use_cache": False, "n_prose": 0}}
    )
    result = await service.reason(request)
    assert result.answer == "4"
    assert result.confidence == pytest.approx(1 / (1 + math.exp(-logit)), abs=1e-6)


# --------------------------------------------------------------------------- served


@pytest.mark.integration
def test_agreement_makes_an_answer_verified_and_the_signals_are_shown(tmp_path: Path) -> None:
    artifact = tmp_path / "calibrator.json"
    artifact.write_text(json.dumps(ARTIFACT))
    agree = [plan(("s1", "calc", e, [])) for e in ("2+2", "1+3", "8/2")]
    split = [plan(("s1", "calc", e, [])) for e in ("2+2", "2+3", "2+5")]
    planner = FakePlanner({"agree": [agree], "split": [split], "one": [agree[:1]]})
    verifier = FakeVerifier(default=0.45)  # the verifier alone would reject every answer
    with orchestrator_stack(
        tmp_path, planner, verifier, confidence_calibrator=artifact, replan_on=["no_answer"]
    ) as url:

        def ask(q: str, **options) -> dict:
            r = httpx.post(f"{url}/reason", json={"question": q, "options": options}, timeout=30)
            assert r.status_code == 200, r.text
            return r.json()

        agreed = ask("agree", n_plans=3)
        assert agreed["verdict"] == "verified" and agreed["confidence"] >= 0.9
        assert agreed["signals"] == {
            "agreement": 1.0,
            "plans": 2,  # the first two agreed: the vote of three was settled
            "complete": True,
            "verifier": 0.45,
            "rounds": 1,
        }
        disputed = ask("split", n_plans=3)
        assert disputed["verdict"] == "rejected" and disputed["confidence"] < 0.9
        # without the verifier nothing is `verified`, however confident
        unasked = ask("agree", n_plans=3, verify=False, use_cache=False)
        assert unasked["verdict"] == "unverified" and unasked["signals"]["verifier"] is None
        assert unasked["confidence"] == pytest.approx(1 / (1 + math.exp(-3.0)), abs=1e-6)
        verifier.mode = "error"
        down = ask("one", use_cache=False)
        assert down["verdict"] == "unverified" and down["signals"]["verifier"] is None


@pytest.mark.integration
@pytest.mark.parametrize(
    ("info", "note"),
    [
        ({"model": "qwen2.5-coder-1.5b-instruct"}, False),  # the default calibrator's model
        ({"model": "qwen2.5-coder-0.5b-instruct"}, False),  # one setting away: its own
        ({"model": "phi-3.5-mini-instruct"}, True),  # none fitted for it
        (None, False),  # a planner without /info: nothing to compare
    ],
)
def test_readiness_says_when_the_calibrator_is_another_models(
    tmp_path: Path, info: dict | None, note: bool
) -> None:
    """The shipped calibrators name the planner model each was fitted for; a planner
    serving a model none was fitted for stays ready, the readiness reason says so, and one
    warning is logged."""
    planner = FakePlanner(info=None if info is None else {**FakePlanner().info, **info})
    with running_orchestrator(tmp_path, planner, FakeVerifier(), confidence_calibrator=None) as (
        url,
        _,
    ):
        answers = [httpx.get(f"{url}/readyz", timeout=5.0) for _ in range(3)]
    assert all(r.status_code == 200 for r in answers)
    reason = answers[-1].json()["reason"]
    expected = "fitted for qwen2.5-coder-1.5b-instruct, not phi-3.5-mini-instruct"
    assert (expected in reason) is note
    lines = [
        flatten_ecs(json.loads(line))
        for path in tmp_path.glob("orchestrator*.jsonl")
        for line in path.read_text().splitlines()
        if line.startswith("{")
    ]
    # (the file the mismatch case finds its warning in: its absence elsewhere is real)
    warned = [x for x in lines if x.get("event.action") == "confidence.calibrator_mismatch"]
    assert len(warned) == int(note)
