"""The planner answers health checks while its model loads, and says why it is not ready."""

from __future__ import annotations

import asyncio
import time

import pytest
from fastapi.testclient import TestClient

from planner.app import create_app
from planner.backends.scripted import ScriptedBackend
from planner.service import PlannerService
from services.schemas import ModelInfo
from services.settings import PlannerSettings

pytestmark = [pytest.mark.unit]


class SlowBackend(ScriptedBackend):
    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.dead: str | None = None

    async def load(self) -> None:
        await self.release.wait()

    def health(self) -> str | None:
        return self.dead


def test_not_ready_while_loading_then_ready_then_not_when_the_engine_dies(tmp_path) -> None:
    settings = PlannerSettings(log_dir=tmp_path)
    backend = SlowBackend()
    with TestClient(create_app(settings, PlannerService(backend, settings))) as client:
        assert client.get("/healthz").status_code == 200
        r = client.get("/readyz")
        assert r.status_code == 503 and r.json()["reason"] == "model loading"
        plan = client.post("/plan", json={"question": "1+1"})
        assert plan.status_code == 503 and plan.json()["error"]["type"] == "not_ready"
        assert int(plan.headers["retry-after"]) > 0
        client.portal.call(backend.release.set)
        deadline = time.monotonic() + 5
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.post("/plan", json={"question": "1+1"}).status_code == 200
        backend.dead = "engine_dead: the vLLM engine process exited"
        r = client.get("/readyz")
        assert r.status_code == 503 and "engine_dead" in r.json()["reason"]


def test_info_names_the_backend_and_model_loaded_or_not(tmp_path) -> None:
    settings = PlannerSettings(log_dir=tmp_path)
    backend = SlowBackend()
    with TestClient(create_app(settings, PlannerService(backend, settings))) as client:
        loading = ModelInfo.model_validate(client.get("/info").json())
        assert (loading.service, loading.backend, loading.ready) == ("planner", "scripted", False)
        assert loading.model == backend.model
        client.portal.call(backend.release.set)
        deadline = time.monotonic() + 5
        while not client.get("/info").json()["ready"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.get("/info").json()["ready"] is True
