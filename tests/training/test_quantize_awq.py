"""AWQ quantization end to end on a tiny random llama: calibration texts are planner
prompts with right GSM8K train plans, llm-compressor's oneshot with AWQModifier writes a
packed 4-bit checkpoint in its own venv, and the checkpoint's config is the one vLLM
reads, which the planner's vLLM backend checks against PLANNER_QUANTIZATION."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")

from planner.backends.vllm import check_quantization, quantization_setting  # noqa: E402
from services.settings import PlannerSettings  # noqa: E402
from tests.training.test_train_planner import EXAMPLES, make_tiny_chat_model  # noqa: E402
from training import quantize_awq  # noqa: E402
from training.train_planner import target_text  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def quantize_python() -> str:
    if os.environ.get("REASON_SKIP_QUANTIZE_VENV") == "1":
        pytest.skip("REASON_SKIP_QUANTIZE_VENV=1: the llm-compressor venv is not built")
    return quantize_awq.quantize_python()


def tiny_model(directory: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    texts = [e["question"] + " " + target_text(e, "draft") for e in EXAMPLES]
    make_tiny_chat_model(directory, texts)
    # AWQ quantizes in groups of 128 input channels: widths that are multiples of it
    config = LlamaConfig.from_pretrained(str(directory))
    config.hidden_size, config.intermediate_size = 128, 256
    config.num_attention_heads = config.num_key_value_heads = 2
    config.head_dim = 64
    LlamaForCausalLM(config).save_pretrained(str(directory))


def test_a_tiny_model_quantizes_to_the_checkpoint_vllm_reads(
    quantize_python: str, tmp_path: Path
) -> None:
    model, data, out = tmp_path / "model", tmp_path / "data", tmp_path / "awq"
    model.mkdir()
    data.mkdir()
    tiny_model(model)
    with (data / "train.jsonl").open("w") as f:
        f.writelines(json.dumps(e) + "\n" for e in EXAMPLES)
    (data / "recipe.json").write_text(json.dumps({"recipe": "planner-sft/1"}))

    recipe = quantize_awq.quantize(
        model, data, out, samples=4, max_seq_len=512, python=quantize_python
    )
    assert recipe["calibration_samples"] == 4 and recipe["data_recipe"]["recipe"] == "planner-sft/1"
    calibration = [json.loads(line)["text"] for line in (out / "calibration.jsonl").open()]
    assert all("<|im_start|>assistant" in t and "```python" in t for t in calibration)

    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config == recipe["quantization_config"]
    # what vLLM's compressed-tensors support reads: the method, the packed format, and
    # 4-bit integer weights in asymmetric groups of 128 for every Linear but lm_head
    assert config["quant_method"] == "compressed-tensors"
    assert config["format"] == "pack-quantized"
    weights = config["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["type"], weights["strategy"]) == (4, "int", "group")
    assert weights["group_size"] == 128 and weights["symmetric"] is False
    assert config["config_groups"]["group_0"]["input_activations"] is None
    assert "lm_head" in config["ignore"]
    # the planner's vLLM backend names this format to the engine, and refuses another
    check_quantization(str(out), quantization_setting("compressed-tensors"))
    with pytest.raises(ValueError, match="set PLANNER_QUANTIZATION=compressed-tensors"):
        check_quantization(str(out), quantization_setting(PlannerSettings().quantization))
    with pytest.raises(ValueError, match="is not quantized"):
        check_quantization(str(model), "compressed-tensors")
    check_quantization(str(model), quantization_setting("none"))

    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        packed = f.get_tensor("model.layers.0.mlp.down_proj.weight_packed")
    prefix = "model.layers.0.self_attn.q_proj."
    assert {prefix + k for k in ("weight_packed", "weight_scale", "weight_zero_point")} <= keys
    assert prefix + "weight" not in keys and "lm_head.weight" in keys
    assert packed.shape == (128, 256 // 8)  # eight 4-bit values in each int32

    # the checkpoint loads back (decompressed by compressed-tensors) and runs
    check = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "print(m(torch.tensor([[2, 5, 7]])).logits.shape)\n"
    )
    done = subprocess.run(
        [quantize_python, "-c", check, str(out)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch.Size([1, 3," in done.stdout


def test_bad_inputs_are_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(quantize_awq.QuantizeError, match=r"config\.json"):
        quantize_awq.quantize(tmp_path, tmp_path, tmp_path / "out", python="python")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(quantize_awq.QuantizeError, match="scheme"):
        quantize_awq.quantize(tmp_path, tmp_path, tmp_path / "out", scheme="W8A8", python="x")
