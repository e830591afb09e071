"""Quantize the production planner to 4-bit with AWQ: llm-compressor's `oneshot` with
`AWQModifier` (AutoAWQ is deprecated in its favour), calibrated on GSM8K train plans.

The calibration texts are the planner's own work: each is a GSM8K train question's plan
prompt (`planner.prompting.build_messages`, the tools a request offers by default) and a
right plan the pipeline executed for it, in the format the planner serves, through the
model's chat template: the activations AWQ scales by are those of the prompts and plans
the quantized model will read and write. They come from `training.planner_data`'s
`train.jsonl` (never GSM8K test). This module writes them in the project venv; the
quantization runs in the quantize venv (`scripts/setup_quantize.sh`: llm-compressor pins
its own transformers) as `training/awq_oneshot.py`, which imports nothing from here.

Output (`--out`): the compressed checkpoint (4-bit weights, groups of 128, asymmetric:
`W4A16_ASYM`, compressed-tensors' packed format), the tokenizer, `calibration.jsonl` and
`quantize.json` (the command's settings, the calibration recipe and the checkpoint's
`quantization_config`). vLLM reads the format from `config.json`; the planner's
production settings name it (`PLANNER_QUANTIZATION=compressed-tensors`, `PLANNER_MODEL_PATH`
at the output).

The production run, on a GPU box (Phi-3.5-mini in bf16, about 20 min on one GPU):

    python -m training.quantize_awq --model /models/phi-3.5-mini-instruct \\
        --data var/planner-sft --out /models/phi-3.5-mini-instruct-awq --device cuda

CI quantizes a tiny random model end to end (tests/training/test_quantize_awq.py).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.data import read_jsonl

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "scripts" / "setup_quantize.sh"
ONESHOT = Path(__file__).with_name("awq_oneshot.py")
SCHEMES = ("W4A16_ASYM", "W4A16")


class QuantizeError(RuntimeError):
    """The quantization could not run; the message says why."""


def calibration_texts(
    data_dir: Path, model_dir: Path, *, plan_format: str, limit: int, seed: int
) -> list[str]:
    """Up to `limit` chat-formatted planner prompts with a right plan each, in a seeded
    order, from `data_dir/train.jsonl`."""
    from transformers import AutoTokenizer

    from training.train_planner import planner_messages, target_text

    rows = read_jsonl(data_dir / "train.jsonl")
    if not rows:
        raise QuantizeError(f"{data_dir}/train.jsonl holds no plan to calibrate on")
    random.Random(seed).shuffle(rows)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    texts = []
    for row in rows[:limit]:
        messages = planner_messages(row["question"], plan_format)
        messages.append({"role": "assistant", "content": target_text(row, plan_format)})
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
    return texts


def quantize_python() -> str:
    """The quantize venv's python, built on first use."""
    done = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise QuantizeError(f"{SETUP.name} failed:\n{tail}")
    return done.stdout.strip().splitlines()[-1]


def quantize(
    model_dir: Path,
    data_dir: Path,
    out: Path,
    *,
    samples: int = 128,
    max_seq_len: int = 2048,
    scheme: str = "W4A16_ASYM",
    plan_format: str = "draft",
    seed: int = 5,
    device: str = "cpu",
    python: str | None = None,
) -> dict[str, Any]:
    if not (model_dir / "config.json").is_file():
        raise QuantizeError(f"{model_dir} has no config.json: pass a transformers model directory")
    if scheme not in SCHEMES:
        raise QuantizeError(f"scheme must be one of {', '.join(SCHEMES)}")
    out.mkdir(parents=True, exist_ok=True)
    texts = calibration_texts(
        data_dir, model_dir, plan_format=plan_format, limit=samples, seed=seed
    )
    calibration = out / "calibration.jsonl"
    calibration.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    command = [
        python or quantize_python(),
        str(ONESHOT),
        "--model",
        str(model_dir),
        "--calibration",
        str(calibration),
        "--out",
        str(out),
        "--scheme",
        scheme,
        "--max-seq-len",
        str(max_seq_len),
        "--device",
        device,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise QuantizeError(f"awq_oneshot failed (exit {done.returncode}):\n{tail}")
    timing = json.loads(done.stdout.strip().splitlines()[-1])
    config = json.loads((out / "config.json").read_text())
    recipe = {
        "model": str(model_dir),
        "data": str(data_dir),
        "data_recipe": json.loads((data_dir / "recipe.json").read_text())
        if (data_dir / "recipe.json").is_file()
        else None,
        "calibration_samples": len(texts),
        "plan_format": plan_format,
        "seed": seed,
        "scheme": scheme,
        "max_seq_len": max_seq_len,
        "device": device,
        **timing,
        "quantization_config": config.get("quantization_config"),
    }
    (out / "quantize.json").write_text(json.dumps(recipe, indent=2) + "\n")
    return recipe


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="transformers model dir")
    parser.add_argument(
        "--data", type=Path, required=True, help="training.planner_data output (train.jsonl)"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=128, help="calibration texts")
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--scheme", choices=SCHEMES, default="W4A16_ASYM")
    parser.add_argument("--plan-format", default="draft")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for the real run")
    parser.add_argument("--python", help="the quantize venv's python (default: build it)")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be >= 1")
    try:
        recipe = quantize(
            args.model,
            args.data,
            args.out,
            samples=args.samples,
            max_seq_len=args.max_seq_len,
            scheme=args.scheme,
            plan_format=args.plan_format,
            seed=args.seed,
            device=args.device,
            python=args.python,
        )
    except QuantizeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(recipe, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
