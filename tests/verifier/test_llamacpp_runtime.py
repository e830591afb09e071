"""`VERIFIER_RUNTIME=llamacpp`: the committed Qwen2.5-Coder-0.5B adapter scored over the
catalog GGUF with its `adapter.gguf`, as the service serves it and as `training/` measures
it: the same tokens as the transformers runtime, the same verdicts, its own calibration,
order-independent scores, and a refused adapter that changed after conversion."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from services.errors import InvalidRequest
from services.lora import AdapterError
from services.settings import VerifierSettings
from tests.verifier.pipeline_samples import pipeline_claims
from verifier.backends import create_backend
from verifier.backends.base import Claim
from verifier.backends.llamacpp import LlamaCppVerifier
from verifier.backends.model import EMBEDDED_ADAPTERS

pytestmark = [pytest.mark.model, pytest.mark.slow]

NAME = "qwen2.5-coder-0.5b-instruct"
ADAPTER = EMBEDDED_ADAPTERS[NAME]


def as_claims(rows: list[dict[str, str]]) -> list[Claim]:
    return [Claim(r["statement"], r["context"], r["question"]) for r in rows]


def settings(tmp: Path, **overrides: object) -> VerifierSettings:
    return VerifierSettings(
        backend="model", runtime="llamacpp", base_model=NAME, log_dir=tmp, **overrides
    )


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> LlamaCppVerifier:
    from services.catalog import resolve_gguf

    if not resolve_gguf(NAME).is_file():
        pytest.skip(f"{NAME} is not pulled on this machine")
    b = create_backend(settings(tmp_path_factory.mktemp("logs")))
    assert isinstance(b, LlamaCppVerifier)
    asyncio.run(b.load())
    yield b
    asyncio.run(b.close())


def test_the_runtime_serves_the_committed_gguf_adapter_with_its_own_calibration(
    backend: LlamaCppVerifier,
) -> None:
    assert backend.model == f"{NAME}+{ADAPTER.name}"
    assert backend._scorer.threads == len(os.sched_getaffinity(0))  # VERIFIER_N_THREADS unset
    fitted = json.loads((ADAPTER / "calibration-llamacpp.json").read_text())
    # held-out pipeline claims (questions training never saw), not synthetic ones
    assert fitted["runtime"] == "llamacpp" and "pipeline-claims/val.jsonl" in fitted["fitted_on"]
    assert (backend.temperature, backend.bias) == (fitted["temperature"], fitted["bias"])
    manifest = json.loads((ADAPTER / "gguf.json").read_text())
    assert manifest["converter"] == "llama.cpp convert_lora_to_gguf.py"


def test_tokens_and_verdicts_match_the_transformers_runtime(backend: LlamaCppVerifier) -> None:
    """The same prompt tokens, and a logit difference within 0.15 of float32's with the
    same sign (measured on 24 test claims: mean 0.026, largest 0.078)."""
    from services.catalog import ensure_hf_dir
    from training.scoring import claim_prompt, load_model, load_tokenizer, score_rows

    rows = pipeline_claims(2)
    hf = ensure_hf_dir(NAME)
    tokenizer = load_tokenizer(hf)
    prompts = [claim_prompt(r, backend._fmt) for r in rows]
    assert [backend._scorer.tokenize(p) for p in prompts] == [
        tokenizer(p)["input_ids"] for p in prompts
    ]
    reference = score_rows(load_model(hf, ADAPTER), tokenizer, rows, backend._fmt)
    served = backend.logit_diffs(prompts)
    for z, ref in zip(served, reference, strict=True):
        assert abs(z - ref) < 0.15 and (z > 0) == (ref > 0)
    probabilities = asyncio.run(backend.score(as_claims(rows)))
    expected = [1 / (1 + math.exp(-(z / backend.temperature + backend.bias))) for z in served]
    assert probabilities == pytest.approx(expected, abs=1e-9)


def test_a_claims_score_is_the_same_alone_and_in_a_batch_in_any_order(
    backend: LlamaCppVerifier,
) -> None:
    claims = as_claims(pipeline_claims(2))
    alone = [asyncio.run(backend.score([c]))[0] for c in claims]
    batched = asyncio.run(backend.score(claims[::-1]))[::-1]
    assert batched == alone
    assert len(set(alone)) > 1  # the claims are told apart


def test_a_claim_past_the_input_limit_is_refused_before_any_work(
    backend: LlamaCppVerifier,
) -> None:
    long = Claim("The answer is 1.", "step " * 600, "How many?")
    with pytest.raises(InvalidRequest, match="at most 512"):
        asyncio.run(backend.score([long]))


def test_an_adapter_gguf_changed_after_conversion_is_refused(tmp_path: Path) -> None:
    from services.catalog import resolve_gguf

    if not resolve_gguf(NAME).is_file():
        pytest.skip(f"{NAME} is not pulled on this machine")
    copy = tmp_path / "adapter"
    shutil.copytree(ADAPTER, copy)
    with (copy / "adapter.gguf").open("r+b") as f:
        f.seek(-16, 2)
        f.write(b"\0" * 16)
    b = create_backend(settings(tmp_path, adapter_dir=copy))
    with pytest.raises(AdapterError, match="changed after conversion"):
        asyncio.run(b.load())
    assert b._scorer is None


def test_calibrate_fits_the_llamacpp_runtime_on_its_own_scores(tmp_path: Path) -> None:
    """`training.calibrate --runtime llamacpp` scores with the service's scorer and writes
    calibration-llamacpp.json beside the transformers runtime's calibration.json."""
    from services.catalog import resolve_gguf
    from training import calibrate

    if not resolve_gguf(NAME).is_file():
        pytest.skip(f"{NAME} is not pulled on this machine")
    adapter = tmp_path / "adapter"
    shutil.copytree(ADAPTER, adapter)
    (adapter / "calibration-llamacpp.json").unlink()
    data = tmp_path / "data"
    data.mkdir()
    rows = [dict(r, label=k < 2) for k, r in enumerate(pipeline_claims(2))]
    (data / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    calibrate.main(["--runtime", "llamacpp", "--adapter", str(adapter), "--data", str(data)])
    fitted = json.loads((adapter / "calibration-llamacpp.json").read_text())
    assert fitted["runtime"] == "llamacpp" and fitted["n"] == 4
    assert fitted["temperature"] > 0
    assert (adapter / "calibration.json").read_bytes() == (
        ADAPTER / "calibration.json"
    ).read_bytes()


def test_the_converted_gguf_is_made_once_from_the_verified_file_and_reused(
    backend: LlamaCppVerifier,
) -> None:
    from services.catalog import ensure_gguf_type, get, resolve_gguf
    from verifier.backends.llamacpp import resolve_gguf_type

    assert backend.gguf_type == resolve_gguf_type("auto")
    if backend.gguf_type == "source":
        pytest.skip("this machine runs the catalog file as it is")
    target = ensure_gguf_type(NAME, backend.gguf_type)
    marker = json.loads(target.with_suffix(".json").read_text())
    assert marker["source_sha256"] == get(NAME).sha256
    assert marker["source"] == resolve_gguf(NAME).name and marker["size"] == target.stat().st_size
    made = target.stat().st_mtime_ns
    assert ensure_gguf_type(NAME, backend.gguf_type) == target
    assert target.stat().st_mtime_ns == made  # reused, not converted again


def test_an_adapter_whose_answer_tokens_are_not_this_tokenizers_is_refused(
    tmp_path: Path,
) -> None:
    from services.catalog import resolve_gguf

    if not resolve_gguf(NAME).is_file():
        pytest.skip(f"{NAME} is not pulled on this machine")
    copy = tmp_path / "adapter"
    shutil.copytree(ADAPTER, copy)
    fmt = json.loads((copy / "prompt.json").read_text())
    fmt["true_token_id"] += 1
    (copy / "prompt.json").write_text(json.dumps(fmt))
    b = create_backend(settings(tmp_path, adapter_dir=copy))
    with pytest.raises(ValueError, match="trained with another tokenizer"):
        asyncio.run(b.load())
    assert b._scorer is None
