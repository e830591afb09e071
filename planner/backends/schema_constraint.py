"""JSON-schema constrained decoding for llama.cpp with xgrammar.

llama.cpp's own GBNF sampler checks the grammar against every token of the vocabulary
(151k for Qwen) at every step, which on a 0.5B model costs about a third of each token's
time on this CPU. xgrammar, the engine vLLM uses for structured outputs, compiles the
schema once into a pushdown automaton whose per-state token masks are mostly precomputed,
so a step is a mask fill plus one masked write over the logits.

`SchemaConstraint` holds what is per model (the tokenizer description and the compiler
with its cache of compiled schemas); `SchemaLogitsProcessor` is per generation: it feeds
each sampled token to its matcher and masks the next step's logits. A token the matcher
rejects is an error, never silently ignored, and a schema xgrammar cannot compile raises
instead of falling back to unconstrained decoding.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import numpy as np

# GGUF `tokenizer.ggml.model` -> how the vocabulary's token strings are encoded.
_VOCAB_TYPES = {"gpt2": "BYTE_LEVEL", "llama": "BYTE_FALLBACK"}


class ConstraintError(RuntimeError):
    """The model's vocabulary or the schema cannot be used for constrained decoding."""


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:
        raise ConstraintError(
            f"the llamacpp backend's xgrammar constraint needs xgrammar: "
            f"pip install -e '.[llamacpp]' ({exc})"
        ) from None
    return xgrammar


def vocabulary(llm: Any) -> tuple[list[str], str, list[int]]:
    """The model's token strings by id, its vocabulary type, and its stop tokens.

    Control, unused and unknown tokens get an empty string, which xgrammar treats as
    special: they can never appear inside a plan (a `<|im_start|>` in a string would
    otherwise be allowed as its literal text).
    """
    from llama_cpp import llama_cpp as lib

    tokenizer_model = str(llm.metadata.get("tokenizer.ggml.model", ""))
    vocab_type = _VOCAB_TYPES.get(tokenizer_model)
    if vocab_type is None:
        raise ConstraintError(f"unsupported GGUF tokenizer model {tokenizer_model!r}")
    # Token attributes (llama.h `llama_token_attr`) of tokens that are never plan text.
    not_text = lib.LLAMA_TOKEN_ATTR_UNKNOWN | lib.LLAMA_TOKEN_ATTR_UNUSED
    not_text |= lib.LLAMA_TOKEN_ATTR_CONTROL
    vocab = lib.llama_model_get_vocab(llm.model)
    tokens: list[str] = []
    stops: list[int] = []
    for token in range(llm.n_vocab()):
        if lib.llama_vocab_is_eog(vocab, token):
            stops.append(token)
        if lib.llama_vocab_get_attr(vocab, token) & not_text:
            tokens.append("")
            continue
        text = lib.llama_vocab_get_text(vocab, token)
        tokens.append(text.decode("utf-8", errors="replace") if text else "")
    if not stops:
        raise ConstraintError("the model declares no end-of-generation token")
    return tokens, vocab_type, stops


# xgrammar 0.2.8 turns a string with minLength/maxLength into a bounded repetition of a
# character class without escapes, so a length-bounded string cannot hold `\n`, `\"` or
# `\\` (python code in a plan would have to be one line). A bounded repetition of
# "character or escape" fixes that but makes each mask 10-1000x slower (measured: 3 ms
# mean, up to 500 ms, against 0.3 ms), since xgrammar cannot precompute it. So the
# grammar printed from the schema is patched: each length-bounded string becomes
# xgrammar's ordinary JSON string, escapes included. Its length is then bounded by the
# generation's `max_tokens`, and plan validation checks the plan's own limits exactly
# (`services.schemas`); every other bound of the schema (enums, item counts, required
# keys) stays in the grammar.
_BOUNDED_STRING = re.compile(r'^(\w+) ::= \(\("\\"" (\w+_characters)\{\d+, -?\d+\} "\\""\)\)$')
_STRING_RULES = {
    "basic_escape": r'basic_escape ::= (([\"\\/bfnrt]) | ("u" [A-Fa-f0-9] [A-Fa-f0-9] '
    r"[A-Fa-f0-9] [A-Fa-f0-9]))",
    "basic_string_sub": r'basic_string_sub ::= (("\"") | ([^\0-\x1f\"\\\r\n] basic_string_sub) '
    r'| ("\\" basic_escape basic_string_sub)) (=([ \n\r\t]* [,}\]:]))',
    "basic_string": r'basic_string ::= (("\"" basic_string_sub))',
}


