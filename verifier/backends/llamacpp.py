"""The model verifier on llama.cpp: the same adapter and prompt, scored over the catalog GGUF.

`VERIFIER_RUNTIME=llamacpp`. The transformers runtime (`verifier.backends.model`) runs
the base model dequantized to float32; this one runs the catalog's GGUF itself, which
holds the very weights the adapter was trained on (`services.catalog.ensure_hf_dir`
dequantizes this file for training), with the adapter applied as a GGUF LoRA
(`adapter.gguf`, written by `python -m training.gguf_lora`, checked against its manifest
by `services.lora`). A claim is one prompt evaluation: its tokens in one `llama_decode`
with logits at the last position only, z = logit(TRUE) - logit(FALSE) there.

The model runs in the tensor type of `VERIFIER_GGUF_TYPE` (`resolve_gguf_type`): by
default BF16 where the CPU has bfloat16 dot products, converted once from the catalog
file by llama.cpp (`services.catalog.ensure_gguf_type`). Measured with
`scripts.bench_verifier` on 24 pipeline claims on a 2-core EPYC (docs/benchmarks/verifier.md,
"The llama.cpp runtime"): P50 745 ms a claim in BF16 against 1,498 ms for float32
transformers, the logit difference within 0.017 of float32's. Since z is close to the
float32 one but not equal, the calibration is this runtime's own,
`calibration-llamacpp.json`, fitted on its scores by
`python -m training.calibrate --runtime llamacpp` (which records the type it scored in).

Claims are scored one after the other, each from an empty KV cache: a claim's score is
the same alone or in a batch, in any order. (On a CPU, prompt evaluation is bound by its
matmuls, which already use every core, so putting several claims in one decode gains
little.)
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import structlog

from services.llamacpp import CPUINFO, cpu_has_bf16, open_llama, use_extra_buffers
from services.lora import LoraAdapter, load_adapter
from services.settings import VerifierSettings
from verifier.backends.base import Claim
from verifier.backends.model import ModelVerifier

log = structlog.get_logger("verifier")


def resolve_gguf_type(setting: str, cpuinfo: Path = CPUINFO) -> str:
    """`VERIFIER_GGUF_TYPE`: `auto` is bf16 on a CPU with bfloat16 dot products, else q8_0."""
    if setting == "auto":
        return "bf16" if cpu_has_bf16(cpuinfo) else "q8_0"
    return setting


def model_gguf(model: str, setting: str) -> tuple[Path, str]:
    """The GGUF to run `model` (a catalog name or a GGUF file) in, and its type. A file
    given by path runs as it is."""
    from services.catalog import MODELS, ensure_gguf_type, resolve_gguf

    if model not in MODELS:
        return resolve_gguf(model), "source"
    ftype = resolve_gguf_type(setting)
    if ftype == "source":
        return resolve_gguf(model), ftype
    return ensure_gguf_type(model, ftype), ftype


class LlamaCppScorer:
    """A GGUF causal LM with an optional GGUF LoRA, scoring prompts TRUE against FALSE.

    Shared by the service and by `training/` (calibration, evaluation), so that what is
    measured is what is served. Not thread-safe by itself: one context, one lock.
    """

    def __init__(
        self,
        gguf: Path,
        *,
        lora: Path | None,
        n_ctx: int,
        answer_ids: tuple[int, int],
        threads: int | None = None,
        gguf_type: str = "source",
    ) -> None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(
                "VERIFIER_RUNTIME=llamacpp needs llama-cpp-python: pip install -e '.[llamacpp]' "
                f"({exc})"
            ) from None
        threads = threads or len(os.sched_getaffinity(0))
        self.threads = threads
        self.gguf = gguf
        self.n_ctx = n_ctx
        self.answer_ids = answer_ids
        self.gguf_type = gguf_type  # what `gguf` holds (model_gguf), for the records
        self._lock = threading.Lock()
        adapter_args: dict[str, Any] = (
            {"lora_path": str(lora), "lora_scale": 1.0} if lora is not None else {}
        )
        self._llm = open_llama(
            gguf,
            # off on AMX CPUs, where ggml's repacked AMX matmul crashes (services.llamacpp)
            extra_buffers=use_extra_buffers("auto"),
            n_ctx=n_ctx,
            # the whole prompt in one decode: a claim's logits never depend on how it
            # was split into chunks
            n_batch=n_ctx,
            n_ubatch=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=False,
            verbose=False,
            **adapter_args,
        )
        vocab = self._llm.n_vocab()
        if max(answer_ids) >= vocab:
            self.close()
            raise ValueError(f"answer token ids {answer_ids} are outside the vocabulary ({vocab})")

    def tokenize(self, prompt: str) -> list[int]:
        # As the transformers tokenizer that training used: special-token text is parsed,
        # and a BOS token only where the model's GGUF asks for one.
        return list(self._llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True))

    def logit_diff(self, tokens: list[int]) -> float:
        from llama_cpp import llama_cpp as lib

        if not 0 < len(tokens) <= self.n_ctx:
            raise ValueError(f"a prompt of {len(tokens)} tokens does not fit {self.n_ctx}")
        with self._lock:
            self._llm.reset()  # n_tokens = 0: eval first removes every cell past it
            self._llm.eval(tokens)
            row = lib.llama_get_logits_ith(self._llm.ctx, -1)
            true_id, false_id = self.answer_ids
            return float(row[true_id]) - float(row[false_id])

    def logit_diffs(self, prompts: list[str]) -> list[float]:
        return [self.logit_diff(self.tokenize(p)) for p in prompts]

    def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.close()


def open_adapter_scorer(
    adapter_dir: Path,
    *,
    model: str | None,
    gguf_type: str,
    n_ctx: int,
    threads: int | None = None,
    setting: str = "VERIFIER_ADAPTER_DIR",
) -> tuple[LlamaCppScorer, LoraAdapter, dict[str, Any]]:
    """A scorer for a verifier adapter directory (the service's and `training/`'s): the
    adapter checked by `services.lora` (`model`: the catalog model it must be trained for;
    None: the one its config names), its model's GGUF in `gguf_type`, and its prompt
    format, whose answer words must be the single tokens it was trained on."""
    adapter = load_adapter(adapter_dir, model=model, gguf=True, setting=setting)
    fmt = json.loads((adapter_dir / "prompt.json").read_text())
    answer_ids = (int(fmt["true_token_id"]), int(fmt["false_token_id"]))
    gguf, resolved = model_gguf(model or adapter.base_model, gguf_type)
    scorer = LlamaCppScorer(
        gguf,
        lora=adapter.gguf,
        n_ctx=n_ctx,
        answer_ids=answer_ids,
        threads=threads,
        gguf_type=resolved,
    )
    for text, token in zip((fmt["true_text"], fmt["false_text"]), answer_ids, strict=True):
        got = scorer.tokenize(text)
        if got[-1:] != [token] or len(got) > 2:
            scorer.close()
            raise ValueError(
                f"adapter {adapter_dir} was trained with another tokenizer: "
                f"{text!r} is {got} here, not [{token}]"
            )
    return scorer, adapter, fmt


class LlamaCppVerifier(ModelVerifier):
    runtime = "llamacpp"
    calibration_file = "calibration-llamacpp.json"

    def __init__(self, settings: VerifierSettings) -> None:
        super().__init__(settings)
        self._scorer: LlamaCppScorer | None = None
        self.gguf_type: str | None = None

    def _load_sync(self) -> None:
        adapter_dir = self._adapter()
        scorer, adapter, fmt = open_adapter_scorer(
            adapter_dir,
            model=self.settings.base_model,
            gguf_type=self.settings.gguf_type,
            n_ctx=self.settings.max_input_tokens,
            threads=self.settings.n_threads,
        )
        self.gguf_type = scorer.gguf_type
        try:
            self._read_calibration(adapter_dir)
            fitted = self.calibration.get("gguf_type") if self.calibration else None
            if fitted is not None and fitted != self.gguf_type:
                log.warning(
                    "the calibration was fitted on another tensor type than the one served",
                    **{
                        "event.action": "verifier.load",
                        "labels.fitted_gguf_type": fitted,
                        "labels.gguf_type": self.gguf_type,
                    },
                )
            self._scorer, self._fmt = scorer, fmt
            self._ids = scorer.answer_ids
            self._lm = scorer  # ModelVerifier.score's loaded-check
            self._score_sync([Claim("2 + 2 = 4")])  # first-call allocations happen now
        except BaseException:
            scorer.close()
            self._scorer = self._lm = None
            raise
        self.model = f"{self.settings.base_model}+{adapter_dir.name}"
        log.info(
            "verifier model ready",
            **{
                "event.action": "verifier.load",
                "labels.runtime": self.runtime,
                "labels.base": str(scorer.gguf),
                "labels.gguf_type": self.gguf_type,
                "labels.threads": scorer.threads,
                "labels.adapter": str(adapter.gguf),
                "labels.adapter_sha256": adapter.sha256,
                "labels.temperature": self.temperature,
                "labels.bias": self.bias,
            },
        )

    def _count_tokens(self, prompt: str) -> int:
        assert self._scorer is not None
        return len(self._scorer.tokenize(prompt))

    def logit_diffs(self, prompts: list[str]) -> list[float]:
        assert self._scorer is not None
        return self._scorer.logit_diffs(prompts)

    async def close(self) -> None:
        scorer, self._scorer, self._lm = self._scorer, None, None
        if scorer is not None:
            scorer.close()
