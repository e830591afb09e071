"""The interface every planner backend implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class GenerationRequest:
    """One constrained generation: chat messages in, `n` JSON texts out."""

    messages: list[dict[str, str]]
    json_schema: dict[str, Any]
    n: int = 1
    temperature: float = 0.3
    top_p: float = 0.85
    max_tokens: int = 512
    seed: int | None = None
    # Free-form hints for scripted backends in tests; real backends ignore them.
    question: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    texts: list[str]
    prompt_tokens: int = 0
    completion_tokens: int = 0


class PlanBackend(Protocol):
    name: str
    model: str

    async def load(self) -> None:
        """Load the model; raise with a clear message when it cannot be loaded."""

    async def generate(self, request: GenerationRequest) -> Generation:
        """Return `request.n` completions, each constrained to `request.json_schema`."""

    async def close(self) -> None: ...
