#!/usr/bin/env bash
# Check the GPU host before the planner and verifier start (compose runs it as the
# one-shot `gpu-check` service; run it by hand on a new box too).
#
#   - nvidia-smi answers (driver installed, NVIDIA Container Toolkit passing the GPUs in);
#   - the driver is new enough for the images' CUDA (torch 2.13 / vLLM 0.32 wheels are
#     CUDA 13.0 builds: driver 580.65.06 or newer on Linux);
#   - at least REQUIRED_GPUS GPUs (compose puts the planner on GPU 0 and the verifier on 1);
#   - every GPU used has compute capability >= 7.5 (vLLM's AWQ kernels and CUDA 13 need
#     Turing or newer) and at least MIN_MEMORY_MIB of memory.
#
# Environment (defaults in brackets):
#   REQUIRED_GPUS [2]  MIN_DRIVER_VERSION [580.65.06]  MIN_COMPUTE_CAPABILITY [7.5]
#   MIN_MEMORY_MIB [7500]  GPU_IDS [every GPU listed]  NVIDIA_SMI [nvidia-smi]
# Exit status: 0 ready, 1 a check failed (the message says which and what to do).
set -euo pipefail

REQUIRED_GPUS="${REQUIRED_GPUS:-2}"
MIN_DRIVER_VERSION="${MIN_DRIVER_VERSION:-580.65.06}"
MIN_COMPUTE_CAPABILITY="${MIN_COMPUTE_CAPABILITY:-7.5}"
MIN_MEMORY_MIB="${MIN_MEMORY_MIB:-7500}"
NVIDIA_SMI="${NVIDIA_SMI:-nvidia-smi}"

fail() {
    echo "gpu-check: FAIL: $*" >&2
    exit 1
}

# version_ge A B: true when dotted version A >= B (numeric per component).
version_ge() {
    local IFS=.
    local -a a=($1) b=($2)
    local i x y
    for ((i = 0; i < ${#a[@]} || i < ${#b[@]}; i++)); do
        x=$((10#${a[i]:-0}))
        y=$((10#${b[i]:-0}))
        ((x > y)) && return 0
        ((x < y)) && return 1
    done
    return 0
}

[[ "$REQUIRED_GPUS" =~ ^[1-9][0-9]*$ ]] || fail "REQUIRED_GPUS must be a positive integer, got '$REQUIRED_GPUS'"

if ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
    fail "nvidia-smi not found. Install the NVIDIA driver on the host and the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker), then restart Docker."
fi

if ! rows="$("$NVIDIA_SMI" --query-gpu=index,name,driver_version,compute_cap,memory.total --format=csv,noheader,nounits 2>&1)"; then
    fail "nvidia-smi failed: ${rows}"
fi
[[ -n "$rows" ]] || fail "nvidia-smi lists no GPUs"

declare -A name cap mem
driver=""
count=0
while IFS=, read -r idx gname gdriver gcap gmem; do
    idx="${idx//[[:space:]]/}"
    [[ "$idx" =~ ^[0-9]+$ ]] || fail "unexpected nvidia-smi output: $idx,$gname,$gdriver,$gcap,$gmem"
    name[$idx]="$(echo "$gname" | sed 's/^ *//; s/ *$//')"
    driver="${gdriver//[[:space:]]/}"
    cap[$idx]="${gcap//[[:space:]]/}"
    mem[$idx]="${gmem//[[:space:]]/}"
    count=$((count + 1))
done <<<"$rows"

echo "gpu-check: driver $driver, $count GPU(s)"
version_ge "$driver" "$MIN_DRIVER_VERSION" \
    || fail "driver $driver is older than $MIN_DRIVER_VERSION, which the images' CUDA 13.0 needs. Upgrade the driver (580 branch or newer), or on data-center GPUs install the CUDA forward-compatibility package."

if ((count < REQUIRED_GPUS)); then
    fail "found $count GPU(s), need $REQUIRED_GPUS: compose places the planner on GPU ${PLANNER_GPU_ID:-0} and the verifier on GPU ${VERIFIER_GPU_ID:-1}. On a one-GPU box set PLANNER_GPU_ID=0 VERIFIER_GPU_ID=0 REQUIRED_GPUS=1 and PLANNER_GPU_MEMORY_UTILIZATION=0.6 so both fit."
fi

ids="${GPU_IDS:-${!name[*]}}"
for id in ${ids//,/ }; do
    [[ -n "${name[$id]:-}" ]] || fail "GPU $id is not visible (nvidia-smi lists indexes: ${!name[*]})"
    [[ "${cap[$id]}" =~ ^[0-9]+\.[0-9]+$ ]] || fail "GPU $id: cannot read its compute capability ('${cap[$id]}'); driver too old for --query-gpu=compute_cap?"
    version_ge "${cap[$id]}" "$MIN_COMPUTE_CAPABILITY" \
        || fail "GPU $id (${name[$id]}) has compute capability ${cap[$id]}; AWQ in vLLM and CUDA 13 need >= $MIN_COMPUTE_CAPABILITY (Turing or newer)"
    [[ "${mem[$id]}" =~ ^[0-9]+$ ]] || fail "GPU $id: cannot read its memory ('${mem[$id]}')"
    ((mem[$id] >= MIN_MEMORY_MIB)) \
        || fail "GPU $id (${name[$id]}) has ${mem[$id]} MiB; the models need at least $MIN_MEMORY_MIB MiB"
    echo "gpu-check: GPU $id ${name[$id]}: compute capability ${cap[$id]}, ${mem[$id]} MiB: ok"
done
echo "gpu-check: ready"
