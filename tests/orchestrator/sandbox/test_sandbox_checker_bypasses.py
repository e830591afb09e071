"""Ways around the static check through allowed library code, run through the sandbox.

Each attempt is code that passed the check once and had allowed library code do what the
code may not write itself: `functools.singledispatch(...).register(f)` evaluating a
string annotation (typing.get_type_hints, dunders and all), and `from X import Y`
binding what `X.Y` is refused for (other modules, and through the interpreter's
`sys.modules` fallback the real `collections.abc`). They must now be refused before any
process is involved. The last group is library code the review kept, run to show that
hostile input stays inert there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from orchestrator.sandbox import Sandbox, SandboxSettings

pytestmark = [pytest.mark.security, pytest.mark.asyncio(loop_scope="module")]

# Evaluated by typing.get_type_hints when register() reads the annotation: a walk of
# the object graph that the check refuses when it is written as code.
SUBCLASS_WALK = "[c.__name__ for c in ().__class__.__base__.__subclasses__()][:5]"

SINGLEDISPATCH_LITERAL = f"""
import functools
def g(x):
    return 0
def f(x: "{SUBCLASS_WALK}"):
    return 1
functools.singledispatch(g).register(f)
"""

# No string literal in the annotation: a name bound to the string.
SINGLEDISPATCH_NAME_BOUND = f"""
from functools import singledispatch
walk = "{SUBCLASS_WALK}"
def g(x):
    return 0
def f(x: walk):
    return 1
singledispatch(g).register(f)
"""

SINGLEDISPATCH_ALIASED = f"""
import functools as tools
dispatch = tools.singledispatch
walk = "{SUBCLASS_WALK}"
def g(x):
    return 0
@dispatch(g).register
def f(x: walk):
    return 1
