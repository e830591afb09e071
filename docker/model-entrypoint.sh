#!/usr/bin/env bash
# Entry point of the planner and verifier images: make sure the model files are in the
# mounted volume and verified before the service starts, then exec the service.
#
#   MODEL_ROLE=planner|verifier   set by the image
#   PREPARE_MODELS=1              prepare missing models from the hub into /models
#                                 (needs network and HF_HUB_OFFLINE=0); default: only verify
#   MODELS_DIR                    default /models
set -euo pipefail

models_dir="${MODELS_DIR:-/models}"
role="${MODEL_ROLE:?MODEL_ROLE must be planner or verifier}"

if [[ "${PREPARE_MODELS:-0}" == "1" ]]; then
    python3.12 /app/scripts/prepare_models.py "$role" --dest "$models_dir"
else
    if ! python3.12 /app/scripts/prepare_models.py "$role" --dest "$models_dir" --verify-only; then
        echo "model-entrypoint: the $role model is missing or fails verification in $models_dir." >&2
        echo "model-entrypoint: run scripts/prepare_models.py on the host into the model volume," >&2
        echo "model-entrypoint: or start with PREPARE_MODELS=1 HF_HUB_OFFLINE=0 where the hub is reachable." >&2
        exit 78  # EX_CONFIG
    fi
fi
exec "$@"
