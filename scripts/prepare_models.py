"""Prepare and verify the production models in a model volume.

    prepare_models.py planner  --dest /models [--from DIR | --repo ID]
    prepare_models.py verifier --dest /models [--base-from DIR | --base-repo ID] --adapter-from DIR
    prepare_models.py all      --dest /models ...
    prepare_models.py planner|verifier|all --dest /models --verify-only

Layout written under --dest (what compose mounts at /models):
    phi-3.5-mini-instruct-awq/   planner: Phi-3.5-mini-instruct, 4-bit AWQ (safetensors)
    tinyllama-1.1b-chat/         verifier base: TinyLlama-1.1B-Chat-v1.0
    verifier-adapter/            verifier LoRA adapter (adapter_config.json +
                                 adapter_model.safetensors, from training/)

Sources for the planner, in the order an operator usually has them:
  --from DIR            an AWQ checkpoint already on disk (copied, then verified);
  --repo ID             an AWQ checkpoint on the Hugging Face hub (needs network and
                        huggingface_hub; pin --revision to a commit);
To quantize full-precision Phi-3.5-mini-instruct yourself, run `python -m
training.quantize_awq` (llm-compressor's AWQModifier, calibrated on GSM8K train plans, in
its own venv; a GPU for a reasonable run time) and pass its output with --from. It writes
the compressed-tensors format, so set PLANNER_QUANTIZATION=compressed-tensors (this
script says so when it prepares such a checkpoint).

Every prepared directory gets `.reason-manifest.json` (source, quantization, size and
sha256 of every file). A second run with the same source finds the manifest, re-checks
the files and does nothing else; `--verify-only` (the images' entry point) never writes.
Verification reads config.json and the safetensors headers (every tensor's byte range
must lie inside its file, every shard named by the index must exist), so a truncated
download or a wrong model family is refused before the engine tries to load it.
Standard library only, apart from the optional hub download.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = ".reason-manifest.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit on the JSON header
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja"]


class PrepareError(Exception):
    """A model is missing, incomplete or not the model it should be."""


@dataclass(frozen=True)
class Target:
    name: str  # directory under --dest
    model_types: tuple[str, ...]  # accepted config.json model_type values ("" = adapter)
    quantized: bool  # must carry a 4-bit quantization_config
    adapter: bool = False


PLANNER = Target("phi-3.5-mini-instruct-awq", ("phi3",), quantized=True)
VERIFIER_BASE = Target("tinyllama-1.1b-chat", ("llama",), quantized=False)
VERIFIER_ADAPTER = Target("verifier-adapter", ("",), quantized=False, adapter=True)
DEFAULT_BASE_REPO = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"


# ---------------------------------------------------------------- verification


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise PrepareError(f"{path} is missing") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise PrepareError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PrepareError(f"{path} is not a JSON object")
    return data


def check_safetensors(path: Path) -> int:
    """Parse the header of a .safetensors file; return its tensor count."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise PrepareError(f"{path}: too short for a safetensors file")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise PrepareError(f"{path}: header length {header_len} exceeds the file")
        try:
            header = json.loads(fh.read(header_len))
        except ValueError as exc:
            raise PrepareError(f"{path}: unreadable safetensors header") from exc
    if not isinstance(header, dict):
        raise PrepareError(f"{path}: safetensors header is not an object")
    data_len = size - 8 - header_len
    tensors = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_len
        ):
            raise PrepareError(f"{path}: tensor {name!r} lies outside the file (truncated?)")
        tensors += 1
    if tensors == 0:
        raise PrepareError(f"{path}: holds no tensors")
    return tensors


