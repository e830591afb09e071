"""Load a base causal LM (with or without a LoRA adapter) and score claims.

A claim's score is the logit difference `z = logit(TRUE) - logit(FALSE)` at the last
prompt position, from one forward pass with left padding and `logits_to_keep=1`;
`sigmoid(z / T + b)` is the probability that the claim is true after calibration with
temperature `T` and bias `b` (`training.calibrate`).

Two runtimes score the same prompts, as the verifier service does (`VERIFIER_RUNTIME`):
`transformers` (`load_model`, `score_rows`: float32, batched) and `llamacpp`
(`llamacpp_scorer`, `score_rows_llamacpp`: the catalog GGUF with the adapter's
`adapter.gguf`, through the service's own `LlamaCppScorer`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from services.claims import PROMPT_FORMAT, render_prompt
from training.prompt import answer_token_ids


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass


def load_tokenizer(base_model: str | Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base_model))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(base_model: str | Path, adapter_dir: str | Path | None = None) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    return model


def prompt_format(adapter_dir: str | Path | None) -> dict[str, Any]:
    if adapter_dir is not None and (Path(adapter_dir) / "prompt.json").exists():
        return dict(json.loads((Path(adapter_dir) / "prompt.json").read_text()))
    return dict(PROMPT_FORMAT)


def claim_prompt(row: dict[str, Any], fmt: dict[str, Any] = PROMPT_FORMAT) -> str:
    return render_prompt(row["statement"], row.get("context") or "", row.get("question"), fmt)


def logit_diff(
    model: Any, batch: dict[str, torch.Tensor], true_id: int, false_id: int
) -> torch.Tensor:
    """TRUE-minus-FALSE logit at the last position, one value per row of the batch."""
    mask = batch["attention_mask"]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=mask,
        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),  # left padding: count real tokens
        logits_to_keep=1,
    )
    last = out.logits[:, -1, :]
    return last[:, true_id] - last[:, false_id]


def batches(items: list[Any], size: int) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@torch.inference_mode()
def score_rows(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    fmt: dict[str, Any] = PROMPT_FORMAT,
    batch_size: int = 16,
    progress: bool = False,
    device: str = "cpu",
) -> list[float]:
    """Logit differences for claims, in input order (batched by similar length)."""
    true_id, false_id = answer_token_ids(tokenizer, fmt)
    prompts = [claim_prompt(r, fmt) for r in rows]
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: lengths[i])
    scores = [0.0] * len(prompts)
    chunks = list(batches(order, batch_size))
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc="scoring", unit="batch")
    for chunk in chunks:
        enc = tokenizer([prompts[i] for i in chunk], return_tensors="pt", padding=True)
        enc = {k: v.to(device) for k, v in enc.items()}
        diffs = logit_diff(model, enc, true_id, false_id)
        for i, z in zip(chunk, diffs.tolist(), strict=True):
            scores[i] = float(z)
    return scores


RUNTIMES = ("transformers", "llamacpp")
CALIBRATION_FILES = {"transformers": "calibration.json", "llamacpp": "calibration-llamacpp.json"}


def llamacpp_scorer(
    adapter_dir: str | Path,
    n_ctx: int = 2048,
    threads: int | None = None,
    gguf_type: str = "auto",
) -> Any:
    """The service's llama.cpp scorer for an adapter: the catalog GGUF of the model the
    adapter names (`base_model_name_or_path`) and its checked `adapter.gguf`. `n_ctx`:
    the longest claim it scores (the service refuses claims past VERIFIER_MAX_INPUT_TOKENS;
    a training split may hold longer ones, which the transformers runtime scores too).
    `gguf_type`: as VERIFIER_GGUF_TYPE; the scorer's `gguf_type` says what it resolved to."""
    from verifier.backends.llamacpp import open_adapter_scorer

    scorer, _, _ = open_adapter_scorer(
        Path(adapter_dir),
        model=None,
        gguf_type=gguf_type,
        n_ctx=n_ctx,
        threads=threads,
        setting="--adapter",
    )
    return scorer


def score_rows_llamacpp(
    scorer: Any, rows: list[dict[str, Any]], fmt: dict[str, Any], progress: bool = False
) -> list[float]:
    """Logit differences for claims on the llama.cpp runtime, in input order."""
    prompts = [claim_prompt(r, fmt) for r in rows]
    if progress:
        from tqdm import tqdm

        prompts = tqdm(prompts, desc="scoring", unit="claim")
    return [scorer.logit_diff(scorer.tokenize(p)) for p in prompts]


def score_with(
    runtime: str,
    base_model: str | Path | None,
    adapter_dir: str | Path | None,
    rows: list[dict[str, Any]],
    threads: int = 1,
    gguf_type: str = "auto",
) -> tuple[list[float], dict[str, Any]]:
    """Logit differences for `rows` on `runtime` (one of RUNTIMES), loading what it needs,
    and what scored them (`runtime`, and on llamacpp the `gguf_type` it ran)."""
    fmt = prompt_format(adapter_dir)
    if runtime == "llamacpp":
        if adapter_dir is None:
            raise ValueError("the llamacpp runtime scores an adapter: give --adapter")
        scorer = llamacpp_scorer(adapter_dir, threads=threads, gguf_type=gguf_type)
        try:
            logits = score_rows_llamacpp(scorer, rows, fmt, progress=True)
            return logits, {"runtime": runtime, "gguf_type": scorer.gguf_type}
        finally:
            scorer.close()
    if runtime != "transformers":
        raise ValueError(f"unknown runtime {runtime!r}; one of {RUNTIMES}")
    if base_model is None:
        raise ValueError("the transformers runtime needs --base-model")
    set_threads(threads)
    model = load_model(base_model, adapter_dir)
    logits = score_rows(model, load_tokenizer(base_model), rows, fmt, progress=True)
    return logits, {"runtime": runtime}
