"""A tool-cache entry that cannot be read back (corrupt, or an older version's schema)
is a miss: logged, deleted and the tool asked afresh, never a failed step. In-process
and real Redis."""

from __future__ import annotations

import json
import uuid

import pytest
from structlog.testing import capture_logs

from orchestrator.cache import Cache, MemoryCache, RedisCache
from orchestrator.tools.base import ToolContext
from tests.conftest import REDIS_TEST_TIMEOUT_S, REDIS_URL
from tests.orchestrator.test_registry import build

pytestmark = [pytest.mark.integration]

UNREADABLE = {
    "corrupt": '{"value": "primary:q", "fresh_un',
    "not json": "\x00\xff garbage",
    "older schema": json.dumps({"result": "primary:q", "expires": 9e12}),
    "wrong type": json.dumps({"value": "primary:q", "fresh_until": "tomorrow"}),
    "not an object": json.dumps(["primary:q"]),
}


def make_cache(backend: str) -> Cache:
    return (
        RedisCache(REDIS_URL, timeout_s=REDIS_TEST_TIMEOUT_S)
        if backend == "redis"
        else MemoryCache()
    )


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize("kind", sorted(UNREADABLE))
async def test_an_unreadable_tool_cache_entry_is_a_miss(backend: str, kind: str) -> None:
    cache = make_cache(backend)
    try:
        assert await cache.ping()
        reg, primary = build(cache, with_fallback=False)
        reg.get("io").cache_ttl_s = 60
        ctx = ToolContext(tenant=f"t-{uuid.uuid4().hex[:8]}", timeout_s=2)  # its own keys
        key = reg._cache_key(reg.get("io"), "q", ctx)

        await cache.set(key, UNREADABLE[kind], 60)
        with capture_logs() as logs:
            result = (await reg.run("io", "q", ctx)).result
        assert (result.status, result.source, result.output) == ("ok", "tool", "primary:q")
        assert primary.calls == 1
        assert any(e["event"].startswith("unreadable cache entry") for e in logs)
        assert json.loads(await cache.get(key) or "")["value"] == "primary:q"  # rewritten
        assert (await reg.run("io", "q", ctx)).result.source == "cache"

        # the tool failing: the unreadable entry is no stale copy either, and is deleted
        await cache.set(key, UNREADABLE[kind], 60)
        primary.mode = "fail"
        reg.get("io").cache_ttl_s = 1e-9  # every entry already past fresh
        failed = (await reg.run("io", "q", ctx)).result
        assert (failed.status, failed.error) == ("error", "backend down")
        assert await cache.get(key) is None
    finally:
        await cache.close()
