"""Continuous batching on one llama.cpp context: every live sequence of every request
advances in one `llama_decode` per token, and the prompt prefix is evaluated once.

Advancing several sequences in one step costs far less than advancing them one by one
(vLLM's scheduler does the same on a GPU). llama.cpp provides the parts (a
multi-sequence `llama_batch`, a unified KV cache whose cells can be tagged with several
sequence ids, per-sequence removal); its own server schedules over them in C++, and this
in-process backend does it here, over llama-cpp-python's low-level bindings: a few list
operations per step around the one `llama_decode`.

One engine thread owns the context. Requests become jobs (`submit`, from any thread):

1. A job waits in a bounded FIFO; past `max_queued` waiting jobs `submit` raises
   `Overloaded` (503 with `Retry-After`).
2. Between two decode steps the engine admits waiting jobs, in order, while there are
   free sequence ids and KV cells for them. Admission is the job's prefill:
   - The first `prefix_slots` sequences hold prompt prefixes (system prompt, tool list,
     few-shot exchanges: every message but the last), one each: the planner's plan
     prompt and its chain-of-thought prompt are both in use when a request votes over
     plans and prose. A job whose prompt starts with a cached prefix copies its cells
     (`llama_memory_seq_cp`: the same cells get one more sequence tag, nothing is
     copied) and evaluates only its question. A job with another prefix (another tool
     list, another prompt) caches its prefix first, on a free prefix sequence or on the
     least recently used one's, which is cleared; the prefix is evaluated from position
     0, so a prefix's cells are the same values however they came to be cached. A job
     whose prefix only starts with a cached one (a second pass over the model's own
     draft: the plan prompt, the question and the draft, then one more request) copies
     the cached cells and evaluates the rest of its prompt on its own sequence, as
     llama.cpp's server reuses a slot's longest common prefix; the rest is not cached,
     so a request's own continuation cannot evict the prompts every request uses. (A
     longer prefix that many jobs share is therefore cached only while no shorter
     cached one covers it; the planner's prompts differ from their first message, so
     for them the rest is always one request's own.) Jobs
     still decoding on an evicted prefix keep its cells through their own tags. Cached
     prefixes no job uses are evicted, least recently used first, when a job needs
     their cells.
   - The question is evaluated once on the job's first sequence and its cells shared
     with the job's other sequences (its n samples).
   - Each sequence samples its first token from the question's last logits.
3. A step puts the last sampled token of every live sequence in one batch (its own
   position and sequence id) and calls `llama_decode` once. The xgrammar matchers fill
   one bitmask row per constrained sequence, `xgrammar.apply_token_bitmask_inplace`
   masks all rows of the logits at once, and each sequence samples its row with its own
   seeded sampler chain.
4. A sequence stops on its own (an end-of-generation token, the only tokens its grammar
   allows once the JSON is complete, or `max_tokens`); its cells are removed and the
   others go on. A job is done when its last sequence stops.
5. A cancelled job's sequences are removed before the next step: its cancel lands within
   one token, and the other jobs' sequences decode on as if it had never been there.

Same input, same seed, same output: the sampler chain of sample k is the one the
sequential path builds (llama-cpp-python's `create_chat_completion` defaults: top-k 40,
typical 1.0, top-p, min-p 0.05, temperature, seeded `dist`; greedy at temperature 0)
with seed + k * stride, the grammar mask applied first; the prefix is always evaluated
the same way and a question (with the rest of a prompt that continues a cached prefix)
always in its own `llama_decode`; and the context is opened
with flash attention, under which a sequence's attention skips the cells of other
sequences. Alone or batched, the output is the same wherever ggml's kernels are
batch-invariant; where they are not (docs/benchmarks/planner.md lists the cases), a
batched sample can come out differently from the same sample decoded alone.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import structlog
from prometheus_client import Counter, Gauge, Histogram

from planner.backends.base import Usage
from planner.backends.schema_constraint import ConstraintError
from services.errors import Overloaded

log = structlog.get_logger(__name__)

# llama-cpp-python's `create_chat_completion` defaults, which the sequential path uses.
TOP_K = 40
MIN_P = 0.05
TYPICAL_P = 1.0

# Prometheus metrics under the names vLLM gives the same figures, so one dashboard reads
# this engine and a vLLM server alike.
_LABELS = ["model_name"]
_TIME_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
RUNNING = Gauge("vllm:num_requests_running", "Jobs decoding in the batch", _LABELS)
WAITING = Gauge("vllm:num_requests_waiting", "Jobs waiting for room in the batch", _LABELS)
PROMPT_TOKENS = Counter("vllm:prompt_tokens", "Prompt tokens (cached or evaluated)", _LABELS)
GENERATION_TOKENS = Counter("vllm:generation_tokens", "Tokens generated", _LABELS)
PREFIX_QUERIES = Counter(
    "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", _LABELS
)
PREFIX_HITS = Counter(
    "vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache", _LABELS
)
QUEUE_TIME = Histogram(
    "vllm:request_queue_time_seconds", "Time waiting for room", _LABELS, buckets=_TIME_BUCKETS
)
PREFILL_TIME = Histogram(
    "vllm:request_prefill_time_seconds", "Prefill time", _LABELS, buckets=_TIME_BUCKETS
)
DECODE_TIME = Histogram(
    "vllm:request_decode_time_seconds", "Decode time", _LABELS, buckets=_TIME_BUCKETS
)
TTFT = Histogram(
    "vllm:time_to_first_token_seconds", "Submit to first token", _LABELS, buckets=_TIME_BUCKETS
)
E2E = Histogram(
    "vllm:e2e_request_latency_seconds", "Submit to last token", _LABELS, buckets=_TIME_BUCKETS
)
REQUEST_PROMPT = Histogram(
    "vllm:request_prompt_tokens", "Prompt tokens per job", _LABELS, buckets=_TOKEN_BUCKETS
)
REQUEST_GENERATION = Histogram(
    "vllm:request_generation_tokens", "Tokens generated per job", _LABELS, buckets=_TOKEN_BUCKETS
)
ITERATION_TOKENS = Histogram(
    "vllm:iteration_tokens_total",
    "Tokens per engine step (one per live sequence)",
    _LABELS,
    buckets=(1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32),
)
CONSTRAINT_TIME = Counter(
    "planner_constraint_seconds", "Time in the xgrammar matchers and masks", _LABELS
)


class JobCancelled(RuntimeError):
    """The job's cancel event was set; its sequences were dropped between two tokens."""


