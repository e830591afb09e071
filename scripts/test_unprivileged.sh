#!/usr/bin/env bash
# Run the security tests of the sandbox and the SQL tool a second time as an
# unprivileged user (uid/gid 65534, no capabilities, no supplementary groups).
#
# Production runs the orchestrator as a non-root uid with every capability dropped;
# CI runs as root. This script makes the non-root path a tested path: it copies the
# checkout (tracked and untracked-not-ignored files) to a world-readable temporary
# folder, builds a virtual environment from the system Python (the root user's own
# interpreter may live under a home directory others cannot enter), and runs pytest
# under setpriv.
#
#   scripts/test_unprivileged.sh [PYTEST ARGS]   default: -m security on the sandbox and SQL tests
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

if [ "$(id -u)" != 0 ]; then
  echo "test_unprivileged.sh: already unprivileged; run the tests directly" >&2
  exit 2
fi
uid="${REASON_UNPRIVILEGED_UID:-65534}"
gid="${REASON_UNPRIVILEGED_GID:-65534}"
python="${REASON_UNPRIVILEGED_PYTHON:-/usr/bin/python3}"

# A venv the unprivileged user can read and execute, cached like the main one.
cache="${REASON_UNPRIVILEGED_CACHE:-/var/cache/reason-unprivileged}"
venv="$(REASON_CACHE_DIR="$cache" PYTHON="$python" scripts/bootstrap.sh dev)"
chmod -R a+rX "$cache"

work="$(mktemp -d /tmp/reason-unprivileged.XXXXXX)"
trap 'rm -rf "$work"' EXIT
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$work"
else
  tar --exclude=.git --exclude=.venv --exclude=var --exclude=logs -cf - . | tar -xf - -C "$work"
fi
mkdir -p "$work/tmp"
chown "$uid:$gid" "$work/tmp"
chmod -R a+rX "$work"
chmod 755 "$work"

if [ "$#" -eq 0 ]; then
  set -- -m security tests/orchestrator/sandbox tests/orchestrator/tools
fi
echo "security tests as uid $uid (no capabilities):" >&2
cd "$work"
setpriv --reuid="$uid" --regid="$gid" --clear-groups \
  --inh-caps=-all --ambient-caps=-all --bounding-set=-all --no-new-privs \
  env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$work/tmp" TMPDIR="$work/tmp" \
  PYTHONPATH="$work" PYTHONDONTWRITEBYTECODE=1 \
  ${TEST_POSTGRES_DSN:+TEST_POSTGRES_DSN="$TEST_POSTGRES_DSN"} \
  ${TEST_REDIS_URL:+TEST_REDIS_URL="$TEST_REDIS_URL"} \
  "$venv/bin/python" -m pytest -p no:cacheprovider "$@"
