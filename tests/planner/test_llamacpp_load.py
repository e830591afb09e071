"""What the llama.cpp backend asks of llama.cpp when it loads: threads, sequences, KV
cache and flash attention, from the settings (no model is loaded)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

import planner.backends.llamacpp as llamacpp
from planner.backends.llamacpp import PREFIX_SLOT_CELLS, LlamaCppBackend
from services.settings import PlannerSettings

pytestmark = pytest.mark.unit


def load_kwargs(monkeypatch: pytest.MonkeyPatch, backend: LlamaCppBackend) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake_open(path: Any, **kwargs: Any) -> str:
        seen.update(kwargs)
        return "llm"

    monkeypatch.setattr(llamacpp, "open_llama", fake_open)
    monkeypatch.setitem(sys.modules, "llama_cpp", object())  # not needed to be installed
    assert backend._load(Path("model.gguf")) == "llm"
    return seen


def test_batch_steps_use_every_core_and_one_token_steps_one_fewer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cores = len(os.sched_getaffinity(0))
    kwargs = load_kwargs(monkeypatch, LlamaCppBackend(PlannerSettings(backend="llamacpp")))
    assert kwargs["n_threads"] == max(1, cores - 1)
    assert kwargs["n_threads_batch"] == cores


def test_thread_settings_are_taken_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_N_THREADS", "3")
    monkeypatch.setenv("PLANNER_N_THREADS_BATCH", "5")
    kwargs = load_kwargs(monkeypatch, LlamaCppBackend(PlannerSettings(backend="llamacpp")))
    assert (kwargs["n_threads"], kwargs["n_threads_batch"]) == (3, 5)


def test_the_engine_gets_a_sequence_per_sample_plus_the_prefixes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = PlannerSettings(
        backend="llamacpp", max_batch=4, n_ctx=2048, max_tokens=256, prefix_slots=3
    )
    kwargs = load_kwargs(monkeypatch, LlamaCppBackend(settings))
    assert kwargs["n_seq_max"] == 4 + 3 and kwargs["flash_attn"] is True
    # One prompt, three more completions, one prefill chunk of slack, two more prefixes.
    assert kwargs["n_ctx"] == 2048 + 3 * 256 + 512 + 2 * PREFIX_SLOT_CELLS
    sequential = load_kwargs(monkeypatch, LlamaCppBackend(settings, batching=False))
    assert sequential["n_seq_max"] == 1 and sequential["flash_attn"] is False
    assert sequential["n_ctx"] == 2048


def test_the_gbnf_engine_takes_the_sequential_path() -> None:
    settings = PlannerSettings(backend="llamacpp", grammar_engine="gbnf")
    assert LlamaCppBackend(settings).batching is False


def test_a_request_without_a_schema_decodes_free_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft (json_schema None) gets no grammar, a plan request gets the plan's; the
    unconstrained backend never gets one."""
    from planner.backends.base import GenerationRequest

    backend = LlamaCppBackend(PlannerSettings(backend="llamacpp"))
    compiled: list[dict[str, Any]] = []
    monkeypatch.setattr(backend, "grammar", lambda schema: compiled.append(schema) or "g")
    schema = {"type": "object"}
    assert backend._grammar_for(GenerationRequest(messages=[], json_schema=None)) is None
    assert backend._grammar_for(GenerationRequest(messages=[], json_schema=schema)) == "g"
    assert compiled == [schema]
    free = LlamaCppBackend(PlannerSettings(backend="llamacpp"), constrained=False)
    assert free._grammar_for(GenerationRequest(messages=[], json_schema=schema)) is None
