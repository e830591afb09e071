"""The tools the orchestrator offers, as the planner sees them.

This is the one place a tool's name, description and input format are written. The
orchestrator attaches implementations, timeouts and fallbacks to these names; the
planner builds its prompt and the JSON schema's tool enum from them (the orchestrator
also sends them with every `/plan` request, so a planner always plans over the tools the
orchestrator actually has).
"""

from __future__ import annotations

import ast

from services.schemas import ToolSpec

# What a python step answers. The sandbox worker applies it (`orchestrator/sandbox/
# _worker.py`, which runs in a clean interpreter and cannot import this module: its copy
# of `python_sets_result` is tied to this one by tests/orchestrator/sandbox/
# test_answer_rule.py), the python tool falls back to the printed text, and the planner
# refuses an answer step that `python_gives_answer` says gives nothing.
PYTHON_ANSWER_RULE = (
    "The step's result is the value of the program's last line when that line is an "
    "expression whose value is not None; otherwise the value of a variable named result "
    "that the program sets; otherwise what the program printed."
)

PYTHON = ToolSpec(
    name="python",
    description=(
        "Run a short Python program in a sandbox. "
        + PYTHON_ANSWER_RULE
        + " Results of earlier steps are variables named by their step ids (s1, s2, ...). "
        "Only math, fractions, decimal, statistics, itertools, functools, re and datetime "
        "may be imported; no files, network or dunder attributes."
    ),
    input_format="Python source code; the last line is an expression giving the answer",
    example="apples = 23 - 20\napples + 6",
)


def python_sets_result(tree: ast.Module) -> bool:
    """Whether the program assigns a variable named `result` (at run time only a value
    the program's own namespace ends up holding counts, not a function's local)."""
    return any(
        isinstance(node, ast.Name) and node.id == "result" and isinstance(node.ctx, ast.Store)
        for node in ast.walk(tree)
    )


def python_gives_answer(tree: ast.Module) -> bool:
    """Whether `PYTHON_ANSWER_RULE` can give the program a result other than its printed
    text: it ends with an expression, or it sets `result`."""
    return bool(tree.body) and (isinstance(tree.body[-1], ast.Expr) or python_sets_result(tree))


CALC = ToolSpec(
    name="calc",
    description=(
        "Evaluate one arithmetic expression exactly: + - * / // % ** ^, parentheses, "
        "decimals, fractions and percentages (15% of 80). Earlier results can be used by "
        "their step ids (s1 * 3)."
    ),
    input_format="a single arithmetic expression",
    example="(48 / 2) + 48",
)

# The sample database as `orchestrator/data/seed.sql` provisions it: its schema, and each
# table with its columns in order (tests compare them with the provisioned tables).
SQL_SCHEMA = "reason_data"
SQL_TABLES: dict[str, tuple[str, ...]] = {
    "countries": ("name", "capital", "continent", "population", "area_km2", "currency"),
    "products": ("id", "name", "category", "price_cents", "stock"),
    "employees": ("id", "name", "department", "title", "salary", "hire_date", "manager_id"),
    "orders": ("id", "customer", "country", "product_id", "quantity", "order_date", "status"),
}
SQL_MAX_ROWS = 200  # rows one query returns at most

SQL = ToolSpec(
    name="sql",
    description=(
        f"Run one read-only SQL SELECT against the sample database (schema {SQL_SCHEMA}: "
        + "; ".join(f"{table}({', '.join(columns)})" for table, columns in SQL_TABLES.items())
        + f"). Returns at most {SQL_MAX_ROWS} rows as JSON."
    ),
    input_format="one SQL SELECT statement",
    example="SELECT name, population FROM countries ORDER BY population DESC LIMIT 3",
)

LOOKUP = ToolSpec(
    name="lookup",
    description=(
        "Look up a fact in the knowledge base (physical constants, unit conversions, "
        "countries, planets). Answers exactly or 'not found'; never guesses."
    ),
    input_format="an entity and attribute, e.g. 'capital of France' or 'speed of light'",
    example="boiling point of water",
)

DEFAULT_TOOLS: tuple[ToolSpec, ...] = (PYTHON, CALC, SQL, LOOKUP)


def tool_names(specs: tuple[ToolSpec, ...] | list[ToolSpec] = DEFAULT_TOOLS) -> list[str]:
    return [spec.name for spec in specs]
