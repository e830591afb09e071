"""`reason models pull --serving` pulls what the environment's settings serve: the
planner's catalog model on llama.cpp and the verifier's base model on the model backend,
each once; a path or another backend pulls nothing, and a name with --serving is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import models as models_cli
from cli.main import app as cli_app

pytestmark = pytest.mark.unit


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("PLANNER_BACKEND", "PLANNER_MODEL", "PLANNER_MODEL_PATH"):
        monkeypatch.delenv(name, raising=False)
    for name in ("VERIFIER_BACKEND", "VERIFIER_BASE_MODEL"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_embedded_default_pulls_the_planner_and_the_verifier_model(env) -> None:
    env.setenv("PLANNER_BACKEND", "llamacpp")
    env.setenv("VERIFIER_BACKEND", "model")
    assert models_cli.serving_models() == ["qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct"]


def test_one_model_serving_both_is_pulled_once(env) -> None:
    env.setenv("PLANNER_BACKEND", "llamacpp")
    env.setenv("PLANNER_MODEL", "qwen2.5-coder-0.5b-instruct")
    env.setenv("VERIFIER_BACKEND", "model")
    env.setenv("VERIFIER_BASE_MODEL", "qwen2.5-coder-0.5b-instruct")
    assert models_cli.serving_models() == ["qwen2.5-coder-0.5b-instruct"]


def test_paths_and_other_backends_pull_nothing(env, tmp_path: Path) -> None:
    env.setenv("PLANNER_BACKEND", "llamacpp")
    env.setenv("PLANNER_MODEL_PATH", str(tmp_path / "model.gguf"))
    env.setenv("VERIFIER_BACKEND", "model")
    env.setenv("VERIFIER_BASE_MODEL", str(tmp_path))
    assert models_cli.serving_models() == []
    env.setenv("PLANNER_BACKEND", "vllm")
    env.setenv("VERIFIER_BACKEND", "scripted")
    env.delenv("PLANNER_MODEL_PATH")
    assert models_cli.serving_models() == []


def test_serving_pulls_each_model(env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("PLANNER_BACKEND", "llamacpp")
    env.setenv("VERIFIER_BACKEND", "model")
    pulled: list[str] = []

    def fake_pull(name: str, cache_dir: Path | None = None, progress=None) -> Path:
        pulled.append(name)
        return tmp_path / f"{name}.gguf"

    monkeypatch.setattr(models_cli, "pull_model", fake_pull)
    result = CliRunner().invoke(cli_app, ["models", "pull", "--serving"])
    assert result.exit_code == 0, result.output
    assert pulled == ["qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct"]
    assert result.output.count("(verified)") == 2


@pytest.mark.parametrize("args", [[], ["smollm2-135m-instruct", "--serving"]])
def test_a_name_or_serving_is_asked_for(env, args: list[str]) -> None:
    result = CliRunner().invoke(cli_app, ["models", "pull", *args])
    assert result.exit_code == 2
    assert "catalog name or --serving" in result.output