"""

REFUSED: dict[str, tuple[str, str]] = {
    # The annotation is met first (the walk follows the source).
    "singledispatch_string_annotation": (SINGLEDISPATCH_LITERAL, "banned_syntax"),
    "singledispatch_name_bound_annotation": (SINGLEDISPATCH_NAME_BOUND, "banned_name"),
    "singledispatch_through_module_alias": (SINGLEDISPATCH_ALIASED, "banned_attribute"),
    "string_annotation_alone": (f'def f(x: "{SUBCLASS_WALK}"):\n    pass', "banned_syntax"),
    "from_functools_singledispatch": ("from functools import singledispatch", "banned_name"),
    "module_alias_singledispatch": (
        "import functools as f\nf.singledispatch(len)",
        "banned_attribute",
    ),
    "from_collections_abc": ("from collections import abc\nabc", "banned_attribute"),
    "from_collections_abc_aliased": (
        "from collections import abc as a\na.Mapping",
        "banned_attribute",
    ),
    "from_fractions_sys": ("from fractions import sys\nsys.modules", "banned_attribute"),
    "from_statistics_random": ("from statistics import random", "banned_attribute"),
    "from_datetime_capi": ("from datetime import datetime_CAPI\ndatetime_CAPI", "banned_attribute"),
}

# What the subclass walk returns starts with these; none may ever come back.
LEAKS = ("'type'", "async_generator", "<class 'type'>", "collections.abc", "PyCapsule")


def _assert_no_leak(outcome: Any) -> None:
    text = f"{outcome.result} {outcome.stdout} {outcome.error}"
    for leak in LEAKS:
        assert leak not in text, outcome


@pytest.mark.parametrize("name", sorted(REFUSED))
async def test_bypass_is_refused(name: str, sandbox: Sandbox, check_clean: Any) -> None:
    code, category = REFUSED[name]
    outcome = await sandbox.run(code, {}, 5.0)
    assert outcome.status == "refused", outcome
    assert outcome.category == category, outcome
    assert outcome.result is None
    _assert_no_leak(outcome)
    await check_clean(sandbox)


@pytest_asyncio.fixture(loop_scope="module")
async def readable_stdlib_sandbox() -> AsyncIterator[Sandbox]:
    """Static check on, with `typing` loaded in the worker.

    That is what a host where the job's child can read the standard library (no chroot,
    no Landlock) gives the code: `register` can then import `typing`, and the string
    annotation is evaluated. The check must refuse the code for that reason alone.
    """
    settings = SandboxSettings(workers=1, memory_mb=256, cpu_s=2, max_output_chars=10_000)
    sb = Sandbox(settings, _preload=("typing",))
    await sb.start()
    try:
        yield sb
    finally:
        workers = [worker.proc for worker in sb._workers]
        await sb.close()
        assert all(proc.returncode is not None for proc in workers), "a worker was left"


@pytest.mark.parametrize(
    "code", [SINGLEDISPATCH_LITERAL, SINGLEDISPATCH_NAME_BOUND, SINGLEDISPATCH_ALIASED]
)
async def test_singledispatch_is_refused_where_typing_can_be_imported(
    code: str, readable_stdlib_sandbox: Sandbox
) -> None:
    outcome = await readable_stdlib_sandbox.run(code, {}, 5.0)
    assert outcome.status == "refused", outcome
    _assert_no_leak(outcome)
    answer = await readable_stdlib_sandbox.run("1+1", {}, 5.0)
    assert answer.status == "ok" and answer.result == 2, answer


# Kept by the review: allowed, and hostile input stays data. `namedtuple` builds and
# evals source from its field names, but only after checking each is an identifier
# that is no keyword and does not start with "_" (or renaming it, with rename=True).
# Format specs go to the value's __format__, which parses a spec and never traverses
# attributes the way str.format's field names do.
CONTAINED: dict[str, tuple[str, str, Any]] = {
    "namedtuple_code_in_field_name": (
        "from collections import namedtuple\nnamedtuple('A', ['x): print(\"pwned\") or (0'])",
        "error",
        None,
    ),
    "namedtuple_code_in_type_name": (
        "from collections import namedtuple\nnamedtuple('A) or print(\"pwned\") or (', 'x')",
        "error",
        None,
    ),
    "namedtuple_underscore_field": (
        "from collections import namedtuple\nnamedtuple('A', ['__builtins__'])",
        "error",
        None,
    ),
    "namedtuple_renamed_hostile_fields": (
        "from collections import namedtuple\n"
        "A = namedtuple('A', ['x): print(\"pwned\") or (0', 'def'], rename=True,"
        " defaults=['print(\"pwned\")'])\n"
        "list(A(1))",
        "ok",
        [1, 'print("pwned")'],
    ),
    "decimal_format_spec_with_field": (
        "import decimal\nformat(decimal.Decimal('2.5'), '{0.__class__}')",
        "error",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(CONTAINED))
async def test_hostile_input_to_kept_library_code_stays_data(
    name: str, sandbox: Sandbox, check_clean: Any
) -> None:
    code, status, result = CONTAINED[name]
    outcome = await sandbox.run(code, {}, 5.0)
    assert outcome.status == status, outcome
    assert outcome.result == result, outcome
    assert outcome.stdout == "", outcome
    if status == "error":
        assert outcome.error is not None and outcome.error.startswith("ValueError"), outcome
    await check_clean(sandbox)


# What the new rules must leave alone: annotations that are not strings, from-imports
# of what the modules are for, str.format on a literal, f-strings.
ORDINARY_PROGRAM = """
from fractions import Fraction
from math import floor
from functools import reduce, lru_cache
from collections import Counter, namedtuple
import operator

Item = namedtuple("Item", ["name", "price"])


def cost(items: int, price: Fraction) -> Fraction:
    return items * price


@lru_cache(maxsize=None)
def steps(n: int) -> int:
    return 0 if n <= 1 else 1 + steps(n // 2)


basket: list[Item] = [Item("apple", Fraction(1, 2)), Item("pear", Fraction(3, 4))]
total = reduce(operator.add, (item.price for item in basket), Fraction(0))
spent = cost(3, Fraction(5, 2)) + total
print(f"spent {float(spent):.2f}; {'{} of {}'.format(2, 3)}")
result = [floor(spent), str(total), steps(64), Counter("aab")["a"]]
"""


async def test_ordinary_program_still_runs(sandbox: Sandbox, check_clean: Any) -> None:
    outcome = await sandbox.run(ORDINARY_PROGRAM, {}, 5.0)
    assert outcome.status == "ok", outcome
    assert outcome.result == [8, "5/4", 6, 2]
    assert outcome.stdout == "spent 8.75; 2 of 3\n"
    await check_clean(sandbox)