class EngineClosed(RuntimeError):
    """The engine stopped (the backend is closing) before the job finished."""


@dataclass
class JobResult:
    texts: list[str]
    finish_reasons: list[str | None]
    completion_tokens: list[int]
    prompt_tokens: int  # the whole prompt, cached or not
    prefix_cached_tokens: int  # of those, served from the prefix cache
    prompt_eval_tokens: int  # evaluated for this job (its question, and a new prefix)
    queue_s: float
    prefill_s: float
    decode_s: float
    ttft_s: float
    constraint_s: float
    mean_batch: float  # live sequences per step while this job decoded
    max_batch: int
    steps: int

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=sum(self.completion_tokens),
            prefix_cached_tokens=self.prefix_cached_tokens,
            prompt_eval_tokens=self.prompt_eval_tokens,
            queue_s=self.queue_s,
            prefill_s=self.prefill_s,
            decode_s=self.decode_s,
            constraint_s=self.constraint_s,
            batch_size_max=self.max_batch,
        )


@dataclass
class Job:
    """n samples of one prompt. `done` is called once, from the engine thread, with the
    `JobResult` or the exception that ended the job."""

    messages: list[dict[str, str]]
    seeds: list[int]
    temperature: float
    top_p: float
    max_tokens: int
    grammar: Any | None  # an xgrammar compiled grammar, or None for unconstrained
    done: Callable[[JobResult | BaseException], None]
    # A completion also ends once its text ends with one of these (kept in the text).
    stop: tuple[bytes, ...] = ()
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    # Filled by the engine.
    prompt: list[int] = field(default_factory=list)
    prefix: list[int] = field(default_factory=list)  # its part the cache serves or keeps
    shareable: int = 0  # tokens of the prompt's own shareable prefix (looked up)
    seqs: list[_Sequence] = field(default_factory=list)
    pinned: _Prefix | None = None
    cells: int = 0  # KV cells reserved: question + n * max_tokens
    admitted: float = 0.0
    first_token: float = 0.0
    prefill_s: float = 0.0
    prefix_cached: int = 0
    prompt_eval: int = 0
    constraint_s: float = 0.0
    batch_sum: int = 0
    batch_max: int = 0
    steps: int = 0

    @cached_property
    def stop_window(self) -> int:
        """Bytes of a completion's tail that can hold the start of a stop string."""
        return max((len(s) for s in self.stop), default=0)


