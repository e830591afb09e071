"""Convert a PEFT LoRA adapter to a GGUF LoRA for the llama.cpp planner backend.

The conversion is llama.cpp's own `convert_lora_to_gguf.py`, from the llama.cpp source
that llama-cpp-python vendors: the source distribution of the installed llama-cpp-python
version is downloaded once from the package index (`pip download --no-binary`), and the
script, its `conversion/` package and the matching `gguf-py` are unpacked into the cache
directory (`<cache>/llama.cpp/<version>/`). The GGUF file is therefore written by the
code of the llama.cpp that loads it, never by a converter of another release. The script
reads only the base model's `config.json` (the catalog model's transformers directory,
`services.catalog.ensure_hf_dir`).

Output, in the adapter directory (`services.lora`'s layout): `adapter.gguf` and
`gguf.json` (its sha256 and size, the sha256 of the PEFT weights it was made from, the
llama-cpp-python release and source archive it was converted with, and the output type).
The llama.cpp backend loads `adapter.gguf` from `PLANNER_LORA` only when both hashes
match.

    python -m training.gguf_lora planner/adapters/qwen2.5-coder-0.5b-instruct \\
        --base ~/.cache/reason/models/qwen2.5-coder-0.5b-instruct/hf
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from services.lora import GGUF_FILE, GGUF_MANIFEST, PEFT_CONFIG, PEFT_WEIGHTS, sha256_of
from services.settings import default_cache_dir

SCRIPT = "convert_lora_to_gguf.py"
# What the script needs from the vendored tree: itself, the model definitions it reuses
# and the gguf-py of the same release.
MEMBERS = (SCRIPT, "convert_hf_to_gguf.py", "conversion/", "gguf-py/")
VENDOR = "vendor/llama.cpp/"


class ConversionError(RuntimeError):
    """The adapter could not be converted; the message says why."""


def llama_cpp_version() -> str:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        raise ConversionError(
            "llama-cpp-python is not installed: the conversion uses the llama.cpp source of "
            "the installed release (pip install -e '.[llamacpp]')"
        ) from None


def unpack_source(sdist: Path, target: Path) -> None:
    """Unpack the converter's files from a llama-cpp-python source archive into `target`,
    refusing any member that would land outside it."""
    with tarfile.open(sdist) as archive:
        top = archive.getmembers()[0].name.split("/", 1)[0]
        prefix = f"{top}/{VENDOR}"
        picked = []
        for member in archive.getmembers():
            if not member.name.startswith(prefix) or not (member.isfile() or member.isdir()):
                continue
            rel = member.name[len(prefix) :]
            if not any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in MEMBERS):
                continue
            member = copy_member(member, rel)
            picked.append(member)
        if not any(m.name == SCRIPT for m in picked):
            raise ConversionError(f"{sdist.name} holds no {VENDOR}{SCRIPT}")
        archive.extractall(target, members=picked, filter="data")


def copy_member(member: tarfile.TarInfo, name: str) -> tarfile.TarInfo:
    renamed = tarfile.TarInfo(name)
    for attr in ("size", "mode", "type", "mtime", "offset", "offset_data", "sparse"):
        setattr(renamed, attr, getattr(member, attr))
    return renamed


INDEX = "https://pypi.org/simple"  # PEP 691 JSON index; REASON_PYPI_SIMPLE overrides
DOWNLOAD_TIMEOUT_S = 300.0


def download_sdist(version: str, dest: Path) -> tuple[Path, str]:
    """The llama-cpp-python `version` source archive from the package index, checked
    against the sha256 the index lists; returns its path and that digest.

    `pip download` cannot fetch it: pip prepares an sdist's metadata, which for
    llama-cpp-python runs its CMake build backend. The index's JSON listing (PEP 691)
    gives the archive's address and hash, and httpx fetches it.
    """
    import httpx

    index = os.environ.get("REASON_PYPI_SIMPLE", INDEX).rstrip("/")
    name = f"llama_cpp_python-{version}.tar.gz"
    try:
        with httpx.Client(timeout=DOWNLOAD_TIMEOUT_S, follow_redirects=True) as client:
            listing = client.get(
                f"{index}/llama-cpp-python/",
                headers={"Accept": "application/vnd.pypi.simple.v1+json"},
            )
            listing.raise_for_status()
            entry = next((f for f in listing.json()["files"] if f["filename"] == name), None)
            if entry is None:
                raise ConversionError(f"{index} lists no {name}")
            expected = entry["hashes"]["sha256"]
            target = dest / name
            digest = hashlib.sha256()
            with client.stream("GET", entry["url"]) as response, target.open("wb") as out:
                response.raise_for_status()
                for block in response.iter_bytes(1 << 20):
                    digest.update(block)
                    out.write(block)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise ConversionError(f"could not download {name} from {index}: {exc}") from None
    if digest.hexdigest() != expected:
        raise ConversionError(f"{name}: sha256 {digest.hexdigest()}, the index lists {expected}")
    return target, expected


def llama_cpp_source(cache_dir: Path | None = None, version: str | None = None) -> Path:
    """The directory holding llama.cpp's LoRA converter for the installed llama-cpp-python,
    downloaded and unpacked on first use."""
    version = version or llama_cpp_version()
    root = (cache_dir or default_cache_dir()) / "llama.cpp" / version
    if (root / "source.json").is_file() and (root / SCRIPT).is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        archive, digest = download_sdist(version, Path(tmp))
        staging = Path(tmp) / "source"
        unpack_source(archive, staging)
        (staging / "source.json").write_text(
            json.dumps(
                {"llama_cpp_python": version, "archive": archive.name, "archive_sha256": digest},
                indent=2,
            )
            + "\n"
        )
        shutil.rmtree(root, ignore_errors=True)
        os.replace(staging, root)
    return root


def convert(
    adapter_dir: Path,
    base_dir: Path,
    *,
    outtype: str = "f16",
    source: Path | None = None,
) -> dict[str, Any]:
    """Write `adapter.gguf` and `gguf.json` into `adapter_dir`; returns the manifest."""
    if not (adapter_dir / PEFT_CONFIG).is_file() or not (adapter_dir / PEFT_WEIGHTS).is_file():
        raise ConversionError(
            f"{adapter_dir} holds no {PEFT_CONFIG} and {PEFT_WEIGHTS} (a PEFT adapter)"
        )
    source_sha256 = sha256_of(adapter_dir / PEFT_WEIGHTS)
    if not (base_dir / "config.json").is_file():
        raise ConversionError(
            f"{base_dir} holds no config.json: pass the base model's transformers directory"
        )
    src = source or llama_cpp_source()
    out = adapter_dir / GGUF_FILE
    partial = adapter_dir / (GGUF_FILE + ".partial")
    env = {**os.environ}
    env.pop("NO_LOCAL_GGUF", None)  # the script puts its own gguf-py first on the path
    command = [
        sys.executable,
        str(src / SCRIPT),
        "--base",
        str(base_dir),
        "--outtype",
        outtype,
        "--outfile",
        str(partial),
        str(adapter_dir),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise ConversionError(f"{SCRIPT} failed (exit {done.returncode}):\n{tail}")
    os.replace(partial, out)
    origin = (
        json.loads((src / "source.json").read_text()) if (src / "source.json").is_file() else {}
    )
    manifest = {
        "file": GGUF_FILE,
        "sha256": sha256_of(out),
        "size": out.stat().st_size,
        "source_sha256": source_sha256,  # the PEFT weights it was converted from
        "outtype": outtype,
        "converter": f"llama.cpp {SCRIPT}",
        **origin,
    }
    (adapter_dir / GGUF_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("adapter", type=Path, help="the PEFT adapter directory")
    parser.add_argument(
        "--base", type=Path, required=True, help="the base model's transformers directory"
    )
    parser.add_argument("--outtype", choices=["f32", "f16", "bf16", "q8_0"], default="f16")
    parser.add_argument(
        "--llama-cpp-src",
        type=Path,
        default=None,
        help="a llama.cpp source tree to convert with instead of the installed release's",
    )
    args = parser.parse_args(argv)
    try:
        manifest = convert(args.adapter, args.base, outtype=args.outtype, source=args.llama_cpp_src)
    except ConversionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
