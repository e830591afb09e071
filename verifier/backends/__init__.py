"""Verifier model backends, chosen by `VERIFIER_BACKEND`."""

from __future__ import annotations

from services.settings import VerifierSettings
from verifier.backends.base import VerifierBackend


def create_backend(settings: VerifierSettings) -> VerifierBackend:
    if settings.backend == "scripted":
        from verifier.backends.scripted import ScriptedVerifier

        return ScriptedVerifier(script_path=settings.script_path)
    if settings.backend == "model" and settings.runtime == "llamacpp":
        from verifier.backends.llamacpp import LlamaCppVerifier

        return LlamaCppVerifier(settings)
    if settings.backend == "model":
        from verifier.backends.model import ModelVerifier

        return ModelVerifier(settings)
    raise ValueError(f"unknown verifier backend {settings.backend!r}")


__all__ = ["VerifierBackend", "create_backend"]
