#!/usr/bin/env bash
# Build (once) the virtual environment that quantizes the production planner with
# llm-compressor (training/quantize_awq.py), and print its python.
#
#   scripts/setup_quantize.sh          -> builds the venv when missing, prints its python
#   scripts/setup_quantize.sh --check  -> prints its python if the venv is complete, else exits 1
#
# llm-compressor pins its own transformers (and brings Hugging Face `datasets`, pandas and
# pyarrow), which do not fit the project venv, so it lives in a venv of its own under the
# cache directory, outside the repository (DESIGN.md section 4):
#   pip install torch==2.13.0 llmcompressor==0.14.0.1
# torch 2.13.0 is the CPU build on this machine; on a GPU box the same command takes the
# CUDA build of that release. The quantization step runs only there and imports nothing
# from the project: training/quantize_awq.py writes the calibration texts in the project
# venv and hands them over as a file.
#
# A stamp file records the recipe; a second run with the same recipe only checks the
# import and exits. Concurrent runs serialise on a lock file.
#
# Environment:
#   REASON_CACHE_DIR       cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/reason)
#   REASON_QUANTIZE_PYTHON interpreter used to create the venv (default python3.11, else python3)
set -euo pipefail

CACHE_DIR="${REASON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/reason}"
VENV="$CACHE_DIR/venv-quantize"
STAMP="$VENV/.recipe"
TORCH_VERSION="2.13.0"
LLMCOMPRESSOR_VERSION="0.14.0.1"
RECIPE="torch==${TORCH_VERSION} llmcompressor==${LLMCOMPRESSOR_VERSION}"

die() {
    echo "setup_quantize: $*" >&2
    exit 1
}

pick_python() {
    if [[ -n "${REASON_QUANTIZE_PYTHON:-}" ]]; then
        command -v "$REASON_QUANTIZE_PYTHON" >/dev/null ||
            die "REASON_QUANTIZE_PYTHON=$REASON_QUANTIZE_PYTHON not found"
        echo "$REASON_QUANTIZE_PYTHON"
    elif command -v python3.11 >/dev/null; then
        echo python3.11
    elif command -v python3 >/dev/null; then
        echo python3
    else
        die "no python3 interpreter found (set REASON_QUANTIZE_PYTHON)"
    fi
}

venv_ok() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$RECIPE" && -x "$VENV/bin/python" ]] || return 1
    "$VENV/bin/python" - "$LLMCOMPRESSOR_VERSION" "$TORCH_VERSION" >/dev/null 2>&1 <<'PY'
import importlib.metadata as md
import sys

llmcompressor_version, torch_version = sys.argv[1:]
assert md.version("llmcompressor") == llmcompressor_version
assert md.version("torch").split("+")[0] == torch_version
PY
}

if [[ "${1:-}" == "--check" ]]; then
    venv_ok || exit 1
    echo "$VENV/bin/python"
    exit 0
fi

mkdir -p "$CACHE_DIR"
exec {lock_fd}>"$CACHE_DIR/.venv-quantize.lock"
flock "$lock_fd"

if ! venv_ok; then
    echo "setup_quantize: building $VENV" >&2
    start=$SECONDS
    rm -rf "$VENV"
    "$(pick_python)" -m venv "$VENV"
    pip=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off)
    "${pip[@]}" --quiet --upgrade pip setuptools wheel >&2
    "${pip[@]}" "torch==${TORCH_VERSION}" "llmcompressor==${LLMCOMPRESSOR_VERSION}" >&2
    "$VENV/bin/python" -m pip check >&2 || echo "setup_quantize: pip check reported the above" >&2
    "$VENV/bin/python" -c "from llmcompressor import oneshot; from llmcompressor.modifiers.awq import AWQModifier" ||
        die "llm-compressor does not import in $VENV"
    printf '%s' "$RECIPE" >"$STAMP"
    echo "setup_quantize: built in $((SECONDS - start)) s" >&2
fi
flock -u "$lock_fd"

echo "$VENV/bin/python"
