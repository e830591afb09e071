"""train_planner on a tiny random llama with a chat template: examples are the planner's
own prompt and the plan in the served format, the shared prefix's cache gives the loss a
whole-sequence forward pass gives, a stopped run resumes to the uninterrupted run's
adapter, and the adapter is saved with its records."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
safetensors_torch = pytest.importorskip("safetensors.torch")

from planner.prompting import few_shot, system_template  # noqa: E402
from training import train_planner as tp  # noqa: E402

pytestmark = [pytest.mark.model]

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["[UNK]", "[PAD]", "<|im_start|>", "<|im_end|>"]


def plan(program: str, reasoning: str) -> dict[str, Any]:
    return {
        "reasoning": reasoning,
        "steps": [{"id": "s1", "tool": "python", "input": program, "depends_on": []}],
        "answer_step": "s1",
    }


EXAMPLES = [
    {
        "id": f"gsm8k-train-{i}",
        "question": f"Tom has {i} apples and buys {i + 2} more. How many apples does he have?",
        "plan": plan(f"apples = {i}\nbought = {i + 2}\nresult = apples + bought", "Add them."),
        "weight": 1.0,
    }
    for i in range(1, 9)
]


def make_tiny_chat_model(directory: Path, texts: list[str]) -> None:
    """A 2-layer random llama and a word-level tokenizer with a ChatML template."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = sorted({w for t in texts for w in re.findall(r"\w+|[^\w\s]", t)} - set(SPECIALS))
    vocab = {w: i for i, w in enumerate([*SPECIALS, *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS[2:]])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="<|im_end|>"
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(str(directory))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    LlamaForCausalLM(config).save_pretrained(str(directory))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny-planner")
    data_dir, model_dir = root / "data", root / "model"
    data_dir.mkdir()
    model_dir.mkdir()
    for name, rows in (("train", EXAMPLES[:6]), ("val", EXAMPLES[6:])):
        with (data_dir / f"{name}.jsonl").open("w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    (data_dir / "recipe.json").write_text(json.dumps({"recipe": "planner-sft/1", "kept": 8}))
    texts = [system_template("draft"), *(json.dumps(e) for e in few_shot())]
    texts += [e["question"] + " " + tp.target_text(e, "draft") for e in EXAMPLES]
    make_tiny_chat_model(model_dir, [*texts, "system user assistant"])
    return data_dir, model_dir


def config(tiny: tuple[Path, Path], out: Path, **kw: Any) -> tp.PlannerTrainConfig:
    data_dir, model_dir = tiny
    base: dict[str, Any] = {
        "base_model": str(model_dir),
        "data_dir": str(data_dir),
        "out_dir": str(out),
        "max_steps": 4,
        "batch_size": 2,
        "warmup_steps": 1,
        "lora_r": 4,
        "lora_alpha": 8,
        "lora_top_layers": 1,
        "learning_rate": 5e-3,
        "log_every": 1,
        "threads": 1,
    }
    return tp.PlannerTrainConfig(**{**base, **kw})


def test_an_example_is_the_planner_prompt_then_the_plan_in_the_served_format(
    tiny: tuple[Path, Path],
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny[1]))
    prefix = tp.shared_prefix(tokenizer, "draft")
    example = EXAMPLES[0]
    enc = tp.encode(example, tokenizer, "draft", prefix)
    assert enc is not None
    prompt = tokenizer.decode(enc.rest[: enc.target_start])
    assert example["question"].split()[0] in prompt and prompt.rstrip().endswith("assistant")
    target = tokenizer.decode(enc.rest[enc.target_start :])
    # the draft format: the thinking, then the program in a python block, then end of turn
    assert target.startswith("Add them")
    assert "python" in target and "result = apples + bought" in target
    assert enc.rest[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the same prompt bytes the planner sends: build_messages over the default tools
    system = tokenizer.decode(prefix)
    assert "python" in system and "calc" in system


def test_the_prompts_show_the_examples_the_config_names(tiny: tuple[Path, Path]) -> None:
    """The training prompt is the served one for the same PLANNER_FEW_SHOT: the shared
    prefix holds exactly the examples the config names."""
    from transformers import AutoTokenizer

    from services.settings import PlannerSettings

    tokenizer = AutoTokenizer.from_pretrained(str(tiny[1]))
    assert tp.PlannerTrainConfig.few_shot == PlannerSettings().few_shot
    from planner.prompting import build_messages
    from services.toolspecs import DEFAULT_TOOLS

    lengths = []
    for shots in (0, 3, 8):
        prefix = tp.shared_prefix(tokenizer, "draft", shots)
        served = build_messages("?", list(DEFAULT_TOOLS), None, "draft", shots)[:-1]
        assert len(served) == 1 + 2 * shots
        assert prefix == tp.chat_ids(tokenizer, served, generation=False)
        lengths.append(len(prefix))
    assert lengths == sorted(set(lengths))  # each count shows more than the one before
    enc = tp.encode(EXAMPLES[0], tokenizer, "draft", tp.shared_prefix(tokenizer, "draft", 8), 8)
    assert enc is not None


def test_the_prefix_cache_gives_the_whole_sequences_loss(tiny: tuple[Path, Path]) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny[1]))
    prefix = tp.shared_prefix(tokenizer, "draft")
    enc = tp.encode(EXAMPLES[1], tokenizer, "draft", prefix)
    assert enc is not None
    torch.manual_seed(1)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(tiny[1])),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    model.eval()
    cache = tp.prefix_cache(model, torch.tensor([prefix]))
    with torch.no_grad():
        cached, n = tp.example_loss(model, cache, enc, "cpu")
        cached_again, _ = tp.example_loss(model, cache, enc, "cpu")  # the cache is not consumed
        ids = torch.tensor([prefix + enc.rest])
        logits = model(input_ids=ids).logits[0]
        start = len(prefix) + enc.target_start
        whole = torch.nn.functional.cross_entropy(
            logits[start - 1 : -1], ids[0, start:], reduction="sum"
        )
    assert n == len(enc.rest) - enc.target_start
    assert torch.allclose(cached, whole, rtol=1e-4) and torch.equal(cached, cached_again)


