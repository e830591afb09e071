#!/usr/bin/env bash
# End-to-end /reason latency on the embedded default: the three services from CHECKOUT
# (a checkout of this repository; default this one, so an older commit's worktree gives
# the "before"), then the first N GSM8K test items through /reason with n_plans 1
# (`plan`: one plan, no verifier) and the first N5 (default N) with n_plans 5
# (`plan+verify+sc5`: five plans, verified, voted), one request at a time, 120 s deadline
# each. One JSON line per item goes to
# docs/benchmarks/results/reason_latency-LABEL-MODE.jsonl (a rerun resumes); the report is
#   python scripts/bench_reason_latency.py docs/benchmarks/results/reason_latency-*.jsonl
# Latency is measured, never tuned: GSM8K test is the reporting set.
#   [CHECKOUT=DIR] [PORT_BASE=18200] scripts/bench_reason_latency.sh LABEL [N] [N5]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
label="${1:?usage: bench_reason_latency.sh LABEL [N]}"
n="${2:-50}"
n5="${3:-$n}"
checkout="$(cd "${CHECKOUT:-$repo}" && pwd)"
port="${PORT_BASE:-18200}"
py="${PYTHON:-$repo/.venv/bin/python}"
out="$repo/docs/benchmarks/results"
logs="$repo/var/bench_reason_latency/$label"
mkdir -p "$out" "$logs"
export PLANNER_BACKEND=llamacpp PLANNER_MODEL=qwen2.5-coder-0.5b-instruct VERIFIER_BACKEND=model
export ORCH_PORT="$port" PLANNER_PORT=$((port + 1)) VERIFIER_PORT=$((port + 2))
export PLANNER_N_THREADS=1  # the service default on this 2-core box, set for both checkouts
"$py" -m cli models pull --serving >/dev/null
(cd "$checkout" && PYTHONPATH="$checkout" exec "$py" -m cli serve --log-dir "$logs") \
  >"$logs/serve.out" 2>&1 &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true' EXIT
"$repo/scripts/wait_ready.sh" "$serve_pid" "$logs/serve.out" "$ORCH_PORT" "$PLANNER_PORT" "$VERIFIER_PORT"
git -C "$checkout" rev-parse HEAD >"$logs/commit"
for mode in plan plan+verify+sc5; do
  limit="$n"
  if [ "$mode" = plan+verify+sc5 ]; then limit="$n5"; fi
  PYTHONPATH="$repo" "$py" -m scripts.eval run \
    --data "$repo/datasets/gsm8k/test.norm.jsonl" --mode "$mode" \
    --out "$out/reason_latency-$label-$mode.jsonl" --limit "$limit" \
    --url "http://127.0.0.1:$ORCH_PORT" --planner-url "http://127.0.0.1:$PLANNER_PORT" \
    --deadline-s 120 --concurrency 1 --no-progress
done
