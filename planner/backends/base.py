"""The interface every planner backend implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class GenerationRequest:
    """One generation: chat messages in, `n` texts out, each held to `json_schema` (None:
    free text, e.g. a draft the planner turns into a plan itself)."""

    messages: list[dict[str, str]]
    json_schema: dict[str, Any] | None
    n: int = 1
    temperature: float = 0.3
    top_p: float = 0.85
    max_tokens: int = 512
    seed: int | None = None
    # Index of the first sample asked for: samples first_sample .. first_sample + n - 1 of
    # the same request, so a second call for more samples draws new ones. llama.cpp gives
    # each sample the seed a single call for all of them would have; OpenAI-compatible
    # servers and vLLM take one seed per call, so there the later samples are new but not
    # the same as one call's.
    first_sample: int = 0
    # Free text only: a completion ends at the first of these strings (backends keep or
    # drop the string itself; callers must accept both).
    stop: list[str] = field(default_factory=list)
    # Free-form hints for scripted backends in tests; real backends ignore them.
    question: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


SEED_STRIDE = 7919  # the k-th sample's seed: seed + k * stride (a prime, so they differ)


def sample_seeds(request: GenerationRequest, default: int) -> list[int]:
    """The seed of each sample `request` asks for."""
    base = request.seed if request.seed is not None else default
    return [base + (request.first_sample + k) * SEED_STRIDE for k in range(request.n)]


@dataclass
class Usage:
    """What one generation cost, for the planner's log line (backends that know more than
    the token counts fill the rest)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefix_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    prompt_eval_tokens: int = 0  # prompt tokens evaluated
    queue_s: float = 0.0  # waiting for room in the running batch
    prefill_s: float = 0.0
    decode_s: float = 0.0
    constraint_s: float = 0.0  # in the grammar engine
    batch_size_max: int = 0  # most sequences decoded together while this one decoded

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            prefix_cached_tokens=self.prefix_cached_tokens + other.prefix_cached_tokens,
            prompt_eval_tokens=self.prompt_eval_tokens + other.prompt_eval_tokens,
            queue_s=self.queue_s + other.queue_s,
            prefill_s=self.prefill_s + other.prefill_s,
            decode_s=self.decode_s + other.decode_s,
            constraint_s=self.constraint_s + other.constraint_s,
            batch_size_max=max(self.batch_size_max, other.batch_size_max),
        )

    def log_fields(self) -> dict[str, Any]:
        """As log fields: OpenTelemetry's gen_ai names for the usage, `planner.*` for the
        rest."""
        return {
            "gen_ai.usage.input_tokens": self.prompt_tokens,
            "gen_ai.usage.output_tokens": self.completion_tokens,
            "planner.prefix_cached_tokens": self.prefix_cached_tokens,
            "planner.prompt_eval_tokens": self.prompt_eval_tokens,
            "planner.queue_s": round(self.queue_s, 4),
            "planner.prefill_s": round(self.prefill_s, 4),
            "planner.decode_s": round(self.decode_s, 4),
            "planner.constraint_s": round(self.constraint_s, 4),
            "planner.batch_size_max": self.batch_size_max,
        }


@dataclass
class Generation:
    texts: list[str]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage: Usage | None = None  # None: the backend reports only the token counts
    # The backend's own figures for this call, where it has more than `usage` (llama.cpp:
    # its GenerationStats, per-completion counts and batch sizes); benchmarks read them.
    stats: Any = None

    def cost(self) -> Usage:
        return self.usage or Usage(
            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens
        )


class PlanBackend(Protocol):
    name: str
    model: str

    async def load(self) -> None:
        """Load the model; raise with a clear message when it cannot be loaded."""

    async def generate(self, request: GenerationRequest) -> Generation:
        """Return `request.n` completions, each constrained to `request.json_schema` (free
        text when it is None)."""

    async def close(self) -> None: ...
