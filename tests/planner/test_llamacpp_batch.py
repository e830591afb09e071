"""The llama.cpp backend's batch engine (`planner.backends.llamacpp_engine`).

SmolLM2-135M (fast) under a tight plan schema. The samples of a request decode as one
job; a request that arrives while another decodes joins the running batch; the prompt
prefix is evaluated once and re-evaluated when it changes; a full queue answers 503 with
Retry-After; a cancelled request leaves the batch within a token without disturbing the
others; every generation is counted.

"Same output alone or batched" is asserted where llama.cpp's CPU kernels are
batch-invariant: a KV view under 512 cells (a single-row step past that takes ggml's
split-KV attention, whose float sums differ from the multi-row kernel's), a model
without repacked 4-row GEMM weights (SmolLM2's Q4_1), and no cells freed while the
request decodes (a sequence's next cell may then land before its earlier ones, which
changes the order of its attention sums). The cases are kept that small on purpose;
docs/benchmarks/planner.md records where the invariance ends.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cli.pull import pull
from services.errors import InvalidRequest, Overloaded
from services.schemas import plan_json_schema
from services.settings import PlannerSettings

pytest.importorskip("llama_cpp")

pytestmark = [pytest.mark.model, pytest.mark.slow]

SYSTEM = {"role": "system", "content": "Answer with a plan as JSON."}
QUESTIONS = ["What is 12 times 7 minus 3?", "What is 5 plus 9 times 2?", "Halve 90, add 4."]


def tight_schema() -> dict[str, Any]:
    schema = plan_json_schema(["calc"])
    schema["properties"]["reasoning"]["maxLength"] = 40
    schema["properties"]["steps"]["maxItems"] = 2
    step = schema["properties"]["steps"]["items"]["properties"]
    step["input"]["pattern"] = "^[0-9+*/ ().-]{1,30}$"
    step["depends_on"]["maxItems"] = 1
    return schema


def make_backend(**settings: Any) -> Any:
    from planner.backends.llamacpp import LlamaCppBackend

    pull("smollm2-135m-instruct")
    values: dict[str, Any] = {
        "backend": "llamacpp",
        "model": "smollm2-135m-instruct",
        "n_ctx": 512,
        "n_threads": 1,
        "max_tokens": 200,
        "max_batch": 4,
    }
    values.update(settings)
    return LlamaCppBackend(PlannerSettings(**values))


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    b = make_backend()
    asyncio.run(b.load())
    yield b
    asyncio.run(b.close())


def request(
    n: int = 1,
    seed: int = 1,
    temperature: float = 0.7,
    question: str = QUESTIONS[0],
    system: dict[str, str] = SYSTEM,
    **kw: Any,
) -> Any:
    from planner.backends.base import GenerationRequest

    return GenerationRequest(
        messages=[system, {"role": "user", "content": question}],
        json_schema=kw.pop("schema", None) or tight_schema(),
        n=n,
        temperature=temperature,
        max_tokens=kw.pop("max_tokens", 200),
        seed=seed,
    )


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll the engine's state (it lives in another thread) until `condition` holds."""
    deadline = time.perf_counter() + timeout_s
    for _ in itertools.count():
        if condition():
            return
        if time.perf_counter() > deadline:
            raise AssertionError("the engine never reached the expected state")
        await asyncio.sleep(0.001)


async def once(backend: Any, req: Any) -> Any:
    return await backend.generate(req)


def run(backend: Any, req: Any) -> Any:
    return asyncio.run(once(backend, req))


def test_three_samples_decode_as_one_job_of_three_valid_plans(backend: Any) -> None:
    generation = run(backend, request(3))
    assert generation.stats.batch_sizes == [3]  # one job, not three decodes
    assert generation.usage.batch_size_max == 3
    assert len(generation.texts) == 3
    for text in generation.texts:
        data = json.loads(text)
        assert set(data) == {"reasoning", "steps", "answer_step"}
        assert all(step["tool"] == "calc" for step in data["steps"])
        assert len(data["reasoning"]) <= 40
    assert len(set(generation.texts)) > 1  # distinct seeds, distinct samples


def test_the_same_seeds_give_the_same_plans(backend: Any) -> None:
    first = run(backend, request(2, seed=5)).texts
    again = run(backend, request(2, seed=5)).texts
    other = run(backend, request(2, seed=6)).texts
    assert first == again
    assert first != other


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_sample_k_of_a_batch_is_what_its_seed_gives_alone(backend: Any, temperature: float) -> None:
    from planner.backends.base import SEED_STRIDE

    two = run(backend, request(2, temperature=temperature)).texts
    for k, text in enumerate(two):
        alone = request(1, seed=1 + k * SEED_STRIDE, temperature=temperature)
        assert run(backend, alone).texts == [text], k


