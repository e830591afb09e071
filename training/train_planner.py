"""Fine-tune a LoRA adapter on the planner's own right plans (supervised, by rejection sampling).

Data: the directory `training.planner_data` writes (`train.jsonl`, `val.jsonl`,
`recipe.json`): plans the serving planner drew for GSM8K train questions, executed with
the real tools, kept when right and free of void steps. Each example is trained the way
the planner is asked at serving time: the prompt is `planner.prompting.build_messages`
for the question (the system prompt, the tools a `/plan` request offers by default and
the few-shot exchanges) through the model's chat template, and the target is the plan
written in the plan format the planner serves (`render_example`, the function that
writes the prompt's own few-shot answers: for `draft`, the plan's thinking and its
program in a python block), then the end-of-turn token. The loss is the cross-entropy of
the target's tokens only, each example's tokens weighted by its `weight`.

Every example's prompt starts with the same system prompt and few-shot exchanges (about
1,200 tokens for the plan prompt). That shared prefix is evaluated once per optimizer
step, without gradients, with the weights of that step (so every forward pass is the
exact one of the model being trained); each example then runs only its question and
target on a copy of the prefix's KV cache, with gradients. The update therefore leaves
out the gradient through the prefix's keys and values in the adapted layers (the
adapter learns to write the plan given the prompt, not to re-read the prompt), which
makes a CPU step several times cheaper than running the whole prompt per example.

Habits of `training.train_lora`: a typed config with every default commented, a
progress bar, resumable checkpoints (`--checkpoint-every`, `--time-budget-s`; a rerun
with the same config continues), validation loss every `--eval-every` steps with
`--keep-best`, and the config, data recipe and loss curve saved beside the adapter.

    python -m training.planner_data --samples \\
        training/samples/qwen2.5-coder-1.5b-instruct/gsm8k-train-draft.jsonl --out var/planner-sft
    python -m training.train_planner --base-model ~/.cache/reason/models/qwen2.5-coder-0.5b-instruct/hf \\
        --data var/planner-sft --out planner/adapters/qwen2.5-coder-0.5b-instruct

On a GPU (the 1.5B model, Phi-3.5-mini): the same command with `--device cuda
--dtype bfloat16 --lora-top-layers 0` (docs/benchmarks/planner.md).
"""

from __future__ import annotations

