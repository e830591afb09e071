"""What every tool implementation looks like to the orchestrator.

A tool is an async callable taking the step's input text and a `ToolContext`, returning a
JSON-safe value (str, int, float, bool, list, dict or None). Expected failures (bad input,
refused query, not found) raise `ToolError` with a message fit for the caller; the
registry turns timeouts and failures into step statuses and runs the fallback chain.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


class ToolError(Exception):
    """The tool ran and failed on this input; the message is shown to the caller."""


class ToolRefused(ToolError):
    """The input was refused by a security check (logged as a security event)."""

    def __init__(self, message: str, *, category: str) -> None:
        super().__init__(message)
        self.category = category


@dataclass
class ToolContext:
    trace_id: str = ""
    tenant: str = "default"
    # Results of earlier steps, by step id ("s1", "s2" ...), as values.
    values: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 5.0
    # Who the per-tenant sandbox share counts (default: `tenant`): the client address
    # when no API keys are configured, while the caches stay in one namespace.
    limits_tenant: str | None = None
    # False: neither read nor fill the tool cache (a counterfactual run's inputs are not
    # a plan's, orchestrator.contribution)
    use_cache: bool = True


ToolFn = Callable[[str, ToolContext], Awaitable[Any]]
