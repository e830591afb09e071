#!/usr/bin/env bash
# Set up everything on a fresh machine and run the whole test suite.
# Needs PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 (.ci/run starts them).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="$(scripts/bootstrap.sh dev,llamacpp,model,training)"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
"$venv/bin/python" -m cli models pull qwen2.5-coder-0.5b-instruct
"$venv/bin/python" -m cli models pull smollm2-135m-instruct
exec "$venv/bin/python" -m pytest "$@"
