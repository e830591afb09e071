#!/usr/bin/env bash
# The full evaluation on the embedded default: Qwen2.5-Coder-1.5B-Instruct Q4_K_M in
# llama.cpp as the planner and as the direct baseline (EVAL_MODEL=qwen2.5-coder-0.5b-instruct
# for the small-machine setting; the run of 2026-11-30 in docs/eval/README.md is that
# model's), the model verifier of the VERIFIER_* settings (symbolic checks first; by
# default SmolLM2-135M + the committed LoRA adapter), services on ports 18000-18002.
# Results go to docs/eval/1.5b/results/ (for the small model, docs/eval/0.5b-draft/results/;
# the run of 2026-11-30 in docs/eval/results/ is that model's on an older pipeline and
# prompt).
#
# The 2 cores are split: the planner's llama.cpp runs on one thread, and the `direct`
# baseline (its own copy of the model, one thread) runs beside the pipeline modes.
# Pipeline items are taken in batches of BATCH, alternating datasets and modes, so every
# mode covers the same items whenever the run is stopped. With the baseline finished, the
# second core can run a second copy of the services for the other dataset:
#   EVAL_DATASETS=gsm8k docs/eval/run_full.sh 200 10 &
#   EVAL_DATASETS=svamp EVAL_PORT_BASE=18100 docs/eval/run_full.sh 200 10 &
# (each copy's planner on one thread, as before). EVAL_START=K starts the pipeline modes at
# item K, so that both cores can share one dataset's items with separate outputs:
#   EVAL_DATASETS=gsm8k docs/eval/run_full.sh 130 10 &
#   EVAL_DATASETS=gsm8k EVAL_START=130 EVAL_PORT_BASE=18100 EVAL_OUT=var/eval/part2 \
#     docs/eval/run_full.sh 200 10 &
# and `cat var/eval/part2/gsm8k-*.jsonl` onto the committed files afterwards (a run with
# EVAL_START leaves the baseline to the run from 0). EVAL_MODES picks the pipeline modes
# (default: all of them); EVAL_BASELINE=0 leaves the `direct` baseline out (a run of
# pipeline modes in a setting the baseline does not depend on, such as
# PLANNER_PLAN_FORMAT, into its own EVAL_OUT). Rerunning resumes: finished items are skipped, and pipeline
# items that failed (a deadline on a busy machine) run again (--retry-errors; the report
# counts each item's last line). Results are committed, so a later run on a fresh clone
# resumes them; logs go to var/eval/logs/.
#   [EVAL_MODEL=...] [EVAL_DATASETS="gsm8k svamp"] [EVAL_MODES="plan ..."]
#   [EVAL_PORT_BASE=18000] [EVAL_START=0] [EVAL_OUT=DIR] [EVAL_BASELINE=1] docs/eval/run_full.sh [N] [BATCH]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
n="${1:-200}"
batch="${2:-10}"
start="${EVAL_START:-0}"
py="${PYTHON:-$repo/.venv/bin/python}"
model="${EVAL_MODEL:-qwen2.5-coder-1.5b-instruct}"
case "$model" in
  qwen2.5-coder-0.5b-instruct) results=docs/eval/0.5b-draft/results ;;
  qwen2.5-coder-1.5b-instruct) results=docs/eval/1.5b/results ;;
  *) results="docs/eval/$model/results" ;;
esac
out="${EVAL_OUT:-$results}"
port="${EVAL_PORT_BASE:-18000}"
logs="${EVAL_LOGS:-var/eval/logs}"
if [ "$port" != 18000 ]; then logs="${EVAL_LOGS:-var/eval/logs-$port}"; fi
mkdir -p "$out" "$logs"
export PLANNER_BACKEND=llamacpp PLANNER_MODEL="$model"
export VERIFIER_BACKEND="${VERIFIER_BACKEND:-model}"
export ORCH_PORT="$port" PLANNER_PORT=$((port + 1)) VERIFIER_PORT=$((port + 2))
export PLANNER_N_THREADS="${PLANNER_N_THREADS:-1}"  # 2 when this is the only copy running
export VERIFIER_N_THREADS="${VERIFIER_N_THREADS:-$PLANNER_N_THREADS}"
"$py" -m cli models pull --serving
declare -A files=([gsm8k]=datasets/gsm8k/test.norm.jsonl
  [svamp]=datasets/svamp/svamp.norm.jsonl)
datasets=()
for name in ${EVAL_DATASETS:-gsm8k svamp}; do
  [ -n "${files[$name]:-}" ] || { echo "unknown dataset $name (gsm8k, svamp)" >&2; exit 2; }
  datasets+=("${files[$name]}")
done

# The baseline: one process per dataset, one after the other, on its own core.
(
  [ "$start" = 0 ] && [ "${EVAL_BASELINE:-1}" = 1 ] || exit 0
  for data in "${datasets[@]}"; do
    name="$(basename "$(dirname "$data")")"
    "$py" -m scripts.eval run --data "$data" --mode direct --out "$out/$name-direct.jsonl" \
      --limit "$n" --no-progress
  done
) >"$logs/direct.out" 2>&1 &
direct_pid=$!

"$py" -m cli serve --log-dir "$logs" >"$logs/serve.out" 2>&1 &
serve_pid=$!
trap 'kill "$serve_pid" "$direct_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true' EXIT
scripts/wait_ready.sh "$serve_pid" "$logs/serve.out" "$ORCH_PORT" "$PLANNER_PORT" "$VERIFIER_PORT"
pipeline=(--url "http://127.0.0.1:$ORCH_PORT" --planner-url "http://127.0.0.1:$PLANNER_PORT" --deadline-s 120
  --retry-errors --concurrency 1 --no-progress)
for ((done_n = start + batch; done_n <= n; done_n += batch)); do
  for data in "${datasets[@]}"; do
    name="$(basename "$(dirname "$data")")"
    for mode in ${EVAL_MODES:-plan plan+verify plan+verify+sc5 plan+verify+mixed5}; do
      "$py" -m scripts.eval run --data "$data" --mode "$mode" --out "$out/$name-$mode.jsonl" \
        --offset "$start" --limit $((done_n - start)) "${pipeline[@]}"
    done
  done
done
wait "$direct_pid"
