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


def log_of(out: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]


def test_scoring_val_does_not_change_what_is_trained(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    plain, scored = tmp_path / "plain", tmp_path / "scored"
    train_lora.train(config(tiny, plain), progress=False)
    summary = train_lora.train(config(tiny, scored, eval_every=2), progress=False)
    for key, value in weights(plain).items():
        torch.testing.assert_close(weights(scored)[key], value)
    val = [r for r in log_of(scored) if "val_auroc" in r]
    assert [r["step"] for r in val] == [2, 4, 6]
    assert all(0.0 <= float(r["val_auroc"]) <= 1.0 and float(r["val_loss"]) > 0 for r in val)
    best = max(val, key=lambda r: float(r["val_auroc"]))  # the first of equals wins
    assert summary["best_val"] == best and summary["saved_step"] == 6  # no keep_best: the last


def test_keep_best_saves_the_best_scored_steps_adapter_and_survives_a_resume(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    kept = tmp_path / "kept"
    # a high learning rate moves the val AUROC from step to step
    kw = {"eval_every": 1, "keep_best": True, "learning_rate": 0.05, "max_steps": 5}
    summary = train_lora.train(config(tiny, kept, **kw), progress=False)
    val = [r for r in log_of(kept) if "val_auroc" in r]
    assert [r["step"] for r in val] == [1, 2, 3, 4, 5]
    top = max(float(r["val_auroc"]) for r in val)
    first_top = next(int(r["step"]) for r in val if float(r["val_auroc"]) == top)
    assert summary["saved_step"] == first_top == summary["best_val"]["step"]
    # the seeded run peaks early: the kept adapter is not the last, and the stopped run
    # below has seen the best step before its stop
    assert first_top <= 2

    # the adapter a run stopped at that step saves is the one keep_best kept
    at_best = tmp_path / "at-best"
    train_lora.train(
        config(tiny, at_best, **{**kw, "keep_best": False}), False, steps_this_run=first_top
    )
    for key, value in weights(at_best).items():
        torch.testing.assert_close(weights(kept)[key], value)

    # a stopped run carries its best step through the checkpoint
    stopped = tmp_path / "stopped"
    train_lora.train(config(tiny, stopped, checkpoint_every=1, **kw), False, steps_this_run=2)
    again = train_lora.train(config(tiny, stopped, checkpoint_every=1, **kw), progress=False)
    assert again["resumed_at_step"] == 2 and again["best_val"] == summary["best_val"]
    assert [r["step"] for r in log_of(stopped) if "val_auroc" in r] == [1, 2, 3, 4, 5]
    for key, value in weights(kept).items():
        torch.testing.assert_close(weights(stopped)[key], value)


def test_keep_best_needs_val_scoring(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="set eval_every"):
        config(tiny, tmp_path / "x", keep_best=True)
    with pytest.raises(ValueError, match=">= 0"):
        config(tiny, tmp_path / "x", eval_every=-1)


def test_a_checkpoint_from_before_a_field_existed_resumes_at_its_default(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    train_lora.train(config(tiny, out, checkpoint_every=1), progress=False, steps_this_run=1)
    state_path = out / "checkpoint" / "state.pt"
    state = torch.load(state_path, weights_only=False)
    for name in ("eval_every", "keep_best"):  # fields newer than such a checkpoint
        del state["config"][name]
    torch.save(state, state_path)
    assert train_lora.train(config(tiny, out, checkpoint_every=1), False)["resumed_at_step"] == 1


def test_val_scoring_needs_both_labels(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    data_dir, model_dir = tiny
    one_label = tmp_path / "data"
    one_label.mkdir()
    (one_label / "train.jsonl").write_text((data_dir / "train.jsonl").read_text())
    rows = [r for r in data.read_jsonl(data_dir / "val.jsonl") if r["label"]]
    data.write_jsonl(one_label / "val.jsonl", rows)
    cfg = config((one_label, model_dir), tmp_path / "out", eval_every=1)
    with pytest.raises(ValueError, match="one label only"):
        train_lora.train(cfg, progress=False)