def test_a_request_joins_the_running_batch_and_decodes_as_alone(backend: Any) -> None:
    many = {"type": "array", "items": {"type": "integer"}, "minItems": 300, "maxItems": 300}
    long = request(question="Count.", schema=many, max_tokens=300, seed=3)
    short = request(question=QUESTIONS[2], seed=4)
    alone = run(backend, short).texts

    async def together() -> tuple[Any, bool]:
        running = asyncio.create_task(backend.generate(long))
        await until(lambda: backend.engine.load[0] > 0)  # the long request is decoding
        await asyncio.sleep(0.2)
        joined = await backend.generate(short)
        still_running = not running.done()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return joined, still_running

    joined, still_running = asyncio.run(together())
    assert still_running  # the short request did not wait for the long one
    assert joined.usage.batch_size_max == 2  # it decoded alongside it
    assert joined.usage.queue_s < 0.5
    # Nothing was freed while it decoded, so its cells kept their order: its output is
    # what it gives alone (see the module docstring for when that does not hold).
    assert joined.texts == alone


def test_the_prefix_is_evaluated_once_and_again_when_it_changes(backend: Any) -> None:
    run(backend, request(question=QUESTIONS[0]))
    hit = run(backend, request(question=QUESTIONS[1])).usage
    assert hit.prefix_cached_tokens > 0
    # Only the question (and the template around it) is evaluated.
    assert hit.prompt_eval_tokens == hit.prompt_tokens - hit.prefix_cached_tokens
    assert hit.prompt_eval_tokens < 25

    other_system = {"role": "system", "content": "Answer with a plan as JSON. Use calc."}
    changed = run(backend, request(question=QUESTIONS[1], system=other_system))
    assert changed.usage.prefix_cached_tokens == 0  # a new prefix: evaluated, not reused
    assert changed.usage.prompt_eval_tokens == changed.usage.prompt_tokens
    again = run(backend, request(question=QUESTIONS[2], system=other_system)).usage
    assert again.prefix_cached_tokens > hit.prefix_cached_tokens  # the new one is cached

    fresh = make_backend()
    asyncio.run(fresh.load())
    try:  # what the cached prefix gives is what a fresh process gives
        expected = run(fresh, request(question=QUESTIONS[1], system=other_system)).texts
    finally:
        asyncio.run(fresh.close())
    assert run(backend, request(question=QUESTIONS[1], system=other_system)).texts == expected
    assert changed.texts == expected


def test_two_prompts_in_turn_both_stay_cached_and_the_least_recent_goes_first(
    backend: Any,
) -> None:
    prompts = [
        {"role": "system", "content": f"Answer with a plan as JSON, form {k}."} for k in "ABC"
    ]
    a, b, c = (request(question=QUESTIONS[0], system=p) for p in prompts)
    run(backend, a)
    run(backend, b)
    # the plan prompt and the chain-of-thought prompt of one request, in turn: both hit
    assert run(backend, a).usage.prefix_cached_tokens > 0
    assert run(backend, b).usage.prefix_cached_tokens > 0
    run(backend, c)  # a third prompt takes the slot of the least recently used (a)
    assert run(backend, b).usage.prefix_cached_tokens > 0
    assert run(backend, a).usage.prefix_cached_tokens == 0


def test_a_prompt_that_continues_a_cached_prefix_reuses_it_and_evicts_nothing(
    backend: Any,
) -> None:
    from dataclasses import replace

    plan_system, other_system = (
        {"role": "system", "content": f"Answer with a plan as JSON, pass {k}."} for k in "XY"
    )
    plan, other = request(system=plan_system), request(system=other_system)
    run(backend, plan)
    run(backend, other)  # both prefix slots are taken
    cached = run(backend, plan).usage.prefix_cached_tokens
    assert cached > 0
    # a second pass over a draft: the plan prompt, the question, the model's own draft,
    # then one more request; only the plan prompt is shared with other jobs
    second = replace(
        plan,
        messages=[
            plan_system,
            {"role": "user", "content": QUESTIONS[1]},
            {"role": "assistant", "content": "5 plus 18 is 23."},
            {"role": "user", "content": "Now the plan."},
        ],
        temperature=0.0,
    )
    got = run(backend, second)
    assert got.usage.prefix_cached_tokens == cached
    assert got.usage.prompt_eval_tokens == got.usage.prompt_tokens - cached
    # its own continuation was not cached in a slot: both shared prompts still hit
    assert run(backend, other).usage.prefix_cached_tokens > 0
    assert run(backend, plan).usage.prefix_cached_tokens == cached

    fresh = make_backend()
    asyncio.run(fresh.load())
    try:  # evaluated from the cached prefix, it gives what a fresh process gives
        assert run(fresh, second).texts == got.texts
    finally:
        asyncio.run(fresh.close())


