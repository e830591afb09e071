"""Caches: tool results by tenant, tool and normalized input with the tool's TTL in the
real Redis; a Redis that is down or slow means no cache, never an error; the in-process
cache and the keys."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from orchestrator.cache import MemoryCache, RedisCache, make_key
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import Tool, ToolRegistry
from services.schemas import ToolSpec
from tests.conftest import REDIS_TEST_TIMEOUT_S, REDIS_URL, free_port


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, text: str, ctx: ToolContext) -> Any:
        self.calls += 1
        return {"answer": text.upper(), "n": self.calls}


def registry(cache: Any, ttl_s: float) -> tuple[ToolRegistry, Counting]:
    fn = Counting()
    reg = ToolRegistry(cache)
    name = "t" + uuid.uuid4().hex[:8]  # keys unique to this test run
    reg.register(
        Tool(
            ToolSpec(name=name, description="d", input_format="f"),
            fn,
            timeout_s=1,
            cache_ttl_s=ttl_s,
        )
    )
    return reg, fn


@pytest.mark.integration
async def test_tool_results_are_cached_in_redis_per_tenant_with_ttl() -> None:
    cache = RedisCache(REDIS_URL, timeout_s=REDIS_TEST_TIMEOUT_S)
    try:
        reg, fn = registry(cache, ttl_s=0.5)
        name = reg.names[0]
        a = ToolContext(tenant="a", timeout_s=1)
        first = (await reg.run(name, "Hello  World", a)).result
        second = (await reg.run(name, "hello world", a)).result
        assert (first.source, second.source) == ("tool", "cache")
        assert second.output == first.output and fn.calls == 1
        other = (await reg.run(name, "hello world", ToolContext(tenant="b", timeout_s=1))).result
        assert other.source == "tool" and fn.calls == 2
        await asyncio.sleep(0.6)  # past the tool's TTL the tool is asked again
        assert (await reg.run(name, "hello world", a)).result.source == "tool"
        raw = await cache._redis.keys("reason:v1:tool:*")
        assert raw and all("hello" not in k for k in raw)  # no client text in keys
    finally:
        await cache.close()


@pytest.mark.integration
async def test_redis_down_means_no_cache_not_an_error() -> None:
    cache = RedisCache(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.1)
    try:
        reg, fn = registry(cache, ttl_s=60)
        t0 = time.perf_counter()
        for _ in range(3):
            r = (await reg.run(reg.names[0], "x", ToolContext(timeout_s=1))).result
            assert r.status == "ok" and r.source == "tool"
        assert fn.calls == 3
        assert time.perf_counter() - t0 < 1.0  # one failed connect, then the back-off
        assert await cache.ping() is False
    finally:
        await cache.close()


@pytest.mark.unit
async def test_memory_cache_bounds_its_size_and_expires() -> None:
    cache = MemoryCache(max_entries=3)
    for i in range(5):
        await cache.set(f"k{i}", str(i), ttl_s=60)
    assert [await cache.get(f"k{i}") for i in range(5)] == [None, None, "2", "3", "4"]
    await cache.set("short", "v", ttl_s=0.01)
    await asyncio.sleep(0.02)
    assert await cache.get("short") is None


@pytest.mark.unit
def test_keys_are_namespaced_by_tenant_and_hashed() -> None:
    k1 = make_key("answer", "tenant-a", "what is 2+2", 1, True)
    k2 = make_key("answer", "tenant-b", "what is 2+2", 1, True)
    assert k1 != k2 and "what" not in k1 and k1.startswith("reason:v1:answer:")
