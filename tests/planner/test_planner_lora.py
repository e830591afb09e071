"""A planner LoRA end to end on the real small-machine model: a PEFT adapter for
Qwen2.5-Coder-0.5B is converted by llama.cpp's own converter (training.gguf_lora), the
llama.cpp backend loads it from `PLANNER_LORA`, and it changes what the model writes;
a GGUF changed after conversion is refused and the planner stays up, not ready."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from cli.pull import pull  # noqa: E402
from planner.backends.base import GenerationRequest  # noqa: E402
from planner.backends.llamacpp import LlamaCppBackend  # noqa: E402
from services.catalog import ensure_hf_dir  # noqa: E402
from services.lora import sha256_of  # noqa: E402
from services.settings import PlannerSettings  # noqa: E402
from training import gguf_lora  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]

MODEL = "qwen2.5-coder-0.5b-instruct"
MESSAGES = [{"role": "user", "content": "Write one short sentence about apples."}]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random (not zero) rank-8 adapter on the top two layers, converted to GGUF."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    pull(MODEL)
    hf = ensure_hf_dir(MODEL)
    out = tmp_path_factory.mktemp("lora") / MODEL
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.bfloat16)
    layers = base.config.num_hidden_layers
    model = get_peft_model(
        base,
        LoraConfig(
            r=8,
            lora_alpha=64,
            target_modules=["q_proj", "v_proj", "down_proj"],
            layers_to_transform=[layers - 2, layers - 1],
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        ),
    )
    model.save_pretrained(str(out))
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = MODEL
    (out / "adapter_config.json").write_text(json.dumps(config))
    del model, base
    manifest = gguf_lora.convert(out, hf)
    assert manifest["sha256"] == sha256_of(out / "adapter.gguf")
    assert manifest["source_sha256"] == sha256_of(out / "adapter_model.safetensors")
    assert manifest["llama_cpp_python"] and len(manifest["archive_sha256"]) == 64
    return out


async def greedy(settings: PlannerSettings) -> tuple[str, str]:
    backend = LlamaCppBackend(settings, constrained=False)
    await backend.load()
    try:
        out = await backend.generate(
            GenerationRequest(messages=MESSAGES, json_schema=None, temperature=0.0, max_tokens=12)
        )
        return backend.model, out.texts[0]
    finally:
        await backend.close()


async def test_the_converted_adapter_loads_and_changes_the_output(adapter: Path) -> None:
    common = {"backend": "llamacpp", "model": MODEL, "n_ctx": 1024, "max_batch": 1}
    name, base_text = await greedy(PlannerSettings(**common))
    lora_name, lora_text = await greedy(PlannerSettings(**common, lora=adapter))
    again_name, again_text = await greedy(PlannerSettings(**common, lora=adapter))
    assert name == MODEL
    identity = sha256_of(adapter / "adapter_model.safetensors")
    assert lora_name == again_name == f"{MODEL}+lora-{identity[:12]}"
    assert lora_text == again_text  # greedy with the adapter: the same text each load
    assert lora_text != base_text, (base_text, lora_text)


def test_a_gguf_changed_after_conversion_keeps_the_planner_up_and_not_ready(
    adapter: Path, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from planner.app import create_app

    tampered = tmp_path / MODEL
    tampered.mkdir()
    for file in adapter.iterdir():
        (tampered / file.name).write_bytes(file.read_bytes())
    data = bytearray((tampered / "adapter.gguf").read_bytes())
    data[-1] ^= 0xFF
    (tampered / "adapter.gguf").write_bytes(bytes(data))
    settings = PlannerSettings(
        backend="llamacpp", model=MODEL, lora=tampered, log_dir=tmp_path / "logs", n_ctx=1024
    )
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready = client.get("/readyz")
            if "changed after conversion" in ready.text:
                break
            time.sleep(0.2)
        assert ready.status_code == 503 and "changed after conversion" in ready.text
        assert client.get("/healthz").status_code == 200