@dataclass
class _Sequence:
    id: int
    seed: int
    sampler: Any = None
    matcher: Any = None
    tokens: list[int] = field(default_factory=list)
    pos: int = 0
    done: bool = False
    finish_reason: str | None = None
    tail: bytes = b""  # the completion's last bytes, for the job's stop strings


@dataclass(eq=False)
class _Prefix:
    """A prefix whose cells are in the cache: on its own sequence `seq` while it is
    cached, and on the sequences of the jobs that copied it (`refs`)."""

    tokens: list[int]
    seq: int = 0
    refs: int = 0
    used: int = 0  # when a job last started on it (the engine's job count)


def chat_formatter(llm: Any) -> Any:
    """The formatter of the model's own chat template, as `Llama` builds it; None if the
    model has none (then `Llama` uses another chat format and only the sequential path
    reproduces it)."""
    from llama_cpp import llama_chat_format

    template = llm.metadata.get("tokenizer.chat_template")
    if not template or llm.chat_format != "chat_template.default":
        return None
    eos, bos = llm.token_eos(), llm.token_bos()
    return llama_chat_format.Jinja2ChatFormatter(
        template=template,
        eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
        bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
        stop_token_ids=[eos],
    )


def chat_prompt(llm: Any, formatter: Any, messages: list[dict[str, str]]) -> list[int]:
    """The prompt tokens `create_chat_completion` would evaluate for these messages."""
    result = formatter(messages=messages)
    return list(
        llm.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)
    )


def prompt_and_prefix(
    llm: Any, formatter: Any, messages: list[dict[str, str]]
) -> tuple[list[int], list[int]]:
    """The prompt's tokens and its shareable prefix: the tokens it has in common with the
    same conversation whose last message is empty, i.e. everything before the question
    (the comparison is on tokens, so a tokenizer merge across the boundary only shortens
    the prefix). At least the prompt's last token is left out of the prefix, so every job
    evaluates something and gets logits of its own."""
    prompt = chat_prompt(llm, formatter, messages)
    blank = chat_prompt(llm, formatter, [*messages[:-1], {**messages[-1], "content": ""}])
    n = 0
    for a, b in zip(prompt, blank, strict=False):
        if a != b:
            break
        n += 1
    return prompt, prompt[: min(n, len(prompt) - 1)]


def sampler_chain(temperature: float, top_p: float, seed: int) -> Any:
    from llama_cpp import llama_cpp as lib

    chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
    if temperature == 0:
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        return chain
    if temperature > 0:
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(TOP_K))
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_typical(TYPICAL_P, 1))
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(top_p, 1))
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_min_p(MIN_P, 1))
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(temperature))
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(seed))
    return chain


