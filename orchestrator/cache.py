"""Caches for answers and tool results: Redis when configured, in-process otherwise.

A cache never fails a request. Redis errors and slow answers are logged as warnings and
read as a miss; after a failure Redis is left alone for a short back-off so a dead Redis
costs one timeout, not one per request. An entry that cannot be read back (corrupt, or
written by an older version in an older schema) is a miss too: logged and deleted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import structlog
from prometheus_client import Counter
from redis import asyncio as aioredis
from redis.exceptions import RedisError

log = structlog.get_logger("cache")

CACHE_OPS = Counter("cache_operations_total", "Cache lookups and writes", ["cache", "op", "result"])

KEY_PREFIX = "reason:v1"


class Cache(Protocol):
    kind: str

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, ttl_s: float) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


def make_key(kind: str, tenant: str, *parts: Any) -> str:
    """Keys are namespaced by tenant; the variable parts are hashed so that no client
    text ends up in a Redis key."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    tenant_hash = hashlib.sha256(tenant.encode()).hexdigest()[:16]
    return f"{KEY_PREFIX}:{kind}:{tenant_hash}:{digest}"


class MemoryCache:
    """TTL cache with a size bound (least recently used entries go first)."""

    kind = "memory"

    def __init__(self, max_entries: int = 10_000) -> None:
        self._data: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._max = max_entries

    async def get(self, key: str) -> str | None:
        item = self._data.get(key)
        if item is None:
            return None
        expires, value = item
        if expires < time.monotonic():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return value

    async def set(self, key: str, value: str, ttl_s: float) -> None:
        self._data[key] = (time.monotonic() + ttl_s, value)
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)

    async def delete(self, key: str) -> None:
        self._data.pop(key, None)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._data.clear()


class RedisCache:
    kind = "redis"

    def __init__(self, url: str, *, timeout_s: float = 0.25, backoff_s: float = 2.0) -> None:
        self._redis = aioredis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=0,
            retry_on_timeout=False,
            decode_responses=True,
        )
        self._backoff_s = backoff_s
        self._guard_s = timeout_s * 2  # hard bound even if the client's own timeout slips
        self._down_until = 0.0

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, op: str, exc: Exception) -> None:
        self._down_until = time.monotonic() + self._backoff_s
        CACHE_OPS.labels(self.kind, op, "error").inc()
        log.warning(
            "redis unavailable, continuing without cache",
            **{
                "event.action": f"cache.{op}",
                "error.type": type(exc).__name__,
                "error.message": str(exc)[:200],
            },
        )

    async def get(self, key: str) -> str | None:
        if not self._available():
            return None
        try:
            async with asyncio.timeout(self._guard_s):
                value = await self._redis.get(key)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("get", exc)
            return None
        return value if isinstance(value, str) else None

    async def set(self, key: str, value: str, ttl_s: float) -> None:
        if not self._available():
            return
        try:
            async with asyncio.timeout(self._guard_s):
                await self._redis.set(key, value, px=max(int(ttl_s * 1000), 1))
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("set", exc)

    async def delete(self, key: str) -> None:
        if not self._available():
            return
        try:
            async with asyncio.timeout(self._guard_s):
                await self._redis.delete(key)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("delete", exc)

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(self._guard_s):
                return bool(await self._redis.ping())
        except (RedisError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        await self._redis.aclose()


def create_cache(redis_url: str | None, *, timeout_s: float, max_entries: int) -> Cache:
    if redis_url:
        return RedisCache(redis_url, timeout_s=timeout_s)
    return MemoryCache(max_entries)


T = TypeVar("T")


async def cache_get(cache: Cache, key: str, label: str, parse: Callable[[str], T]) -> T | None:
    """The entry at `key` read by `parse`, or None: a miss, or an entry `parse` refuses
    (ValueError, which pydantic's ValidationError is), which is then deleted."""
    value = await cache.get(key)
    if value is None:
        CACHE_OPS.labels(label, "get", "miss").inc()
        return None
    try:
        parsed = parse(value)
    except (ValueError, TypeError, KeyError) as exc:
        CACHE_OPS.labels(label, "get", "unreadable").inc()
        log.warning(
            "unreadable cache entry, treated as a miss and deleted",
            **{
                "event.action": f"cache.{label}",
                "error.type": type(exc).__name__,
                "error.message": str(exc)[:200],
            },
        )
        await cache.delete(key)
        return None
    CACHE_OPS.labels(label, "get", "hit").inc()
    return parsed
