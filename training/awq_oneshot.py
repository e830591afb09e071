"""The AWQ step itself, run in the quantize venv (scripts/setup_quantize.sh), not the
project's: it imports only llm-compressor and what llm-compressor brings (transformers,
datasets), and reads its calibration texts from a file `training.quantize_awq` wrote.

    <quantize venv>/bin/python training/awq_oneshot.py --model DIR --calibration FILE \\
        --out DIR [--scheme W4A16_ASYM] [--max-seq-len 2048] [--device cpu]

Writes the compressed checkpoint (`save_compressed=True`: compressed-tensors' packed
4-bit format, which vLLM reads from `config.json`'s `quantization_config`) and the
tokenizer into --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--calibration", type=Path, required=True, help="JSONL, one {text}")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scheme", default="W4A16_ASYM")
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.awq import AWQModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not torch.accelerator.is_available():
        # llm-compressor 0.14's AWQ pins its cached activations in page-locked memory for
        # fast copies to the accelerator, which torch refuses on a machine without one;
        # with no accelerator there is no copy to speed up, so pinning is skipped (CI
        # quantizes a tiny model on a CPU; the real run is on a GPU, where this is unused).
        from llmcompressor.pipelines.cache import IntermediatesCache

        IntermediatesCache._pin_intermediate = classmethod(lambda cls, intermediate: None)
    texts = [json.loads(line)["text"] for line in args.calibration.read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    dataset = Dataset.from_dict({"text": texts}).map(
        lambda row: tokenizer(
            row["text"], truncation=True, max_length=args.max_seq_len, add_special_tokens=False
        ),
        remove_columns=["text"],
    )
    dtype = torch.float32 if args.device == "cpu" else "auto"
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=dtype)
    model.to(args.device)
    started = time.perf_counter()
    oneshot(
        model=model,
        dataset=dataset,
        recipe=[AWQModifier(ignore=["lm_head"], scheme=args.scheme, targets=["Linear"])],
        max_seq_length=args.max_seq_len,
        num_calibration_samples=len(texts),
    )
    seconds = time.perf_counter() - started
    model.save_pretrained(str(args.out), save_compressed=True)
    tokenizer.save_pretrained(str(args.out))
    print(json.dumps({"oneshot_seconds": round(seconds, 1), "samples": len(texts)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
