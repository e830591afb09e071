"""The pipeline-trained verifier's recipe end to end on a tiny random llama: committed
pipeline samples -> claim splits -> LoRA -> calibration -> best-of-k ranking with the
trained adapter. Proves the hand-offs on the pipeline's real data; says nothing about
accuracy (docs/benchmarks/verifier.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.training.test_pipeline import make_tiny_model
from training import calibrate, rerank, train_lora
from training import sample_pipeline as sp
from training.prompt import PROMPT_FORMAT

pytestmark = [pytest.mark.model, pytest.mark.slow]

SAMPLES = Path(__file__).resolve().parents[2] / "training" / "samples"
QUESTIONS = 12  # of the committed file: enough for both labels in every split


def first_questions(path: Path, n: int, out: Path) -> Path:
    ids: list[str] = []
    lines = []
    for row in sp.read_samples(path):
        if row["id"] not in ids:
            if len(ids) == n:
                break
            ids.append(row["id"])
        lines.append(json.dumps(row))
    out.write_text("\n".join(lines) + "\n")
    return out


def test_committed_samples_train_a_verifier_that_ranks_them(tmp_path: Path) -> None:
    files = sorted(SAMPLES.glob("*/gsm8k-train*.jsonl"))
    assert files, "no committed pipeline samples under training/samples"
    samples = first_questions(files[0], QUESTIONS, tmp_path / "samples.jsonl")
    claims = tmp_path / "claims"
    summary = sp.write_claims(claims, [samples], sp.ClaimSplit(seed=7, val=0.3, test=0.0))
    assert summary["train"]["n"] > 0 and summary["val"]["n"] > 0
    assert 0 < summary["train"]["true"] < summary["train"]["n"]

    rows = [json.loads(x) for x in (claims / "train.jsonl").read_text().splitlines()]
    rows += [json.loads(x) for x in (claims / "val.jsonl").read_text().splitlines()]
    model_dir, adapter = tmp_path / "tiny", tmp_path / "adapter"
    model_dir.mkdir()
    make_tiny_model(
        model_dir,
        [json.dumps(PROMPT_FORMAT)]
        + [f"{r['question']} {r['context']} {r['statement']}" for r in rows],
    )
    result = train_lora.train(
        train_lora.TrainConfig(
            base_model=str(model_dir),
            data_dir=str(claims),
            out_dir=str(adapter),
            max_steps=3,
            batch_size=4,
            warmup_steps=1,
            lora_r=4,
            lora_alpha=8,
            max_seq_tokens=2048,
            balanced_batches=True,
            checkpoint_every=2,
        ),
        progress=False,
    )
    assert result["steps_done"] == 3 and result["train_claims"] == summary["train"]["n"]
    assert json.loads((adapter / "data_recipe.json").read_text())["sampler"] == sp.RECIPE

    calibrate.main(
        ["--base-model", str(model_dir), "--adapter", str(adapter), "--data", str(claims)]
    )
    assert (adapter / "calibration.json").exists()

    report = rerank.rerank(
        list(sp.read_samples(samples)),
        rerank.model_scorer(str(model_dir), str(adapter))[0],
        k=4,
        kinds=["plan"],
    )
    assert report["questions"] == QUESTIONS and report["claims"] > 0
    # every rule serves an answer some sample gave, so none beats the oracle
    assert all(report["right"][rule] <= report["right"]["oracle"] for rule in report["right"])
    assert report["auroc"] is None or 0 <= report["auroc"] <= 1
