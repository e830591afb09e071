#!/usr/bin/env bash
# Set up everything on a fresh machine and run the whole test suite.
# Arguments go to pytest: `scripts/test.sh -m unit` runs the fast unit tier only.
# Needs PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 (.ci/run starts them).
# As root and with no arguments, the security tests then run again as uid 65534
# (scripts/test_unprivileged.sh); REASON_SKIP_UNPRIVILEGED=1 skips that second run.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="$(scripts/bootstrap.sh dev,llamacpp,model,training)"
# The web console's browser tests (tests/orchestrator/console) drive the system's
# Chromium through Playwright; as root on Debian, install it when it is missing (they
# skip without it, except under CI=true, where they fail).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium for the console's browser tests..." >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
fi
# The monitoring tests (tests/deploy/test_monitoring.py) check the Prometheus config and
# every dashboard query with promtool, from Debian's `prometheus` package: installed the
# same way (they skip without it, except under CI=true).
if ! command -v promtool >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing promtool (Debian's prometheus) for the monitoring tests..." >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
"$venv/bin/python" -m cli models pull qwen2.5-coder-0.5b-instruct
"$venv/bin/python" -m cli models pull smollm2-135m-instruct
status=0
"$venv/bin/python" -m pytest "$@" || status=$?
# CI runs as root; production runs the orchestrator unprivileged. With no arguments,
# run the sandbox's and SQL tool's security tests again as an unprivileged user.
if [ "$#" -eq 0 ] && [ "$(id -u)" = 0 ] && [ "${REASON_SKIP_UNPRIVILEGED:-0}" != 1 ]; then
  scripts/test_unprivileged.sh || status=$?
fi
exit "$status"
