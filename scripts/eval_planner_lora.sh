#!/usr/bin/env bash
# The planner adapter's evaluation: the 0.5B planner with and without its LoRA adapter on
# the same questions, same prompts, same decoding (greedy, one plan per question, the
# `draft` plan format), each plan executed with the orchestrator's real tools by
# training.sample_pipeline. Both arms run at once, one core each, so their latencies are
# measured under the same load. Results are committed under docs/benchmarks/results/
# planner-lora/; a rerun resumes (finished questions are skipped).
#   scripts/eval_planner_lora.sh DATASET N [ADAPTER]
#     DATASET: test (GSM8K test) or dev (the GSM8K train dev split, held out from the
#     adapter's data: the sampler never draws it)
# then: python -m training.planner_eval <base file> <lora file> --out <report>.json
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
dataset="$1" n="$2" adapter="${3:-planner/adapters/qwen2.5-coder-0.5b-instruct}"
py="${PYTHON:-$repo/.venv/bin/python}"
out="${EVAL_OUT:-docs/benchmarks/results/planner-lora}"
case "$dataset" in
  test) data=datasets/gsm8k/test.norm.jsonl exclude=() ;;
  dev) data=evals/splits/gsm8k-train-dev.jsonl exclude=(--exclude) ;;
  *) echo "DATASET is test or dev, not $dataset" >&2; exit 2 ;;
esac
mkdir -p "$out"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PLANNER_BACKEND=llamacpp PLANNER_MODEL=qwen2.5-coder-0.5b-instruct
export PLANNER_PLAN_FORMAT=draft PLANNER_TEMPERATURE=0
export PLANNER_N_THREADS=1 PLANNER_N_THREADS_BATCH=1
"$py" -m cli models pull "$PLANNER_MODEL" >/dev/null
run() {  # ARM [ENV...]
  local arm="$1"
  shift
  env "$@" "$py" -m training.sample_pipeline --data "$data" "${exclude[@]}" --limit "$n" \
    --plans 1 --prose 0 --out "$out/$dataset-$arm.jsonl" --no-progress
}
run base &
base_pid=$!
run lora PLANNER_LORA="$adapter" &
lora_pid=$!
trap 'kill "$base_pid" "$lora_pid" 2>/dev/null || true' EXIT
wait "$base_pid"
wait "$lora_pid"
trap - EXIT
"$py" -m training.planner_eval "$out/$dataset-base.jsonl" "$out/$dataset-lora.jsonl" \
  --out "$out/$dataset-report.json"
