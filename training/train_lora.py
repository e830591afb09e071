"""Fine-tune a LoRA adapter that makes a causal LM a TRUE/FALSE claim verifier.

The model reads the prompt of `training/prompt.py`; the loss is the binary cross-entropy
of `sigmoid(logit(TRUE) - logit(FALSE))` at the last position against the claim's label,
exactly what serving computes. Output: the adapter directory (`adapter_config.json`,
`adapter_model.safetensors`) with `prompt.json`, `train_config.json`, `data_recipe.json`
and `train_log.jsonl` beside it.

Long runs resume: with `--checkpoint-every N` the run writes `checkpoint/` in the output
directory every N steps and when its time budget stops it (adapter, optimizer, random
state, step); a rerun with the same config continues from there and ends with the same
adapter an uninterrupted run makes. The finished run removes `checkpoint/`. A big model
fits in memory with `--micro-batch-size` (gradients accumulate over the batch) and
`--gradient-checkpointing`.

Small data overfits a long run: `--eval-every N` scores `val.jsonl` every N steps (AUROC
and loss, logged) and `--keep-best` saves the adapter of the scored step with the best
validation AUROC instead of the last one.

    python -m training.data --out var/verifier-data --seed 7
    python -m training.train_lora --base-model ~/.cache/reason/models/smollm2-135m-instruct/hf \\
        --data var/verifier-data --out verifier/adapters/smollm2-135m-instruct --seed 7
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from training.data import read_jsonl
from training.metrics import auroc
from training.prompt import answer_token_ids, write_prompt_format
from training.scoring import claim_prompt, load_tokenizer, score_rows, set_threads


@dataclass
class TrainConfig:
    base_model: str  # directory of the base causal LM (safetensors + tokenizer)
    data_dir: str  # directory with train.jsonl (from training.data) and recipe.json
    out_dir: str  # where the adapter and its records are written
    base_model_name: str = ""  # name recorded in adapter_config.json (default: the dir name)
    seed: int = 7  # seeds data order, LoRA initialisation and dropout
    # --- LoRA
    lora_r: int = 16  # rank of each low-rank update (dimensionless)
    lora_alpha: int = 32  # updates are scaled by lora_alpha / lora_r (dimensionless)
    lora_dropout: float = 0.05  # dropout probability on the LoRA input during training
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
    )  # linear layers that get an adapter (names in the llama architecture)
    # Adapters only in the top N decoder layers (0 = all): backpropagation then stops
    # there, which makes a CPU step several times cheaper.
    lora_top_layers: int = 10
    # --- optimisation
    max_steps: int = 120  # optimizer steps (one batch each)
    batch_size: int = 8  # claims per optimizer step
    learning_rate: float = 1e-3  # peak AdamW step size (per step, after warm-up)
    warmup_steps: int = 10  # steps of linear warm-up from 0 to learning_rate
    min_lr_ratio: float = 0.1  # cosine decay ends at learning_rate * min_lr_ratio
    weight_decay: float = 0.0  # AdamW decoupled weight decay (per step, times lr)
    grad_clip_norm: float = 1.0  # clip the global L2 norm of gradients to this
    max_seq_tokens: int = 192  # claims whose prompt is longer (in tokens) are skipped
    # Every batch holds as many TRUE as FALSE claims (batch_size must be even), so the
    # gradient never just pushes the bias towards the label of an unlucky batch.
    balanced_batches: bool = False
    # Stop early (and save) once this many seconds of training have passed; 0 = no limit.
    time_budget_s: float = 0.0
    # Claims per forward/backward pass (0 = the whole batch): gradients accumulate over
    # the batch, so the update is the batch's, at the memory of a micro-batch.
    micro_batch_size: int = 0
    # Recompute activations during backward instead of keeping them: less memory for
    # long prompts or big models, about a third more time per step.
    gradient_checkpointing: bool = False
    # Steps between resumable checkpoints in out_dir/checkpoint (0 = none); one is also
    # written when the time budget stops the run. A rerun with the same config resumes.
    checkpoint_every: int = 0
    # --- selection on the validation split (val.jsonl beside train.jsonl)
    # Steps between scoring val.jsonl (AUROC and loss, logged in train_log.jsonl);
    # 0 = never. Scoring runs without dropout and draws no random numbers, so it does
    # not change what the run trains.
    eval_every: int = 0
    # Save the adapter of the scored step with the best val AUROC instead of the last
    # step's: early stopping by selection, for small data that a long run overfits.
    keep_best: bool = False
    # --- machine and records
    threads: int = 1  # torch CPU threads (1 is fastest on a busy 2-core machine)
    # Where the model trains: "cpu" here; "cuda" (or "cuda:N") for the production
    # verifier, TinyLlama-1.1B, on a GPU (docs/benchmarks/verifier.md has the command).
    device: str = "cpu"
    log_every: int = 10  # steps between log lines / train_log.jsonl records

    def __post_init__(self) -> None:
        if not (Path(self.base_model) / "config.json").exists():
            raise ValueError(
                f"base_model {self.base_model!r} has no config.json; pass a transformers "
                "model directory (e.g. the one `reason models pull smollm2-135m-instruct` makes)"
            )
        if not (Path(self.data_dir) / "train.jsonl").exists():
            raise ValueError(
                f"{self.data_dir}/train.jsonl is missing; generate it with "
                f"`python -m training.data --out {self.data_dir}`"
            )
        if self.lora_r < 1 or self.lora_alpha < 1:
            raise ValueError("lora_r and lora_alpha must be >= 1")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError("lora_dropout is a probability in [0, 1)")
        if not self.target_modules:
            raise ValueError("target_modules must name at least one linear layer")
        if self.max_steps < 1 or self.batch_size < 1:
            raise ValueError("max_steps and batch_size must be >= 1")
        if not 0 < self.learning_rate < 1:
            raise ValueError(f"learning_rate {self.learning_rate} is outside (0, 1); try 5e-4")
        if not 0 <= self.warmup_steps < self.max_steps:
            raise ValueError("warmup_steps must be in [0, max_steps)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("min_lr_ratio must be in [0, 1]")
        if self.grad_clip_norm <= 0 or self.weight_decay < 0:
            raise ValueError("grad_clip_norm must be > 0 and weight_decay >= 0")
        if self.balanced_batches and self.batch_size % 2:
            raise ValueError("balanced_batches needs an even batch_size")
        if self.time_budget_s < 0:
            raise ValueError("time_budget_s must be >= 0 (0 = no limit)")
        if self.micro_batch_size < 0 or self.checkpoint_every < 0:
            raise ValueError("micro_batch_size and checkpoint_every must be >= 0 (0 = off)")
        if self.eval_every < 0:
            raise ValueError("eval_every must be >= 0 (0 = never)")
        if self.keep_best and not self.eval_every:
            raise ValueError("keep_best chooses among scored steps: set eval_every too")
        if self.eval_every and not (Path(self.data_dir) / "val.jsonl").exists():
            raise ValueError(f"eval_every scores {self.data_dir}/val.jsonl, which is missing")
        if self.max_seq_tokens < 16:
            raise ValueError("max_seq_tokens must be >= 16")
        if self.lora_top_layers < 0:
            raise ValueError("lora_top_layers must be >= 0 (0 = every layer)")
        if self.threads < 1 or self.log_every < 1:
            raise ValueError("threads and log_every must be >= 1")
        check_device(self.device)
        if not self.base_model_name:
            self.base_model_name = Path(self.base_model).resolve().name


def check_device(device: str) -> None:
    """Refuse a device torch cannot use here, before any model is loaded."""
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is not a torch device: {exc}") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asks for a GPU, and torch sees none here")
    index = torch.device(device).index
    if kind == "cuda" and index is not None and index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: torch sees {torch.cuda.device_count()} GPUs")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: use cpu or cuda[:N]")


def top_layers(model: Any, n: int) -> list[int] | None:
    """Indices of the top `n` decoder layers, or None for all of them."""
    total = int(model.config.num_hidden_layers)
    if n <= 0 or n >= total:
        return None
    return list(range(total - n, total))


def lr_at(step: int, cfg: Any) -> float:
    """Linear warm-up, then cosine decay to learning_rate * min_lr_ratio."""
    if step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.learning_rate * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def make_batches(
    rows: list[dict[str, Any]], lengths: list[int], cfg: TrainConfig, rng: random.Random
) -> list[list[int]]:
    """Index batches for max_steps steps: shuffled, grouped by similar length within pools."""
    if cfg.balanced_batches:
        return balanced_batches(rows, lengths, cfg, rng)
    batches: list[list[int]] = []
    while len(batches) < cfg.max_steps:
        order = list(range(len(rows)))
        rng.shuffle(order)
        pool = cfg.batch_size * 16
        epoch: list[list[int]] = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start : start + pool], key=lambda i: lengths[i])
            epoch += [chunk[k : k + cfg.batch_size] for k in range(0, len(chunk), cfg.batch_size)]
        epoch = [b for b in epoch if len(b) == cfg.batch_size]
        rng.shuffle(epoch)
        batches += epoch
    return batches[: cfg.max_steps]


def balanced_batches(
    rows: list[dict[str, Any]], lengths: list[int], cfg: TrainConfig, rng: random.Random
) -> list[list[int]]:
    """Like make_batches, but each batch is half TRUE and half FALSE claims.

    Each label's claims are shuffled and cut into pools; within a pool they are sorted by
    length, and the k-th shortest TRUE half-batch is paired with the k-th shortest FALSE
    half-batch of the matching pool, so padding stays small.
    """
    half = cfg.batch_size // 2
    by_label = {
        label: [i for i, r in enumerate(rows) if bool(r["label"]) is label]
        for label in (True, False)
    }
    if not by_label[True] or not by_label[False]:
        raise ValueError("balanced_batches needs both TRUE and FALSE training claims")
    pool = half * 16
    batches: list[list[int]] = []
    while len(batches) < cfg.max_steps:
        halves: dict[bool, list[list[int]]] = {}
        for label, members in by_label.items():
            order = list(members)
            rng.shuffle(order)
            groups: list[list[int]] = []
            for start in range(0, len(order), pool):
                chunk = sorted(order[start : start + pool], key=lambda i: lengths[i])
                groups += [chunk[k : k + half] for k in range(0, len(chunk), half)]
            halves[label] = [g for g in groups if len(g) == half]
        epoch = [t + f for t, f in zip(halves[True], halves[False], strict=False)]
        rng.shuffle(epoch)
        batches += epoch
    return batches[: cfg.max_steps]


CHECKPOINT_DIR = "checkpoint"
# Fields a resumed run may change: they decide how fast or how long a run goes, not
# what it computes.
RESUMABLE_CHANGES = frozenset({"time_budget_s", "threads", "device", "log_every"})


def _recipe(cfg: Any) -> dict[str, Any]:
    return {k: v for k, v in asdict(cfg).items() if k not in RESUMABLE_CHANGES}


def save_checkpoint(
    directory: Path,
    cfg: Any,
    model: Any,
    optimizer: torch.optim.Optimizer,
    step: int,
    trained_s: float,
    best: dict[str, Any] | None = None,
) -> None:
    """Everything a rerun needs to go on from `step`, written whole or not at all."""
    from peft import get_peft_model_state_dict

    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step,
        "trained_s": trained_s,
        "config": _recipe(cfg),
        "adapter": get_peft_model_state_dict(model),
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "best": best,
    }
    tmp = directory / "state.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, directory / "state.pt")


def resume(
    directory: Path, cfg: Any, model: Any, optimizer: torch.optim.Optimizer
) -> tuple[int, float, dict[str, Any] | None]:
    """Load a checkpoint of the same config (a dataclass: this module's `TrainConfig`, or
    another training script's); returns its step, the seconds trained so far and the best
    scored step's record and adapter (None before the first scoring)."""
    from peft import set_peft_model_state_dict

    state = torch.load(directory / "state.pt", map_location=cfg.device, weights_only=False)
    # a checkpoint from before a field existed ran with that field's default
    defaults = {f.name: f.default for f in fields(type(cfg)) if f.default is not MISSING}
    saved = {**{k: v for k, v in defaults.items() if k in _recipe(cfg)}, **state["config"]}
    if saved != _recipe(cfg):
        changed = sorted(k for k, v in _recipe(cfg).items() if saved.get(k) != v)
        raise ValueError(
            f"{directory} holds a checkpoint of another config (differs in {', '.join(changed)}); "
            "rerun with that config to resume, or delete the directory to start over"
        )
    set_peft_model_state_dict(model, state["adapter"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return int(state["step"]), float(state["trained_s"]), state.get("best")


def start_or_resume(
    checkpoint: Path, cfg: Any, model: Any, optimizer: torch.optim.Optimizer, log_path: Path
) -> tuple[int, float, dict[str, Any] | None]:
    """Resume from `checkpoint` when it holds a state (the log keeps only the lines up to
    its step), else start at step 0 with a fresh log."""
    if not (checkpoint / "state.pt").exists():
        log_path.unlink(missing_ok=True)
        return 0, 0.0, None
    first_step, trained_s, best = resume(checkpoint, cfg, model, optimizer)
    kept = (
        [
            line
            for line in log_path.read_text().splitlines()
            if line.strip() and json.loads(line)["step"] <= first_step
        ]
        if log_path.exists()
        else []
    )
    log_path.write_text("".join(line + "\n" for line in kept))
    print(f"resuming at step {first_step} of {cfg.max_steps} from {checkpoint}", file=sys.stderr)
    return first_step, trained_s, best


def step_range(
    cfg: Any, first_step: int, steps_this_run: int | None, desc: str, progress: bool
) -> tuple[Any, Any]:
    """This run's steps (from `first_step`, at most `steps_this_run` of them), behind a
    progress bar when `progress`; returns them and the bar (None without one)."""
    last = (
        cfg.max_steps if steps_this_run is None else min(cfg.max_steps, first_step + steps_this_run)
    )
    steps: Any = range(first_step, last)
    if not progress:
        return steps, None
    from tqdm import tqdm

    bar = tqdm(steps, desc=desc, unit="step", initial=first_step, total=cfg.max_steps)
    return bar, bar


def keep_if_best(
    best: dict[str, Any] | None, scored: dict[str, Any], model: Any, key: str, higher: bool
) -> dict[str, Any]:
    """The scored step's record with a copy of the adapter when its `key` beats `best`'s
    (higher or lower is better), else `best`."""
    from peft import get_peft_model_state_dict

    if best is not None and (scored[key] <= best[key] if higher else scored[key] >= best[key]):
        return best
    adapter = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return {**scored, "adapter": adapter}


def save_adapter(model: Any, out: Path, base_model_name: str) -> None:
    """The PEFT adapter files, naming the base model as the catalog does."""
    model.save_pretrained(str(out))
    adapter_config = out / "adapter_config.json"
    conf = json.loads(adapter_config.read_text())
    conf["base_model_name_or_path"] = base_model_name
    adapter_config.write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")


def copy_data_recipe(data_dir: Path, out: Path) -> None:
    recipe = data_dir / "recipe.json"
    if recipe.exists():
        (out / "data_recipe.json").write_text(recipe.read_text())


def score_val(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], cfg: TrainConfig
) -> dict[str, float]:
    """AUROC and mean log-loss of the adapter being trained on the validation claims."""
    model.eval()  # no dropout while scoring
    zs = score_rows(
        model, tokenizer, rows, batch_size=cfg.micro_batch_size or cfg.batch_size, device=cfg.device
    )
    model.train()
    labels = [bool(r["label"]) for r in rows]
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        torch.tensor(zs), torch.tensor([float(x) for x in labels])
    )
    return {"val_auroc": round(auroc(zs, labels), 4), "val_loss": round(float(loss), 4)}


def train(
    cfg: TrainConfig, progress: bool = True, steps_this_run: int | None = None
) -> dict[str, Any]:
    """Train (or resume) the adapter; `steps_this_run` stops this run after that many
    steps, as a time budget would (the next run resumes from its checkpoint)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    set_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = load_tokenizer(cfg.base_model)
    true_id, false_id = answer_token_ids(tokenizer)
    all_rows = read_jsonl(Path(cfg.data_dir) / "train.jsonl")
    prompts = [claim_prompt(r) for r in all_rows]
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    keep = [i for i, n in enumerate(lengths) if n <= cfg.max_seq_tokens]
    rows = [all_rows[i] for i in keep]
    prompts = [prompts[i] for i in keep]
    lengths = [lengths[i] for i in keep]
    skipped = len(all_rows) - len(rows)
    val_rows: list[dict[str, Any]] = []
    if cfg.eval_every:  # as training sees claims: no longer ones
        val_rows = [
            r
            for r in read_jsonl(Path(cfg.data_dir) / "val.jsonl")
            if len(tokenizer(claim_prompt(r))["input_ids"]) <= cfg.max_seq_tokens
        ]
        if len({bool(r["label"]) for r in val_rows}) < 2:
            raise ValueError(
                "eval_every ranks val.jsonl's claims by AUROC, which needs TRUE and FALSE "
                f"claims within max_seq_tokens; {cfg.data_dir}/val.jsonl has one label only"
            )

    base = AutoModelForCausalLM.from_pretrained(cfg.base_model, dtype=torch.float32)
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
    if cfg.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(base, "activation_checkpointing_enable"):  # transformers 5's name
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        base.enable_input_require_grads()
    model = get_peft_model(base, lora)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    rng = random.Random(cfg.seed)
    plan = make_batches(rows, lengths, cfg, rng)
    log_path = out / "train_log.jsonl"
    best: dict[str, Any] | None  # {"step", "val_auroc", "val_loss", "adapter"}
    checkpoint = out / CHECKPOINT_DIR
    first_step, trained_s, best = start_or_resume(checkpoint, cfg, model, optimizer, log_path)
    log_file = log_path.open("a")
    micro = cfg.micro_batch_size or cfg.batch_size
    steps, bar = step_range(cfg, first_step, steps_this_run, "lora", progress)
    started = time.perf_counter()
    window_loss, window_hits, window_n = 0.0, 0, 0
    steps_done = first_step
    for step in steps:
        if cfg.time_budget_s and time.perf_counter() - started > cfg.time_budget_s:
            break
        idx = plan[step]
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, len(idx), micro):
            part = idx[start : start + micro]
            enc = tokenizer([prompts[i] for i in part], return_tensors="pt", padding=True)
            enc = {k: v.to(cfg.device) for k, v in enc.items()}
            labels = torch.tensor([float(rows[i]["label"]) for i in part], device=cfg.device)
            mask = enc["attention_mask"]
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(
                input_ids=enc["input_ids"],
                attention_mask=mask,
                position_ids=position_ids,
                logits_to_keep=1,
            ).logits[:, -1, :]
            z = logits[:, true_id] - logits[:, false_id]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z, labels)
            # the batch's mean loss is the size-weighted sum of its micro-batches' means
            (loss * (len(part) / len(idx))).backward()
            window_loss += loss.item() * len(part)
            window_hits += int(((z > 0).float() == labels).sum())
            window_n += len(part)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip_norm)
        optimizer.step()
        steps_done = step + 1
        if cfg.eval_every and (steps_done % cfg.eval_every == 0 or steps_done == cfg.max_steps):
            scored = {"step": steps_done, **score_val(model, tokenizer, val_rows, cfg)}
            log_file.write(json.dumps(scored) + "\n")
            log_file.flush()
            best = keep_if_best(best, scored, model, "val_auroc", higher=True)
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
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.max_steps:
            record = {
                "step": step + 1,
                "loss": round(window_loss / window_n, 4),
                "accuracy": round(window_hits / window_n, 4),
                "lr": lr_at(step, cfg),
                "elapsed_s": round(time.perf_counter() - started, 1),
            }
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            if bar is not None:
                bar.set_postfix(loss=record["loss"], acc=record["accuracy"])
            window_loss, window_hits, window_n = 0.0, 0, 0
    if window_n:  # the last partial window of a run stopped by time_budget_s
        log_file.write(
            json.dumps(
                {
                    "step": steps_done,
                    "loss": round(window_loss / window_n, 4),
                    "accuracy": round(window_hits / window_n, 4),
                    "lr": lr_at(steps_done - 1, cfg),
                    "elapsed_s": round(time.perf_counter() - started, 1),
                }
            )
            + "\n"
        )
    log_file.close()
    elapsed = trained_s + time.perf_counter() - started
    if steps_done < cfg.max_steps and cfg.checkpoint_every:
        save_checkpoint(checkpoint, cfg, model, optimizer, steps_done, elapsed, best)
    elif steps_done == cfg.max_steps:
        shutil.rmtree(checkpoint, ignore_errors=True)
    if cfg.keep_best and best is not None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, best["adapter"])

    save_adapter(model, out, cfg.base_model_name)
    write_prompt_format(out, tokenizer)
    # peft writes a blank model card; replace it with what reproduces this adapter
    (out / "README.md").write_text(
        f"# LoRA verifier adapter for {cfg.base_model_name}\n\n"
        "Made by `training/train_lora.py`; the config, data recipe and loss curve are in "
        "`train_config.json`, `data_recipe.json` and `train_log.jsonl` beside this file.\n\n"
        "```\npython -m training.train_lora " + " ".join(sys.argv[1:]) + "\n```\n"
    )
    copy_data_recipe(Path(cfg.data_dir), out)
    summary = {
        "train_claims": len(rows),
        "skipped_too_long": skipped,
        "trainable_parameters": n_trainable,
        "train_seconds": round(elapsed, 1),
        "steps_done": steps_done,
        "resumed_at_step": first_step,
        "seconds_per_step": round(elapsed / max(1, steps_done), 2),
        "torch": torch.__version__,
    }
    if best is not None:
        summary["best_val"] = {k: v for k, v in best.items() if k != "adapter"}
        summary["saved_step"] = best["step"] if cfg.keep_best else steps_done
    (out / "train_config.json").write_text(
        json.dumps({"config": asdict(cfg), "summary": summary}, indent=2) + "\n"
    )
    return summary


def config_from_args(cls: type[Any], description: str, argv: list[str] | None = None) -> Any:
    """A training config dataclass from the command line: one flag per field
    (`--base-model`, `--data`, `--out` required; lists take several values, booleans
    `--x`/`--no-x`); the config's own checks raise ValueError."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "target_modules":
            parser.add_argument(flag, nargs="+", default=None)
        elif isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        elif f.name in ("base_model", "data_dir", "out_dir"):
            parser.add_argument(
                flag if f.name != "data_dir" else "--data", dest=f.name, required=True
            )
        else:
            parser.add_argument(
                flag, type=type(f.default) if f.default is not None else str, default=f.default
            )
    args = vars(parser.parse_args(argv))
    if args["target_modules"] is None:
        args.pop("target_modules")
    return cls(**args)


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    return config_from_args(TrainConfig, __doc__ or "", argv)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    print(json.dumps(train(cfg)))


if __name__ == "__main__":
    main()
