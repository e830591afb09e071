"""Plan-generating model backends, chosen by `PLANNER_BACKEND`."""

from __future__ import annotations

from planner.backends.base import GenerationRequest, PlanBackend
from services.settings import PlannerSettings


def create_backend(settings: PlannerSettings) -> PlanBackend:
    """Build the configured backend without loading it (loading happens at startup)."""
    if settings.backend == "scripted":
        from planner.backends.scripted import ScriptedBackend

        return ScriptedBackend(script_path=settings.script_path)
    if settings.backend == "llamacpp":
        from planner.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend(settings)
    if settings.backend == "vllm":
        from planner.backends.vllm import VllmBackend

        return VllmBackend(settings)
    if settings.backend == "openai":
        from planner.backends.openai import OpenAIBackend

        return OpenAIBackend(settings)
    raise ValueError(f"unknown planner backend {settings.backend!r}")


__all__ = ["GenerationRequest", "PlanBackend", "create_backend"]
