#!/usr/bin/env bash
# Build (once) and locate the tools CI uses to validate the deployment files.
#
#   scripts/ci_tools.sh compose   -> prints the path of a docker-compose 1.29.2 binary
#   scripts/ci_tools.sh k8s       -> prints the path of a kubernetes-validate binary
#   scripts/ci_tools.sh all       -> builds both, prints both paths
#
# Each tool lives in its own virtual environment under a cache directory outside the
# repository (docker-compose 1.29.2 needs jsonschema<4, kubernetes-validate needs
# jsonschema>=4.23, so they cannot share one). A stamp file records the recipe a venv
# was built with; a second run with the same recipe only checks the binary and exits.
# Concurrent runs (parallel test workers) serialise on a lock file.
#
# Environment:
#   REASON_CI_TOOLS_DIR   where the venvs go (default ${XDG_CACHE_HOME:-$HOME/.cache}/reason)
#   REASON_CI_PYTHON      interpreter used to create the venvs (default python3.11, else python3)
set -euo pipefail

TOOLS_DIR="${REASON_CI_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/reason}"

COMPOSE_VERSION="1.29.2"
K8S_VALIDATE_VERSION="1.37.0"

# The recipes. Changing one changes its stamp, which forces a rebuild.
COMPOSE_RECIPE="cython<3 wheel setuptools<70 | --no-build-isolation pyyaml==5.4.1 | docker-compose==${COMPOSE_VERSION}"
K8S_RECIPE="kubernetes-validate==${K8S_VALIDATE_VERSION}"

die() {
    echo "ci_tools: $*" >&2
    exit 1
}

pick_python() {
    if [[ -n "${REASON_CI_PYTHON:-}" ]]; then
        command -v "$REASON_CI_PYTHON" >/dev/null || die "REASON_CI_PYTHON=$REASON_CI_PYTHON not found"
        echo "$REASON_CI_PYTHON"
    elif command -v python3.11 >/dev/null; then
        echo python3.11
    elif command -v python3 >/dev/null; then
        echo python3
    else
        die "no python3 interpreter found (set REASON_CI_PYTHON)"
    fi
}

# ensure_venv NAME RECIPE CHECK_BIN INSTALL_FUNCTION
ensure_venv() {
    local name="$1" recipe="$2" check_bin="$3" installer="$4"
    local venv="$TOOLS_DIR/$name"
    local stamp="$venv/.recipe"

    mkdir -p "$TOOLS_DIR"
    # One builder at a time; others wait and then find the stamp.
    exec {lock_fd}>"$TOOLS_DIR/.$name.lock"
    flock "$lock_fd"

    if [[ -f "$stamp" && "$(cat "$stamp")" == "$recipe" && -x "$venv/bin/$check_bin" ]]; then
        flock -u "$lock_fd"
        return 0
    fi

    echo "ci_tools: building $venv ($recipe)" >&2
    rm -rf "$venv"
    "$(pick_python)" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip<25" >&2
    "$installer" "$venv" >&2
    [[ -x "$venv/bin/$check_bin" ]] || die "$check_bin missing from $venv after install"
    printf '%s' "$recipe" >"$stamp"
    flock -u "$lock_fd"
}

install_compose() {
    local pip=("$1/bin/python" -m pip install --quiet --disable-pip-version-check)
    "${pip[@]}" "cython<3" wheel "setuptools<70"
    # PyYAML 5.4.1 has no wheel for current Pythons and its sdist breaks under Cython 3.
    "${pip[@]}" --no-build-isolation "pyyaml==5.4.1"
    "${pip[@]}" "docker-compose==${COMPOSE_VERSION}"
}

install_k8s() {
    "$1/bin/python" -m pip install --quiet --disable-pip-version-check \
        "kubernetes-validate==${K8S_VALIDATE_VERSION}"
}

compose() {
    ensure_venv venv-compose "$COMPOSE_RECIPE" docker-compose install_compose
    local bin="$TOOLS_DIR/venv-compose/bin/docker-compose"
    "$bin" version --short >/dev/null || die "$bin does not run"
    echo "$bin"
}

k8s() {
    ensure_venv venv-k8s "$K8S_RECIPE" kubernetes-validate install_k8s
    local bin="$TOOLS_DIR/venv-k8s/bin/kubernetes-validate"
    "$bin" --version >/dev/null || die "$bin does not run"
    echo "$bin"
}

case "${1:-}" in
compose) compose ;;
k8s) k8s ;;
all)
    compose
    k8s
    ;;
*)
    echo "usage: $0 compose|k8s|all" >&2
    exit 2
    ;;
esac
