#!/usr/bin/env bash
# Set up everything on a fresh machine and serve POST /reason on the embedded CPU default:
# planner (:8001), verifier (:8002) and orchestrator (:8000). Ctrl-C stops all three.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="$(scripts/bootstrap.sh llamacpp,model)"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PLANNER_BACKEND="${PLANNER_BACKEND:-llamacpp}"
export PLANNER_MODEL="${PLANNER_MODEL:-qwen2.5-coder-1.5b-instruct}"
export VERIFIER_BACKEND="${VERIFIER_BACKEND:-model}"
"$venv/bin/python" -m cli models pull --serving  # the planner's and the verifier's models
exec "$venv/bin/python" -m cli serve "$@"
