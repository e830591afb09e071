"""The restricted runtime on its own: static check OFF, restricted builtins ON.

What the worker gives the code (builtins without eval/open/..., an `__import__` that
hands out copies of the allowed modules) must hold without the static check in front
of it: imports the check refuses by name must not yield real modules at run time.
Dunder access is open here (no check), so this is not a boundary; the point is that
the runtime's own import never hands out what the check is there to refuse.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from orchestrator.sandbox import Sandbox, SandboxSettings

pytestmark = [pytest.mark.security, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runtime_sandbox() -> AsyncIterator[Sandbox]:
    settings = SandboxSettings(workers=2, memory_mb=256, cpu_s=2, max_output_chars=10_000)
    sb = Sandbox(settings, _ast_check=False, _restricted=True)
    await sb.start()
    try:
        yield sb
    finally:
        await sb.close()


async def test_runtime_is_restricted_without_the_check(runtime_sandbox: Sandbox) -> None:
    # The check is off (a dunder passes) and the builtins are restricted (no `open`).
    outcome = await runtime_sandbox.run("().__class__.__name__", {}, 5.0)
    assert (outcome.status, outcome.result) == ("ok", "tuple"), outcome
    outcome = await runtime_sandbox.run("open('/etc/passwd')", {}, 5.0)
    assert outcome.status == "error" and outcome.error.startswith("NameError"), outcome


# `from X import Y` where Y is no attribute of the module copy: the interpreter would
# fall back to sys.modules["X.Y"], the real module.
SUBMODULE_IMPORTS = {
    "collections_abc": "from collections import abc\nresult = repr(abc)",
    "collections_abc_aliased": "from collections import abc as m\nresult = repr(m)",
    "among_allowed_names": "from collections import Counter, abc\nresult = repr(abc)",
    "re_internal": "from re import _parser\nresult = repr(_parser)",
}


@pytest.mark.parametrize("name", sorted(SUBMODULE_IMPORTS))
async def test_from_import_of_a_submodule_is_refused(
    name: str, runtime_sandbox: Sandbox, check_clean: Any
) -> None:
    outcome = await runtime_sandbox.run(SUBMODULE_IMPORTS[name], {}, 5.0)
    assert outcome.status == "error", outcome
    assert outcome.error.startswith("ImportError"), outcome
    assert "<module" not in f"{outcome.result} {outcome.error}", outcome
    await check_clean(runtime_sandbox)


async def test_module_copies_lead_to_no_registered_module(runtime_sandbox: Sandbox) -> None:
    """A copy's name is no key of sys.modules, so no fallback can start from it."""
    code = "import collections, math\nresult = [collections.__name__, math.__name__]"
    outcome = await runtime_sandbox.run(code, {}, 5.0)
    assert outcome.status == "ok", outcome
    assert "collections" not in outcome.result and "math" not in outcome.result, outcome


async def test_from_import_of_allowed_names_works(runtime_sandbox: Sandbox) -> None:
    code = (
        "from collections import Counter, deque\nfrom math import pi as p\n"
        "result = [Counter('aab')['a'], len(deque([p])), round(p, 2)]"
    )
    outcome = await runtime_sandbox.run(code, {}, 5.0)
    assert (outcome.status, outcome.result) == ("ok", [2, 1, 3.14]), outcome


# Every plain name the checker refuses as an attribute is left out of the copies too.
HIDDEN = {
    "datetime": ["datetime_CAPI", "sys"],
    "fractions": ["numbers", "sys"],
    "statistics": ["numbers", "random", "sys"],
    "re": ["enum", "copyreg"],
    "functools": ["wraps", "update_wrapper", "singledispatch", "singledispatchmethod"],
    "operator": ["attrgetter", "methodcaller"],
}


@pytest.mark.parametrize("module", sorted(HIDDEN))
async def test_refused_attributes_are_absent_from_module_copies(
    module: str, runtime_sandbox: Sandbox
) -> None:
    names = HIDDEN[module]
    code = f"import {module}\nresult = [n for n in {names!r} if n in {module}.__dict__]"
    outcome = await runtime_sandbox.run(code, {}, 5.0)
    assert (outcome.status, outcome.result) == ("ok", []), outcome


async def test_datetime_capi_cannot_be_imported_from(runtime_sandbox: Sandbox) -> None:
    outcome = await runtime_sandbox.run("from datetime import datetime_CAPI", {}, 5.0)
    assert outcome.status == "error" and outcome.error.startswith("ImportError"), outcome


async def test_internal_imports_give_nothing(runtime_sandbox: Sandbox) -> None:
    """`time` and `_strptime` pass the import (datetime's C code needs them) but are empty."""
    code = (
        "t = __import__('time')\ns = __import__('_strptime')\n"
        "result = [n for n in [*t.__dict__, *s.__dict__] if not n.startswith('__')]"
    )
    outcome = await runtime_sandbox.run(code, {}, 5.0)
    assert (outcome.status, outcome.result) == ("ok", []), outcome
    for code in ("from time import sleep", "from _strptime import _strptime_datetime"):
        outcome = await runtime_sandbox.run(code, {}, 5.0)
        assert outcome.status == "error" and outcome.error.startswith("ImportError"), outcome
