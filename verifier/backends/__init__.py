"""Verifier model backends, chosen by `VERIFIER_BACKEND` and `VERIFIER_RUNTIME`."""

from __future__ import annotations

from pathlib import Path

from services.settings import VerifierSettings
from verifier.backends.base import VerifierBackend


def resolve_runtime(settings: VerifierSettings) -> str:
    """The runtime the model backend runs on. `auto`: llama.cpp for a catalog model on the
    CPU whose adapter has its GGUF conversion (`adapter.gguf`), transformers otherwise: a
    model directory (no catalog GGUF to run), a GPU (float16 on CUDA), or an adapter that
    was never converted."""
    if settings.runtime != "auto":
        return settings.runtime
    from services.catalog import MODELS
    from verifier.backends.model import adapter_dir_for

    adapter = adapter_dir_for(settings)
    if (
        settings.base_model in MODELS
        and settings.device == "cpu"
        and adapter is not None
        and (Path(adapter) / "adapter.gguf").is_file()
    ):
        return "llamacpp"
    return "transformers"


def create_backend(settings: VerifierSettings) -> VerifierBackend:
    if settings.backend == "scripted":
        from verifier.backends.scripted import ScriptedVerifier

        return ScriptedVerifier(script_path=settings.script_path)
    if settings.backend == "model" and resolve_runtime(settings) == "llamacpp":
        from verifier.backends.llamacpp import LlamaCppVerifier

        return LlamaCppVerifier(settings)
    if settings.backend == "model":
        from verifier.backends.model import ModelVerifier

        return ModelVerifier(settings)
    raise ValueError(f"unknown verifier backend {settings.backend!r}")


__all__ = ["VerifierBackend", "create_backend", "resolve_runtime"]