def check_model_dir(directory: Path, target: Target) -> dict[str, Any]:
    """Structural checks; returns facts for the manifest (quantization, tensor count)."""
    if not directory.is_dir():
        raise PrepareError(f"{directory} does not exist")
    facts: dict[str, Any] = {}
    if target.adapter:
        config = read_json(directory / "adapter_config.json")
        if config.get("peft_type") != "LORA":
            raise PrepareError(f"{directory}: adapter_config.json is not a LoRA adapter")
        weights = directory / "adapter_model.safetensors"
        if not weights.is_file():
            raise PrepareError(f"{directory}: adapter_model.safetensors is missing")
        facts["tensors"] = check_safetensors(weights)
        facts["base_model"] = config.get("base_model_name_or_path")
        return facts

    config = read_json(directory / "config.json")
    if config.get("model_type") not in target.model_types:
        raise PrepareError(
            f"{directory}: model_type {config.get('model_type')!r}, expected one of "
            f"{', '.join(target.model_types)}"
        )
    raw_quant = config.get("quantization_config")
    quant: dict[str, Any] = raw_quant if isinstance(raw_quant, dict) else {}
    if target.quantized:
        method = quant.get("quant_method")
        if method == "awq":
            if quant.get("bits") != 4:
                raise PrepareError(f"{directory}: AWQ with {quant.get('bits')} bits, expected 4")
        elif method == "compressed-tensors":
            groups = quant.get("config_groups") or {}
            bits = {
                g.get("weights", {}).get("num_bits") for g in groups.values() if isinstance(g, dict)
            }
            if bits != {4}:
                raise PrepareError(f"{directory}: compressed-tensors weights of {bits} bits")
        else:
            raise PrepareError(
                f"{directory}: not a 4-bit AWQ checkpoint (quantization_config.quant_method="
                f"{method!r}); use an AWQ checkpoint or quantize one with training.quantize_awq"
            )
        facts["quantization"] = method
    if not any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        raise PrepareError(f"{directory}: no tokenizer.json or tokenizer.model")

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise PrepareError(f"{index}: no weight_map")
        shards = sorted(set(weight_map.values()))
    else:
        shards = sorted(p.name for p in directory.glob("*.safetensors"))
    if not shards:
        raise PrepareError(f"{directory}: no .safetensors weights")
    tensors = 0
    for shard in shards:
        path = directory / shard
        if not path.is_file() or Path(shard).name != shard:
            raise PrepareError(f"{directory}: shard {shard!r} is missing")
        tensors += check_safetensors(path)
    facts["tensors"] = tensors
    return facts


def file_digests(directory: Path) -> dict[str, dict[str, Any]]:
    digests: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.rglob("*")):
        if not path.is_file() or path.name == MANIFEST or ".cache" in path.parts:
            continue
        sha = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                sha.update(block)
        rel = path.relative_to(directory).as_posix()
        digests[rel] = {"size": path.stat().st_size, "sha256": sha.hexdigest()}
    return digests


def verify(directory: Path, target: Target) -> dict[str, Any]:
    """Structure plus the manifest's checksums. Returns the manifest."""
    facts = check_model_dir(directory, target)
    manifest = read_json(directory / MANIFEST)
    recorded = manifest.get("files")
    if not isinstance(recorded, dict) or not recorded:
        raise PrepareError(f"{directory}/{MANIFEST} lists no files")
    actual = file_digests(directory)
    for rel, info in recorded.items():
        if rel not in actual:
            raise PrepareError(f"{directory}: {rel} is listed in the manifest but missing")
        if actual[rel] != info:
            raise PrepareError(f"{directory}: {rel} does not match its recorded sha256")
    if manifest.get("facts") != facts:
        raise PrepareError(f"{directory}: contents changed since the manifest was written")
    return manifest


# ---------------------------------------------------------------- preparing


def install(staged: Path, dest: Path, target: Target, source: str) -> dict[str, Any]:
    """Check a staged directory, write its manifest, move it into place atomically."""
    facts = check_model_dir(staged, target)
    manifest = {
        "target": target.name,
        "source": source,
        "facts": facts,
        "files": file_digests(staged),
    }
    (staged / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    final = dest / target.name
    if final.exists():
        old = final.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        staged.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staged.rename(final)
    return manifest


def already_prepared(dest: Path, target: Target, source: str) -> bool:
    final = dest / target.name
    if not (final / MANIFEST).is_file():
        return False
    try:
        manifest = verify(final, target)
    except PrepareError as exc:
        print(f"{final}: {exc}; preparing it again", file=sys.stderr)
        return False
    return manifest.get("source") == source


def stage_dir(dest: Path, target: Target) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=dest))