def schema_grammar(schema: dict[str, Any]) -> str:
    """The EBNF grammar (xgrammar's dialect) of a JSON schema, compact one-line layout.

    That is the layout of `json.dumps` and of the prompt's few-shot plans, and it leaves
    the model no whitespace to spend tokens on. Length-bounded strings are patched to
    take JSON escapes (see above). Raises `ConstraintError` on a schema xgrammar cannot
    express.
    """
    xgr = _xgrammar()
    try:
        ebnf = str(
            xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
        )
    except Exception as exc:  # xgrammar raises its own and RuntimeError types
        raise ConstraintError(f"cannot compile the plan schema: {exc}") from exc
    lines = ebnf.splitlines()
    bounded = {}
    for i, line in enumerate(lines):
        if match := _BOUNDED_STRING.match(line):
            bounded[match.group(2)] = i
            lines[i] = f"{match.group(1)} ::= ((basic_string))"
    if bounded:
        lines = [line for line in lines if line.partition(" ::= ")[0] not in bounded]
        defined = {line.partition(" ::= ")[0] for line in lines}
        lines += [rule for name, rule in _STRING_RULES.items() if name not in defined]
    return "\n".join(lines) + "\n"


class SchemaConstraint:
    """Compiles JSON schemas against one llama.cpp model's vocabulary."""

    def __init__(self, llm: Any, *, threads: int = 1) -> None:
        xgr = _xgrammar()
        tokens, vocab_type, stops = vocabulary(llm)
        self.vocab_size = llm.n_vocab()
        self.stop_token_ids = stops
        self.tokenizer_info = xgr.TokenizerInfo(
            tokens,
            getattr(xgr.VocabType, vocab_type),
            vocab_size=self.vocab_size,
            stop_token_ids=stops,
        )
        self._compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=threads, cache_enabled=True
        )

    def compile(self, schema: dict[str, Any]) -> Any:
        """The compiled grammar of a schema (see `schema_grammar`); raises on a schema
        xgrammar cannot express."""
        grammar = schema_grammar(schema)
        try:
            return self._compiler.compile_grammar(grammar)
        except Exception as exc:
            raise ConstraintError(f"cannot compile the plan schema's grammar: {exc}") from exc

    def processor(self, compiled: Any) -> SchemaLogitsProcessor:
        return SchemaLogitsProcessor(compiled, self.vocab_size, self.stop_token_ids)


class SchemaLogitsProcessor:
    """A llama-cpp-python logits processor that keeps one generation inside a grammar.

    llama-cpp-python calls it before sampling each token with every token id so far (the
    prompt, then the sampled tokens); the first call marks where the prompt ends. It runs
    inside a ctypes callback, where a raised exception is printed and dropped and
    generation would go on unconstrained; so a failure is kept in `error`, every token but
    the stop tokens is masked to end the generation, and the caller raises `error`.
    """

    def __init__(self, compiled: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        xgr = _xgrammar()
        self._matcher = xgr.GrammarMatcher(compiled)
        self._vocab_size = vocab_size
        self._stops = stop_token_ids
        self.error: ConstraintError | None = None
        self._bitmask = np.full((1, (vocab_size + 31) // 32), -1, dtype=np.int32)
        self._seen: int | None = None
        self.steps = 0
        self.seconds = 0.0  # time spent in the matcher and the mask, for benchmarks

    @property
    def terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def __call__(self, input_ids: Any, scores: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        try:
            self._advance(input_ids)
            self._matcher.fill_next_token_bitmask(self._bitmask)
        except Exception as exc:
            if self.error is None:
                self.error = ConstraintError(f"constrained decoding failed: {exc}")
        if self.error is not None:
            stops = scores[self._stops].copy()
            scores[:] = -np.inf
            scores[self._stops] = stops
        else:
            allowed = np.unpackbits(self._bitmask[0].view(np.uint8), bitorder="little")
            scores[: self._vocab_size][allowed[: self._vocab_size] == 0] = -np.inf
        self.steps += 1
        self.seconds += time.perf_counter() - started
        return scores

    def _advance(self, input_ids: Any) -> None:
        """Feed the matcher the tokens sampled since the last call."""
        n = len(input_ids)
        if self._seen is None:
            self._seen = n
        for token in input_ids[self._seen : n]:
            if not self._matcher.accept_token(int(token)):
                raise ConstraintError(f"token {int(token)} is outside the grammar")
        self._seen = n
