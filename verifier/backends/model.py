"""A causal LM with a LoRA adapter that scores claims TRUE against FALSE.

One forward pass per batch (eval mode, `torch.inference_mode`, left padding, only the
last position's logits): z = logit(TRUE) - logit(FALSE) at the end of the prompt, and
the calibrated probability that the claim is true is sigmoid(z / T + b), with the
temperature T and bias b from the adapter's `calibration.json` (b = 0 when it has none).
The adapter directory is the hand-off from `training/`: `adapter_config.json`,
`adapter_model.safetensors`, `prompt.json` (the prompt format and answer token ids) and
`calibration.json`.

The committed adapters under `verifier/adapters/` run over catalog models (dequantized
once by the catalog): SmolLM2-135M's is the embedded default; Qwen2.5-Coder-0.5B's,
trained on the pipeline's own executed plans, is served by `VERIFIER_RUNTIME=auto` on the
llama.cpp runtime (verifier.backends.llamacpp) on a CPU. Production:
TinyLlama-1.1B on a GPU with an adapter trained the same way (`VERIFIER_BASE_MODEL`,
`VERIFIER_ADAPTER_DIR`, `VERIFIER_DEVICE=cuda:0`) on this runtime.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
from pathlib import Path
from typing import Any

import structlog

from services.claims import render_prompt
from services.errors import InvalidRequest
from services.settings import VerifierSettings
from verifier.backends.base import Claim

log = structlog.get_logger("verifier")

ADAPTERS_DIR = Path(__file__).resolve().parents[1] / "adapters"
# Catalog models with an adapter committed in this repository. SmolLM2's (v3, synthetic
# claims) is the default; Qwen's was trained on the pipeline's own executed plans
# (docs/benchmarks/verifier.md, "Third round").
EMBEDDED_ADAPTERS = {
    name: ADAPTERS_DIR / name for name in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
}
CPU_THREADS = max(1, min(4, os.cpu_count() or 1))


def adapter_dir_for(settings: VerifierSettings) -> Path | None:
    """VERIFIER_ADAPTER_DIR, else the adapter committed for the catalog base model."""
    return settings.adapter_dir or EMBEDDED_ADAPTERS.get(settings.base_model)


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class ModelVerifier:
    name = "model"
    runtime = "transformers"
    # sigmoid(z / T + b)'s T and b, fitted on this runtime's own scores (training.calibrate)
    calibration_file = "calibration.json"

    def __init__(self, settings: VerifierSettings) -> None:
        self.settings = settings
        self.model = settings.base_model
        self.adapter_dir = adapter_dir_for(settings)
        self.temperature = 1.0
        self.bias = 0.0
        self.calibration: dict[str, Any] | None = None  # the calibration file, as read
        self._lm: Any = None
        self._tokenizer: Any = None
        self._fmt: dict[str, Any] = {}
        self._ids: tuple[int, int] = (0, 0)
        self._lock = asyncio.Lock()
        self._thread_lock = threading.Lock()

    # ------------------------------------------------------------------ loading

    def _base_dir(self) -> Path:
        candidate = Path(self.settings.base_model).expanduser()
        if candidate.is_dir():
            return candidate
        from services.catalog import ensure_hf_dir

        return ensure_hf_dir(self.settings.base_model)

    def _adapter(self) -> Path:
        if (
            self.adapter_dir is None
            or not (Path(self.adapter_dir) / "adapter_config.json").exists()
        ):
            raise FileNotFoundError(
                f"no LoRA adapter for {self.settings.base_model!r}: set VERIFIER_ADAPTER_DIR to "
                "a directory made by `python -m training.train_lora`"
            )
        return Path(self.adapter_dir)

    def _read_calibration(self, adapter: Path) -> None:
        """T and b from the adapter's calibration file for this runtime, if it has one."""
        calibration = adapter / self.calibration_file
        if calibration.exists():
            fitted = json.loads(calibration.read_text())
            self.calibration = fitted
            self.temperature = float(fitted["temperature"])
            self.bias = float(fitted.get("bias", 0.0))  # files without one: temperature only
        else:
            log.warning(
                f"adapter has no {self.calibration_file}; confidences are uncalibrated",
                **{"event.action": "verifier.load", "labels.adapter": str(adapter)},
            )

    def _load_sync(self) -> None:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        adapter = self._adapter()
        device = torch.device(self.settings.device)
        if device.type == "cpu":
            torch.set_num_threads(self.settings.n_threads or CPU_THREADS)
        base_dir = self._base_dir()
        tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        fmt = json.loads((adapter / "prompt.json").read_text())
        true_id = tokenizer(fmt["true_text"], add_special_tokens=False)["input_ids"][0]
        false_id = tokenizer(fmt["false_text"], add_special_tokens=False)["input_ids"][0]
        if (true_id, false_id) != (fmt["true_token_id"], fmt["false_token_id"]):
            raise ValueError(
                f"adapter {adapter} was trained with another tokenizer: answer token ids "
                f"{fmt['true_token_id']}/{fmt['false_token_id']} != {true_id}/{false_id}"
            )
        dtype = torch.float32 if device.type == "cpu" else torch.float16
        lm = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=dtype)
        lm = PeftModel.from_pretrained(lm, str(adapter)).merge_and_unload()
        lm.to(device).eval()
        limit = int(getattr(lm.config, "max_position_embeddings", 0) or 0)
        if limit and self.settings.max_input_tokens > limit:
            raise ValueError(
                f"VERIFIER_MAX_INPUT_TOKENS={self.settings.max_input_tokens} exceeds the "
                f"model's context of {limit} tokens"
            )
        self._read_calibration(adapter)
        self._lm, self._tokenizer, self._fmt, self._ids = lm, tokenizer, fmt, (true_id, false_id)
        self._device = device
        self._score_sync([Claim("2 + 2 = 4")])  # warm-up: first-call allocations happen now
        self.model = f"{self.settings.base_model}+{adapter.name}"
        log.info(
            "verifier model ready",
            **{
                "event.action": "verifier.load",
                "labels.base": str(base_dir),
                "labels.adapter": str(adapter),
                "labels.device": str(device),
                "labels.temperature": self.temperature,
                "labels.bias": self.bias,
            },
        )

    async def load(self) -> None:
        await asyncio.to_thread(self._load_sync)

    # ------------------------------------------------------------------ scoring

    def _encode(self, claims: list[Claim]) -> list[str]:
        # the adapter's format, rendered as training rendered it (services.claims)
        prompts = [render_prompt(c.statement, c.context, c.question, self._fmt) for c in claims]
        for k, prompt in enumerate(prompts):
            n = self._count_tokens(prompt)
            if n > self.settings.max_input_tokens:
                raise InvalidRequest(
                    f"claim {k} is {n} tokens with its question and context; the verifier "
                    f"model reads at most {self.settings.max_input_tokens}",
                    param="statement",
                )
        return prompts

    def _count_tokens(self, prompt: str) -> int:
        return len(self._tokenizer(prompt)["input_ids"])

    def logit_diffs(self, prompts: list[str]) -> list[float]:
        """Raw TRUE-minus-FALSE logits for prompts, one forward pass."""
        import torch

        with self._thread_lock, torch.inference_mode():
            enc = self._tokenizer(prompts, return_tensors="pt", padding=True)
            mask = enc["attention_mask"].to(self._device)
            out = self._lm(
                input_ids=enc["input_ids"].to(self._device),
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                logits_to_keep=1,
            )
            last = out.logits[:, -1, :].float()
            true_id, false_id = self._ids
            return [float(z) for z in (last[:, true_id] - last[:, false_id]).cpu().tolist()]

    def _calibrated(self, diffs: list[float]) -> list[float]:
        """P(TRUE) = sigmoid(z / T + b) with the adapter's calibration."""
        return [sigmoid(z / self.temperature + self.bias) for z in diffs]

    def _score_sync(self, claims: list[Claim]) -> list[float]:
        return self._calibrated(self.logit_diffs(self._encode(claims)))

    async def score(self, claims: list[Claim]) -> list[float]:
        if self._lm is None:
            raise RuntimeError("model backend used before load()")
        prompts = self._encode(claims)  # a too-long claim fails before any work is queued
        async with self._lock:
            diffs = await asyncio.to_thread(self.logit_diffs, prompts)
        return self._calibrated(diffs)

    async def close(self) -> None:
        self._lm = None
