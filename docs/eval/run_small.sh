#!/usr/bin/env bash
# The small evaluation on the embedded default recorded in docs/eval/README.md:
# Qwen2.5-Coder-0.5B-Instruct Q4_K_M in llama.cpp as the planner (and as the direct
# baseline), the scripted verifier, services on ports 18000-18002.
# Items are taken in batches of BATCH, alternating modes, so every mode covers the same
# items whenever the run is stopped; rerunning resumes (finished items are skipped).
# Pipeline items that failed (e.g. a planner timeout on an overloaded machine) are run
# again on a rerun (--retry-errors); the report counts each item's last attempt.
#   docs/eval/run_small.sh [N_PER_DATASET] [BATCH]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
n="${1:-20}"
batch="${2:-5}"
py="${PYTHON:-$repo/.venv/bin/python}"
out="${EVAL_OUT:-var/eval/small}"
mkdir -p "$out" "$out/logs"
export PLANNER_BACKEND=llamacpp PLANNER_MODEL=qwen2.5-coder-0.5b-instruct
export VERIFIER_BACKEND="${VERIFIER_BACKEND:-scripted}"
export PLANNER_PORT=18001 VERIFIER_PORT=18002 ORCH_PORT=18000
export PLANNER_N_THREADS="${PLANNER_N_THREADS:-2}"
"$py" -m cli models pull "$PLANNER_MODEL"
"$py" -m cli serve --log-dir "$out/logs" >"$out/logs/serve.out" 2>&1 &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true' EXIT
until curl -sf http://127.0.0.1:18000/readyz >/dev/null && curl -sf http://127.0.0.1:18001/readyz >/dev/null; do
  kill -0 "$serve_pid" || { echo "services exited; see $out/logs/serve.out" >&2; exit 1; }
  sleep 2
done
common=(--concurrency 1 --no-progress)
pipeline=(--url http://127.0.0.1:18000 --planner-url http://127.0.0.1:18001 --deadline-s 120 --retry-errors)
for ((done_n = batch; done_n <= n; done_n += batch)); do
  for data in ../shared/datasets/gsm8k/test.norm.jsonl ../shared/datasets/svamp/svamp.norm.jsonl; do
    name="$(basename "$(dirname "$data")")"
    "$py" scripts/eval.py run --data "$data" --mode direct --out "$out/$name-direct.jsonl" \
      --limit "$done_n" "${common[@]}"
    "$py" scripts/eval.py run --data "$data" --mode plan --out "$out/$name-plan.jsonl" \
      --limit "$done_n" "${common[@]}" "${pipeline[@]}"
  done
done
