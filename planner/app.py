"""Planner service: `POST /plan` turns a question into validated JSON plans."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from planner.backends import create_backend
from planner.service import PlannerService
from services.app import create_service_app
from services.logging import configure_logging
from services.schemas import PlanRequest, PlanResponse
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
        await planner.load()
        try:
            yield
        finally:
            await planner.backend.close()

    app = create_service_app(
        name="planner",
        lifespan=lifespan,
        readiness=planner.readiness,
        max_body_bytes=settings.max_body_bytes,
    )
    app.state.planner = planner

    @app.post("/plan", response_model=PlanResponse, response_model_exclude_none=True)
    async def plan(body: PlanRequest, request: Request) -> PlanResponse:
        service: PlannerService = request.app.state.planner
        return await service.plan(body)

    return app


def __getattr__(name: str) -> FastAPI:
    # `uvicorn planner.app:app` builds the app from the environment on first access.
    if name == "app":
        return create_app()
    raise AttributeError(name)