import copy
import inspect
import json
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from planner.prompting import (
    DEFAULT_SHOTS,
    PLAN_FORMATS,
    build_messages,
    few_shot,
    render_example,
)
from services.toolspecs import DEFAULT_TOOLS
from training.data import read_jsonl
from training.scoring import load_tokenizer, set_threads
from training.train_lora import (
    CHECKPOINT_DIR,
    check_device,
    config_from_args,
    copy_data_recipe,
    keep_if_best,
    lr_at,
    save_adapter,
    save_checkpoint,
    start_or_resume,
    step_range,
    top_layers,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class PlannerTrainConfig:
    base_model: str  # directory of the base causal LM (safetensors + tokenizer)
    data_dir: str  # directory with train.jsonl and val.jsonl (from training.planner_data)
    out_dir: str  # where the adapter and its records are written
    base_model_name: str = ""  # name recorded in adapter_config.json (default: the dir name)
    # The plan format the targets are written in: the planner's `PLANNER_PLAN_FORMAT`
    # (services.settings), which the adapter is then served with.
    plan_format: str = "draft"
    # How many of the plan prompt's worked examples the training prompts show: the
    # planner's `PLANNER_FEW_SHOT`, which the adapter is then served with.
    few_shot: int = DEFAULT_SHOTS
    seed: int = 7  # seeds data order, LoRA initialisation and dropout
    # --- LoRA
    lora_r: int = 16  # rank of each low-rank update (dimensionless)
    lora_alpha: int = 32  # updates are scaled by lora_alpha / lora_r (dimensionless)
    lora_dropout: float = 0.05  # dropout probability on the LoRA input during training
    target_modules: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )  # linear layers that get an adapter (names in the llama/qwen2 architecture)
    # Adapters only in the top N decoder layers (0 = all): backpropagation then stops
    # there, which makes a CPU step several times cheaper.
    lora_top_layers: int = 8
    # --- optimisation
    max_steps: int = 80  # optimizer steps (one batch each)
    batch_size: int = 4  # examples per optimizer step
    learning_rate: float = 2e-4  # peak AdamW step size (per step, after warm-up)
    warmup_steps: int = 5  # steps of linear warm-up from 0 to learning_rate
    min_lr_ratio: float = 0.1  # cosine decay ends at learning_rate * min_lr_ratio
    weight_decay: float = 0.0  # AdamW decoupled weight decay (per step, times lr)
    grad_clip_norm: float = 1.0  # clip the global L2 norm of gradients to this
    # Examples whose target is longer (in tokens) are skipped: the planner's
    # `PLANNER_MAX_TOKENS` default, so no target is one serving would cut short.
    max_target_tokens: int = 512
    # Stop early (and save) once this many seconds of training have passed; 0 = no limit.
    time_budget_s: float = 0.0
    # Steps between resumable checkpoints in out_dir/checkpoint (0 = none); one is also
    # written when the time budget stops the run. A rerun with the same config resumes.
    checkpoint_every: int = 0
    # --- selection on the validation split (val.jsonl beside train.jsonl)
    # Steps between scoring val.jsonl (mean target-token loss, logged); 0 = never.
    eval_every: int = 0
    # Save the adapter of the scored step with the lowest val loss instead of the last.
    keep_best: bool = False
    # --- machine and records
    threads: int = 2  # torch CPU threads
    # "cpu" here; "cuda" (or "cuda:N") for the 1.5B model or Phi-3.5-mini on a GPU.
    device: str = "cpu"
    # Weights' dtype while training: float32 on a CPU; bfloat16 on a GPU.
    dtype: str = "float32"
    log_every: int = 5  # steps between log lines / train_log.jsonl records

    def __post_init__(self) -> None:
        if not (Path(self.base_model) / "config.json").exists():
            raise ValueError(
                f"base_model {self.base_model!r} has no config.json; pass a transformers "
                "model directory (services.catalog.ensure_hf_dir makes one from a catalog GGUF)"
            )
        for name in ("train.jsonl", "val.jsonl"):
            if not (Path(self.data_dir) / name).exists():
                raise ValueError(
                    f"{self.data_dir}/{name} is missing; build the data with "
                    f"`python -m training.planner_data --out {self.data_dir}`"
                )
        if self.plan_format not in PLAN_FORMATS:
            raise ValueError(f"plan_format must be one of {', '.join(PLAN_FORMATS)}")
        if not 0 <= self.few_shot <= len(few_shot()):
            raise ValueError(f"few_shot must be 0 to {len(few_shot())}")
        if self.lora_r < 1 or self.lora_alpha < 1:
            raise ValueError("lora_r and lora_alpha must be >= 1")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError("lora_dropout is a probability in [0, 1)")
        if not self.target_modules:
            raise ValueError("target_modules must name at least one linear layer")
        if self.lora_top_layers < 0:
            raise ValueError("lora_top_layers must be >= 0 (0 = every layer)")
        if self.max_steps < 1 or self.batch_size < 1:
            raise ValueError("max_steps and batch_size must be >= 1")
        if not 0 < self.learning_rate < 1:
            raise ValueError(f"learning_rate {self.learning_rate} is outside (0, 1); try 2e-4")
        if not 0 <= self.warmup_steps < self.max_steps:
            raise ValueError("warmup_steps must be in [0, max_steps)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("min_lr_ratio must be in [0, 1]")
        if self.grad_clip_norm <= 0 or self.weight_decay < 0:
            raise ValueError("grad_clip_norm must be > 0 and weight_decay >= 0")
        if self.max_target_tokens < 8:
            raise ValueError("max_target_tokens must be >= 8")
        if self.time_budget_s < 0:
            raise ValueError("time_budget_s must be >= 0 (0 = no limit)")
        if self.checkpoint_every < 0 or self.eval_every < 0:
            raise ValueError("checkpoint_every and eval_every must be >= 0 (0 = off)")
        if self.keep_best and not self.eval_every:
            raise ValueError("keep_best chooses among scored steps: set eval_every too")
        if self.threads < 1 or self.log_every < 1:
            raise ValueError("threads and log_every must be >= 1")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
        check_device(self.device)
        if not self.base_model_name:
            self.base_model_name = Path(self.base_model).resolve().name


@dataclass(frozen=True)
class Encoded:
    """One example as token ids: the shared prefix, then the example's own part."""

    rest: list[int]  # the question's turn and the target, after the shared prefix
    target_start: int  # index in `rest` of the target's first token
    weight: float


def target_text(example: dict[str, Any], fmt: str) -> str:
    """The plan as the model is asked to write it in `fmt` (the few-shot answers' form)."""
    plan = example["plan"]
    return render_example({"plan": plan, "thought": plan.get("reasoning", "")}, fmt)  # type: ignore[arg-type]


def chat_ids(tokenizer: Any, messages: list[dict[str, str]], generation: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=generation, tokenize=True, return_dict=False
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 returns an encoding
        ids = ids["input_ids"]
    return list(ids)


def planner_messages(question: str, fmt: str, shots: int = DEFAULT_SHOTS) -> list[dict[str, str]]:
    """The planner's first-pass messages for a question, over the tools a `/plan` request
    gets when it names none (`planner.service`), with `shots` worked examples."""
    return build_messages(question, list(DEFAULT_TOOLS), None, fmt, shots)  # type: ignore[arg-type]


def shared_prefix(tokenizer: Any, fmt: str, shots: int = DEFAULT_SHOTS) -> list[int]:
    """Token ids of the system prompt and few-shot exchanges every example starts with."""
    messages = planner_messages("?", fmt, shots)[:-1]
    return chat_ids(tokenizer, messages, generation=False)


def encode(
    example: dict[str, Any],
    tokenizer: Any,
    fmt: str,
    prefix: list[int],
    shots: int = DEFAULT_SHOTS,
) -> Encoded | None:
    """The example's tokens after `prefix`, or None where the chat template does not
    tokenize the conversation as the prefix followed by the rest (then it cannot share
    the prefix's cache)."""
    messages = planner_messages(example["question"], fmt, shots)
    prompt = chat_ids(tokenizer, messages, generation=True)
    full = chat_ids(
        tokenizer,
        [*messages, {"role": "assistant", "content": target_text(example, fmt)}],
        generation=False,
    )
    if full[: len(prefix)] != prefix or full[: len(prompt)] != prompt:
        return None
    end = len(full)
    # The template may close the turn with more than the end-of-turn token (Qwen's adds a
    # newline); the target ends at the end-of-turn token, where generation stops.
    vocab = tokenizer.get_vocab()
    eos = vocab["<|im_end|>"] if "<|im_end|>" in vocab else tokenizer.eos_token_id
    if eos in full[len(prompt) :]:
        end = len(prompt) + full[len(prompt) :].index(eos) + 1
    return Encoded(
        rest=full[len(prefix) : end],
        target_start=len(prompt) - len(prefix),
        weight=float(example.get("weight", 1.0)),
    )


def load_examples(
    path: Path, tokenizer: Any, cfg: PlannerTrainConfig, prefix: list[int]
) -> tuple[list[Encoded], dict[str, int]]:
    rows = read_jsonl(path)
    kept: list[Encoded] = []
    skipped = {"too_long": 0, "template": 0}
    for row in rows:
        enc = encode(row, tokenizer, cfg.plan_format, prefix, cfg.few_shot)
        if enc is None:
            skipped["template"] += 1
        elif len(enc.rest) - enc.target_start > cfg.max_target_tokens:
            skipped["too_long"] += 1
        else:
            kept.append(enc)
    return kept, skipped


def cache_argument(model: Any) -> str:
    """The forward argument that takes a KV cache: `cache` in transformers 5 (which
    deprecates `past_key_values`), `past_key_values` before it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def prefix_cache(model: Any, prefix: torch.Tensor) -> Any:
    """The KV cache of the shared prefix under the current weights, no dropout, no grad."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        cache = model(input_ids=prefix, use_cache=True).past_key_values  # the output's name
    model.train(was_training)
    return cache


def example_loss(model: Any, cache: Any, enc: Encoded, device: str) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy of the example's target tokens, and how many there are."""
    rest = torch.tensor([enc.rest], device=device)
    n_target = len(enc.rest) - enc.target_start
    # logits at position i predict token i + 1: the target's tokens are predicted by the
    # positions from target_start - 1 to the one before last
    logits = model(
        input_ids=rest,
        use_cache=True,
        logits_to_keep=n_target + 1,
        **{cache_argument(model): copy.deepcopy(cache)},
    ).logits[0, :-1, :]
    targets = rest[0, enc.target_start :]
    loss = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
    return loss, n_target


def val_loss(model: Any, cache_of: Any, examples: list[Encoded], device: str) -> float:
    model.eval()
    total, count = 0.0, 0
    cache = cache_of()
    with torch.no_grad():
        for enc in examples:
            loss, n = example_loss(model, cache, enc, device)
            total += float(loss) * enc.weight
            count += n * enc.weight
    model.train()
    return round(total / max(count, 1e-9), 4)


def make_batches(n: int, cfg: PlannerTrainConfig, rng: random.Random) -> list[list[int]]:
    """Index batches for max_steps steps: epochs of the shuffled examples, back to back."""
    batches: list[list[int]] = []
    while len(batches) < cfg.max_steps:
        order = list(range(n))
        rng.shuffle(order)
        batches += [
            order[k : k + cfg.batch_size] for k in range(0, n - cfg.batch_size + 1, cfg.batch_size)
        ] or [order]
    return batches[: cfg.max_steps]


def train(
    cfg: PlannerTrainConfig, progress: bool = True, steps_this_run: int | None = None
) -> dict[str, Any]:
    """Train (or resume) the adapter; `steps_this_run` stops this run after that many
    steps, as a time budget would (the next run resumes from its checkpoint)."""
    from peft import (
        LoraConfig,
        get_peft_model,
        set_peft_model_state_dict,
    )
    from transformers import AutoModelForCausalLM

    set_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = load_tokenizer(cfg.base_model)
    prefix = shared_prefix(tokenizer, cfg.plan_format, cfg.few_shot)
    examples, skipped = load_examples(Path(cfg.data_dir) / "train.jsonl", tokenizer, cfg, prefix)
    if not examples:
        raise ValueError(f"{cfg.data_dir}/train.jsonl has no example to train on ({skipped})")
    val_examples: list[Encoded] = []
    if cfg.eval_every:
        val_examples, _ = load_examples(Path(cfg.data_dir) / "val.jsonl", tokenizer, cfg, prefix)
        if not val_examples:
            raise ValueError(f"eval_every scores {cfg.data_dir}/val.jsonl, which has no example")

    base = AutoModelForCausalLM.from_pretrained(cfg.base_model, dtype=DTYPES[cfg.dtype])
    base.to(cfg.device)
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.target_modules),
        layers_to_transform=top_layers(base, cfg.lora_top_layers),
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    prefix_ids = torch.tensor([prefix], device=cfg.device)

    rng = random.Random(cfg.seed)
    plan = make_batches(len(examples), cfg, rng)
    log_path = out / "train_log.jsonl"
    best: dict[str, Any] | None  # {"step", "val_loss", "adapter"}
    checkpoint = out / CHECKPOINT_DIR
    first_step, trained_s, best = start_or_resume(checkpoint, cfg, model, optimizer, log_path)
    log_file = log_path.open("a")
    steps, bar = step_range(cfg, first_step, steps_this_run, "planner lora", progress)
    started = time.perf_counter()
    window_loss, window_tokens = 0.0, 0.0
    steps_done = first_step
    for step in steps:
        if cfg.time_budget_s and time.perf_counter() - started > cfg.time_budget_s:
            break
        batch = [examples[i] for i in plan[step]]
        optimizer.zero_grad(set_to_none=True)
        cache = prefix_cache(model, prefix_ids)
        weighted_tokens = sum(e.weight * (len(e.rest) - e.target_start) for e in batch)
        for enc in batch:
            loss, n = example_loss(model, cache, enc, cfg.device)
            # the batch's loss is the weighted mean over all its target tokens
            (loss * enc.weight / weighted_tokens).backward()
            window_loss += float(loss.detach()) * enc.weight
            window_tokens += n * enc.weight
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip_norm)
        optimizer.step()
        steps_done = step + 1
        if cfg.eval_every and (steps_done % cfg.eval_every == 0 or steps_done == cfg.max_steps):
            scored = {
                "step": steps_done,
                "val_loss": val_loss(
                    model, lambda: prefix_cache(model, prefix_ids), val_examples, cfg.device
                ),
            }
            log_file.write(json.dumps(scored) + "\n")
            log_file.flush()
            best = keep_if_best(best, scored, model, "val_loss", higher=False)
        if cfg.checkpoint_every and steps_done % cfg.checkpoint_every == 0:
            save_checkpoint(
                checkpoint,
                cfg,
                model,
                optimizer,
                steps_done,
                trained_s + time.perf_counter() - started,
                best,
            )
        if steps_done % cfg.log_every == 0 or steps_done == cfg.max_steps:
            record = {
                "step": steps_done,
                "loss": round(window_loss / window_tokens, 4),
                "lr": lr_at(step, cfg),
                "elapsed_s": round(time.perf_counter() - started, 1),
            }
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            if bar is not None:
                bar.set_postfix(loss=record["loss"])
            window_loss, window_tokens = 0.0, 0.0
    if window_tokens:  # the last partial window of a run stopped early
        log_file.write(
            json.dumps(
                {
                    "step": steps_done,
                    "loss": round(window_loss / window_tokens, 4),
                    "lr": lr_at(steps_done - 1, cfg),
                    "elapsed_s": round(time.perf_counter() - started, 1),
                }
            )
            + "\n"
        )
    log_file.close()
    elapsed = trained_s + time.perf_counter() - started
    if steps_done < cfg.max_steps:
        if cfg.checkpoint_every:
            save_checkpoint(checkpoint, cfg, model, optimizer, steps_done, elapsed, best)
        return {"steps_done": steps_done, "finished": False, "train_seconds": round(elapsed, 1)}
    shutil.rmtree(checkpoint, ignore_errors=True)
    if cfg.keep_best and best is not None:
        set_peft_model_state_dict(model, best["adapter"])

    save_adapter(model, out, cfg.base_model_name)
    (out / "README.md").write_text(
        f"# LoRA planner adapter for {cfg.base_model_name}\n\n"
        "Made by `training/train_planner.py` from the planner's own right plans "
        "(`training/planner_data.py`); the config, data recipe and loss curve are in "
        "`train_config.json`, `data_recipe.json` and `train_log.jsonl` beside this file. "
        f"Served with `PLANNER_PLAN_FORMAT={cfg.plan_format} PLANNER_FEW_SHOT={cfg.few_shot}`.\n\n"
        "```\npython -m training.train_planner " + " ".join(sys.argv[1:]) + "\n```\n"
    )
    copy_data_recipe(Path(cfg.data_dir), out)
    summary = {
        "train_examples": len(examples),
        "skipped": skipped,
        "val_examples": len(val_examples),
        "prefix_tokens": len(prefix),
        "trainable_parameters": n_trainable,
        "train_seconds": round(elapsed, 1),
        "steps_done": steps_done,
        "resumed_at_step": first_step,
        "seconds_per_step": round(elapsed / max(1, steps_done - first_step or 1), 2),
        "epochs": round(cfg.max_steps * cfg.batch_size / len(examples), 2),
        "torch": torch.__version__,
        "finished": True,
    }
    if best is not None:
        summary["best_val"] = {k: v for k, v in best.items() if k != "adapter"}
        summary["saved_step"] = best["step"] if cfg.keep_best else steps_done
    (out / "train_config.json").write_text(
        json.dumps({"config": asdict(cfg), "summary": summary}, indent=2) + "\n"
    )
    return summary


def parse_args(argv: list[str] | None = None) -> PlannerTrainConfig:
    return config_from_args(PlannerTrainConfig, __doc__ or "", argv)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    print(json.dumps(train(cfg)))


if __name__ == "__main__":
    main()
