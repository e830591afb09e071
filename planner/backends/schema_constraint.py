"""JSON-schema constrained decoding for llama.cpp with xgrammar.

llama.cpp's own GBNF sampler checks the grammar against every token of the vocabulary
(151k for Qwen) at every step, a large share of a small model's time per token
(docs/benchmarks/planner.md). xgrammar, the engine vLLM uses for structured outputs, compiles the
schema once into a pushdown automaton whose per-state token masks are mostly precomputed,
so a step is a mask fill plus one masked write over the logits.

`SchemaConstraint` holds what is per model (the tokenizer description and the compiler
with its cache of compiled schemas); `SchemaLogitsProcessor` is per generation: it feeds
each sampled token to its matcher and masks the next step's logits. A token the matcher
rejects is an error, never silently ignored, and a schema xgrammar cannot compile raises
instead of falling back to unconstrained decoding.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import numpy as np

from services.errors import DependencyUnavailable


class ConstraintError(DependencyUnavailable):
    """The model's vocabulary or the schema cannot be used for constrained decoding, or the
    grammar engine failed mid-generation: the planner answers 503, never an unconstrained
    plan."""

    error_type = "constraint_failed"


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:
        raise ConstraintError(
            f"the llamacpp backend's xgrammar constraint needs xgrammar: "
            f"pip install -e '.[llamacpp]' ({exc})"
        ) from None
    return xgrammar


def vocabulary(llm: Any) -> tuple[list[bytes], list[int]]:
    """The bytes each token id decodes to, and the model's stop (end-of-generation) tokens.

    Pieces are taken as llama.cpp renders them, so byte-level BPE, byte-fallback
    SentencePiece and added tokens all arrive as the plain bytes they stand for (xgrammar's
    RAW vocabulary). Control, unused and unknown tokens render as nothing, which xgrammar
    treats as special: they can never appear inside a plan (a `<|im_start|>` in a string
    would otherwise be allowed as its literal text).
    """
    import ctypes

    from llama_cpp import llama_cpp as lib

    vocab = lib.llama_model_get_vocab(llm.model)
    buf = ctypes.create_string_buffer(256)
    pieces: list[bytes] = []
    stops: list[int] = []
    for token in range(llm.n_vocab()):
        if lib.llama_vocab_is_eog(vocab, token):
            stops.append(token)
        n = lib.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
        if n < 0:  # the piece is longer than the buffer: -n is its length
            buf = ctypes.create_string_buffer(-n)
            n = lib.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
        pieces.append(buf.raw[:n])
    if not stops:
        raise ConstraintError("the model declares no end-of-generation token")
    return pieces, stops


# xgrammar 0.2.8 turns a string with minLength/maxLength into a bounded repetition of a
# character class without escapes, so a length-bounded string cannot hold `\n`, `\"` or
# `\\`: a plan's python could not have a second line. A bounded repetition of "character
# or escape" makes each mask 10-1000x slower (measured: 3 ms mean, up to 500 ms, against
# 0.3 ms), since xgrammar cannot precompute it. So the string fields that carry code or
# queries (`ESCAPED_FIELDS`, the plan steps' `input`) become xgrammar's ordinary JSON
# string, escapes included and non-empty where minLength >= 1; their maximum length is
# bounded by the generation's `max_tokens` and by plan validation (`services.schemas`).
# Every other string keeps xgrammar's bounded form, so free text such as the plan's
# `reasoning` cannot run on, and every other bound of the schema stays in the grammar.
ESCAPED_FIELDS = frozenset({"input"})
_CHARACTERS = r" ::= (([^\"\\\r\n]))"  # the class of xgrammar's bounded strings
_TEXT_CHARACTERS = r" ::= (([^\0-\x1f\"\\\r\n]))"
_MARK = "__escaped_string_{}__"
_STRING_RULES = {
    "basic_escape": r'basic_escape ::= (([\"\\/bfnrt]) | ("u" [A-Fa-f0-9] [A-Fa-f0-9] '
    r"[A-Fa-f0-9] [A-Fa-f0-9]))",
    "basic_string_sub": r'basic_string_sub ::= (("\"") | ([^\0-\x1f\"\\\r\n] basic_string_sub) '
    r'| ("\\" basic_escape basic_string_sub)) (=([ \n\r\t]* [,}\]:]))',
    "basic_string": r'basic_string ::= (("\"" basic_string_sub))',
    "escaped_nonempty_string": r'escaped_nonempty_string ::= (("\"" ([^\0-\x1f\"\\\r\n] '
    r'| ("\\" basic_escape)) basic_string_sub))',
}


def _mark_escaped(node: Any, fields: frozenset[str], marks: dict[str, int]) -> Any:
    """A copy of the schema in which each plain string property named in `fields` is a
    one-value enum of a unique marker (its minLength kept in `marks`)."""
    if isinstance(node, list):
        return [_mark_escaped(item, fields, marks) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            properties = {}
            for name, sub in value.items():
                plain = isinstance(sub, dict) and sub.get("type") == "string"
                if name in fields and plain and not {"enum", "const", "pattern"} & sub.keys():
                    mark = _MARK.format(len(marks))
                    marks[mark] = int(sub.get("minLength", 0))
                    properties[name] = {"type": "string", "enum": [mark]}
                else:
                    properties[name] = _mark_escaped(sub, fields, marks)
            out[key] = properties
        else:
            out[key] = _mark_escaped(value, fields, marks)
    return out


def schema_grammar(schema: dict[str, Any], escaped: frozenset[str] = ESCAPED_FIELDS) -> str:
    """The EBNF grammar (xgrammar's dialect) of a JSON schema, compact one-line layout.

    That is the layout of `json.dumps` and of the prompt's few-shot plans, and it leaves
    the model no whitespace to spend tokens on. String properties named in `escaped` take
    JSON escapes (see above). Raises `ConstraintError` on a schema xgrammar cannot
    express. Cached: the schema repeats for every request with the same tools.
    """
    return _schema_grammar(json.dumps(schema), escaped)  # key order matters: no sort_keys


@functools.lru_cache(maxsize=32)
def _schema_grammar(schema_json: str, escaped: frozenset[str]) -> str:
    xgr = _xgrammar()
    marks: dict[str, int] = {}
    marked = _mark_escaped(json.loads(schema_json), escaped, marks)
    try:
        ebnf = str(
            xgr.Grammar.from_json_schema(json.dumps(marked), any_whitespace=False, strict_mode=True)
        )
    except Exception as exc:  # xgrammar raises its own and RuntimeError types
        raise ConstraintError(f"cannot compile the plan schema: {exc}") from exc
    for mark, min_length in marks.items():
        literal = f'"\\"{mark}\\""'
        if literal not in ebnf:
            raise ConstraintError(f"xgrammar printed the schema in an unexpected form ({mark})")
        rule = "escaped_nonempty_string" if min_length > 0 else "basic_string"
        ebnf = ebnf.replace(literal, rule)
    # The bounded strings' class lets raw control characters through, which JSON forbids.
    ebnf = ebnf.replace(_CHARACTERS, _TEXT_CHARACTERS)
    lines = ebnf.splitlines()
    if marks:
        defined = {line.partition(" ::= ")[0] for line in lines}
        lines += [rule for name, rule in _STRING_RULES.items() if name not in defined]
    return "\n".join(lines) + "\n"


class SchemaConstraint:
    """Compiles JSON schemas against one llama.cpp model's vocabulary."""

    def __init__(self, llm: Any, *, threads: int = 1) -> None:
        xgr = _xgrammar()
        pieces, stops = vocabulary(llm)
        self.vocab_size = llm.n_vocab()
        self.stop_token_ids = stops
        self.tokenizer_info = xgr.TokenizerInfo(
            pieces, xgr.VocabType.RAW, vocab_size=self.vocab_size, stop_token_ids=stops
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
    the stop tokens is masked to end the generation, and the backend raises `error` once
    the completion has stopped. Speculative decoding (a draft model) would feed it tokens
    that are later rejected, with no rollback: the backend does not use one.
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

    def __call__(self, input_ids: Any, scores: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        try:
            if self.error is None:
                if len(scores) != self._vocab_size:
                    raise ConstraintError(
                        f"{len(scores)} logits for a vocabulary of {self._vocab_size}"
                    )
                self._advance(input_ids)
                self._matcher.fill_next_token_bitmask(self._bitmask)
                allowed = np.unpackbits(self._bitmask[0].view(np.uint8), bitorder="little")
                scores[allowed[: self._vocab_size] == 0] = -np.inf
        except Exception as exc:
            self.error = ConstraintError(f"constrained decoding failed: {exc}")
        if self.error is not None:
            # Only a stop token stays possible: the completion ends at this step.
            mask = np.ones(len(scores), dtype=bool)
            mask[[t for t in self._stops if t < len(scores)]] = False
            scores[mask] = -np.inf
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
