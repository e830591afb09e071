"""n samples of one prompt decoded together, as one llama.cpp batch per token.

On a CPU a decode step is bound by reading the weights once, so advancing n sequences in
one `llama_decode` costs little more than advancing one. `decode_batch` does it with
llama.cpp's own multi-sequence API through llama-cpp-python's low-level bindings:

1. The prompt is evaluated once, on sequence 0 (only the part not already in the KV cache
   from the previous request, as llama-cpp-python's own prefix match does), in chunks of
   the context's `n_batch`, the same chunks `Llama.eval` uses.
2. Its KV cells are shared with sequences 1..n-1 (`llama_memory_seq_cp`; in the unified
   KV cache the context is opened with, that tags the same cells, nothing is copied).
3. Each step puts one token per live sequence in a `llama_batch` (its own position and
   sequence id, logits on) and calls `llama_decode` once. Each sequence has its own
   sampler chain with its own seed and its own xgrammar matcher: the matcher's mask is
   written into that row of llama.cpp's logits, then `llama_sampler_sample` samples it.
4. A sequence stops on its own: an end-of-generation token (the only tokens the grammar
   allows once the JSON is complete) or `max_tokens`; the others go on.
5. Afterwards the KV cache holds the prompt on sequence 0 only, and `Llama`'s record of
   what is cached says so, so the next request (batched or not) reuses the prefix.

The sampler chain is the one `Llama.create_chat_completion` builds at its defaults (top-k
40, typical 1.0, top-p, min-p 0.05, temperature, then a seeded `dist`; greedy at
temperature 0), and the grammar mask is applied before it, as the sequential path's
logits processor is. So sequence k with seed s samples what the sequential path samples
with seed s, as long as llama.cpp computes the same logits.

Where determinism ends: a sequence's output depends only on its prompt and seed, except
that llama.cpp's logits for a token are not bitwise identical across batch sizes. With
one sequence the matmuls are matrix-vector products; with several, ggml runs
matrix-matrix kernels (and, with extra buffers, the repacked-weight GEMM) whose float
summation order differs, and the attention sees a KV view padded with other sequences'
(masked) cells. The logits then differ in the last bits, and where two candidate tokens
are that close, the sampled token (greedy or seeded) can differ and the sequences diverge
from there. A batch of one runs the same kernels as the sequential path. The rate at
which this happens on the planner's prompts is measured in docs/benchmarks/planner.md.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.backends.schema_constraint import ConstraintError

# llama-cpp-python's `create_chat_completion` defaults, which the sequential path uses.
TOP_K = 40
MIN_P = 0.05
TYPICAL_P = 1.0


class BatchCancelled(RuntimeError):
    """The caller's cancel event was set; decoding stopped between two tokens."""


@dataclass
class Sequence:
    seed: int
    sampler: Any = None
    matcher: Any = None
    tokens: list[int] = field(default_factory=list)
    done: bool = False
    finish_reason: str | None = None
    finished_s: float = 0.0


@dataclass
class BatchResult:
    texts: list[str]
    prompt_tokens: int  # tokens of the prompt evaluated (not served from the cache)
    prompt_eval_s: float
    completion_tokens: list[int]
    finish_reasons: list[str | None]
    finished_s: list[float]  # seconds from the start to each sequence's end
    constraint_s: float
    steps: int


def chat_prompt(llm: Any, formatter: Any, messages: list[dict[str, str]]) -> list[int]:
    """The prompt tokens `create_chat_completion` would evaluate for these messages."""
    result = formatter(messages=messages)
    return list(
        llm.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)
    )


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


def _sampler(temperature: float, top_p: float, seed: int) -> Any:
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


