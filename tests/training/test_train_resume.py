"""train_lora's long-run habits on a tiny random llama: a stopped run resumes from its
checkpoint to the adapter an uninterrupted run makes, a checkpoint of another config is
refused, and micro-batches accumulate to the whole batch's update."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

from tests.training.test_pipeline import make_tiny_model  # noqa: E402
from training import data, train_lora  # noqa: E402
from training.prompt import PROMPT_FORMAT  # noqa: E402

pytestmark = [pytest.mark.model]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    data_dir, model_dir = root / "data", root / "model"
    sizes = ["--n-train", "48", "--n-val", "8", "--n-test", "8", "--n-gsm8k-test", "8"]
    data.main(["--out", str(data_dir), "--seed", "5", *sizes])
    rows = data.read_jsonl(data_dir / "train.jsonl")
    model_dir.mkdir()
    make_tiny_model(
        model_dir,
        [json.dumps(PROMPT_FORMAT)]
        + [f"{r['question']} {r['context']} {r['statement']}" for r in rows],
    )
    return data_dir, model_dir


def config(tiny: tuple[Path, Path], out: Path, **kw: object) -> train_lora.TrainConfig:
    data_dir, model_dir = tiny
    base: dict[str, object] = {
        "base_model": str(model_dir),
        "data_dir": str(data_dir),
        "out_dir": str(out),
        "max_steps": 6,
        "batch_size": 4,
        "warmup_steps": 1,
        "lora_r": 4,
        "lora_alpha": 8,
        "max_seq_tokens": 512,
        "log_every": 1,
    }
    return train_lora.TrainConfig(**{**base, **kw})  # type: ignore[arg-type]


def weights(out: Path) -> dict[str, torch.Tensor]:
    return safetensors_torch.load_file(str(out / "adapter_model.safetensors"))


def test_a_stopped_run_resumes_to_the_uninterrupted_runs_adapter(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    straight = tmp_path / "straight"
    train_lora.train(config(tiny, straight, checkpoint_every=2), progress=False)
    assert not (straight / "checkpoint").exists()  # a finished run leaves none

    stopped = tmp_path / "stopped"
    first = train_lora.train(config(tiny, stopped, checkpoint_every=2), False, steps_this_run=3)
    assert first["steps_done"] == 3 and (stopped / "checkpoint" / "state.pt").exists()
    assert weights(stopped).keys() == weights(straight).keys()
    assert any(
        not torch.equal(weights(stopped)[k], weights(straight)[k]) for k in weights(straight)
    )
    # the rerun may be slower or on another budget: those fields do not block resuming
    again = train_lora.train(
        config(tiny, stopped, checkpoint_every=2, time_budget_s=3600.0), progress=False
    )
    assert again["resumed_at_step"] == 3 and again["steps_done"] == 6
    assert not (stopped / "checkpoint").exists()
    for key, value in weights(straight).items():
        torch.testing.assert_close(weights(stopped)[key], value)
    log = [json.loads(x) for x in (stopped / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    straight_log = (straight / "train_log.jsonl").read_text().splitlines()
    assert [r["loss"] for r in log] == [json.loads(x)["loss"] for x in straight_log]


def test_a_checkpoint_of_another_config_is_refused(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    train_lora.train(config(tiny, out, checkpoint_every=1), progress=False, steps_this_run=1)
    with pytest.raises(ValueError, match="differs in learning_rate"):
        train_lora.train(config(tiny, out, checkpoint_every=1, learning_rate=5e-4), False)


def test_micro_batches_accumulate_to_the_whole_batchs_update(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    # no dropout: its masks are drawn per forward pass, so they differ between the two
    train_lora.train(config(tiny, whole, lora_dropout=0.0, max_steps=3), progress=False)
    train_lora.train(
        config(tiny, parts, lora_dropout=0.0, max_steps=3, micro_batch_size=1), progress=False
    )
    for key, value in weights(whole).items():
        torch.testing.assert_close(weights(parts)[key], value, rtol=1e-4, atol=1e-6)


def test_gradient_checkpointing_trains_the_same_adapter(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    plain, recomputed = tmp_path / "plain", tmp_path / "recomputed"
    train_lora.train(config(tiny, plain, lora_dropout=0.0, max_steps=2), progress=False)
    train_lora.train(
        config(tiny, recomputed, lora_dropout=0.0, max_steps=2, gradient_checkpointing=True),
        progress=False,
    )
    for key, value in weights(plain).items():
        torch.testing.assert_close(weights(recomputed)[key], value, rtol=1e-4, atol=1e-6)
