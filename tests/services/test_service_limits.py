"""Each service's app bounds its HTTP front with its own settings' limits
(`PLANNER_*`, `VERIFIER_*`, `ORCH_*`), not the factory's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from services.app import TraceMiddleware
from services.settings import HttpLimits, PlannerSettings, VerifierSettings

pytestmark = [pytest.mark.unit]


def front_limits(app: FastAPI) -> HttpLimits:
    (mw,) = [m for m in app.user_middleware if m.cls is TraceMiddleware]
    return mw.kwargs["limits"]


def test_planner_limits_come_from_its_settings(monkeypatch, tmp_path: Path) -> None:
    from planner.app import create_app

    monkeypatch.setenv("PLANNER_MAX_IN_FLIGHT", "3")
    monkeypatch.setenv("PLANNER_MAX_HEADER_BYTES", "2048")
    monkeypatch.setenv("PLANNER_BODY_READ_TIMEOUT_S", "1.5")
    settings = PlannerSettings(log_dir=tmp_path)
    app = create_app(settings)
    assert front_limits(app) == HttpLimits(
        max_body_bytes=settings.max_body_bytes,
        max_header_bytes=2048,
        body_read_timeout_s=1.5,
        max_in_flight=3,
    )


def test_verifier_header_limit_takes_effect(monkeypatch, tmp_path: Path) -> None:
    from verifier.app import create_app

    monkeypatch.setenv("VERIFIER_MAX_HEADER_BYTES", "1024")
    monkeypatch.setenv("VERIFIER_MAX_IN_FLIGHT", "5")
    app = create_app(VerifierSettings(log_dir=tmp_path))
    assert front_limits(app).max_in_flight == 5
    with TestClient(app) as client:
        assert client.get("/healthz", headers={"X-Pad": "a" * 900}).status_code == 200
        r = client.get("/healthz", headers={"X-Pad": "a" * 2000})
        assert r.status_code == 431
        assert r.json()["error"]["type"] == "request_header_too_large"
