"""The planner's warm-up: on a backend that caches prompt prefixes, the plan prompt's
prefix is evaluated once after the model loads and before the service says it is ready,
with the prompt a real request has before its question; a failed warm-up leaves the
service ready; a backend that caches nothing is not asked."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from planner.backends.base import Generation, GenerationRequest
from planner.prompting import build_messages
from planner.service import WARM_UP_QUESTION, PlannerService
from services.schemas import PlanRequest, ToolSpec
from services.settings import PlannerSettings
from services.toolspecs import DEFAULT_TOOLS

pytestmark = pytest.mark.unit

PLAN = (
    '{"reasoning": "add", "steps": [{"id": "s1", "tool": "python", '
    '"input": "result = 14", "depends_on": []}], "answer_step": "s1"}'
)


class PrefixBackend:
    """Records each generation and whether the service said it was ready then."""

    name = "prefix"
    model = "prefix"

    def __init__(self, caches_prefixes: bool = True, fail: bool = False) -> None:
        self.caches_prefixes = caches_prefixes
        self.fail = fail
        self.host: PlannerService | None = None
        self.calls: list[tuple[GenerationRequest, bool]] = []

    async def load(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> Generation:
        assert self.host is not None
        self.calls.append((request, self.host.ready))
        if self.fail and request.metadata.get("warm_up"):
            raise RuntimeError("engine busy")
        return Generation(texts=[PLAN] * request.n)

    async def close(self) -> None: ...


def service(backend: PrefixBackend, **settings: object) -> PlannerService:
    host = PlannerService(backend, PlannerSettings(**settings))  # type: ignore[arg-type]
    backend.host = host
    return host


@pytest.mark.parametrize("fmt", ["json", "draft"])
async def test_the_plan_prefix_is_evaluated_before_the_service_is_ready(fmt: str) -> None:
    backend = PrefixBackend()
    host = service(backend, plan_format=fmt)
    await host.load()
    assert host.ready
    [(warm, ready_then)] = backend.calls
    assert not ready_then and warm.max_tokens == 1 and warm.n == 1
    assert (warm.json_schema is None) == (fmt == "draft")

    # a request as the orchestrator sends it: its registry's tool specs (DEFAULT_TOOLS,
    # in order: tests/orchestrator/test_registry.py), through the wire schema
    specs = [ToolSpec.model_validate(s.model_dump()) for s in DEFAULT_TOOLS]
    await host.plan(PlanRequest(question="What is 2 * 7?", tools=specs))
    asked = backend.calls[1][0].messages
    # everything before the question is the same prompt, so the cached prefix serves it
    assert warm.messages[:-1] == asked[:-1]
    assert (
        warm.messages[-1]["content"].replace(WARM_UP_QUESTION, "What is 2 * 7?")
        == (asked[-1]["content"])
    )
    assert warm.messages == build_messages(WARM_UP_QUESTION, list(DEFAULT_TOOLS), None, fmt)


async def test_a_failed_warm_up_leaves_the_service_ready_and_says_so() -> None:
    backend = PrefixBackend(fail=True)
    host = service(backend)
    with capture_logs() as logs:
        await host.load()
    assert host.ready
    assert any(e.get("event.action") == "model.warm_up" for e in logs)


@pytest.mark.parametrize(
    ("backend", "settings"),
    [(PrefixBackend(caches_prefixes=False), {}), (PrefixBackend(), {"warm_up": False})],
)
async def test_no_warm_up_without_a_prefix_cache_or_when_turned_off(
    backend: PrefixBackend, settings: dict[str, object]
) -> None:
    host = service(backend, **settings)
    await host.load()
    assert host.ready and backend.calls == []