def decode_batch(
    llm: Any,
    prompt: list[int],
    seeds: list[int],
    *,
    temperature: float,
    top_p: float,
    max_tokens: int,
    compiled_grammar: Any | None,
    stop_tokens: list[int],
    cancel: threading.Event,
) -> BatchResult:
    """Decode `len(seeds)` completions of `prompt` together; see the module docstring.

    The caller holds the context exclusively. `compiled_grammar` is an xgrammar compiled
    grammar (one matcher per sequence) or None for unconstrained decoding."""
    from llama_cpp import llama_cpp as lib

    n = len(seeds)
    if n > lib.llama_n_seq_max(llm.ctx):
        raise ValueError(f"{n} sequences exceed the context's n_seq_max")
    ctx = llm.ctx
    mem = lib.llama_get_memory(ctx)
    vocab_size = llm.n_vocab()
    stops = set(stop_tokens)
    started = time.perf_counter()
    seqs = [Sequence(seed=s) for s in seeds]
    width = max(n, llm.n_batch)
    batch = lib.llama_batch_init(width, 0, 1)
    constraint_s = 0.0
    prompt_eval_s = 0.0
    steps = 0
    try:
        # 1. The prompt on sequence 0, from where the cached prefix ends (at least its
        # last token is evaluated, for the logits).
        cached = llm.n_tokens
        prefix = 0
        for a, b in zip(llm._input_ids[:cached], prompt, strict=False):
            if a != b:
                break
            prefix += 1
        prefix = min(prefix, len(prompt) - 1)
        lib.llama_memory_seq_rm(mem, -1, prefix, -1)
        llm.n_tokens = prefix
        for s in range(1, lib.llama_n_seq_max(ctx)):
            lib.llama_memory_seq_rm(mem, s, -1, -1)
        t0 = time.perf_counter()
        for start in range(prefix, len(prompt), llm.n_batch):
            chunk = prompt[start : start + llm.n_batch]
            for i, token in enumerate(chunk):
                last = start + i == len(prompt) - 1
                _set(batch, i, token, start + i, 0, last)
            batch.n_tokens = len(chunk)
            _decode(lib, ctx, batch)
        prompt_eval_s = time.perf_counter() - t0
        llm.n_tokens = len(prompt)
        llm.input_ids[: len(prompt)] = prompt
        llm._requires_eval = True  # its logits are about to be overwritten by the batch
        # 2. The prompt's cells shared with every other sequence.
        for k in range(1, n):
            lib.llama_memory_seq_cp(mem, 0, k, -1, -1)
        if compiled_grammar is not None:
            import xgrammar

            bitmask = np.full((1, (vocab_size + 31) // 32), -1, dtype=np.int32)
        for seq in seqs:
            seq.sampler = _sampler(temperature, top_p, seq.seed)
            if compiled_grammar is not None:
                seq.matcher = xgrammar.GrammarMatcher(compiled_grammar)
        # Rows of the logits to sample from: the prompt's last token for all at first.
        rows = {k: batch.n_tokens - 1 for k in range(n)}
        pos = len(prompt)
        # 3. One token per live sequence per step.
        while True:
            for k, row in rows.items():
                seq = seqs[k]
                if seq.matcher is not None:
                    c0 = time.perf_counter()
                    seq.matcher.fill_next_token_bitmask(bitmask)
                    allowed = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")
                    logits = np.ctypeslib.as_array(
                        lib.llama_get_logits_ith(ctx, row), shape=(vocab_size,)
                    )
                    logits[allowed[:vocab_size] == 0] = -np.inf
                    constraint_s += time.perf_counter() - c0
                token = lib.llama_sampler_sample(seq.sampler, ctx, row)
                if token in stops:
                    seq.done, seq.finish_reason = True, "stop"
                else:
                    if seq.matcher is not None:
                        c0 = time.perf_counter()
                        accepted = seq.matcher.accept_token(token)
                        constraint_s += time.perf_counter() - c0
                        if not accepted:
                            raise ConstraintError(
                                f"constrained decoding failed: token {token} is outside the grammar"
                            )
                    seq.tokens.append(token)
                    if len(seq.tokens) >= max_tokens:
                        seq.done, seq.finish_reason = True, "length"
                if seq.done:
                    seq.finished_s = time.perf_counter() - started
            live = [k for k in range(n) if not seqs[k].done]
            if not live:
                break
            if cancel.is_set():  # between two tokens: the cancel lands within one
                raise BatchCancelled("generation cancelled")
            # All live sequences are at the same position: they started together and
            # each adds one token per step.
            for i, k in enumerate(live):
                _set(batch, i, seqs[k].tokens[-1], pos, k, True)
            batch.n_tokens = len(live)
            _decode(lib, ctx, batch)
            steps += 1
            rows = {k: i for i, k in enumerate(live)}
            pos += 1
    finally:
        # 5. Only the prompt stays cached, on sequence 0, as `Llama` records it.
        for k in range(1, n):
            lib.llama_memory_seq_rm(mem, k, -1, -1)
        lib.llama_memory_seq_rm(mem, 0, len(prompt), -1)
        for seq in seqs:
            if seq.sampler is not None:
                lib.llama_sampler_free(seq.sampler)
        lib.llama_batch_free(batch)
    return BatchResult(
        texts=[
            llm.detokenize(seq.tokens, prev_tokens=prompt).decode("utf-8", errors="ignore")
            for seq in seqs
        ],
        prompt_tokens=len(prompt) - prefix,
        prompt_eval_s=prompt_eval_s,
        completion_tokens=[len(seq.tokens) for seq in seqs],
        finish_reasons=[seq.finish_reason for seq in seqs],
        finished_s=[seq.finished_s for seq in seqs],
        constraint_s=constraint_s,
        steps=steps,
    )
