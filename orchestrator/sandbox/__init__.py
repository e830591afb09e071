"""Python sandbox for model-written code: a static check plus a confined worker pool."""

from orchestrator.sandbox.sandbox import (
    Sandbox,
    SandboxResult,
    SandboxSettings,
    SandboxUnavailableError,
)

__all__ = ["Sandbox", "SandboxResult", "SandboxSettings", "SandboxUnavailableError"]
