"""`services.llamacpp`: ggml's extra weight buffers are off on AMX CPUs by default
(`PLANNER_EXTRA_BUFFERS`), and a library that ignores the load parameters fails the load."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.llamacpp import cpu_has_amx, use_extra_buffers
from services.settings import PlannerSettings

pytestmark = pytest.mark.unit

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_bf16 avx512_fp16 amx_tile amx_int8
"""
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16
"""


@pytest.fixture
def cpuinfo(tmp_path: Path):
    def write(text: str) -> Path:
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        return path

    return write


def test_amx_is_read_from_the_flags_line(cpuinfo) -> None:
    assert cpu_has_amx(cpuinfo(SAPPHIRE_RAPIDS)) is True
    assert cpu_has_amx(cpuinfo(EPYC)) is False
    # "amx" in another line (a model name, say) is not a flag
    assert cpu_has_amx(cpuinfo("model name\t: amx_int8 lookalike\nflags\t\t: avx2\n")) is False


def test_unreadable_cpuinfo_counts_as_no_amx(tmp_path: Path) -> None:
    assert cpu_has_amx(tmp_path / "missing") is False


@pytest.mark.parametrize(
    ("setting", "text", "expected"),
    [
        ("auto", SAPPHIRE_RAPIDS, False),
        ("auto", EPYC, True),
        ("on", SAPPHIRE_RAPIDS, True),
        ("off", EPYC, False),
    ],
)
def test_setting_resolves_against_the_cpu(cpuinfo, setting: str, text: str, expected: bool) -> None:
    assert use_extra_buffers(setting, cpuinfo(text)) is expected


def test_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert PlannerSettings().extra_buffers == "auto"
    monkeypatch.setenv("PLANNER_EXTRA_BUFFERS", "off")
    assert PlannerSettings().extra_buffers == "off"
    monkeypatch.setenv("PLANNER_EXTRA_BUFFERS", "sometimes")
    with pytest.raises(ValueError, match="extra_buffers"):
        PlannerSettings()


def test_a_library_that_ignores_the_setting_fails_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """If llama-cpp-python stops building its parameters from the wrapped function, the
    load fails with a clear error (and closes the model) instead of crashing on decode."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from services.llamacpp import open_llama

    closed: list[bool] = []

    class IgnoresWrapper:
        def __init__(self, model_path: str, **kwargs: object) -> None:
            self.model_params = type("Params", (), {"use_extra_bufts": True})()

        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(llama_cpp, "Llama", IgnoresWrapper)
    with pytest.raises(RuntimeError, match="use_extra_bufts"):
        open_llama("model.gguf", extra_buffers=False)
    assert closed == [True]
    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True
