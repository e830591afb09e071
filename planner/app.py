"""Planner service: `POST /plan` turns a question into validated JSON plans; `POST /solve`
answers it with the model's own chain-of-thought solutions (no tools)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request

from planner.backends import create_backend
from planner.service import PlannerService
from services.app import cancel_on_disconnect, create_service_app
from services.logging import configure_logging
from services.schemas import PlanRequest, PlanResponse, SolveRequest, SolveResponse
from services.settings import PlannerSettings


def create_app(
    settings: PlannerSettings | None = None, service: PlannerService | None = None
) -> FastAPI:
    settings = settings or PlannerSettings()
    configure_logging(
        "planner", log_dir=settings.log_dir, level=settings.log_level, fmt=settings.log_format
    )
    planner = service or PlannerService(create_backend(settings), settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Load in the background: /healthz answers at once, /readyz says "loading" until
        # the model is up, and /plan answers 503 with the reason meanwhile.
        loading = asyncio.create_task(planner.load())
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await planner.backend.close()

    app = create_service_app(
        name="planner",
        lifespan=lifespan,
        readiness=planner.readiness,
        limits=settings.http_limits(),
    )
    app.state.planner = planner

    @app.post("/plan", response_model=PlanResponse, response_model_exclude_none=True)
    async def plan(body: PlanRequest, request: Request) -> Any:
        service: PlannerService = request.app.state.planner
        # A caller that gives up (its deadline passed) frees the model for the next one.
        return await cancel_on_disconnect(request, service.plan(body))

    @app.post("/solve", response_model=SolveResponse, response_model_exclude_none=True)
    async def solve(body: SolveRequest, request: Request) -> Any:
        service: PlannerService = request.app.state.planner
        return await cancel_on_disconnect(request, service.solve(body))

    return app


def __getattr__(name: str) -> FastAPI:
    # `uvicorn planner.app:app` builds the app from the environment on first access.
    if name == "app":
        return create_app()
    raise AttributeError(name)
