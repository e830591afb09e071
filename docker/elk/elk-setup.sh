#!/usr/bin/env bash
# One-shot setup of the elk compose profile:
#   1. set the kibana_system user's password (Kibana logs in with it);
#   2. wait until Kibana is available;
#   3. import the trace-lookup saved search and its data view (saved objects import API).
# Idempotent: the password is set again, the import overwrites the same object ids.
set -euo pipefail

: "${ES_URL:?}" "${KIBANA_URL:?}" "${ELASTIC_PASSWORD:?}" "${KIBANA_SYSTEM_PASSWORD:?}"
saved_objects="${SAVED_OBJECTS:-/setup/kibana-saved-objects.ndjson}"
auth=(-u "elastic:${ELASTIC_PASSWORD}")

echo "elk-setup: setting the kibana_system password"
body="$(printf '{"password":"%s"}' "$(printf '%s' "$KIBANA_SYSTEM_PASSWORD" | sed 's/\\/\\\\/g; s/"/\\"/g')")"
curl -fsS "${auth[@]}" -X POST "$ES_URL/_security/user/kibana_system/_password" \
    -H 'Content-Type: application/json' --data-binary @- <<<"$body" >/dev/null

echo "elk-setup: waiting for Kibana at $KIBANA_URL"
for _ in $(seq 1 120); do
    if curl -fsS "${auth[@]}" "$KIBANA_URL/api/status" 2>/dev/null | grep -q '"level":"available"'; then
        break
    fi
    sleep 5
done
curl -fsS "${auth[@]}" "$KIBANA_URL/api/status" | grep -q '"level":"available"' \
    || { echo "elk-setup: Kibana did not become available" >&2; exit 1; }

echo "elk-setup: importing $saved_objects"
result="$(curl -fsS "${auth[@]}" -X POST "$KIBANA_URL/api/saved_objects/_import?overwrite=true" \
    -H 'kbn-xsrf: true' --form "file=@${saved_objects}")"
echo "$result"
echo "$result" | grep -q '"success":true' || { echo "elk-setup: import failed" >&2; exit 1; }
echo "elk-setup: done"
