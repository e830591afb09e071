"""scripts/bench_planner.py's recorder: per-question calls under concurrency, and timing
for a backend that reports no stats of its own (the openai backend)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from planner.backends.base import Generation, GenerationRequest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_planner.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_planner", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_planner", module)
    spec.loader.exec_module(module)
    return module


class SlowBackend:
    """Answers after a delay, with no stats of its own (like an HTTP endpoint)."""

    name = "fake"
    model = "fake-model"

    async def generate(self, request: GenerationRequest) -> Generation:
        await asyncio.sleep(0.05)
        return Generation(texts=[request.messages[0]["content"]], completion_tokens=10)


def request(text: str) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], json_schema={})


@pytest.mark.unit
async def test_recorder_times_calls_and_keeps_each_questions_calls_apart() -> None:
    module = bench()
    recorder = module.Recorder(SlowBackend())

    async def question(name: str, calls: int) -> list[str]:
        mine: list[tuple[Generation, object]] = []
        module._question_calls.set(mine)
        for _ in range(calls):
            await recorder.generate(request(name))
        return [generation.texts[0] for generation, _ in mine]

    a, b = await asyncio.gather(question("a", 2), question("b", 3))
    assert (a, b) == (["a", "a"], ["b", "b", "b"])  # interleaved, yet kept per question
    assert len(recorder.calls) == 5
    for _, stats in recorder.calls:
        assert stats.completion_tokens == 10 and stats.prompt_eval_s == 0.0
        assert stats.wall_s >= 0.05  # the call's own wall time


@pytest.mark.unit
async def test_recorder_prefers_the_backends_own_stats() -> None:
    module = bench()
    own = SimpleNamespace(completion_tokens=7, wall_s=1.0, prompt_eval_s=0.2)

    class OwnStats(SlowBackend):
        async def generate(self, request: GenerationRequest) -> Generation:
            generation = await super().generate(request)
            generation.stats = own
            return generation

    generation, stats = await module.Recorder(OwnStats()).measure(request("x"))
    assert stats is own and generation.texts == ["x"]
