"""A model that was never pulled: both model services refuse it the same way, naming the
command to run, and neither downloads anything while starting."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.backends.llamacpp import LlamaCppBackend
from services.model_host import ModelHost
from services.settings import PlannerSettings, VerifierSettings
from verifier.backends.model import ModelVerifier

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("service", ["planner", "verifier"])
async def test_a_model_that_is_not_pulled_is_refused_with_the_pull_command(
    service: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("REASON_CACHE_DIR", str(cache))
    downloads: list[object] = []
    import cli.pull

    monkeypatch.setattr(cli.pull, "_download", lambda *a: downloads.append(a))
    if service == "planner":
        name = "qwen2.5-coder-1.5b-instruct"
        backend = LlamaCppBackend(PlannerSettings(model=name))
    else:
        name = "smollm2-135m-instruct"
        backend = ModelVerifier(VerifierSettings(base_model=name))
    host = ModelHost(backend)
    await host.load()
    ready, reason = await host.readiness()
    assert not ready
    assert reason.startswith("ModelNotPulled: ")
    assert f"run `reason models pull {name}`" in reason
    assert downloads == []
    assert not list(cache.rglob("*.gguf"))
