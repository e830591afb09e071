"""The llama.cpp backend's batched n: the n samples of one request decode as one batch.

SmolLM2-135M (fast) under a tight plan schema: a batch returns n schema-valid plans, the
same seeds give the same plans, each sequence's output is what it is alone (with flash
attention, see `planner.backends.batch_decode`), n = 1 through the batch equals the
sequential path, a sequence that stops early leaves the others running, and a cancel
frees the model within a token.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from services import catalog
from services.schemas import plan_json_schema
from services.settings import PlannerSettings

pytest.importorskip("llama_cpp")

pytestmark = [pytest.mark.model, pytest.mark.slow]

MESSAGES = [
    {"role": "system", "content": "Answer with a plan as JSON."},
    {"role": "user", "content": "What is 12 times 7 minus 3?"},
]


def tight_schema() -> dict[str, Any]:
    schema = plan_json_schema(["calc"])
    schema["properties"]["reasoning"]["maxLength"] = 40
    schema["properties"]["steps"]["maxItems"] = 2
    step = schema["properties"]["steps"]["items"]["properties"]
    step["input"]["pattern"] = "^[0-9+*/ ().-]{1,30}$"
    step["depends_on"]["maxItems"] = 1
    return schema


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    from planner.backends.llamacpp import LlamaCppBackend

    catalog.pull("smollm2-135m-instruct")
    settings = PlannerSettings(
        backend="llamacpp", model="smollm2-135m-instruct", n_ctx=1024, n_threads=1
    )
    b = LlamaCppBackend(settings, max_batch=4)
    asyncio.run(b.load())
    yield b
    asyncio.run(b.close())


def request(n: int, seed: int = 1, temperature: float = 0.7, **kw: Any) -> Any:
    from planner.backends.base import GenerationRequest

    return GenerationRequest(
        messages=MESSAGES,
        json_schema=kw.pop("schema", None) or tight_schema(),
        n=n,
        temperature=temperature,
        max_tokens=kw.pop("max_tokens", 200),
        seed=seed,
    )


def test_a_batch_of_three_returns_three_schema_valid_plans(backend: Any) -> None:
    texts = asyncio.run(backend.generate(request(3))).texts
    assert backend.last_stats.batch_sizes == [3]  # one batch, not three decodes
    assert len(texts) == 3
    for text in texts:
        data = json.loads(text)
        assert set(data) == {"reasoning", "steps", "answer_step"}
        assert all(step["tool"] == "calc" for step in data["steps"])
        assert len(data["reasoning"]) <= 40
    assert len(set(texts)) > 1  # distinct seeds, distinct samples


def test_the_same_seeds_give_the_same_plans(backend: Any) -> None:
    first = asyncio.run(backend.generate(request(3, seed=5))).texts
    again = asyncio.run(backend.generate(request(3, seed=5))).texts
    other = asyncio.run(backend.generate(request(3, seed=6))).texts
    assert first == again
    assert first != other


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_sequence_decodes_the_same_alone_and_in_a_batch_of_four(
    backend: Any, temperature: float
) -> None:
    from planner.backends.llamacpp import SEED_STRIDE

    cancel = threading.Event()
    four = backend._generate_batched(request(4, temperature=temperature), cancel).texts
    assert backend.last_stats.batch_sizes == [4]
    for k, text in enumerate(four):
        alone = request(1, seed=1 + k * SEED_STRIDE, temperature=temperature)
        assert backend._generate_batched(alone, cancel).texts == [text], k


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_n1_through_the_batch_equals_the_sequential_path(backend: Any, temperature: float) -> None:
    cancel = threading.Event()
    backend._llm.reset()  # both from an empty cache: the same prompt evaluation
    sequential = backend._generate_sequential(request(1, temperature=temperature), cancel)
    backend._llm.reset()
    batched = backend._generate_batched(request(1, temperature=temperature), cancel)
    assert batched.texts == sequential.texts
    # And n > 1 sequentially vs batched: sample k has the same seed on both paths.
    backend.batched = False
    try:
        sequential = asyncio.run(backend.generate(request(3, seed=2)))
    finally:
        backend.batched = True
    batched = asyncio.run(backend.generate(request(3, seed=2)))
    assert backend.last_stats.batch_sizes == [3]
    assert batched.texts == sequential.texts


def test_a_sequence_that_stops_early_does_not_stop_the_others(backend: Any) -> None:
    long = "no, and here is a much longer answer that takes many more tokens to write out"
    schema = {"type": "string", "enum": ["yes", long]}
    texts = asyncio.run(backend.generate(request(4, seed=3, temperature=1.5, schema=schema))).texts
    tokens = [c["completion_tokens"] for c in backend.last_stats.per_completion]
    assert {json.loads(t) for t in texts} == {"yes", long}, texts  # both lengths in one batch
    assert min(tokens) < 10 < max(tokens)
    assert all(c["finish_reason_length"] == 0 for c in backend.last_stats.per_completion)


def test_more_samples_than_the_batch_holds_run_as_several_batches(backend: Any) -> None:
    texts = asyncio.run(backend.generate(request(6, max_tokens=60))).texts
    assert len(texts) == 6
    assert backend.last_stats.batch_sizes == [4, 2]


def test_a_cancelled_batch_frees_the_model_at_once(backend: Any) -> None:
    many = {"type": "array", "items": {"type": "integer"}, "minItems": 400, "maxItems": 400}
    long = request(3, schema=many, max_tokens=2000)
    short = request(2, schema={"type": "string"}, max_tokens=4)

    async def scenario() -> float:
        task = asyncio.create_task(backend.generate(long))
        await asyncio.sleep(1.0)
        task.cancel()
        started = time.perf_counter()
        with pytest.raises(asyncio.CancelledError):
            await task
        await backend.generate(short)
        assert backend.last_stats.batch_sizes == [2]
        return time.perf_counter() - started

    # 3 x 400 numbers take minutes here; the next request must not wait for them.
    assert asyncio.run(scenario()) < 10
