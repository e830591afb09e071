"""Planner service: `POST /plan` turns a question into validated JSON plans; `POST /solve`
answers it with the model's own chain-of-thought solutions (no tools)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from planner.backends import create_backend
from planner.service import PlannerService
from services.app import cancel_on_disconnect, create_service_app
from services.logging import configure_logging
from services.model_host import loading_lifespan
from services.schemas import (
    ModelInfo,
    PlanRequest,
    PlanResponse,
    SolveRequest,
    SolveResponse,
)
from services.settings import PlannerSettings


def create_app(
    settings: PlannerSettings | None = None, service: PlannerService | None = None
) -> FastAPI:
    settings = settings or PlannerSettings()
    configure_logging(
        "planner", log_dir=settings.log_dir, level=settings.log_level, fmt=settings.log_format
    )
    planner = service or PlannerService(create_backend(settings), settings)

    app = create_service_app(
        name="planner",
        lifespan=loading_lifespan(planner),
        readiness=planner.readiness,
        limits=settings.http_limits(),
    )
    app.state.planner = planner

    @app.get("/info", response_model=ModelInfo)
    async def info() -> ModelInfo:
        return await planner.info("planner")

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
