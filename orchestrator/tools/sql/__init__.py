"""The `sql` tool: read-only queries on the sample database, held against a hostile model.

Modules: `policy` (parse and allowlist), `bounds` (size bounds), `render` (results),
`tool` (the pool and the executors), `sqlite_guard` (the SQLite connection and
authorizer), `errors` (driver errors as fixed messages). The schema, its data and the
reader role are provisioned by `orchestrator.provisioning` (`reason db init`).

Independent defences (the first two each enough on its own for writes):

1. **The role.** On PostgreSQL the pool connects as `reason_reader`, created by
   `orchestrator.provisioning.init_database`: LOGIN, no superuser, CREATEDB,
   CREATEROLE, REPLICATION or BYPASSRLS, member of no role, USAGE on schema `reason_data` and SELECT on its tables only; the
   database's TEMPORARY right and schema `public` are revoked from PUBLIC (the tool's
   database should be the product's own); role defaults `default_transaction_read_only`,
   `statement_timeout`, `lock_timeout`, `idle_in_transaction_session_timeout` and a
   `search_path` of `pg_catalog, reason_data, pg_temp`, and resource limits the server
   enforces: `work_mem`, `hash_mem_multiplier`, no parallel workers, no JIT, and (set
   by a superuser) `temp_file_limit`. On SQLite the file is opened read-only
   (`mode=ro`), with `PRAGMA query_only=ON`, `trusted_schema=OFF`, temporary data on
   disk, length and pattern limits, an authorizer that allows only SELECT, reads of the
   sample tables and an allowlist of functions, and a progress handler that stops a
   query at its deadline or after a fixed amount of work.
2. **The parser.** Exactly one statement, parsed by PostgreSQL's own parser (pglast),
   and only a plain query: every node of the tree must be of an allowed type (so DML,
   DDL, COPY, SET, LOCK, transaction control, LISTEN/NOTIFY, DO, CALL, EXPLAIN, writable
   CTEs, `SELECT ... INTO` and `FOR UPDATE/SHARE` are refused wherever they appear);
   every function call must be on an allowlist of aggregate, window, math, string and
   date functions (so nothing that reads files, reaches the network, sleeps, takes
   locks, touches large objects or sequences, or changes settings can be called); casts
   only to plain types; relations only from the sample schema (or CTEs in scope); no
   function called through attribute notation (`t.row_to_json`). Both backends run the
   deparsed text of the checked tree, never the input, and that text must parse back
   to the same tree, so comments and lexer tricks cannot smuggle anything past the
   check. For SQLite the text must also split into the same tokens under SQLite's
   lexer (no brackets, backticks, parameters, prefixed strings or comments), and
   constructs SQLite reads differently (array subscripts, bit strings) are refused.
3. **The size bounds** (`bounds`). Every value the query can build gets an upper
   bound from the sizes of the sample tables, constant arguments and the rules of each
   allowed function; format() widths, char(n) padding, nested replace(), aggregates
   over cross joins, `x || x` through subqueries, recursive queries whose values grow,
   and generate_series over huge ranges are refused before they run.
4. **The transaction.** Each PostgreSQL call runs in a READ ONLY transaction with
   `statement_timeout` (from the caller's budget), `lock_timeout`, `search_path`,
   `work_mem` and the other limits set LOCAL by the tool (never by the model), reads at
   most `max_rows + 1` rows through a cursor, each row cut to `MAX_ROW_CHARS` on the
   server, and the connection is reset before it returns to the pool (asyncpg's reset:
   advisory locks released, cursors closed, UNLISTEN, RESET ALL; plus RESET ROLE,
   DISCARD TEMP and DISCARD SEQUENCES), so nothing one call sets reaches the next.
   SQLite calls use a fresh read-only connection each time.

Errors: the caller gets a fixed message per kind of failure (syntax, unknown name,
invalid value, permission, time limit, too large, unavailable; with the SQLSTATE on
PostgreSQL); the driver's text, which can name hosts, roles, databases, files and
catalog internals, is only logged. Checking a long query and rendering a large result
run in a worker thread, and input over `MAX_INPUT_CHARS` is refused before any work.

Results: a single value is answered as that value; otherwise a JSON list of row objects,
or `{"rows": [...], "truncated": true, "row_limit": N}` when there were more rows, with
`"output_limit": C` added when rows were left out (or cells cut) to fit C characters.
"""
