"""llama.cpp loading shared by the services that run a GGUF in process: the planner's
backend and the verifier's llama.cpp runtime.

Whether ggml's extra buffer types (weights repacked for the CPU's best kernels) are safe
on this CPU, and a `Llama` opened with them on or off and with room for several
sequences; llama-cpp-python has no arguments for either.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo; empty if unknown."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cpu_has_amx(cpuinfo: Path = CPUINFO) -> bool:
    """Whether the CPU advertises AMX (the `amx_int8` or `amx_bf16` flag); False if unknown."""
    return bool(cpu_flags(cpuinfo) & {"amx_int8", "amx_bf16"})


def cpu_has_bf16(cpuinfo: Path = CPUINFO) -> bool:
    """Whether the CPU has native bfloat16 dot products (`avx512_bf16` or `amx_bf16`),
    which ggml's BF16 kernels use; False if unknown."""
    return bool(cpu_flags(cpuinfo) & {"avx512_bf16", "amx_bf16"})


def use_extra_buffers(setting: str, cpuinfo: Path = CPUINFO) -> bool:
    """Resolve `PLANNER_EXTRA_BUFFERS`: `auto` is on unless the CPU has AMX.

    With extra buffers on, ggml repacks the weights for the CPU's best kernels; on an AMX
    CPU that means its AMX matmul, which crashes the process on the first decode
    (ggml-org/llama.cpp#20824). Off, every CPU runs the plain ggml kernels.
    """
    if setting == "auto":
        return not cpu_has_amx(cpuinfo)
    return setting == "on"


_MODEL_PARAMS_LOCK = threading.Lock()


def open_llama(
    model_path: Path | str, *, extra_buffers: bool, n_seq_max: int = 1, **kwargs: Any
) -> Any:
    """`llama_cpp.Llama(model_path, **kwargs)` with ggml's extra buffer types on or off, and
    room for `n_seq_max` sequences in one unified KV cache.

    llama-cpp-python builds its model and context parameters from
    `llama_model_default_params()` and `llama_context_default_params()` inside
    `Llama.__init__` and has no argument for `use_extra_bufts`, `n_seq_max` or
    `kv_unified`, so those functions are wrapped for the duration of the load (under a
    lock; loads are rare). The KV cache is unified so that sequences share the prompt's
    cells (`n_ctx` is then the total over all sequences). The loaded model's parameters
    are checked, so a library that stops reading them fails here instead of crashing on
    the first decode.
    """
    from llama_cpp import Llama
    from llama_cpp import llama_cpp as lib

    if extra_buffers and n_seq_max == 1:
        return Llama(model_path=str(model_path), **kwargs)
    with _MODEL_PARAMS_LOCK:
        default_params = lib.llama_model_default_params
        default_context = lib.llama_context_default_params

        def params() -> Any:
            value = default_params()
            if not extra_buffers:
                value.use_extra_bufts = False
            return value

        def context() -> Any:
            value = default_context()
            if n_seq_max > 1:
                value.n_seq_max = n_seq_max
                value.kv_unified = True
            return value

        lib.llama_model_default_params = params
        lib.llama_context_default_params = context
        try:
            llm = Llama(model_path=str(model_path), **kwargs)
        finally:
            lib.llama_model_default_params = default_params
            lib.llama_context_default_params = default_context
    if (
        llm.model_params.use_extra_bufts != extra_buffers
        or lib.llama_n_seq_max(llm.ctx) < n_seq_max
    ):
        llm.close()
        raise RuntimeError(
            "llama-cpp-python ignored use_extra_bufts or n_seq_max; cannot load safely"
        )
    return llm
