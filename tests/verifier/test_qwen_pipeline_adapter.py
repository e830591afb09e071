"""The committed Qwen2.5-Coder-0.5B verifier adapter, trained on the pipeline's own
executed plans: one setting (`VERIFIER_BASE_MODEL=qwen2.5-coder-0.5b-instruct`) serves it,
with its calibration, and the service scores a pipeline claim exactly as the training and
evaluation code that measured it does."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from services.settings import VerifierSettings
from tests.verifier.pipeline_samples import pipeline_claims
from verifier.backends.base import Claim
from verifier.backends.model import EMBEDDED_ADAPTERS, ModelVerifier

pytestmark = [pytest.mark.model, pytest.mark.slow]

NAME = "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> ModelVerifier:
    try:
        from services.catalog import ensure_hf_dir

        ensure_hf_dir(NAME)
    except Exception as exc:  # not pulled on this machine
        pytest.skip(f"{NAME} is not available: {exc}")
    b = ModelVerifier(
        VerifierSettings(backend="model", base_model=NAME, log_dir=tmp_path_factory.mktemp("logs"))
    )
    asyncio.run(b.load())
    return b


def test_the_catalog_name_alone_serves_the_committed_adapter_with_its_calibration(
    backend: ModelVerifier,
) -> None:
    adapter = Path(EMBEDDED_ADAPTERS[NAME])
    assert backend.adapter_dir == adapter and adapter.parent.name == "adapters"
    assert backend.model == f"{NAME}+{adapter.name}"
    fitted = json.loads((adapter / "calibration.json").read_text())
    assert fitted["fitted_on"].endswith("val.jsonl")  # pipeline claims, not synthetic ones
    assert (backend.temperature, backend.bias) == (fitted["temperature"], fitted["bias"])
    recipe = json.loads((adapter / "data_recipe.json").read_text())
    assert recipe["sampler"].startswith("pipeline-samples")


def test_served_scores_are_the_ones_training_measured(backend: ModelVerifier) -> None:
    from services.catalog import ensure_hf_dir
    from training.scoring import load_model, load_tokenizer, prompt_format, score_rows

    claims = pipeline_claims(2)
    adapter = EMBEDDED_ADAPTERS[NAME]
    model = load_model(ensure_hf_dir(NAME), adapter)
    logits = score_rows(model, load_tokenizer(ensure_hf_dir(NAME)), claims, prompt_format(adapter))
    served = asyncio.run(
        backend.score([Claim(c["statement"], c["context"], c["question"]) for c in claims])
    )
    expected = [1 / (1 + math.exp(-(z / backend.temperature + backend.bias))) for z in logits]
    assert served == pytest.approx(expected, abs=1e-3)
    assert all(0 < p < 1 for p in served)
