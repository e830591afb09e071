#!/usr/bin/env bash
# One pipeline mode over the GSM8K train dev split (evals/splits/gsm8k-train-dev.jsonl),
# on services started here with the current defaults (PLANNER_*, VERIFIER_*, ORCH_*
# settings from the environment pass through), each model on one thread so that another
# run can use the other core. The result lines are what calibrators, thresholds and
# replanning rules are fitted on; GSM8K test and SVAMP are never used for that.
# Rerunning resumes: finished items are skipped, failed ones run again. EVAL_START=K runs
# items K..N-1 only, so that two copies (on two EVAL_PORT_BASEs, one per core) can share
# the first N items with separate outputs, concatenated afterwards.
#   [EVAL_PORT_BASE=18200] [EVAL_START=0] [EVAL_LOGS=DIR] scripts/eval_dev.sh MODE N OUT.jsonl
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
mode="$1" n="$2" out="$3"
py="${PYTHON:-$repo/.venv/bin/python}"
port="${EVAL_PORT_BASE:-18200}"
start="${EVAL_START:-0}"
[ "$start" -lt "$n" ] || { echo "EVAL_START ($start) must be below N ($n)" >&2; exit 2; }
logs="${EVAL_LOGS:-var/eval/logs-dev-$port}"
mkdir -p "$(dirname "$out")" "$logs"
export PLANNER_BACKEND="${PLANNER_BACKEND:-llamacpp}" VERIFIER_BACKEND="${VERIFIER_BACKEND:-model}"
export ORCH_PORT="$port" PLANNER_PORT=$((port + 1)) VERIFIER_PORT=$((port + 2))
export PLANNER_N_THREADS="${PLANNER_N_THREADS:-1}" PLANNER_N_THREADS_BATCH="${PLANNER_N_THREADS_BATCH:-1}"
export VERIFIER_N_THREADS="${VERIFIER_N_THREADS:-1}"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
"$py" -m cli models pull --serving >/dev/null  # the planner's and the verifier's models
"$py" -m cli serve --log-dir "$logs" >"$logs/serve.out" 2>&1 &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true' EXIT
scripts/wait_ready.sh "$serve_pid" "$logs/serve.out" "$ORCH_PORT" "$PLANNER_PORT" "$VERIFIER_PORT"
"$py" -m scripts.eval run --data evals/splits/gsm8k-train-dev.jsonl --mode "$mode" --out "$out" \
  --offset "$start" --limit $((n - start)) --url "http://127.0.0.1:$ORCH_PORT" --planner-url "http://127.0.0.1:$PLANNER_PORT" \
  --deadline-s 120 --retry-errors --concurrency 1 --no-progress
