"""The training scripts end to end on a tiny random llama: data -> LoRA -> calibration ->
evaluation -> the adapter served by the verifier's model backend. Proves the scripts and
the hand-off work; says nothing about accuracy (that is docs/benchmarks/verifier.md)."""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("transformers")

from training import calibrate, compare, data, evaluate, metrics, train_lora  # noqa: E402
from training.prompt import PROMPT_FORMAT  # noqa: E402


def make_tiny_model(directory: Path, texts: list[str]) -> None:
    """A 2-layer random llama and a word-level tokenizer over the words in `texts`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = sorted({w for t in texts for w in re.findall(r"\w+|[^\w\s]", t)})
    vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]", "[EOS]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )
    fast.save_pretrained(str(directory))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    LlamaForCausalLM(config).save_pretrained(str(directory))


@pytest.mark.model
@pytest.mark.slow
def test_train_calibrate_evaluate_and_serve(tmp_path: Path) -> None:
    data_dir, model_dir, adapter_dir = tmp_path / "data", tmp_path / "tiny", tmp_path / "adapter"
    data.main(
        [
            "--out",
            str(data_dir),
            "--seed",
            "3",
            "--n-train",
            "64",
            "--n-val",
            "24",
            "--n-test",
            "24",
            "--n-gsm8k-test",
            "16",
        ]
    )
    rows = [
        r
        for s in ("train", "val", "test", "gsm8k_test")
        for r in data.read_jsonl(data_dir / f"{s}.jsonl")
    ]
    assert {r["kind"] for r in rows} >= {"arith", "logic", "gsm8k_gold"}
    texts = [json.dumps(PROMPT_FORMAT)] + [
        f"{r['question']} {r['context']} {r['statement']}" for r in rows
    ]
    model_dir.mkdir()
    make_tiny_model(model_dir, texts)

    cfg = train_lora.TrainConfig(
        base_model=str(model_dir),
        data_dir=str(data_dir),
        out_dir=str(adapter_dir),
        max_steps=4,
        batch_size=4,
        warmup_steps=1,
        lora_r=4,
        lora_alpha=8,
        lora_top_layers=1,
        max_seq_tokens=512,
        log_every=2,
    )
    summary = train_lora.train(cfg, progress=False)
    assert summary["train_claims"] == len(data.read_jsonl(data_dir / "train.jsonl")) > 50
    for name in (
        "adapter_config.json",
        "adapter_model.safetensors",
        "prompt.json",
        "train_config.json",
        "data_recipe.json",
        "train_log.jsonl",
    ):
        assert (adapter_dir / name).exists(), name
    log = [json.loads(x) for x in (adapter_dir / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [2, 4] and all(r["loss"] > 0 for r in log)
    # only the top layer was adapted
    conf = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert conf["layers_to_transform"] == [1] and conf["r"] == 4

    calibrate.main(
        ["--base-model", str(model_dir), "--adapter", str(adapter_dir), "--data", str(data_dir)]
    )
    cal = json.loads((adapter_dir / "calibration.json").read_text())
    assert cal["temperature"] > 0 and cal["after"]["nll"] <= cal["before"]["nll"] + 1e-9
    assert cal["method"] == "temperature_scaling_with_bias" and "bias" in cal

    out = tmp_path / "metrics.json"
    evaluate.main(
        [
            "--base-model",
            str(model_dir),
            "--adapter",
            str(adapter_dir),
            "--data",
            str(data_dir),
            "--out",
            str(out),
            "--scores-out",
            str(tmp_path / "scores.json"),
        ]
    )
    result = json.loads(out.read_text())["models"]
    scores = json.loads((tmp_path / "scores.json").read_text())
    n_test = len(data.read_jsonl(data_dir / "test.jsonl"))
    assert set(scores) == {"untrained", "lora"} and len(scores["lora"]["test"]) == n_test
    assert scores["lora"]["temperature"] == pytest.approx(cal["temperature"])
    assert scores["lora"]["bias"] == pytest.approx(cal["bias"])
    paired = compare.compare_split(
        scores["untrained"]["test"],
        scores["lora"]["test"],
        50,
        1,
        (scores["untrained"]["temperature"], scores["untrained"]["bias"]),
        (scores["lora"]["temperature"], scores["lora"]["bias"]),
    )
    assert paired["accuracy_a"] == result["untrained"]["test"]["calibrated"]["accuracy"]
    assert paired["accuracy_b"] == result["lora"]["test"]["calibrated"]["accuracy"]
    for model in ("untrained", "lora"):
        for split in ("test", "gsm8k_test"):
            for mode in ("uncalibrated", "calibrated"):
                m = result[model][split][mode]
                assert 0 <= m["accuracy"] <= 1 and 0 <= m["ece"] <= 1 and 0 <= m["brier"] <= 1

    only = evaluate.evaluate(
        str(model_dir), str(adapter_dir), str(data_dir), ["test"], limit=8, untrained=False
    )
    assert set(only) == {"lora"} and only["lora"]["test"]["calibrated"]["n"] == 8
    # the validation split can be reported too, under the adapter's stored calibration
    with_val = evaluate.evaluate(
        str(model_dir), str(adapter_dir), str(data_dir), ["val", "test"], limit=8, untrained=False
    )
    assert with_val["lora"]["val"]["calibrated"]["n"] == 8
    assert with_val["lora"]["temperature"] == pytest.approx(cal["temperature"], abs=1e-6)

    # the adapter directory is all serving needs
    from services.settings import VerifierSettings
    from verifier.backends.base import Claim
    from verifier.backends.model import ModelVerifier

    backend = ModelVerifier(
        VerifierSettings(backend="model", base_model=str(model_dir), adapter_dir=adapter_dir)
    )

    async def serve() -> list[float]:
        await backend.load()
        return await backend.score([Claim("2 + 2 = 5"), Claim("7 * 8 = 56", "", "What?")])

    probs = asyncio.run(serve())
    assert len(probs) == 2 and all(0 < p < 1 for p in probs)
    assert backend.temperature == pytest.approx(cal["temperature"])
    assert backend.bias == pytest.approx(cal["bias"])

    # a calibration.json written before biases existed is served as temperature only
    (adapter_dir / "calibration.json").write_text(json.dumps({"temperature": 2.0}))
    legacy = ModelVerifier(
        VerifierSettings(backend="model", base_model=str(model_dir), adapter_dir=adapter_dir)
    )
    asyncio.run(legacy.load())
    assert (legacy.temperature, legacy.bias) == (2.0, 0.0)


@pytest.mark.unit
def test_config_checks_give_actionable_messages(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"config\.json"):
        train_lora.TrainConfig(base_model=str(tmp_path), data_dir=str(tmp_path), out_dir="x")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("device", "message"),
    [("tpu", "not a torch device"), ("meta", "use cpu or cuda"), ("cuda:0", "torch sees none")],
)
def test_a_device_torch_cannot_use_here_is_refused_before_loading(
    device: str, message: str
) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match=message):
        train_lora.check_device(device)
    train_lora.check_device("cpu")  # what this machine trains on


@pytest.mark.unit
def test_metrics_on_known_values() -> None:
    labels = [True, False, True, False]
    assert metrics.auroc([0.9, 0.1, 0.8, 0.2], labels) == 1.0
    assert metrics.auroc([0.1, 0.9, 0.2, 0.8], labels) == 0.0
    assert metrics.brier([1.0, 0.0, 1.0, 0.0], labels) == 0.0
    assert metrics.ece([0.75] * 4, [True, True, True, False]) == pytest.approx(0.0)
    assert metrics.ece([0.9] * 4, labels) == pytest.approx(0.4)
    # a temperature fitted to over-confident logits is > 1
    logits = [4.0, -4.0, 4.0, -4.0, 4.0, -4.0]
    t = metrics.fit_temperature(logits, [True, False, False, False, True, True])
    assert t > 1


@pytest.mark.unit
def test_temperature_and_bias_are_recovered_and_fix_an_offset() -> None:
    rng = random.Random(3)
    # claims whose true P(TRUE) is sigmoid(z / 2 - 1): the raw scores are over-confident
    # and say TRUE too often
    logits = [rng.uniform(-6, 6) for _ in range(20000)]
    labels = [rng.random() < metrics.sigmoid(z / 2 - 1) for z in logits]
    t, b = metrics.fit_temperature_bias(logits, labels)
    assert t == pytest.approx(2.0, rel=0.08) and b == pytest.approx(-1.0, abs=0.08)
    # a temperature alone cannot move where the verdict flips; the bias can
    t_only = metrics.fit_temperature(logits, labels)
    ece = {
        "raw": metrics.report(logits, labels)["ece"],
        "t": metrics.report(logits, labels, t_only)["ece"],
        "t+b": metrics.report(logits, labels, t, b)["ece"],
    }
    assert ece["t+b"] < 0.02 < ece["t"] < ece["raw"]
    fitted = metrics.nll(logits, labels, t, b)
    assert fitted < metrics.nll(logits, labels, t_only) < metrics.nll(logits, labels)
    # the slope stays positive: anti-correlated scores get a huge T, never a reversed ranking
    t_rev, _ = metrics.fit_temperature_bias([-z for z in logits], labels)
    assert t_rev > 10


@pytest.mark.unit
def test_calibrate_methods() -> None:
    logits = [3.0, 2.0, 1.0, -1.0, 0.5, 2.5, -2.0, 1.5]
    labels = [True, False, True, False, False, True, False, False]
    t_only, b_zero = calibrate.fit(logits, labels, "temperature")
    assert b_zero == 0.0
    t, b = calibrate.fit(logits, labels, "temperature+bias")
    # the joint fit is at least as good as the temperature alone, and at its optimum in b
    assert metrics.nll(logits, labels, t, b) <= metrics.nll(logits, labels, t_only) + 1e-12
    grad_b = sum(metrics.calibrated(z, t, b) - y for z, y in zip(logits, labels, strict=True))
    assert abs(grad_b) < 1e-6 and b < 0  # 3 of 8 TRUE while most scores are positive
    with pytest.raises(ValueError, match="unknown calibration method"):
        calibrate.fit(logits, labels, "isotonic")
    with pytest.raises(ValueError, match="all TRUE"):
        calibrate.fit([1.0, 2.0], [True, True], "temperature+bias")


@pytest.mark.unit
def test_calibration_files_without_a_bias_are_temperature_only(tmp_path: Path) -> None:
    legacy = tmp_path / "calibration.json"
    legacy.write_text(json.dumps({"method": "temperature_scaling", "temperature": 0.9}))
    assert evaluate.read_calibration(legacy) == (0.9, 0.0, "temperature")
    legacy.write_text(json.dumps({"temperature": 1.5}))
    assert evaluate.read_calibration(legacy) == (1.5, 0.0, "temperature")
    legacy.write_text(json.dumps({"method": "isotonic", "temperature": 1.0}))
    with pytest.raises(ValueError, match="unknown calibration method"):
        evaluate.read_calibration(legacy)


@pytest.mark.unit
def test_balanced_batches_hold_equal_labels_and_parse_as_flags(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "train.jsonl").write_text("")
    args = ["--base-model", str(tmp_path), "--data", str(tmp_path), "--out", "x"]
    cfg = train_lora.parse_args([*args, "--balanced-batches", "--max-steps", "50"])
    assert cfg.balanced_batches is True and cfg.max_steps == 50
    assert train_lora.parse_args(args).balanced_batches is False
    # 3 of 4 claims TRUE: unbalanced batches would mirror that ratio
    rows = [{"label": i % 4 != 0} for i in range(200)]
    lengths = [i % 17 for i in range(200)]
    batches = train_lora.make_batches(rows, lengths, cfg, random.Random(1))
    assert len(batches) == 50
    for batch in batches:
        assert len(batch) == cfg.batch_size == len(set(batch))
        assert sum(rows[i]["label"] for i in batch) == cfg.batch_size // 2
    with pytest.raises(ValueError, match="even batch_size"):
        train_lora.parse_args([*args, "--balanced-batches", "--batch-size", "5"])
    with pytest.raises(ValueError, match="both TRUE and FALSE"):
        train_lora.make_batches([{"label": True}] * 20, [1] * 20, cfg, random.Random(1))


@pytest.mark.unit
def test_paired_comparison_counts_discordant_claims() -> None:
    labels = [True, False] * 10
    a = [{"id": i, "label": y, "z": 1.0 if y else -1.0} for i, y in enumerate(labels)]
    b = [dict(r, z=-r["z"] if r["id"] < 4 else r["z"]) for r in a]  # B misses 4 claims
    out = compare.compare_split(a, b, 200, 0)
    assert (out["accuracy_a"], out["accuracy_b"], out["accuracy_diff"]) == (1.0, 0.8, -0.2)
    assert (out["only_a_right"], out["only_b_right"]) == (4, 0)
    assert out["mcnemar_p"] == pytest.approx(0.125)  # 2 * (1/2)**4
    assert out["accuracy_diff_95"][0] <= -0.2 <= out["accuracy_diff_95"][1] <= 0
    assert compare.mcnemar_p(0, 0) == 1.0
    with pytest.raises(ValueError, match="different claims"):
        compare.compare_split(a, b[:-1], 10, 0)
