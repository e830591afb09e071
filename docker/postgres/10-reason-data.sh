#!/usr/bin/env bash
# PostgreSQL init step, run by the image's entrypoint from /docker-entrypoint-initdb.d
# when the data directory is empty. Creates the SQL tool's schema, loads the sample
# data (orchestrator/data/seed.sql: unqualified names, loaded with the schema as the
# search path), and makes the tool's role read-only with its password from the
# environment. The role part is idempotent; the seed is loaded only into an empty schema.
#
#   REASON_READER_PASSWORD   required; the password the orchestrator's DSN carries
#   READER_ROLE              default reason_reader
#   READER_SCHEMA            default reason_data
#   SEED_FILE                default /seed/seed.sql
#   POSTGRES_USER/POSTGRES_DB and the PG* variables select the server and database.
set -euo pipefail

: "${REASON_READER_PASSWORD:?REASON_READER_PASSWORD must be set for the read-only SQL role}"
role="${READER_ROLE:-reason_reader}"
schema="${READER_SCHEMA:-reason_data}"
[[ "$role" =~ ^[a-z_][a-z0-9_]{0,62}$ ]] || { echo "bad READER_ROLE '$role'" >&2; exit 1; }
[[ "$schema" =~ ^[a-z_][a-z0-9_]{0,62}$ ]] || { echo "bad READER_SCHEMA '$schema'" >&2; exit 1; }
seed="${SEED_FILE:-/seed/seed.sql}"
[[ -r "$seed" ]] || { echo "seed file $seed not readable" >&2; exit 1; }

# psql variables are quoted by psql itself (:'pw' as a literal, :"role" as an identifier),
# so the password never becomes SQL text.
psql -v ON_ERROR_STOP=1 --no-psqlrc \
    --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-${PGDATABASE:-postgres}}" \
    -v pw="$REASON_READER_PASSWORD" -v role="$role" -v schema="$schema" -v seed="$seed" <<'SQL'
BEGIN;
CREATE SCHEMA IF NOT EXISTS :"schema";
SELECT NOT EXISTS (
    SELECT 1 FROM information_schema.tables WHERE table_schema = :'schema'
) AS load_seed \gset
\if :load_seed
  SET LOCAL search_path TO :"schema";
  \i :seed
\endif
COMMIT;

SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role') AS create_role \gset
\if :create_role
  CREATE ROLE :"role" LOGIN;
\endif
-- The same role the SQL tool's own init_database (orchestrator/provisioning.py) creates.
ALTER ROLE :"role" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION
    NOBYPASSRLS CONNECTION LIMIT 32 PASSWORD :'pw';
-- Member of no role.
SELECT format('REVOKE %I FROM %I', roleid::regrole::text, :'role')
    FROM pg_auth_members WHERE member = (SELECT oid FROM pg_roles WHERE rolname = :'role') \gexec
-- Every session of the role is read-only and bounded, whatever the client asks for: the
-- settings of ROLE_SETTINGS in orchestrator/provisioning.py (a deploy test ties the two).
ALTER ROLE :"role" SET default_transaction_read_only = on;
ALTER ROLE :"role" SET statement_timeout = '5000ms';
ALTER ROLE :"role" SET lock_timeout = '1000ms';
ALTER ROLE :"role" SET idle_in_transaction_session_timeout = '10000ms';
ALTER ROLE :"role" SET search_path = pg_catalog, :"schema", pg_temp;
-- Memory and disk one query may use (the tool sets the same per call; these hold for
-- any client of the role). temp_file_limit needs a superuser, which this step runs as.
ALTER ROLE :"role" SET work_mem = '4096kB';
ALTER ROLE :"role" SET hash_mem_multiplier = '1';
ALTER ROLE :"role" SET max_parallel_workers_per_gather = '0';
ALTER ROLE :"role" SET jit = 'off';
ALTER ROLE :"role" SET temp_file_limit = '64MB';

REVOKE ALL ON SCHEMA :"schema" FROM PUBLIC;
GRANT USAGE ON SCHEMA :"schema" TO :"role";
GRANT SELECT ON ALL TABLES IN SCHEMA :"schema" TO :"role";
ALTER DEFAULT PRIVILEGES IN SCHEMA :"schema" GRANT SELECT ON TABLES TO :"role";
REVOKE ALL ON SCHEMA public FROM PUBLIC;
REVOKE ALL ON SCHEMA public FROM :"role";
SELECT current_database() AS db \gset
REVOKE TEMPORARY ON DATABASE :"db" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO :"role";
SQL
echo "10-reason-data: $role can read schema $schema"