def test_an_idle_cached_prefix_gives_its_cells_to_a_job_that_needs_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from planner.backends import llamacpp

    monkeypatch.setattr(llamacpp, "PREFIX_SLOT_CELLS", 0)  # no room set aside for b
    backend = make_backend(max_batch=1, n_ctx=4096, prefix_slots=2)
    long_a = {"role": "system", "content": "Answer with a plan as JSON. Use calc. " * 30}
    long_b = {"role": "system", "content": "Answer with a JSON plan. Use calc. " * 30}

    async def scenario() -> tuple[int, int]:
        await backend.load()
        try:
            await backend.generate(request(question=QUESTIONS[0], system=long_a))
            await backend.generate(request(question=QUESTIONS[0], system=long_b))
            engine = backend.engine
            assert engine is not None and len(engine._prefixes) == 2
            len_b = len(engine._prefixes[1].tokens)
            hit = (await backend.generate(request(question=QUESTIONS[0], system=long_a))).usage
            question = hit.prompt_tokens - hit.prefix_cached_tokens
            # a job on a that fits only without b's cells: b (idle) is evicted for it
            room = engine.n_cells - 512
            big = room - hit.prefix_cached_tokens - question - len_b // 2
            await backend.generate(request(question=QUESTIONS[0], system=long_a, max_tokens=big))
            b_again = (await backend.generate(request(question=QUESTIONS[0], system=long_b))).usage
            return hit.prefix_cached_tokens, b_again.prefix_cached_tokens
        finally:
            await backend.close()

    a_cached, b_cached = asyncio.run(scenario())
    assert a_cached > 200 and b_cached == 0


def test_a_full_queue_answers_overloaded_with_retry_after() -> None:
    backend = make_backend(max_batch=1, max_queued=1, n_ctx=2048)
    many = {"type": "array", "items": {"type": "integer"}, "minItems": 300, "maxItems": 300}
    long = request(schema=many, max_tokens=1500)

    async def scenario() -> Overloaded:
        await backend.load()
        try:
            running = asyncio.create_task(backend.generate(long))
            await until(lambda: backend.engine.load[0] > 0)
            queued = asyncio.create_task(backend.generate(long))
            await until(lambda: backend.engine.load[1] > 0)
            with pytest.raises(Overloaded) as refused:
                await backend.generate(long)
            running.cancel()
            queued.cancel()
            await asyncio.gather(running, queued, return_exceptions=True)
            # The queue drains: the next request is served.
            await backend.generate(request(schema={"type": "string"}, max_tokens=4))
            return refused.value
        finally:
            await backend.close()

    refused = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.retry_after_s is not None
    assert refused.retry_after_s >= 1
    assert "waiting" in refused.message


def test_a_cancelled_request_leaves_the_batch_within_a_token(backend: Any) -> None:
    many = {"type": "array", "items": {"type": "integer"}, "minItems": 300, "maxItems": 300}
    long = request(question="Count.", schema=many, max_tokens=400, seed=8)
    other = request(question=QUESTIONS[1], seed=9)
    alone = run(backend, other).texts

    async def scenario() -> tuple[list[str], float]:
        cancelled = asyncio.create_task(backend.generate(long))
        await until(lambda: backend.engine.load[0] > 0)
        kept = asyncio.create_task(backend.generate(other))
        await asyncio.sleep(0.3)
        cancelled.cancel()
        started = time.perf_counter()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await until(lambda: backend.engine.load[0] <= 1)  # its sequences left the batch
        left = time.perf_counter() - started
        return (await kept).texts, left

    texts, left = asyncio.run(scenario())
    assert left < 1.0  # a token of this model is milliseconds
    # The other request decoded on to a complete plan. (Not necessarily the one it gives
    # alone: its next cells reuse the freed ones, which changes the order of its
    # attention sums; see the module docstring.)
    data = json.loads(texts[0])
    assert set(data) == {"reasoning", "steps", "answer_step"}
    assert len(json.loads(alone[0])["steps"]) >= 1


def test_a_sequence_that_stops_early_does_not_stop_the_others(backend: Any) -> None:
    long = "no, and here is a much longer answer that takes many more tokens to write out"
    schema = {"type": "string", "enum": ["yes", long]}
    generation = run(backend, request(4, seed=3, temperature=1.5, schema=schema))
    texts = generation.texts
    tokens = [c["completion_tokens"] for c in generation.stats.per_completion]
    assert {json.loads(t) for t in texts} == {"yes", long}, texts  # both lengths in one job
    assert min(tokens) < 10 < max(tokens)
    assert all(c["finish_reason_length"] == 0 for c in generation.stats.per_completion)


def test_more_samples_than_the_batch_holds_run_as_several_jobs(backend: Any) -> None:
    generation = run(backend, request(6, max_tokens=60))
    assert len(generation.texts) == 6
    assert generation.stats.batch_sizes == [4, 2]


