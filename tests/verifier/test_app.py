"""The verifier's HTTP surface with a scripted backend: routing, methods, readiness, 4xx."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from services.settings import VerifierSettings
from verifier.app import create_app
from verifier.backends.scripted import ScriptedVerifier
from verifier.service import VerifierService

pytestmark = [pytest.mark.unit]

STEPS = "Steps:\ns1 [calc] '16 - 3 - 4' -> '9'\ns2 [calc] 's1 * 2' -> '18'\nanswer_step: s2"


class GatedVerifier(ScriptedVerifier):
    """Loads only when the test opens the gate, like a model that takes a while."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__({"The sky is green.": 0.1, "The answer is 18.": 0.9})
        self.gate = gate

    async def load(self) -> None:
        import asyncio

        await asyncio.to_thread(self.gate.wait, 10)


def make_client(tmp_path, gate: threading.Event) -> TestClient:
    settings = VerifierSettings(log_dir=tmp_path, log_format="json")
    service = VerifierService(GatedVerifier(gate), settings)
    return TestClient(create_app(settings, service))


def wait_ready(client: TestClient) -> None:
    for _ in range(100):
        if client.get("/readyz").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError("verifier never became ready")


def test_readyz_is_false_until_the_model_is_loaded(tmp_path) -> None:
    gate = threading.Event()
    with make_client(tmp_path, gate) as client:
        assert client.get("/healthz").status_code == 200
        r = client.get("/readyz")
        assert r.status_code == 503 and r.json()["ready"] is False
        # exact checks need no model; a claim that needs the model gets a 503 for now
        assert client.post("/verify", json={"statement": "2 + 2 = 4"}).status_code == 200
        r = client.post("/verify", json={"statement": "The sky is green."})
        assert r.status_code == 503 and "Retry-After" in r.headers
        gate.set()
        wait_ready(client)
        r = client.post("/verify", json={"statement": "The sky is green."})
        assert r.status_code == 200 and r.json()["method"] == "model"


def test_methods_symbolic_model_and_both(tmp_path) -> None:
    gate = threading.Event()
    gate.set()
    with make_client(tmp_path, gate) as client:
        wait_ready(client)
        items = [
            {"statement": "17 * 23 + 4 = 395"},
            {"statement": "17 * 23 + 4 = 396"},
            {"statement": "The sky is green."},
            {"statement": "The answer is 18.", "context": STEPS, "question": "How much?"},
            {"statement": "The answer is 19.", "context": STEPS, "question": "How much?"},
        ]
        r = client.post("/verify/batch", json={"items": items})
        assert r.status_code == 200, r.text
        got = [(x["verdict"], x["method"]) for x in r.json()["results"]]
        assert got == [
            (True, "symbolic"),
            (False, "symbolic"),
            (False, "model"),
            (True, "both"),
            (False, "symbolic"),
        ]
        single = client.post("/verify", json=items[2]).json()
        assert single["confidence"] == r.json()["results"][2]["confidence"] == 0.1


@pytest.mark.parametrize(
    "body",
    [
        {"statement": ""},
        {"statement": "   "},
        {"context": "no statement"},
        {"statement": "x" * 8001},
        {"statement": "2 + 2 = 4", "unknown": 1},
    ],
)
def test_bad_claims_are_4xx(tmp_path, body) -> None:
    gate = threading.Event()
    gate.set()
    with make_client(tmp_path, gate) as client:
        r = client.post("/verify", json=body)
        assert 400 <= r.status_code < 500
        assert r.json()["error"]["type"]


def test_batch_limits(tmp_path) -> None:
    gate = threading.Event()
    gate.set()
    with make_client(tmp_path, gate) as client:
        assert client.post("/verify/batch", json={"items": []}).status_code == 422
        many = [{"statement": "1 = 1"}] * 17
        assert client.post("/verify/batch", json={"items": many}).status_code == 422


def test_info_names_the_backend_and_model(tmp_path) -> None:
    gate = threading.Event()
    with make_client(tmp_path, gate) as client:
        assert client.get("/info").json()["ready"] is False
        gate.set()
        wait_ready(client)
        info = client.get("/info").json()
        assert info == {
            "service": "verifier",
            "backend": "scripted",
            "model": info["model"],
            "ready": True,
        }
        assert info["model"]