class BatchEngine:
    """The scheduler and decode loop over one llama.cpp context (see the module docstring).

    `llm` must be opened with `n_seq_max` >= `max_batch` + `prefix_slots` (the first
    sequences hold the cached prefixes) in a unified KV cache, with flash attention;
    nothing else may use its context while the engine runs. `prompt_limit` is the most tokens a job's prompt and completion may
    take together (the service's `n_ctx`): a longer prompt fails at once with
    `ValueError`, a completion stops there.
    """

    def __init__(
        self,
        llm: Any,
        formatter: Any,
        *,
        stop_tokens: list[int],
        max_batch: int,
        max_queued: int,
        prompt_limit: int,
        model_name: str,
        prefix_slots: int = 1,
    ) -> None:
        from llama_cpp import llama_cpp as lib

        self._lib = lib
        self._llm = llm
        self._ctx = llm.ctx
        self._mem = lib.llama_get_memory(llm.ctx)
        self._formatter = formatter
        self._stops = frozenset(stop_tokens)
        self.max_batch = max_batch
        self.max_queued = max_queued
        self.prompt_limit = prompt_limit
        if prefix_slots < 1:
            raise ValueError("the engine needs at least one prefix slot")
        if lib.llama_n_seq_max(self._ctx) < max_batch + prefix_slots:
            raise ValueError("the context holds fewer sequences than max_batch + prefix_slots")
        self.prefix_slots = prefix_slots
        self.n_cells = lib.llama_n_ctx(self._ctx)
        self._vocab = llm.n_vocab()
        self._n_batch = llm.n_batch
        self._labels = {"model_name": model_name}
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._free_ids = list(range(prefix_slots, prefix_slots + max_batch))
        self._prefixes: list[_Prefix] = []  # cached, one per prefix sequence
        self._started = 0  # jobs started: the clock of the prefixes' `used`
        self._reserved = 0  # KV cells held by running jobs and cached or pinned prefixes
        self._job_s = 5.0  # running mean of a job's time, for Retry-After
        self._closing = False
        self._batch = lib.llama_batch_init(max(max_batch, self._n_batch), 0, 1)
        self._bitmask = np.full((max_batch, (self._vocab + 31) // 32), -1, dtype=np.int32)
        self._thread = threading.Thread(target=self._run, name="llamacpp-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ caller side

    def submit(self, job: Job) -> None:
        """Queue a job (n <= max_batch). Raises `Overloaded` when the queue is full."""
        if not 1 <= len(job.seeds) <= self.max_batch:
            raise ValueError(f"a job has 1 to {self.max_batch} samples")
        with self._cond:
            if self._closing:
                raise EngineClosed("the planner model is shutting down")
            gone = [waiting for waiting in self._waiting if waiting.cancel.is_set()]
            for waiting in gone:  # cancelled while queued: no longer waiting
                self._waiting.remove(waiting)
                _notify(waiting, JobCancelled("generation cancelled"))
            if len(self._waiting) >= self.max_queued:
                retry = self._retry_after()
                raise Overloaded(
                    f"the planner has {len(self._waiting)} requests waiting for the model; "
                    f"retry in {retry}s",
                    retry_after_s=retry,
                )
            self._waiting.append(job)
            WAITING.labels(**self._labels).set(len(self._waiting))
            self._cond.notify()

    def wake(self) -> None:
        """Have the engine look at its jobs now (a job's cancel event was set)."""
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        """Stop the loop; every job not finished ends with `EngineClosed`. Idempotent."""
        with self._cond:
            if self._closing and self._batch is None:
                return
            self._closing = True
            self._cond.notify()
        self._thread.join()
        with self._cond:
            batch, self._batch = self._batch, None
        if batch is not None:
            self._lib.llama_batch_free(batch)

    @property
    def load(self) -> tuple[int, int]:
        """(jobs running, jobs waiting)."""
        with self._cond:
            return len(self._running), len(self._waiting)

    def _retry_after(self) -> int:
        waves = (len(self._waiting) + len(self._running)) / self.max_batch
        return max(1, min(60, math.ceil(self._job_s * waves)))

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._closing or self._running or self._waiting):
                    self._cond.wait()
                if self._closing:
                    break
            try:
                self._drop_cancelled()
                self._admit()
                if self._running:
                    self._step()
            except Exception as exc:  # llama.cpp failed: fail what runs, keep serving
                log.exception("llama.cpp engine step failed", **{"error.type": "engine_failed"})
                self._reset(exc)
        self._reset(EngineClosed("the planner model is shutting down"))
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
        for job in waiting:
            _notify(job, EngineClosed("the planner model is shutting down"))

    def _reset(self, exc: BaseException) -> None:
        for job in list(self._running):
            self._finish(job, exc)
        self._lib.llama_memory_seq_rm(self._mem, -1, -1, -1)
        self._prefixes = []
        self._reserved = 0

    def _drop_cancelled(self) -> None:
        with self._cond:
            cancelled = [job for job in self._waiting if job.cancel.is_set()]
            for job in cancelled:
                self._waiting.remove(job)
            WAITING.labels(**self._labels).set(len(self._waiting))
        for job in cancelled:
            _notify(job, JobCancelled("generation cancelled"))
        for job in [job for job in self._running if job.cancel.is_set()]:
            self._finish(job, JobCancelled("generation cancelled"))

    def _admit(self) -> None:
        while True:
            with self._cond:
                if not self._waiting:
                    return
                job = self._waiting[0]
            if not job.prompt:
                try:
                    job.prompt, job.prefix = prompt_and_prefix(
                        self._llm, self._formatter, job.messages
                    )
                except Exception as exc:  # the chat template refused the messages
                    if self._pop(job):
                        _notify(job, RuntimeError(f"the chat template failed: {exc}"))
                    continue
                if len(job.prompt) >= self.prompt_limit:
                    self._refuse(
                        job,
                        f"the prompt is {len(job.prompt)} tokens, which exceeds the "
                        f"planner's context of {self.prompt_limit} tokens",
                    )
                    continue
                # As llama.cpp does: a completion ends where the context does.
                job.max_tokens = min(job.max_tokens, self.prompt_limit - len(job.prompt))
                job.shareable = len(job.prefix)
            n = len(job.seeds)
            cached = self._cached(job.prefix)
            if cached is not None and len(cached.tokens) < len(job.prefix):
                job.prefix = cached.tokens  # the rest is this job's own
            job.cells = len(job.prompt) - len(job.prefix) + n * job.max_tokens
            need = job.cells + (0 if cached else len(job.prefix))
            # cached prefixes no job uses give their cells up to a job that needs them
            spare = sum(len(p.tokens) for p in self._evictable(cached))
            held = self._reserved - spare
            room = self.n_cells - self._n_batch
            if len(self._free_ids) < n or held + need > room:
                if not self._running and need > room:  # would never fit: do not wait
                    self._refuse(
                        job,
                        f"{n} samples of up to {job.max_tokens} tokens need {need} KV "
                        f"cells; the planner's cache holds {room}",
                    )
                    continue
                return  # the head of the queue waits for room; FIFO, so no starvation
            if self._pop(job):
                self._start(job, cached)

    def _pop(self, job: Job) -> bool:
        """Take `job` off the queue; False if a caller already took it (cancelled)."""
        with self._cond:
            if job not in self._waiting:
                return False
            self._waiting.remove(job)
            WAITING.labels(**self._labels).set(len(self._waiting))
            return True

    def _refuse(self, job: Job, message: str) -> None:
        if self._pop(job):
            _notify(job, ValueError(message))

    def _start(self, job: Job, cached: _Prefix | None) -> None:
        lib = self._lib
        job.admitted = t0 = time.perf_counter()
        if cached is not None:
            job.prefix_cached = len(job.prefix)
            prefix = cached
            self._make_room(job.cells, keep=prefix)
        else:
            try:
                prefix = self._cache_prefix(job.prefix, job.cells)
            except Exception as exc:
                _notify(job, exc)
                return
            job.prompt_eval += len(job.prefix)
            job.prefill_s += time.perf_counter() - t0
        self._started += 1
        prefix.used = self._started
        prefix.refs += 1
        job.pinned = prefix
        self._reserved += job.cells
        ids = [self._free_ids.pop(0) for _ in job.seeds]
        job.seqs = [
            _Sequence(id=k, seed=s, pos=len(job.prompt))
            for k, s in zip(ids, job.seeds, strict=True)
        ]
        self._running.append(job)
        RUNNING.labels(**self._labels).set(len(self._running))
        try:
            for seq in job.seqs:
                seq.sampler = sampler_chain(job.temperature, job.top_p, seq.seed)
                if job.grammar is not None:
                    import xgrammar

                    seq.matcher = xgrammar.GrammarMatcher(job.grammar)
            first = job.seqs[0].id
            lib.llama_memory_seq_cp(self._mem, prefix.seq, first, -1, -1)
            t0 = time.perf_counter()
            row = self._evaluate(job.prompt, len(job.prefix), first, job.cancel)
            job.prefill_s += time.perf_counter() - t0
            job.prompt_eval += len(job.prompt) - len(job.prefix)
            if row is None:
                raise JobCancelled("generation cancelled")
            for seq in job.seqs[1:]:
                lib.llama_memory_seq_cp(self._mem, first, seq.id, -1, -1)
            # Every matcher is at the grammar's start: one mask serves all first tokens.
            self._mask([(row, job, job.seqs[0])], row_logits=True)
            for seq in job.seqs:
                self._sample(job, seq, row)
            job.first_token = time.perf_counter()
        except Exception as exc:
            self._finish(job, exc)
            return
        if all(seq.done for seq in job.seqs):
            self._finish(job, None)

    def _cached(self, tokens: list[int]) -> _Prefix | None:
        """The cached prefix `tokens` is, or else the longest (non-empty) one it starts
        with."""
        covering = [
            p
            for p in self._prefixes
            if p.tokens == tokens or (p.tokens and tokens[: len(p.tokens)] == p.tokens)
        ]
        return max(covering, key=lambda p: len(p.tokens), default=None)

    def _evictable(self, keep: _Prefix | None) -> list[_Prefix]:
        """Cached prefixes no job uses, but `keep`; least recently used first."""
        idle = [p for p in self._prefixes if p.refs == 0 and p is not keep]
        return sorted(idle, key=lambda p: p.used)

    def _evict(self, prefix: _Prefix) -> None:
        """Uncache `prefix`: its sequence is cleared; jobs on it keep its cells (and the
        cells stay reserved until the last of them finishes)."""
        self._prefixes.remove(prefix)
        self._lib.llama_memory_seq_rm(self._mem, prefix.seq, -1, -1)
        if prefix.refs == 0:
            self._reserved -= len(prefix.tokens)

    def _make_room(self, cells: int, keep: _Prefix | None) -> None:
        """Evict idle prefixes, least recently used first, until `cells` more fit."""
        room = self.n_cells - self._n_batch
        for idle in self._evictable(keep):
            if self._reserved + cells <= room:
                return
            self._evict(idle)

    def _cache_prefix(self, tokens: list[int], cells: int) -> _Prefix:
        """Cache `tokens` as a prefix, evaluated from position 0 on a prefix sequence of
        its own: a free one, or the least recently used one's (an idle one first)."""
        self._make_room(cells + len(tokens), keep=None)
        if len(self._prefixes) == self.prefix_slots:
            self._evict(min(self._prefixes, key=lambda p: (p.refs > 0, p.used)))
        taken = {p.seq for p in self._prefixes}
        seq = min(k for k in range(self.prefix_slots) if k not in taken)
        prefix = _Prefix(list(tokens), seq=seq)
        self._prefixes.append(prefix)
        self._reserved += len(tokens)
        try:
            self._evaluate(tokens, 0, seq, None, logits=False)
        except Exception:
            self._evict(prefix)
            raise
        return prefix

    def _evaluate(
        self,
        tokens: list[int],
        start: int,
        seq: int,
        cancel: threading.Event | None,
        *,
        logits: bool = True,
    ) -> int | None:
        """Evaluate tokens[start:] on one sequence in chunks of n_batch; return the batch
        index of the last token's logits (None if `cancel` was set between chunks)."""
        batch = self._batch
        for begin in range(start, len(tokens), self._n_batch):
            if cancel is not None and cancel.is_set():
                return None
            chunk = tokens[begin : begin + self._n_batch]
            for i, token in enumerate(chunk):
                last = logits and begin + i == len(tokens) - 1
                _set(batch, i, token, begin + i, seq, last)
            batch.n_tokens = len(chunk)
            _decode(self._lib, self._ctx, batch)
        return batch.n_tokens - 1

    def _step(self) -> None:
        live = [(job, seq) for job in self._running for seq in job.seqs if not seq.done]
        batch = self._batch
        for i, (_, seq) in enumerate(live):
            _set(batch, i, seq.tokens[-1], seq.pos, seq.id, True)
            seq.pos += 1
        batch.n_tokens = len(live)
        _decode(self._lib, self._ctx, batch)
        ITERATION_TOKENS.labels(**self._labels).observe(len(live))
        for job in self._running:
            job.steps += 1
            job.batch_sum += len(live)
            job.batch_max = max(job.batch_max, len(live))
        broken: dict[int, ConstraintError] = {}
        self._mask([(i, job, seq) for i, (job, seq) in enumerate(live)], failed=broken)
        failed: dict[int, tuple[Job, Exception]] = {}
        for job, seq in live:
            if seq.id in broken:
                failed[id(job)] = (job, broken[seq.id])
        for i, (job, seq) in enumerate(live):
            if id(job) in failed:
                continue
            try:
                self._sample(job, seq, i)
            except ConstraintError as error:
                failed[id(job)] = (job, error)
        for job, failure in failed.values():
            self._finish(job, failure)
        for job in [j for j in self._running if all(s.done for s in j.seqs)]:
            self._finish(job, None)

    def _mask(
        self,
        rows: list[tuple[int, Job, _Sequence]],
        row_logits: bool = False,
        failed: dict[int, ConstraintError] | None = None,
    ) -> None:
        """Write each constrained sequence's grammar mask into its row of the logits: the
        matchers fill one bitmask row each, then one `apply_token_bitmask_inplace` masks
        them all (its CPU kernel, over llama.cpp's logits buffer without a copy). A matcher
        that fails in a decode step is recorded in `failed` (by sequence id), its row left
        unmasked for the caller to discard."""
        failed = {} if failed is None else failed
        rows = [(row, job, seq) for row, job, seq in rows if seq.matcher is not None]
        if not rows:
            return
        import torch
        import xgrammar

        t0 = time.perf_counter()
        lib = self._lib
        if row_logits:  # one row, a prefill's last token: every matcher is at the start
            row, _, seq = rows[0]
            _fill(seq, self._bitmask, 0)
            pointer, n, indices = lib.llama_get_logits_ith(self._ctx, row), 1, None
        else:  # a decode step: every token has logits, rows in batch order
            for row, _, seq in rows:
                try:
                    _fill(seq, self._bitmask, row)
                except ConstraintError as exc:
                    failed[seq.id] = exc
            indices = [row for row, _, _ in rows]
            n = indices[-1] + 1
            if indices == list(range(n)):
                indices = None
            pointer = lib.llama_get_logits(self._ctx)
        logits = np.ctypeslib.as_array(pointer, shape=(n, self._vocab))
        xgrammar.apply_token_bitmask_inplace(
            torch.from_numpy(logits),
            torch.from_numpy(self._bitmask[:n]),
            vocab_size=self._vocab,
            indices=indices,
        )
        share = (time.perf_counter() - t0) / len(rows)
        for _, job, _ in rows:
            job.constraint_s += share

    def _sample(self, job: Job, seq: _Sequence, row: int) -> None:
        token = self._lib.llama_sampler_sample(seq.sampler, self._ctx, row)
        if token in self._stops:
            seq.done, seq.finish_reason = True, "stop"
        else:
            if seq.matcher is not None:
                t0 = time.perf_counter()
                try:
                    accepted = seq.matcher.accept_token(token)
                except Exception as exc:  # xgrammar raises its own and RuntimeError types
                    raise ConstraintError(f"constrained decoding failed: {exc}") from exc
                job.constraint_s += time.perf_counter() - t0
                if not accepted:
                    raise ConstraintError(
                        f"constrained decoding failed: token {token} is outside the grammar"
                    )
            seq.tokens.append(token)
            if job.stop:
                piece = self._llm.detokenize([token])
                seq.tail = (seq.tail + piece)[-(job.stop_window + len(piece)) :]
                if any(stop in seq.tail for stop in job.stop):
                    seq.done, seq.finish_reason = True, "stop"
            if not seq.done and len(seq.tokens) >= job.max_tokens:
                seq.done, seq.finish_reason = True, "length"
        if seq.done:
            self._lib.llama_memory_seq_rm(self._mem, seq.id, -1, -1)

    def _finish(self, job: Job, error: BaseException | None) -> None:
        """Take a running job out: free its sequences, cells and samplers; report it."""
        lib = self._lib
        now = time.perf_counter()
        for seq in job.seqs:
            lib.llama_memory_seq_rm(self._mem, seq.id, -1, -1)
            if seq.sampler is not None:
                lib.llama_sampler_free(seq.sampler)
                seq.sampler = None
            self._free_ids.append(seq.id)
        self._free_ids.sort()
        self._running.remove(job)
        self._reserved -= job.cells
        if job.pinned is not None:
            job.pinned.refs -= 1
            if job.pinned.refs == 0 and job.pinned not in self._prefixes:
                self._reserved -= len(job.pinned.tokens)
            job.pinned = None
        RUNNING.labels(**self._labels).set(len(self._running))
        if error is not None:
            _notify(job, error)
            return
        try:
            result = self._result(job, now)
        except Exception as exc:  # detokenizing or a metric failed: still answer
            log.exception("llama.cpp job result failed", **{"error.type": "engine_failed"})
            _notify(job, RuntimeError(f"the planner could not read its output: {exc}"))
            return
        _notify(job, result)

    def _result(self, job: Job, now: float) -> JobResult:
        """The finished job's texts and figures, counted in the metrics."""
        labels = self._labels
        completion = [len(seq.tokens) for seq in job.seqs]
        result = JobResult(
            texts=[
                self._llm.detokenize(seq.tokens, prev_tokens=job.prompt).decode(
                    "utf-8", errors="ignore"
                )
                for seq in job.seqs
            ],
            finish_reasons=[seq.finish_reason for seq in job.seqs],
            completion_tokens=completion,
            prompt_tokens=len(job.prompt),
            prefix_cached_tokens=job.prefix_cached,
            prompt_eval_tokens=job.prompt_eval,
            queue_s=job.admitted - job.submitted,
            prefill_s=job.prefill_s,
            decode_s=now - job.first_token,
            ttft_s=job.first_token - job.submitted,
            constraint_s=job.constraint_s,
            mean_batch=job.batch_sum / job.steps if job.steps else float(len(job.seqs)),
            max_batch=max(job.batch_max, len(job.seqs)),
            steps=job.steps,
        )
        self._job_s = 0.8 * self._job_s + 0.2 * (now - job.admitted)
        PROMPT_TOKENS.labels(**labels).inc(result.prompt_tokens)
        GENERATION_TOKENS.labels(**labels).inc(sum(completion))
        PREFIX_QUERIES.labels(**labels).inc(job.shareable)
        PREFIX_HITS.labels(**labels).inc(result.prefix_cached_tokens)
        QUEUE_TIME.labels(**labels).observe(result.queue_s)
        PREFILL_TIME.labels(**labels).observe(result.prefill_s)
        DECODE_TIME.labels(**labels).observe(result.decode_s)
        TTFT.labels(**labels).observe(result.ttft_s)
        E2E.labels(**labels).observe(now - job.submitted)
        REQUEST_PROMPT.labels(**labels).observe(result.prompt_tokens)
        REQUEST_GENERATION.labels(**labels).observe(sum(completion))
        CONSTRAINT_TIME.labels(**labels).inc(result.constraint_s)
        return result


def _notify(job: Job, outcome: JobResult | BaseException) -> None:
    """Call the job's `done` once; a callback that raises (its event loop is gone) must
    not take the engine thread or another request with it."""
    try:
        job.done(outcome)
    except Exception:
        log.warning("a job's caller could not be told its outcome", exc_info=True)


def _fill(seq: _Sequence, bitmask: np.ndarray, row: int) -> None:
    try:
        seq.matcher.fill_next_token_bitmask(bitmask, row)
    except Exception as exc:  # xgrammar raises its own and RuntimeError types
        raise ConstraintError(f"constrained decoding failed: {exc}") from exc


def _decode(lib: Any, ctx: Any, batch: Any) -> None:
    rc = lib.llama_decode(ctx, batch)
    if rc == 1:
        raise RuntimeError("llama.cpp found no KV cache slot for the batch (context too small)")
    if rc != 0:
        raise RuntimeError(f"llama_decode failed ({rc})")


def _set(batch: Any, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq
    batch.logits[i] = logits