def test_a_prompt_longer_than_the_context_is_a_clear_error(backend: Any) -> None:
    with pytest.raises(InvalidRequest) as refused:
        run(backend, request(question="seven " * 600))
    assert "exceeds the planner's context" in refused.value.message
    assert run(backend, request(schema={"type": "string"}, max_tokens=4)).texts  # still serving


def test_generations_are_counted_under_vllms_metric_names(backend: Any) -> None:
    from prometheus_client import REGISTRY

    labels = {"model_name": "smollm2-135m-instruct"}

    def value(name: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    names = [
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_queue_time_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ]
    before = {name: value(name) for name in names}
    usage = run(backend, request(question=QUESTIONS[2])).usage
    after = {name: value(name) for name in names}
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == (
        usage.prompt_tokens
    )
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == (
        usage.completion_tokens
    )
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == (
        usage.prefix_cached_tokens
    )
    assert after["vllm:prefix_cache_queries_total"] > before["vllm:prefix_cache_queries_total"]
    assert after["vllm:request_queue_time_seconds_count"] == (
        before["vllm:request_queue_time_seconds_count"] + 1
    )
    assert after["vllm:e2e_request_latency_seconds_count"] == (
        before["vllm:e2e_request_latency_seconds_count"] + 1
    )


def test_a_failed_llama_cpp_step_fails_its_requests_with_503_and_the_engine_serves_on(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from planner.backends import llamacpp_engine
    from services.errors import DependencyUnavailable

    real = llamacpp_engine._decode
    calls: list[int] = []

    def failing(lib: Any, ctx: Any, batch: Any) -> None:
        calls.append(1)
        if len(calls) == 5:  # a few tokens in
            raise RuntimeError("llama_decode failed (-3)")
        real(lib, ctx, batch)

    monkeypatch.setattr(llamacpp_engine, "_decode", failing)
    with pytest.raises(DependencyUnavailable) as failed:
        run(backend, request(2, seed=11))
    assert failed.value.status_code == 503 and "llama_decode failed" in failed.value.message
    monkeypatch.setattr(llamacpp_engine, "_decode", real)
    # The cache was cleared with the failure: the next request evaluates the prefix again
    # and decodes as a fresh engine would.
    after = run(backend, request(question=QUESTIONS[1], seed=12))
    assert after.usage.prefix_cached_tokens == 0
    assert json.loads(after.texts[0])["steps"]


def test_a_job_the_cache_can_never_hold_is_refused_not_left_waiting() -> None:
    # a cache sized for 64-token plans and one prefix
    backend = make_backend(max_batch=2, max_tokens=64, prefix_slots=1)

    async def scenario() -> InvalidRequest:
        await backend.load()
        try:
            with pytest.raises(InvalidRequest) as refused:
                await asyncio.wait_for(backend.generate(request(2, max_tokens=480)), 30)
            return refused.value
        finally:
            await backend.close()

    assert "KV cells" in asyncio.run(scenario()).message


def test_messages_the_chat_template_refuses_fail_alone(backend: Any) -> None:
    """A job whose prompt cannot be rendered fails by itself (503); it neither stalls the
    queue nor fails the requests decoding beside it."""
    from planner.backends.base import GenerationRequest
    from services.errors import DependencyUnavailable

    broken = GenerationRequest(messages=[], json_schema=tight_schema(), max_tokens=50)

    async def scenario() -> tuple[BaseException | Any, Any]:
        ok = asyncio.create_task(backend.generate(request(question=QUESTIONS[1], seed=13)))
        await until(lambda: backend.engine.load[0] > 0)
        failed = await asyncio.gather(backend.generate(broken), return_exceptions=True)
        return failed[0], await ok

    failed, ok = asyncio.run(scenario())
    assert isinstance(failed, DependencyUnavailable) and "chat template" in failed.message
    assert json.loads(ok.texts[0])["steps"]
    assert backend.engine.load == (0, 0)


def test_free_text_samples_end_at_their_stop_string(backend: Any) -> None:
    """A request without a schema decodes free text; each sample ends with the token that
    completes its first stop string (kept in its text), not at the token limit."""
    from planner.backends.base import GenerationRequest

    req = GenerationRequest(
        messages=[SYSTEM, {"role": "user", "content": "Describe the sea in a long sentence."}],
        json_schema=None,
        n=2,
        temperature=0.7,
        max_tokens=60,
        seed=3,
        stop=[" "],
    )
    generation = run(backend, req)
    assert len(generation.texts) == 2
    for text, figures in zip(generation.texts, generation.stats.per_completion, strict=True):
        # "The sea": the token " sea" holds the first space after the first word
        assert " " in text and text.strip().count(" ") <= 1, text
        assert figures["finish_reason_length"] == 0.0
