"""Size bounds: queries that make the database build huge values are refused up front.

One allowed query could otherwise make PostgreSQL (or SQLite) allocate up to a gigabyte
per value: a huge format() width, a blank-padded char(n) cast, nested replace(),
string_agg over a cross join, `x || x` through a chain of subqueries, a recursive query
that doubles a string each round. The checker bounds every value from the sizes of the
sample tables and refuses those whose bound passes the limits, on both dialects, while
the ordinary questions about the sample data still pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.tools.base import ToolRefused
from orchestrator.tools.sql.policy import PG_FUNCTIONS, SqlPolicy, check_query
from orchestrator.tools.sql.tool import SqlTool


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SqlPolicy]]:
    """The policies the tool derives from the shipped sample data, for each dialect."""
    import asyncio

    tool = SqlTool(None, Path(tmp_path_factory.mktemp("bounds")) / "sample.sqlite3")
    asyncio.run(tool.start())
    sqlite = tool.policy
    assert sqlite is not None and sqlite.shape is not None
    postgres = dataclasses.replace(sqlite, functions=PG_FUNCTIONS, dialect="postgres")
    yield {"postgres": postgres, "sqlite": sqlite}


def _nested_concat(levels: int) -> str:
    """`x || x || x || x` through `levels` subqueries: 4 ** levels times the inner value."""
    query = "SELECT format('%1000s', '') AS v0"
    for i in range(1, levels + 1):
        prev = f"v{i - 1}"
        query = f"SELECT {prev} || {prev} || {prev} || {prev} AS v{i} FROM ({query}) q{i}"
    return f"SELECT length(v{levels}) FROM ({query}) q"


NESTED_REPLACE = (
    "SELECT length(" + "replace(" * 6 + "'xxxxxxxxxx'" + ", 'x', 'xxxxxxxxxx')" * 6 + ")"
)

AMPLIFIERS_PG = [
    "SELECT format('%900000000s', 'x')",
    "SELECT format('%*s', 900000000, 'x')",
    "SELECT format('%1$*2$s', 'x', 900000000)",
    "SELECT format(name, 1) FROM countries",
    "SELECT CAST('x' AS char(10000000))",
    "SELECT 'x'::character(10000000)",
    NESTED_REPLACE,
    "SELECT length(regexp_replace(regexp_replace(format('%1000s', ''), '', '\\&\\&\\&\\&', 'g'),"
    " '', '\\&\\&\\&\\&', 'g'))",
    "SELECT string_agg(a.name, ',') FROM countries a, countries b, countries c, countries d",
    "SELECT array_agg(a.name) FROM countries a, countries b, countries c",
    "SELECT json_agg(o) FROM orders o, orders p, orders q",
    "SELECT string_agg(x::text, ',') FROM generate_series(1, 1000000) x",
    "SELECT ARRAY(SELECT a.name FROM countries a, countries b, countries c)",
    "SELECT count(*) FROM countries a WHERE a.name IN "
    "(SELECT b.name FROM countries b, countries c, countries d, countries e)",
    "SELECT a.name FROM countries a, countries b, countries c, countries d "
    "INTERSECT SELECT name FROM countries",
    _nested_concat(6),
    "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r) "
    "SELECT length(s) FROM r LIMIT 40",
    "WITH RECURSIVE r(s, n) AS (SELECT 'x', 1 UNION ALL SELECT s || 'x', n + 1 FROM r) "
    "SELECT max(n) FROM r",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
    "SELECT string_agg(n::text, ',') FROM r",
    "SELECT count(*) FROM generate_series(1, 100000000)",
    "SELECT count(*) FROM generate_series(1, (SELECT 10))",
    "SELECT x FROM generate_series('2020-01-01'::timestamp, '2024-01-01'::timestamp, "
    "interval '1 second') x",
    "SELECT x FROM generate_series(now(), now() + interval '1 year', interval '1 second') x",
    # Expressions PostgreSQL cannot stop half-way: divisions of 100 000-digit numbers...
    "WITH v AS (SELECT 2::numeric ^ 400000 AS x, 3::numeric ^ 120000 AS y) "
    "SELECT x / y + x / y + x / y + x / y + x / y + x / y + x / y + x / y FROM v",
    "SELECT sqrt(2::numeric ^ x) + ln(3::numeric ^ x) FROM generate_series(1, 3) x",
    # ... and one call that neither engine can stop: a search of a big value for another.
    "SELECT translate(x, x, 'a') FROM (SELECT replace(format('%1000s', ''), ' ', "
    "format('%900s', '')) AS x) q",
]

AMPLIFIERS_SQLITE = [
    "SELECT printf('%.900000c', 'x')",
    "SELECT printf('%900000d', 1)",
    "SELECT printf('%.*c', 900000, 'x')",
    "SELECT format('%*d', 900000, 1)",
    "SELECT printf(name, 1) FROM countries",
    NESTED_REPLACE,
    "SELECT group_concat(a.name) FROM countries a, countries b, countries c",
    _nested_concat(6).replace("format(", "printf("),
    "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r) "
    "SELECT length(s) FROM r LIMIT 40",
    "SELECT instr(x, substr(x, 1, 500000)) FROM (SELECT replace(printf('%1000s', ''), ' ', "
    "printf('%999s', '')) AS x) q",
    "SELECT x LIKE '%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a"
    "%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a"
    "%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%b' FROM (SELECT replace(printf('%1000s', ''), ' ', "
    "printf('%999s', '')) AS x) q",
]


@pytest.mark.unit
@pytest.mark.security
@pytest.mark.parametrize("sql", AMPLIFIERS_PG, ids=lambda s: s[:60])
def test_amplifying_queries_are_refused_on_postgres(
    policies: dict[str, SqlPolicy], sql: str
) -> None:
    with pytest.raises(ToolRefused) as info:
        check_query(sql, policies["postgres"])
    assert info.value.category in ("sql_too_large", "sql_construct"), str(info.value)


@pytest.mark.unit
@pytest.mark.security
@pytest.mark.parametrize("sql", AMPLIFIERS_SQLITE, ids=lambda s: s[:60])
def test_amplifying_queries_are_refused_on_sqlite(policies: dict[str, SqlPolicy], sql: str) -> None:
    with pytest.raises(ToolRefused) as info:
        check_query(sql, policies["sqlite"])
    assert info.value.category == "sql_too_large", str(info.value)


# Questions about the sample data, written as a model writes them: none may be refused.
ORDINARY_PG = [
    "SELECT string_agg(name, ', ' ORDER BY name) FROM countries WHERE continent = 'Europe'",
    "SELECT c.continent, string_agg(c.name, ', ') FROM countries c GROUP BY c.continent",
    "SELECT o.customer, p.name, c.capital FROM orders o JOIN products p ON p.id = o.product_id "
    "JOIN countries c ON c.name = o.country",
    "SELECT string_agg(o.customer || ': ' || p.name, '; ') FROM orders o, products p, "
    "countries c, employees e WHERE p.id = o.product_id AND c.name = o.country AND e.id = 1",
    "SELECT e.name, m.name AS manager FROM employees e LEFT JOIN employees m ON m.id = e.manager_id",
    "SELECT json_agg(o) FROM orders o WHERE o.status = 'delivered'",
    "SELECT array_agg(name ORDER BY population DESC) FROM countries",
    "WITH RECURSIVE chain(id, name, manager_id, depth) AS (SELECT id, name, manager_id, 0 "
    "FROM employees WHERE id = 10 UNION ALL SELECT e.id, e.name, e.manager_id, c.depth + 1 "
    "FROM employees e JOIN chain c ON e.id = c.manager_id) SELECT name, depth FROM chain",
    "WITH RECURSIVE chain(id, name, manager_id) AS (SELECT id, name, manager_id FROM employees "
    "WHERE id = 10 UNION ALL SELECT e.id, e.name, e.manager_id FROM employees e "
    "JOIN chain c ON e.id = c.manager_id) "
    "SELECT string_agg(name, ' > ') FROM (SELECT name FROM chain LIMIT 50) q",
    "SELECT format('%s has %s people', name, population) FROM countries",
    "SELECT format('%-20s|%10s', name, capital) FROM countries",
    "SELECT to_char(hire_date, 'YYYY-MM') AS month, count(*) FROM employees GROUP BY 1",
    "SELECT department, round(avg(salary), 2) FROM employees GROUP BY department",
    "SELECT (SELECT count(*) FROM orders) * 1.0 / (SELECT count(*) FROM products)",
    "SELECT replace(name, ' ', '_'), regexp_replace(name, '[aeiou]', '', 'g') FROM countries",
    "SELECT x, x * x FROM generate_series(1, 10) AS g(x)",
    "SELECT d::date FROM generate_series('2024-01-01'::date, '2024-12-01'::date, "
    "interval '1 month') AS d",
    "SELECT count(*) FROM orders o WHERE o.product_id IN (SELECT id FROM products)",
    "SELECT continent, count(*) FILTER (WHERE population > 100000000) FROM countries "
    "GROUP BY ROLLUP(continent)",
    "SELECT string_agg(a.name || '-' || b.name, ',') FROM countries a, countries b "
    "WHERE a.continent = b.continent AND a.name < b.name",
    "SELECT name, salary - lag(salary) OVER (ORDER BY hire_date) FROM employees",
    "SELECT 2 ^ 10, power(2, 10), sqrt(144), 17 % 5, 7 / 2.0, exp(1)",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY salary) FROM employees",
    "SELECT CAST(salary AS numeric(12, 2)) / 12, CAST(name AS char(40)) FROM employees",
    "SELECT x FROM generate_series(1, 1000000) x LIMIT 5",
    "SELECT salary * 1.1, salary / 12, salary % 7, div(salary, 12), sqrt(salary) FROM employees",
    "WITH RECURSIVE f(n, fact) AS (SELECT 1, 1::numeric UNION ALL "
    "SELECT n + 1, fact * (n + 1) FROM f WHERE n < 20) SELECT max(fact) FROM f",
]

ORDINARY_SQLITE = [
    "SELECT group_concat(name, ', ') FROM countries WHERE continent = 'Europe'",
    "SELECT printf('%-20s|%10d', name, population) FROM countries",
    "SELECT printf('%.2f', avg(salary)) FROM employees",
    "SELECT strftime('%Y', hire_date), count(*) FROM employees GROUP BY 1",
    "SELECT o.customer, p.name FROM orders o JOIN products p ON p.id = o.product_id",
    "WITH RECURSIVE chain(id, name, manager_id, depth) AS (SELECT id, name, manager_id, 0 "
    "FROM employees WHERE id = 10 UNION ALL SELECT e.id, e.name, e.manager_id, c.depth + 1 "
    "FROM employees e JOIN chain c ON e.id = c.manager_id) SELECT max(depth) FROM chain",
    "SELECT iif(population > 100000000, 'big', 'small'), ifnull(NULL, name) FROM countries",
]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("dialect", "sql"),
    [("postgres", q) for q in ORDINARY_PG] + [("sqlite", q) for q in ORDINARY_SQLITE],
    ids=lambda v: v[:60],
)
def test_ordinary_queries_pass_the_bounds(
    policies: dict[str, SqlPolicy], dialect: str, sql: str
) -> None:
    assert check_query(sql, policies[dialect]).upper().startswith(("SELECT", "WITH"))


@pytest.mark.unit
def test_joins_on_unique_keys_do_not_multiply(policies: dict[str, SqlPolicy]) -> None:
    """string_agg over a four-table join is refused as a cross join, allowed when each
    table is joined on its unique key."""
    cross = "SELECT string_agg(o.customer, ',') FROM orders o, products p, countries c, employees e"
    keyed = cross + " WHERE p.id = o.product_id AND c.name = o.country AND e.id = o.quantity"
    with pytest.raises(ToolRefused, match="string_agg"):
        check_query(cross, policies["postgres"])
    assert check_query(keyed, policies["postgres"])
    # A key compared with a column of its own table proves nothing.
    with pytest.raises(ToolRefused, match="string_agg"):
        check_query(cross + " WHERE p.id = p.stock AND c.name = c.capital", policies["postgres"])


@pytest.mark.unit
def test_limits_scale_with_the_policy(policies: dict[str, SqlPolicy]) -> None:
    from orchestrator.tools.sql.bounds import Limits

    tight = dataclasses.replace(policies["postgres"], limits=Limits(max_value_bytes=100))
    sql = "SELECT string_agg(name, ',') FROM countries"
    assert check_query(sql, policies["postgres"])
    with pytest.raises(ToolRefused, match=r"the limit is 100\b"):
        check_query(sql, tight)


@pytest.mark.unit
def test_every_allowed_function_has_a_size_rule() -> None:
    from orchestrator.tools.sql.bounds import SIZED_FUNCTIONS, check_coverage
    from orchestrator.tools.sql.policy import SQLITE_FUNCTIONS

    assert PG_FUNCTIONS | SQLITE_FUNCTIONS <= SIZED_FUNCTIONS
    with pytest.raises(RuntimeError, match="repeat"):
        check_coverage({"repeat", "count"})
