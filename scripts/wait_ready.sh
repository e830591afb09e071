#!/usr/bin/env bash
# Wait until the three services answer /readyz, or fail if the process serving them exits.
#   scripts/wait_ready.sh SERVE_PID LOG_FILE ORCH_PORT PLANNER_PORT VERIFIER_PORT
set -euo pipefail
pid="$1" log="$2"
shift 2
for port in "$@"; do
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "services exited; see $log" >&2; exit 1; }
    sleep 2
  done
done
