"""A LoRA adapter directory, and the checks made before a backend loads one (the planner's,
and the verifier's on its llama.cpp runtime).

`PLANNER_LORA` names a directory that `training.train_planner` wrote and
`training.gguf_lora` converted:

    adapter_config.json          PEFT's config; `base_model_name_or_path` names the model
    adapter_model.safetensors    the PEFT weights (what vLLM loads)
    adapter.gguf                 the same adapter as a GGUF LoRA (what llama.cpp loads)
    gguf.json                    adapter.gguf's sha256 and size, and how it was converted

An adapter's identity is the sha256 of its PEFT weights (what training wrote; an operator
may pin it with `PLANNER_LORA_SHA256`). It is loaded only onto the model it was trained
for, and `adapter.gguf` only when its sha256 is the one `gguf.json` records and that
manifest names these weights as its source. The model's name gains the adapter's tag
(`<model>+lora-<sha256 prefix>`), the same on both backends, so plans, logs, metrics and
the orchestrator's answer cache tell the adapted model from the base model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

GGUF_FILE = "adapter.gguf"
GGUF_MANIFEST = "gguf.json"
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"


class AdapterError(ValueError):
    """The adapter cannot be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class LoraAdapter:
    directory: Path
    base_model: str  # adapter_config.json's base_model_name_or_path
    rank: int  # the LoRA rank r
    sha256: str  # of the PEFT weights (adapter_model.safetensors): the adapter's identity

    @property
    def gguf(self) -> Path:
        return self.directory / GGUF_FILE

    @property
    def tag(self) -> str:
        return f"lora-{self.sha256[:12]}"

    def served_name(self, model: str) -> str:
        return f"{model}+{self.tag}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _base_name(name: str) -> str:
    """A model's name without a directory, a served adapter tag or letter case (a catalog
    model's transformers directory, `models/<name>/hf`, is named after the model)."""
    path = Path(name.split("+lora-", 1)[0])
    return (path.parent.name if path.name == "hf" else path.name).lower()


def trained_for(base: str, model: str) -> bool:
    """Whether an adapter trained on `base` fits `model`: the same name, or the name of a
    quantized or otherwise suffixed checkpoint of it (`phi-3.5-mini-instruct` fits
    `Phi-3.5-mini-instruct-AWQ`)."""
    base, model = _base_name(base), _base_name(model)
    return bool(base) and (model == base or model.startswith(base + "-"))


def load_adapter(
    directory: Path,
    *,
    model: str | None,
    gguf: bool,
    pinned_sha256: str | None = None,
    setting: str = "PLANNER_LORA",
) -> LoraAdapter:
    """Check the adapter directory and return what the backend loads. `model`: the
    catalog name (or model directory name) the adapter must have been trained for; None
    for a model given by a file path, where the engine's own load refuses an adapter of
    other shapes. `gguf`: the llama.cpp backend's check (adapter.gguf against its
    manifest); otherwise the PEFT files vLLM loads. `setting`: the setting that named the
    directory, for the messages."""
    if not directory.is_dir():
        raise AdapterError(f"{setting} {directory} is not a directory")
    try:
        config = json.loads((directory / PEFT_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(
            f"{setting} {directory} has no readable {PEFT_CONFIG} ({exc}); "
            "pass a directory that training wrote"
        ) from None
    base = str(config.get("base_model_name_or_path") or "")
    if model is not None and not trained_for(base, model):
        raise AdapterError(
            f"the adapter in {directory} was trained for {base or 'an unnamed model'}, "
            f"not {model}: serve it on its own model, or unset {setting}"
        )
    rank = int(config.get("r") or 0)
    weights = directory / PEFT_WEIGHTS
    if not weights.is_file():
        raise AdapterError(f"{weights} is missing: the PEFT adapter is incomplete")
    identity = sha256_of(weights)
    if pinned_sha256 is not None and identity != pinned_sha256.strip().lower():
        raise AdapterError(
            f"the adapter's sha256 is {identity}, not the pinned {setting}_SHA256 {pinned_sha256}"
        )
    if gguf:
        try:
            manifest = json.loads((directory / GGUF_MANIFEST).read_text())
        except (OSError, ValueError):
            raise AdapterError(
                f"{directory} has no {GGUF_MANIFEST}: convert the adapter first with "
                f"`python -m training.gguf_lora {directory} --base <the model's hf dir>`"
            ) from None
        file = directory / GGUF_FILE
        if not file.is_file():
            raise AdapterError(f"{file} is missing: rerun training.gguf_lora")
        digest = sha256_of(file)
        if digest != manifest.get("sha256"):
            raise AdapterError(
                f"{file} has sha256 {digest}, but {GGUF_MANIFEST} records "
                f"{manifest.get('sha256')}: the file changed after conversion"
            )
        if manifest.get("source_sha256") != identity:
            raise AdapterError(
                f"{file} was converted from other weights than {PEFT_WEIGHTS} "
                "(the adapter was retrained): rerun training.gguf_lora"
            )
    return LoraAdapter(directory=directory, base_model=base, rank=rank, sha256=identity)