def test_a_stopped_run_resumes_to_the_uninterrupted_runs_adapter(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    whole = tp.train(config(tiny, tmp_path / "whole", eval_every=2, keep_best=True), progress=False)
    assert whole["finished"] and whole["train_examples"] == 6 and whole["val_examples"] == 2
    out = tmp_path / "whole"
    for name in ("adapter_model.safetensors", "adapter_config.json", "README.md"):
        assert (out / name).is_file()
    assert json.loads((out / "data_recipe.json").read_text())["recipe"] == "planner-sft/1"
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "val_loss" in r] == [2, 4]
    assert all(r["loss"] > 0 for r in log if "loss" in r)
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["summary"]["saved_step"] == saved["summary"]["best_val"]["step"]
    conf = json.loads((out / "adapter_config.json").read_text())
    assert conf["base_model_name_or_path"] == "model" and conf["r"] == 4

    split = config(tiny, tmp_path / "split", eval_every=2, keep_best=True, checkpoint_every=1)
    first = tp.train(split, progress=False, steps_this_run=2)
    assert first == {"steps_done": 2, "finished": False, "train_seconds": first["train_seconds"]}
    assert (tmp_path / "split" / "checkpoint" / "state.pt").is_file()
    assert not (tmp_path / "split" / "adapter_model.safetensors").exists()
    second = tp.train(split, progress=False)
    assert second["resumed_at_step"] == 2 and not (tmp_path / "split" / "checkpoint").exists()
    a = safetensors_torch.load_file(str(out / "adapter_model.safetensors"))
    b = safetensors_torch.load_file(str(tmp_path / "split" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    # the adapter learned something: its B matrices left their zero initialisation
    assert any(float(v.abs().sum()) > 0 for k, v in a.items() if "lora_B" in k)


def test_the_config_refuses_what_it_cannot_train(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="plan_format"):
        config(tiny, tmp_path, plan_format="yaml")
    with pytest.raises(ValueError, match="keep_best"):
        config(tiny, tmp_path, keep_best=True)
    with pytest.raises(ValueError, match=r"val\.jsonl is missing"):
        empty = tmp_path / "data"
        empty.mkdir()
        (empty / "train.jsonl").write_text("")
        tp.PlannerTrainConfig(base_model=str(tiny[1]), data_dir=str(empty), out_dir="x")
    with pytest.raises(ValueError, match="dtype"):
        config(tiny, tmp_path, dtype="int8")
    with pytest.raises(ValueError, match="few_shot"):
        config(tiny, tmp_path, few_shot=len(few_shot()) + 1)
    args = ["--base-model", str(tiny[1]), "--data", str(tiny[0]), "--out", "x"]
    cfg = tp.parse_args([*args, "--max-steps", "9", "--target-modules", "q_proj", "v_proj"])
    assert cfg.max_steps == 9 and cfg.target_modules == ["q_proj", "v_proj"]
