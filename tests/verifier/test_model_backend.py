"""The real embedded-default verifier: SmolLM2-135M-Instruct with the committed adapter."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from fastapi.testclient import TestClient

from services.errors import InvalidRequest
from services.settings import VerifierSettings
from verifier.app import create_app
from verifier.backends.base import Claim
from verifier.backends.model import EMBEDDED_ADAPTERS, ModelVerifier

pytestmark = [pytest.mark.model, pytest.mark.slow]

CLAIMS = [
    Claim("The answer is 18.", "Steps:\ns1 [calc] '16 - 3 - 4' -> '9'", "How many eggs?"),
    Claim("Ana went to the park on Monday.", "On Monday, Ana did not go to the park."),
    Claim(
        "The car Ben picked is red.", "All cars in the lot are red. Ben picked a car in the lot."
    ),
]


def base_model_dir() -> str:
    try:
        from services.catalog import ensure_hf_dir

        return str(ensure_hf_dir("smollm2-135m-instruct"))
    except Exception as exc:  # not pulled on this machine
        pytest.skip(f"smollm2-135m-instruct is not available: {exc}")


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> VerifierSettings:
    return VerifierSettings(
        backend="model",
        base_model=base_model_dir(),
        adapter_dir=EMBEDDED_ADAPTERS["smollm2-135m-instruct"],
        max_input_tokens=256,
        log_dir=tmp_path_factory.mktemp("logs"),
        log_format="json",
    )


@pytest.fixture(scope="module")
def backend(settings: VerifierSettings) -> ModelVerifier:
    b = ModelVerifier(settings)
    asyncio.run(b.load())
    return b


def test_calibration_is_loaded(backend: ModelVerifier) -> None:
    committed = json.loads(
        (Path(EMBEDDED_ADAPTERS["smollm2-135m-instruct"]) / "calibration.json").read_text()
    )
    assert backend.temperature == committed["temperature"] and backend.temperature != 1.0
    assert backend.bias == committed.get("bias", 0.0)
    z = backend.logit_diffs(["x"])[0]
    assert backend._calibrated([z]) == [
        pytest.approx(1 / (1 + math.exp(-(z / backend.temperature + backend.bias))))
    ]


def test_same_input_same_output(backend: ModelVerifier) -> None:
    first = asyncio.run(backend.score(CLAIMS))
    second = asyncio.run(backend.score(CLAIMS))
    assert first == second
    assert all(0 < p < 1 for p in first)


def test_batch_equals_single(backend: ModelVerifier) -> None:
    batch = asyncio.run(backend.score(CLAIMS))
    single = [asyncio.run(backend.score([c]))[0] for c in CLAIMS]
    assert batch == pytest.approx(single, abs=1e-4)


def test_over_long_claim_is_refused(backend: ModelVerifier) -> None:
    with pytest.raises(InvalidRequest, match="tokens"):
        asyncio.run(backend.score([Claim("The answer is 1. " * 200)]))


@pytest.fixture(scope="module")
def client(settings: VerifierSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        deadline = time.monotonic() + 120
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, c.get("/readyz").json()
            time.sleep(0.2)
        yield c


def test_verify_endpoints_with_the_real_model(client: TestClient) -> None:
    body = {"statement": CLAIMS[1].statement, "context": CLAIMS[1].context}
    r = client.post("/verify", json=body)
    assert r.status_code == 200, r.text
    one = r.json()
    assert one["method"] == "model" and one["verdict"] == (one["confidence"] >= 0.5)
    assert client.post("/verify", json=body).json()["confidence"] == one["confidence"]
    items = [
        body,
        {"statement": "12 * 12 = 144"},
        {"statement": "The answer is 9.", "context": CLAIMS[0].context, "question": "How many?"},
    ]
    r = client.post("/verify/batch", json={"items": items})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["method"] for x in results] == ["model", "symbolic", "both"]
    assert results[0]["confidence"] == pytest.approx(one["confidence"], abs=1e-4)


def test_over_long_and_empty_statements_are_4xx(client: TestClient) -> None:
    r = client.post("/verify", json={"statement": "Tom has many apples. " * 150})
    assert r.status_code == 400 and r.json()["error"]["param"] == "statement"
    assert client.post("/verify", json={"statement": ""}).status_code == 422
