#!/usr/bin/env bash
# Make (or reuse) the project's virtual environment and print its path.
#
# The venv lives in the cache directory, keyed by a hash of pyproject.toml and the extras
# asked for, so a fresh clone reuses it and a dependency change builds a new one. The
# project itself is not installed into it: callers put the checkout on PYTHONPATH.
#
#   scripts/bootstrap.sh [EXTRAS]     e.g. scripts/bootstrap.sh dev,llamacpp,model
set -euo pipefail

extras="${1:-llamacpp,model}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${REASON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/reason}"
python="${PYTHON:-python3}"
key="$( (cat "$repo/pyproject.toml"; echo "$extras"; "$python" --version) | sha256sum | cut -c1-16)"
venv="$cache/venvs/$key"

if [ ! -f "$venv/.complete" ]; then
  mkdir -p "$cache/venvs" "$cache/wheels"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  if [[ ",$extras," == *",llamacpp,"* ]] && ! ls "$cache"/wheels/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
    # PyPI has only the sdist: build the wheel once (about 16 minutes on 2 cores) and keep it.
    echo "building llama-cpp-python (first time only)..." >&2
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$venv/bin/python" -m pip wheel -q --no-deps \
      -w "$cache/wheels" llama-cpp-python==0.3.36 >&2
  fi
  reqs="$("$venv/bin/python" - "$repo/pyproject.toml" "$extras" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = list(project["dependencies"])
name = project["name"]
wanted = [e for e in sys.argv[2].split(",") if e]
while wanted:
    extra = wanted.pop()
    for dep in project.get("optional-dependencies", {}).get(extra, []):
        if dep.startswith(name + "["):
            wanted.extend(dep[len(name) + 1:-1].split(","))
        else:
            deps.append(dep)
print("\n".join(dict.fromkeys(deps)))
PY
)"
  echo "$reqs" > "$venv/requirements.txt"
  "$venv/bin/python" -m pip install -q --find-links "$cache/wheels" -r "$venv/requirements.txt" >&2
  touch "$venv/.complete"
fi
echo "$venv"
