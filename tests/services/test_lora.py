"""A planner LoRA directory is checked before any backend loads it: the model it was
trained for, its weights' identity (pinned or not), and its GGUF against the manifest
the conversion wrote; the served model name carries the adapter's tag."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import planner.backends.llamacpp as llamacpp
from planner.backends.llamacpp import LlamaCppBackend
from planner.backends.vllm import VllmBackend
from services.lora import AdapterError, load_adapter, trained_for
from services.settings import PlannerSettings

pytestmark = pytest.mark.unit

MODEL = "qwen2.5-coder-0.5b-instruct"


def make_adapter(directory: Path, base: str = MODEL, gguf: bytes | None = b"GGUF-lora") -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 16, "base_model_name_or_path": base})
    )
    weights = b"peft weights"
    (directory / "adapter_model.safetensors").write_bytes(weights)
    identity = hashlib.sha256(weights).hexdigest()
    if gguf is not None:
        (directory / "adapter.gguf").write_bytes(gguf)
        (directory / "gguf.json").write_text(
            json.dumps({"sha256": hashlib.sha256(gguf).hexdigest(), "source_sha256": identity})
        )
    return identity


def test_a_converted_adapter_loads_with_its_identity_and_tag(tmp_path: Path) -> None:
    identity = make_adapter(tmp_path / "a")
    adapter = load_adapter(tmp_path / "a", model=MODEL, gguf=True)
    assert adapter.sha256 == identity and adapter.rank == 16
    assert adapter.gguf == tmp_path / "a" / "adapter.gguf"
    assert adapter.served_name(MODEL) == f"{MODEL}+lora-{identity[:12]}"
    # pinned to the same weights: loads; the GGUF is not needed for vLLM
    assert load_adapter(tmp_path / "a", model=MODEL, gguf=False, pinned_sha256=identity.upper())


@pytest.mark.parametrize(
    ("base", "model", "fits"),
    [
        (MODEL, MODEL, True),
        (f"/cache/models/{MODEL}/hf", MODEL, True),
        ("phi-3.5-mini-instruct", "org/Phi-3.5-mini-instruct-AWQ", True),
        (MODEL, "qwen2.5-coder-1.5b-instruct", False),
        ("", MODEL, False),
        (MODEL, f"{MODEL}+lora-0123456789ab", True),
    ],
)
def test_an_adapter_fits_its_own_model_and_its_quantized_checkpoints(
    base: str, model: str, fits: bool
) -> None:
    assert trained_for(base, model) is fits


def test_every_flaw_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="not a directory"):
        load_adapter(tmp_path / "missing", model=MODEL, gguf=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match=r"no readable adapter_config\.json"):
        load_adapter(tmp_path / "empty", model=MODEL, gguf=True)

    make_adapter(tmp_path / "other", base="qwen2.5-coder-1.5b-instruct")
    with pytest.raises(AdapterError, match=r"trained for qwen2\.5-coder-1\.5b-instruct, not"):
        load_adapter(tmp_path / "other", model=MODEL, gguf=True)
    # a model given by path: the name is not compared (llama.cpp refuses other shapes)
    assert load_adapter(tmp_path / "other", model=None, gguf=True)

    make_adapter(tmp_path / "pinned")
    with pytest.raises(AdapterError, match="not the pinned PLANNER_LORA_SHA256"):
        load_adapter(tmp_path / "pinned", model=MODEL, gguf=True, pinned_sha256="0" * 64)

    make_adapter(tmp_path / "unconverted", gguf=None)
    with pytest.raises(AdapterError, match="convert the adapter first"):
        load_adapter(tmp_path / "unconverted", model=MODEL, gguf=True)
    assert load_adapter(tmp_path / "unconverted", model=MODEL, gguf=False)

    make_adapter(tmp_path / "changed")
    (tmp_path / "changed" / "adapter.gguf").write_bytes(b"GGUF-other")
    with pytest.raises(AdapterError, match="changed after conversion"):
        load_adapter(tmp_path / "changed", model=MODEL, gguf=True)

    make_adapter(tmp_path / "retrained")
    (tmp_path / "retrained" / "adapter_model.safetensors").write_bytes(b"new weights")
    with pytest.raises(AdapterError, match="retrained"):
        load_adapter(tmp_path / "retrained", model=MODEL, gguf=True)

    make_adapter(tmp_path / "noweights")
    (tmp_path / "noweights" / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterError, match=r"adapter_model\.safetensors is missing"):
        load_adapter(tmp_path / "noweights", model=MODEL, gguf=False)


def test_the_pin_must_be_a_sha256() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        PlannerSettings(lora_sha256="abc")


async def test_llamacpp_loads_the_gguf_at_its_scale_and_serves_the_tagged_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    identity = make_adapter(tmp_path / "a")
    backend = LlamaCppBackend(
        PlannerSettings(
            backend="llamacpp",
            model=MODEL,
            lora=tmp_path / "a",
            lora_scale=0.5,
            grammar_engine="gbnf",
        ),
        constrained=False,
    )
    seen: dict[str, Any] = {}

    def fake_open(path: Any, **kwargs: Any) -> object:
        seen.update(kwargs)
        return object()

    monkeypatch.setattr(llamacpp, "open_llama", fake_open)
    monkeypatch.setattr(llamacpp, "resolve_gguf", lambda *a: tmp_path / "model.gguf")
    monkeypatch.setattr(llamacpp, "chat_formatter", lambda llm: None)
    monkeypatch.setitem(sys.modules, "llama_cpp", object())
    await backend.load()
    assert seen["lora_path"] == str(tmp_path / "a" / "adapter.gguf")
    assert seen["lora_scale"] == 0.5
    assert backend.model == f"{MODEL}+lora-{identity[:12]}"


async def test_llamacpp_without_an_adapter_asks_for_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LlamaCppBackend(
        PlannerSettings(backend="llamacpp", model=MODEL, grammar_engine="gbnf"), constrained=False
    )
    seen: dict[str, Any] = {}
    monkeypatch.setattr(llamacpp, "open_llama", lambda path, **kw: seen.update(kw) or object())
    monkeypatch.setattr(llamacpp, "resolve_gguf", lambda *a: tmp_path / "model.gguf")
    monkeypatch.setattr(llamacpp, "chat_formatter", lambda llm: None)
    monkeypatch.setitem(sys.modules, "llama_cpp", object())
    await backend.load()
    assert "lora_path" not in seen and backend.model == MODEL


def test_vllm_enables_lora_at_a_supported_rank_for_the_tagged_model(tmp_path: Path) -> None:
    identity = make_adapter(tmp_path / "a", gguf=None)  # vLLM reads the PEFT weights
    backend = VllmBackend(PlannerSettings(backend="vllm", model=MODEL, lora=tmp_path / "a"))
    backend.check_adapter()
    assert backend.model == f"{MODEL}+lora-{identity[:12]}"
    assert backend.lora_engine_args() == {"enable_lora": True, "max_loras": 1, "max_lora_rank": 16}
    assert VllmBackend(PlannerSettings(backend="vllm", model=MODEL)).lora_engine_args() == {}
    other = PlannerSettings(
        backend="vllm", model="qwen2.5-coder-1.5b-instruct", lora=tmp_path / "a"
    )
    with pytest.raises(AdapterError, match="trained for"):
        VllmBackend(other).check_adapter()