def from_local(src: Path, dest: Path, target: Target) -> dict[str, Any]:
    source = f"local:{src.resolve()}"
    if already_prepared(dest, target, source):
        print(f"{dest / target.name}: already prepared from {src}")
        return read_json(dest / target.name / MANIFEST)
    check_model_dir(src, target)  # refuse before copying gigabytes
    staged = stage_dir(dest, target)
    try:
        shutil.copytree(
            src, staged, dirs_exist_ok=True, ignore=shutil.ignore_patterns(MANIFEST, ".cache")
        )
        return install(staged, dest, target, source)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def from_hub(repo: str, revision: str | None, dest: Path, target: Target) -> dict[str, Any]:
    source = f"hub:{repo}@{revision or 'main'}"
    if already_prepared(dest, target, source):
        print(f"{dest / target.name}: already prepared from {source}")
        return read_json(dest / target.name / MANIFEST)
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise PrepareError(f"HF_HUB_OFFLINE is set; cannot download {repo}")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise PrepareError(
            "downloading needs huggingface_hub (pip install huggingface-hub)"
        ) from exc
    staged = stage_dir(dest, target)
    try:
        snapshot_download(
            repo_id=repo, revision=revision, local_dir=staged, allow_patterns=HUB_PATTERNS
        )
        shutil.rmtree(staged / ".cache", ignore_errors=True)
        return install(staged, dest, target, source)
    except PrepareError:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    except Exception as exc:  # network, auth, missing repo
        shutil.rmtree(staged, ignore_errors=True)
        raise PrepareError(f"download of {repo} failed: {exc}") from exc


# ---------------------------------------------------------------- command line


def prepare_planner(args: argparse.Namespace) -> None:
    if args.verify_only:
        report(verify(args.dest / PLANNER.name, PLANNER), args.dest / PLANNER.name)
        return
    if args.planner_from:
        manifest = from_local(args.planner_from, args.dest, PLANNER)
    elif args.planner_repo:
        manifest = from_hub(args.planner_repo, args.planner_revision, args.dest, PLANNER)
    else:
        raise PrepareError(
            "planner: give --planner-from DIR or --planner-repo ID (to quantize one yourself: "
            "python -m training.quantize_awq, then --planner-from its output)"
        )
    report(manifest, args.dest / PLANNER.name)
    method = manifest["facts"].get("quantization")
    if method != "awq":
        print(f"note: quantization is {method}; set PLANNER_QUANTIZATION={method}")


def prepare_verifier(args: argparse.Namespace) -> None:
    base_dir, adapter_dir = args.dest / VERIFIER_BASE.name, args.dest / VERIFIER_ADAPTER.name
    if args.verify_only:
        report(verify(base_dir, VERIFIER_BASE), base_dir)
        report(verify(adapter_dir, VERIFIER_ADAPTER), adapter_dir)
        return
    if args.base_from:
        report(from_local(args.base_from, args.dest, VERIFIER_BASE), base_dir)
    else:
        report(from_hub(args.base_repo, args.base_revision, args.dest, VERIFIER_BASE), base_dir)
    if args.adapter_from:
        report(from_local(args.adapter_from, args.dest, VERIFIER_ADAPTER), adapter_dir)
    else:
        report(verify(adapter_dir, VERIFIER_ADAPTER), adapter_dir)


def report(manifest: dict[str, Any], directory: Path) -> None:
    files = manifest["files"]
    total = sum(info["size"] for info in files.values())
    print(
        f"ok {directory}: {len(files)} files, {total / 2**20:.1f} MiB, "
        f"{manifest['facts'].get('tensors')} tensors, from {manifest['source']}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Prepare and verify the production models in a model volume."
    )
    parser.add_argument("which", choices=["planner", "verifier", "all"])
    parser.add_argument("--dest", type=Path, required=True, help="model volume root")
    parser.add_argument("--verify-only", action="store_true", help="check, never write")
    planner = parser.add_argument_group("planner (Phi-3.5-mini-instruct, 4-bit AWQ)")
    planner.add_argument("--planner-from", type=Path, help="local AWQ checkpoint directory")
    planner.add_argument(
        "--planner-repo",
        default=os.environ.get("PLANNER_AWQ_REPO"),
        help="hub repo id of an AWQ checkpoint (env PLANNER_AWQ_REPO)",
    )
    planner.add_argument("--planner-revision", default=os.environ.get("PLANNER_AWQ_REVISION"))
    verifier = parser.add_argument_group("verifier (TinyLlama-1.1B-Chat + LoRA adapter)")
    verifier.add_argument("--base-from", type=Path, help="local TinyLlama directory")
    verifier.add_argument("--base-repo", default=DEFAULT_BASE_REPO)
    verifier.add_argument("--base-revision", default=os.environ.get("VERIFIER_BASE_REVISION"))
    verifier.add_argument("--adapter-from", type=Path, help="adapter directory from training/")
    return parser.parse_args(argv)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.which in ("planner", "all"):
            prepare_planner(args)
        if args.which in ("verifier", "all"):
            prepare_verifier(args)
    except PrepareError as exc:
        print(f"prepare_models: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
