"""In-process llama.cpp backend (llama-cpp-python) on a GGUF file: the embedded default.

Decoding is constrained by the plan's JSON schema, so every completion is JSON of the
plan's shape with a registered tool name. Two engines do it (`PLANNER_GRAMMAR_ENGINE`):
xgrammar (the default; see `schema_constraint`), a logits processor that masks each step
from a precompiled automaton, and llama.cpp's own GBNF grammar sampler, which checks the
whole vocabulary at every token and is markedly slower (docs/benchmarks/planner.md).
Either grammar is compiled here and passed explicitly: llama-cpp-python's
`response_format` path silently falls back to unconstrained JSON when a schema fails to
compile, and a silent fallback is exactly what must not happen.

Generation runs off the event loop. With the model's own chat template and the xgrammar
engine (the default), one `BatchEngine` thread owns the context (`llamacpp_engine`): the
samples of every request in flight decode together, one `llama_decode` per token, each
with its own seed (seed + k * SEED_STRIDE), sampler and xgrammar matcher; a request that
arrives mid-decode joins the batch between two tokens, up to `PLANNER_MAX_BATCH`
sequences, and waits in a bounded queue beyond it (`PLANNER_MAX_QUEUED`; then 503 with
Retry-After); the prompt prefix (system prompt, tools, few-shot) is evaluated once and
shared. The GBNF engine and a model without its own chat template take the sequential
path: one `create_chat_completion` per sample, one request at a time (an asyncio lock),
sharing the prompt's KV cache through llama-cpp-python's prefix match.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from planner.backends.base import Generation, GenerationRequest, Usage, sample_seeds
from planner.backends.llamacpp_engine import (
    BatchEngine,
    EngineClosed,
    Job,
    JobCancelled,
    JobResult,
    chat_formatter,
)
from planner.backends.schema_constraint import ConstraintError, SchemaConstraint
from services.catalog import resolve_gguf
from services.errors import DependencyUnavailable, InvalidRequest, NotReady
from services.llamacpp import open_llama, use_extra_buffers
from services.lora import LoraAdapter, load_adapter
from services.settings import PlannerSettings

log = structlog.get_logger(__name__)


class GenerationCancelled(RuntimeError):
    """The request that asked for this generation went away; the model is free again."""


@dataclass
class GenerationStats:
    """Timings of one `generate` call (`Generation.stats`), for benchmarks and logs."""

    completions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    prompt_eval_s: float = 0.0  # llama.cpp's own prefill time (tokens not served from cache)
    prompt_eval_tokens: int = 0
    constraint_s: float = 0.0  # xgrammar only: time in the matcher and the logits mask
    batch_sizes: list[int] = field(default_factory=list)  # sequences per engine job
    per_completion: list[dict[str, float]] = field(default_factory=list)

    @property
    def decode_tokens_per_s(self) -> float:
        """Completion tokens over wall time less prefill: includes sampling and grammar."""
        decode_s = self.wall_s - self.prompt_eval_s
        return self.completion_tokens / decode_s if decode_s > 0 else 0.0


def default_threads() -> int:
    """One core fewer than the machine has, at least one.

    In the embedded default the orchestrator and verifier share the machine, and llama.cpp's
    threads spin at every barrier: with as many threads as cores, one descheduled thread
    stalls the rest (measured on a busy 2-core box: 40 SmolLM2-135M tokens took 21.9 s with two
    threads and 7.3 s with one).
    """
    return max(1, len(os.sched_getaffinity(0)) - 1)


def batch_threads() -> int:
    """Every core, for `llama_decode` calls of several tokens (prefill, a batch of sequences).

    A one-token step is bound by reading the weights and gains little from a second thread;
    a step of several tokens is bound by the matmuls and parallelizes. Measured on the
    idle 2-core box (qwen2.5-coder-0.5b, docs/benchmarks/planner.md): five samples as one
    batch took 23.7 s with one thread and 12.8 s with two.
    """
    return max(1, len(os.sched_getaffinity(0)))


PREFIX_SLOT_CELLS = 2048  # KV cells set aside per cached prefix past the first


class LlamaCppBackend:
    name = "llamacpp"
    caches_prefixes = True  # the batch engine keeps evaluated prompt prefixes (warm-up)

    def __init__(
        self,
        settings: PlannerSettings,
        *,
        constrained: bool = True,
        cache_dir: Path | None = None,
        batching: bool = True,
    ) -> None:
        self.settings = settings
        self.model = settings.model_path.name if settings.model_path else settings.model
        # PLANNER_LORA, checked at load (its file is hashed then); the model's name gains
        # the adapter's tag once it is.
        self.adapter: LoraAdapter | None = None
        # False: every generation is free text (what the grammar costs is measured against
        # it, and the evaluation's `direct` mode uses it). True: a request without a
        # schema (a draft) is still free text.
        self.constrained = constrained
        self.grammar_engine = settings.grammar_engine
        self.extra_buffers = use_extra_buffers(settings.extra_buffers)
        self._constraint: SchemaConstraint | None = None
        # False: every sample through `create_chat_completion`, one after the other (the
        # benchmark's baseline, and the path of the GBNF engine).
        self.batching = batching and (not constrained or self.grammar_engine == "xgrammar")
        self.max_batch = settings.max_batch
        self.prefix_slots = settings.prefix_slots
        self._engine: BatchEngine | None = None
        self._cache_dir = cache_dir
        self._llm: Any = None
        self._async_lock = asyncio.Lock()
        self._thread_lock = threading.Lock()
        self._grammars: dict[str, Any] = {}
        self._active: set[threading.Event] = set()
        self.load_seconds: float | None = None

    async def load(self) -> None:
        gguf = resolve_gguf(self.settings.model, self.settings.model_path, self._cache_dir)
        started = time.perf_counter()
        if self.settings.lora is not None and self.adapter is None:
            self.adapter = await asyncio.to_thread(
                load_adapter,
                self.settings.lora,
                model=None if self.settings.model_path else self.settings.model,
                gguf=True,
                pinned_sha256=self.settings.lora_sha256,
            )
            self.model = self.adapter.served_name(self.model)
        llm = await asyncio.to_thread(self._load, gguf)
        if self.grammar_engine == "xgrammar":
            try:
                # The xgrammar tokenizer description is built once per model; it must work
                # before the model is declared ready.
                self._constraint = await asyncio.to_thread(SchemaConstraint, llm)
            except Exception:
                await asyncio.to_thread(llm.close)
                raise
        formatter = chat_formatter(llm) if self.batching else None
        if formatter is not None:
            self._engine = BatchEngine(
                llm,
                formatter,
                stop_tokens=self._stop_tokens(llm),
                max_batch=self.max_batch,
                max_queued=self.settings.max_queued,
                prompt_limit=self.settings.n_ctx,
                model_name=self.model,
                prefix_slots=self.prefix_slots,
            )
        elif self.batching:
            log.warning(
                "the model has no chat template of its own: samples decode one at a time",
                **{
                    "event.action": "planner.load",
                    "labels.model": self.model,
                },
            )
        self._llm = llm
        self.load_seconds = time.perf_counter() - started
        log.info(
            "llama.cpp model loaded",
            **{
                "event.action": "planner.load",
                "labels.model": self.model,
                "labels.path": str(gguf),
                "labels.lora": str(self.adapter.gguf) if self.adapter else None,
                "labels.n_ctx": self.settings.n_ctx,
                "labels.grammar_engine": self.grammar_engine,
                "labels.extra_buffers": self.extra_buffers,
                "labels.max_batch": self.max_batch if self._engine else 1,
                "labels.threads": self.settings.n_threads or default_threads(),
                "labels.threads_batch": self.settings.n_threads_batch or batch_threads(),
                "labels.seconds": round(self.load_seconds, 2),
            },
        )

    def _load(self, gguf: Path) -> Any:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(
                f"the llamacpp backend needs llama-cpp-python: pip install -e '.[llamacpp]' ({exc})"
            ) from None
        threads = self.settings.n_threads or default_threads()
        batch = self.max_batch if self.batching else 1
        return open_llama(
            gguf,
            extra_buffers=self.extra_buffers,
            # The first sequences hold the cached prompt prefixes, the rest the samples.
            n_seq_max=batch + self.prefix_slots if self.batching else 1,
            # The KV cache is unified: the prefix's cells once, each request's question
            # once, each sample's completion on top; one prefill chunk of slack; room for
            # the other cached prefixes (the plan prompt is ~1,200 tokens, the
            # chain-of-thought prompt ~660).
            n_ctx=self.settings.n_ctx
            + (batch - 1) * self.settings.max_tokens
            + 512
            + (self.prefix_slots - 1) * PREFIX_SLOT_CELLS
            if self.batching
            else self.settings.n_ctx,
            n_batch=512,
            # Flash attention skips the KV cells of other sequences, so a sequence's
            # logits do not depend on what else is in the cache; without it they do
            # (see llamacpp_engine).
            flash_attn=self.batching,
            n_threads=threads,
            n_threads_batch=self.settings.n_threads_batch or batch_threads(),
            seed=self.settings.seed,
            verbose=False,
            # The adapter is applied to every decode of the context (both passes of a
            # draft, the chain-of-thought prompt and warm-up alike).
            **(
                {"lora_path": str(self.adapter.gguf), "lora_scale": self.settings.lora_scale}
                if self.adapter is not None
                else {}
            ),
        )

    async def close(self) -> None:
        for cancel in list(self._active):  # stop a running generation first
            cancel.set()
        # No new generation from here on (neither path: a request arriving while the
        # engine thread winds down must not reach the context through the other one).
        llm, self._llm = self._llm, None
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.close)
        async with self._async_lock:  # a sequential generation still running ends first
            if llm is not None:
                await asyncio.to_thread(self._close, llm)

    def _close(self, llm: Any) -> None:
        with self._thread_lock:
            llm.close()

    @property
    def engine(self) -> BatchEngine | None:
        return self._engine

    async def generate(self, request: GenerationRequest) -> Generation:
        if self._llm is None:
            raise RuntimeError("llama.cpp model is not loaded")
        if self._engine is not None:
            return await self._generate_batched(self._engine, request)
        async with self._async_lock:
            cancel = threading.Event()
            self._active.add(cancel)
            try:
                return await asyncio.to_thread(self._generate_sequential, request, cancel)
            finally:
                # A cancelled request (its caller gone or its deadline passed) stops the
                # generation at the next token instead of holding the model to the end.
                cancel.set()
                self._active.discard(cancel)

    def grammar(self, schema: dict[str, Any]) -> Any:
        """The compiled grammar of a JSON schema for the configured engine (cached: schemas
        repeat per tool set). Raises on a schema the engine cannot express: never fall back
        to unconstrained JSON."""
        key = self.grammar_engine + json.dumps(schema, sort_keys=True)
        grammar = self._grammars.get(key)
        if grammar is None:
            if self.grammar_engine == "xgrammar":
                if self._constraint is None:
                    raise RuntimeError("llama.cpp model is not loaded")
                grammar = self._constraint.compile(schema)
            else:
                from llama_cpp import LlamaGrammar

                grammar = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
            if len(self._grammars) > 32:
                self._grammars.clear()
            self._grammars[key] = grammar
        return grammar

    def _grammar_for(self, request: GenerationRequest) -> Any:
        if not self.constrained or request.json_schema is None:
            return None
        return self.grammar(request.json_schema)

    async def _generate_batched(
        self, engine: BatchEngine, request: GenerationRequest
    ) -> Generation:
        """The n samples as jobs of up to `max_batch` sequences in the shared engine;
        sample k has the seed the sequential path gives it."""
        grammar = self._grammar_for(request)
        seeds = sample_seeds(request, self.settings.seed)
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        jobs: list[Job] = []
        futures: list[asyncio.Future[JobResult]] = []
        for first in range(0, len(seeds), self.max_batch):
            future: asyncio.Future[JobResult] = loop.create_future()

            def done(outcome: JobResult | BaseException, future: Any = future) -> None:
                loop.call_soon_threadsafe(_settle, future, outcome)

            jobs.append(
                Job(
                    messages=request.messages,
                    seeds=seeds[first : first + self.max_batch],
                    temperature=request.temperature,
                    top_p=request.top_p,
                    max_tokens=request.max_tokens,
                    grammar=grammar,
                    done=done,
                    stop=tuple(s.encode() for s in request.stop),
                )
            )
            futures.append(future)
        try:
            for job in jobs:
                engine.submit(job)  # raises Overloaded when the queue is full
            results = await asyncio.gather(*futures)
        except JobCancelled:
            raise GenerationCancelled("generation cancelled") from None
        except ValueError as exc:  # the prompt does not fit the context
            raise InvalidRequest(str(exc)) from None
        except ConstraintError as exc:
            log.error(
                "constrained decoding failed",
                **{"error.type": "constraint_failed", "error.message": str(exc)},
            )
            raise
        except EngineClosed as exc:
            raise NotReady(str(exc)) from None
        except RuntimeError as exc:  # llama.cpp failed a step (logged by the engine)
            raise DependencyUnavailable(f"the planner model failed: {exc}") from None
        finally:
            # Cancelled, overloaded or failed: the request's other jobs stop within a
            # token and leave the batch to the other requests.
            for job in jobs:
                job.cancel.set()
            engine.wake()
            for future in futures:
                if not future.done():
                    future.cancel()
                elif not future.cancelled():
                    future.exception()  # retrieved: one error is reported, not each
        stats = GenerationStats(wall_s=time.perf_counter() - started)
        usage = Usage()
        texts: list[str] = []
        for result in results:
            texts += result.texts
            usage += result.usage()
            stats.prompt_tokens += result.prompt_tokens
            stats.prompt_eval_tokens += result.prompt_eval_tokens
            stats.prompt_eval_s += result.prefill_s
            stats.completion_tokens += sum(result.completion_tokens)
            stats.constraint_s += result.constraint_s
            stats.batch_sizes.append(len(result.texts))
            stats.per_completion += [
                {
                    "completion_tokens": float(tokens),
                    "finish_reason_length": float(reason == "length"),
                }
                for tokens, reason in zip(
                    result.completion_tokens, result.finish_reasons, strict=True
                )
            ]
        return self._finish(request, stats, texts, usage)

    def _stop_tokens(self, llm: Any) -> list[int]:
        if self._constraint is not None:
            return self._constraint.stop_token_ids
        from llama_cpp import llama_cpp as lib

        vocab = lib.llama_model_get_vocab(llm.model)
        return [t for t in range(llm.n_vocab()) if lib.llama_vocab_is_eog(vocab, t)]

    def _finish(
        self,
        request: GenerationRequest,
        stats: GenerationStats,
        texts: list[str],
        usage: Usage | None = None,
    ) -> Generation:
        stats.completions = len(texts)
        if usage is None:  # the sequential path: llama.cpp's own counters
            usage = Usage(
                prompt_tokens=stats.prompt_tokens,
                completion_tokens=stats.completion_tokens,
                prompt_eval_tokens=stats.prompt_eval_tokens,
                prefill_s=stats.prompt_eval_s,
                decode_s=stats.wall_s - stats.prompt_eval_s,
                constraint_s=stats.constraint_s,
                batch_size_max=1,
            )
        return Generation(
            texts=texts,
            prompt_tokens=stats.prompt_tokens,
            completion_tokens=stats.completion_tokens,
            usage=usage,
            stats=stats,
        )

    def _generate_sequential(
        self, request: GenerationRequest, cancel: threading.Event
    ) -> Generation:
        from llama_cpp import llama_cpp as lib

        grammar = self._grammar_for(request)
        stats = GenerationStats()
        texts: list[str] = []
        seeds = sample_seeds(request, self.settings.seed)
        with self._thread_lock:
            llm = self._llm
            if llm is None:
                raise RuntimeError("llama.cpp model was closed")
            started = time.perf_counter()
            for k in range(request.n):
                lib.llama_perf_context_reset(llm.ctx)
                processor = None
                if grammar is not None and self.grammar_engine == "xgrammar":
                    assert self._constraint is not None
                    processor = self._constraint.processor(grammar)
                t0 = time.perf_counter()
                chunks = llm.create_chat_completion(
                    messages=request.messages,
                    grammar=grammar if processor is None else None,
                    logits_processor=[processor] if processor is not None else None,
                    temperature=request.temperature,
                    top_p=request.top_p,
                    max_tokens=request.max_tokens,
                    seed=seeds[k],
                    stop=request.stop or None,
                    stream=True,
                )
                parts: list[str] = []
                finish_reason = None
                for chunk in chunks:  # one chunk per token: a cancel lands within a token
                    if cancel.is_set():
                        chunks.close()
                        raise GenerationCancelled("generation cancelled")
                    choice = chunk["choices"][0]
                    parts.append(choice.get("delta", {}).get("content") or "")
                    finish_reason = choice.get("finish_reason") or finish_reason
                if processor is not None and processor.error is not None:
                    # The grammar engine failed mid-way and ended the completion: that is
                    # not the model's mistake, so no retry with feedback; the request fails.
                    log.error(
                        "constrained decoding failed",
                        **{
                            "error.type": "constraint_failed",
                            "error.message": str(processor.error),
                        },
                    )
                    raise processor.error
                wall = time.perf_counter() - t0
                perf = lib.llama_perf_context(llm.ctx)
                texts.append("".join(parts))
                # Streaming reports no usage: llama.cpp's counters give the tokens decoded
                # and the prompt tokens evaluated (those not served from the prefix cache).
                stats.prompt_tokens += perf.n_p_eval
                stats.completion_tokens += perf.n_eval
                stats.prompt_eval_s += perf.t_p_eval_ms / 1000
                stats.prompt_eval_tokens += perf.n_p_eval
                stats.constraint_s += processor.seconds if processor is not None else 0.0
                stats.per_completion.append(
                    {
                        "wall_s": wall,
                        "prompt_eval_s": perf.t_p_eval_ms / 1000,
                        "completion_tokens": float(perf.n_eval),
                        "finish_reason_length": float(finish_reason == "length"),
                    }
                )
            stats.wall_s = time.perf_counter() - started
            stats.batch_sizes = [1] * len(texts)
        return self._finish(request, stats, texts)


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    """Resolve a job's future on the event loop (unless its request already gave up)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
