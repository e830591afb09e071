"""Verifier service: `POST /verify` and `POST /verify/batch` give verdicts with confidence."""

from __future__ import annotations

from fastapi import FastAPI, Request

from services.app import create_service_app
from services.logging import configure_logging
from services.model_host import loading_lifespan
from services.schemas import (
    ModelInfo,
    VerifyBatchRequest,
    VerifyBatchResponse,
    VerifyRequest,
    VerifyResponse,
)
from services.settings import VerifierSettings
from verifier.backends import create_backend
from verifier.service import VerifierService


def create_app(
    settings: VerifierSettings | None = None, service: VerifierService | None = None
) -> FastAPI:
    settings = settings or VerifierSettings()
    configure_logging(
        "verifier", log_dir=settings.log_dir, level=settings.log_level, fmt=settings.log_format
    )
    verifier = service or VerifierService(create_backend(settings), settings)

    app = create_service_app(
        name="verifier",
        lifespan=loading_lifespan(verifier),
        readiness=verifier.readiness,
        limits=settings.http_limits(),
    )
    app.state.verifier = verifier

    @app.get("/info", response_model=ModelInfo)
    async def info() -> ModelInfo:
        return await verifier.info("verifier")

    @app.post("/verify", response_model=VerifyResponse)
    async def verify(body: VerifyRequest, request: Request) -> VerifyResponse:
        service: VerifierService = request.app.state.verifier
        return (await service.verify_many([body]))[0]

    @app.post("/verify/batch", response_model=VerifyBatchResponse)
    async def verify_batch(body: VerifyBatchRequest, request: Request) -> VerifyBatchResponse:
        service: VerifierService = request.app.state.verifier
        results = await service.verify_many(body.items)
        return VerifyBatchResponse(
            results=results, latency_ms=max((r.latency_ms for r in results), default=0.0)
        )

    return app


def __getattr__(name: str) -> FastAPI:
    # `uvicorn verifier.app:app` builds the app from the environment on first access.
    if name == "app":
        return create_app()
    raise AttributeError(name)
