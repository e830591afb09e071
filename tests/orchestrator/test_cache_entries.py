"""An answer-cache entry that cannot be read back (corrupt, or an older version's schema)
is a miss: logged, deleted and answered afresh, never a 500. In-process and real Redis."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
import redis

from orchestrator.cache import MemoryCache, RedisCache, cache_get
from services.schemas import ReasonRequest
from tests.conftest import REDIS_TEST_TIMEOUT_S, REDIS_URL
from tests.orchestrator.helpers import FakePlanner, FakeVerifier, plan, running_orchestrator

pytestmark = [pytest.mark.integration]


def entries(valid: str) -> dict[str, str]:
    """Unreadable variants of a valid cached response."""
    old = json.loads(valid)
    del old["timings_ms"]  # an older schema: a field it lacked
    old["legacy_score"] = 1  # and one since removed
    wrong = json.loads(valid)
    wrong["confidence"] = "high"
    return {
        "corrupt": valid[: len(valid) // 2],
        "not json": "\x00\xff garbage",
        "older schema": json.dumps(old),
        "wrong type": json.dumps(wrong),
    }


def ask(url: str, question: str) -> httpx.Response:
    return httpx.post(f"{url}/reason", json={"question": question}, timeout=30)


def logged_unreadable(log_dir) -> bool:
    lines = (log_dir / "orchestrator.jsonl").read_text().splitlines()
    return any("unreadable cache entry" in line and '"warning"' in line for line in lines)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_an_unreadable_cached_answer_is_a_miss(tmp_path, backend) -> None:
    question = f"q-{uuid.uuid4().hex[:8]}"  # its own key in the shared Redis
    planner = FakePlanner({question: [[plan(("s1", "calc", "40+2", []))]]})
    settings = {"redis_url": REDIS_URL} if backend == "redis" else {}
    with running_orchestrator(tmp_path, planner, FakeVerifier(), **settings) as (url, app):
        service = app.state.reason
        first = ask(url, question)
        assert first.status_code == 200 and first.json()["cached"] is False
        key = service._answer_cache_key(ReasonRequest(question=question), "default", planner.model)
        assert ask(url, question).json()["cached"] is True

        if backend == "redis":
            raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
            valid = raw.get(key)

            def corrupt(value: str) -> None:
                raw.set(key, value, px=60_000)

            def stored() -> str | None:
                return raw.get(key)
        else:
            cache = service.cache
            valid = cache._data[key][1]

            def corrupt(value: str) -> None:
                cache._data[key] = (cache._data[key][0], value)

            def stored() -> str | None:
                item = cache._data.get(key)
                return item[1] if item else None

        assert valid is not None
        try:
            for name, value in entries(valid).items():
                corrupt(value)
                r = ask(url, question)
                assert r.status_code == 200, (name, r.text)
                assert r.json()["cached"] is False and r.json()["answer"] == "42", name
                # the bad entry is gone and a fresh one written in its place
                assert stored() != value, name
                assert ask(url, question).json()["cached"] is True, name
        finally:
            if backend == "redis":
                raw.delete(key)
                raw.close()
    assert logged_unreadable(tmp_path)
    assert len(planner.requests) == 1 + len(entries(valid))


async def test_cache_get_deletes_what_it_cannot_read() -> None:
    caches = [MemoryCache(), RedisCache(REDIS_URL, timeout_s=REDIS_TEST_TIMEOUT_S)]
    key = f"reason:v1:test:{uuid.uuid4().hex}"
    try:
        for cache in caches:
            await cache.set(key, "{broken", ttl_s=60)
            assert await cache_get(cache, key, "test", json.loads) is None
            assert await cache.get(key) is None
            await cache.set(key, '{"ok": 1}', ttl_s=60)
            assert await cache_get(cache, key, "test", json.loads) == {"ok": 1}
            await cache.delete(key)
            assert await cache.get(key) is None
    finally:
        for cache in caches:
            await cache.close()
