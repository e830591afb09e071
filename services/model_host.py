"""Loading a model backend once and reporting readiness: shared by planner and verifier."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import structlog

from services.schemas import ModelInfo

log = structlog.get_logger("model")


class ModelHost:
    """Holds a backend with async `load()`; a failed load keeps the service up, not ready,
    with the reason. A backend may offer `health() -> str | None` (e.g. a dead engine)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.ready = False
        self.load_error: str | None = None

    async def load(self) -> None:
        try:
            await self.backend.load()
        except Exception as exc:  # keep serving health checks; requests answer 503
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error(
                "model failed to load",
                **{"error.type": type(exc).__name__, "error.message": str(exc)},
            )
            return
        try:
            await self.warm_up()
        except Exception as exc:  # a cold cache costs the first request time, nothing more
            log.warning(
                "model warm-up failed; serving without it",
                **{
                    "event.action": "model.warm_up",
                    "error.type": type(exc).__name__,
                    "error.message": str(exc),
                },
            )
        self.ready = True
        log.info(
            "model loaded",
            **{
                "event.action": "model.load",
                "labels.backend": self.backend.name,
                "labels.model": self.backend.model,
            },
        )

    async def warm_up(self) -> None:
        """Work done once the backend has loaded and before the service says it is ready
        (nothing here; a service overrides it)."""

    async def readiness(self) -> tuple[bool, str]:
        if self.ready:
            health = getattr(self.backend, "health", None)
            problem = health() if health is not None else None
            if problem:
                return False, problem
            return True, f"{self.backend.name}:{self.backend.model} loaded"
        return False, self.load_error or "model loading"

    async def info(self, service: str) -> ModelInfo:
        """`GET /info`: the backend and the model it serves (loaded or not)."""
        ready, _ = await self.readiness()
        return ModelInfo(
            service=service, backend=self.backend.name, model=self.backend.model, ready=ready
        )


def loading_lifespan(service: Any) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """The app lifespan of a model service: the model loads in the background, so
    /healthz answers at once and /readyz says "loading" (requests that need the model get
    503 meanwhile); at shutdown a load still running is cancelled and the backend closed.
    `service` has `load()` and `backend.close()` (a ModelHost or what wraps one)."""

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        loading = asyncio.create_task(service.load())
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await service.backend.close()

    return lifespan
