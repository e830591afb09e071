"""`VERIFIER_BACKEND` and `VERIFIER_RUNTIME` pick the verifier's backend class; a bad value
is refused when the settings are read, and a runtime without its adapter fails its load
with what to do."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.settings import VerifierSettings
from verifier.backends import create_backend, resolve_runtime
from verifier.backends.llamacpp import LlamaCppVerifier
from verifier.backends.model import ModelVerifier

pytestmark = pytest.mark.unit


def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RUNTIME", "BASE_MODEL", "ADAPTER_DIR", "DEVICE"):
        monkeypatch.delenv(f"VERIFIER_{name}", raising=False)


def test_the_default_model_runs_on_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    settings = VerifierSettings(backend="model")
    assert (settings.base_model, settings.runtime) == ("smollm2-135m-instruct", "auto")
    backend = create_backend(settings)  # its adapter has no adapter.gguf
    assert type(backend) is ModelVerifier
    assert (backend.runtime, backend.calibration_file) == ("transformers", "calibration.json")


def test_auto_runs_the_pipeline_trained_adapter_on_llamacpp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clean_env(monkeypatch)
    settings = VerifierSettings(backend="model", base_model="qwen2.5-coder-0.5b-instruct")
    backend = create_backend(settings)
    assert isinstance(backend, LlamaCppVerifier)
    assert backend.calibration_file == "calibration-llamacpp.json"
    assert backend.adapter_dir is not None and backend.adapter_dir.name == (
        "qwen2.5-coder-0.5b-instruct"
    )


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"device": "cuda:0"}, "a GPU runs float16 on transformers"),
        ({"runtime": "transformers"}, "asked for"),
    ],
)
def test_auto_runs_transformers_where_llamacpp_cannot_or_is_not_asked(
    monkeypatch: pytest.MonkeyPatch, overrides: dict[str, str], why: str
) -> None:
    clean_env(monkeypatch)
    settings = VerifierSettings(
        backend="model", base_model="qwen2.5-coder-0.5b-instruct", **overrides
    )
    assert resolve_runtime(settings) == "transformers", why
    backend = create_backend(settings)
    assert type(backend) is ModelVerifier
    assert (backend.runtime, backend.calibration_file) == ("transformers", "calibration.json")


def test_auto_runs_transformers_for_a_model_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env(monkeypatch)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter.gguf").write_bytes(b"GGUF")
    settings = VerifierSettings(backend="model", base_model=str(tmp_path), adapter_dir=adapter)
    assert resolve_runtime(settings) == "transformers"  # no catalog GGUF to run it from


def test_the_llamacpp_runtime_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("VERIFIER_RUNTIME", "llamacpp")
    monkeypatch.setenv("VERIFIER_BASE_MODEL", "qwen2.5-coder-0.5b-instruct")
    backend = create_backend(VerifierSettings(backend="model"))
    assert isinstance(backend, LlamaCppVerifier)


def test_an_unknown_runtime_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERIFIER_RUNTIME", "onnx")
    with pytest.raises(ValidationError, match="runtime"):
        VerifierSettings()


def test_a_model_without_an_adapter_fails_its_load_saying_what_to_set(tmp_path: Path) -> None:
    backend = create_backend(
        VerifierSettings(backend="model", runtime="llamacpp", base_model=str(tmp_path))
    )
    with pytest.raises(FileNotFoundError, match="VERIFIER_ADAPTER_DIR"):
        asyncio.run(backend.load())


def test_auto_runs_bf16_only_where_the_cpu_has_bfloat16_dot_products(tmp_path: Path) -> None:
    from verifier.backends.llamacpp import resolve_gguf_type

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert resolve_gguf_type("auto", cpuinfo) == "bf16"
    cpuinfo.write_text("model name\t: avx512_bf16 lookalike\nflags\t\t: fpu avx2 avx512_vnni\n")
    assert resolve_gguf_type("auto", cpuinfo) == "q8_0"
    assert resolve_gguf_type("auto", tmp_path / "missing") == "q8_0"
    assert resolve_gguf_type("source") == "source"
    assert resolve_gguf_type("q8_0") == "q8_0"


def test_an_unknown_gguf_type_is_refused() -> None:
    from services.catalog import CatalogError, ensure_gguf_type

    with pytest.raises(CatalogError, match="unknown GGUF type"):
        ensure_gguf_type("qwen2.5-coder-0.5b-instruct", "q3_k")
    with pytest.raises(ValidationError, match="gguf_type"):
        VerifierSettings(gguf_type="q3_k")


def test_the_verifier_threads_setting_is_a_positive_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERIFIER_N_THREADS", "1")
    assert VerifierSettings().n_threads == 1
    monkeypatch.setenv("VERIFIER_N_THREADS", "0")
    with pytest.raises(ValidationError, match="n_threads"):
        VerifierSettings()
