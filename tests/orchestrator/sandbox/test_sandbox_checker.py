"""Layer 1 on its own: the static check, without any process."""

from __future__ import annotations

import pytest

from orchestrator.sandbox import SandboxSettings
from orchestrator.sandbox.checker import check_source

pytestmark = pytest.mark.unit

GSM8K_STYLE = """
from fractions import Fraction
eggs = 16 - 3 - 4
result = eggs * Fraction(2)
print(f"{float(result):.2f}")
"""


# Programs of the kind the planner writes for word problems; none may be refused.
GSM8K_PROGRAMS = [
    """
from math import floor
from fractions import Fraction


def cost(items: int, price: Fraction) -> Fraction:
    return items * price


total: Fraction = cost(3, Fraction(5, 2)) + 4
result = floor(total)
""",
    """
def average(values: list[int]) -> float | None:
    if not values:
        return None
    return sum(values) / len(values)


scores = [s for s in range(10, 60, 10) if s != 30]
result = average(scores)
print(f"average {result:.1f} of {len(scores)} scores")
""",
    """
import math
from decimal import Decimal, ROUND_HALF_UP
from collections import Counter, namedtuple, defaultdict
from functools import reduce, lru_cache
import operator

Item = namedtuple("Item", ["name", "price"])
basket = [Item("apple", Decimal("0.5")), Item("pear", Decimal("0.75"))]
total = reduce(operator.add, (item.price for item in basket), Decimal(0))
counts = Counter(item.name for item in basket)
by_letter = defaultdict(list)
for item in basket:
    by_letter[item.name[0]].append(item)


@lru_cache(maxsize=None)
def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


result = (total.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP), fib(20), math.gcd(12, 18))
""",
    """
import datetime
import statistics
start = datetime.date(2024, 1, 31)
later = start + datetime.timedelta(days=45)
median = statistics.median([3, 1, 2])
"{} {:%Y-%m-%d} {:>6.2f}".format(median, later, 3.14159)
""",
    "x: int = 5\ny: list[float] = [1.5]\nx * y[0]",
    "def f(*args: int, scale: float = 1.0, **kw: bool) -> tuple[int, ...]:\n    return args",
]


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        SandboxSettings(workers=0)
    with pytest.raises(ValueError):
        SandboxSettings(memory_mb=1)
    with pytest.raises(ValueError):
        SandboxSettings(network_isolation="bogus")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "code",
    [
        GSM8K_STYLE,
        "'{} and {name}'.format(1, name=2)",
        "from math import sqrt as root\nroot(4)",
        "total = sum(x * x for x in range(10) if x % 2)\ntotal",
        "from decimal import localcontext, Decimal\nwith localcontext() as c:\n    c.prec = 5\n    x = Decimal(1) / 7\nx",
        "import re\nm = re.match(r'(\\d+)', '42 apples')\nint(m.group(1))",
        *GSM8K_PROGRAMS,
    ],
)
def test_checker_accepts_ordinary_programs(code: str) -> None:
    assert check_source(code, max_source_chars=20_000) is None


def test_checker_refuses_before_parsing_oversized_source() -> None:
    refusal = check_source("1" * 30_000, max_source_chars=20_000)
    assert refusal is not None and refusal.category == "source_too_large"


ANNOTATIONS_AS_EXPRESSIONS = [
    ("def f(x: ().__class__):\n    pass", "dunder_access"),
    ("def f() -> eval:\n    pass", "banned_name"),
    ("x: (lambda: 0).__globals__ = 1", "dunder_access"),
    ("from __future__ import annotations", "banned_import"),
]

# Functions of allowed modules that evaluate strings (singledispatch's register runs
# typing.get_type_hints on the annotations), and what reaches internals.
EVALUATORS = [
    ("import functools\nfunctools.singledispatch(len)", "banned_attribute"),
    ("import functools as f\nf.singledispatch", "banned_attribute"),
    ("import functools\nm = functools\nm.singledispatchmethod", "banned_attribute"),
    ("import functools\n@functools.singledispatch\ndef f(x):\n    pass", "banned_attribute"),
    ("from functools import singledispatch", "banned_name"),
    ("from functools import singledispatch as dispatch", "banned_name"),
    ("from functools import singledispatchmethod", "banned_name"),
    ("def h(x):\n    pass\ng.register(h)", "banned_attribute"),
    ("@g.register\ndef h(x: int):\n    pass", "banned_attribute"),
    ("import datetime\ndatetime.datetime_CAPI", "banned_attribute"),
    ("f.cell_contents", "banned_attribute"),
]

# `from X import Y` is held to the rules of `X.Y`.
FROM_IMPORTS = [
    ("from fractions import sys", "banned_attribute"),
    ("from fractions import sys as s", "banned_attribute"),
    ("from statistics import random", "banned_attribute"),
    ("from re import enum", "banned_attribute"),
    ("from re import copyreg", "banned_attribute"),
    ("from datetime import sys", "banned_attribute"),
    ("from collections import abc", "banned_attribute"),
    ("from collections import abc as c", "banned_attribute"),
    ("from datetime import datetime_CAPI", "banned_attribute"),
    ("from operator import format", "format_string"),
    ("from collections.abc import Mapping", "banned_import"),
    ("import collections.abc as c", "banned_import"),
    ("from re import _parser", "private_access"),
]


@pytest.mark.parametrize(
    ("code", "category"),
    [
        ("x.__class__", "dunder_access"),
        ("x._private", "private_access"),
        ("gen.gi_frame", "banned_attribute"),
        ("frame.f_back", "banned_attribute"),
        ("code.co_code", "banned_attribute"),
        ("tb.tb_frame", "banned_attribute"),
        ("import fractions\nfractions.sys", "banned_attribute"),
        ("import re\nre.enum", "banned_attribute"),
        ("import statistics\nstatistics.random", "banned_attribute"),
        ("'{0.real}'.format(1)", "format_string"),
        ("'{0[0]}'.format([1])", "format_string"),
        ("'{:{x.real}}'.format(1, x=1)", "format_string"),
        ("'{'.format(1)", "format_string"),
        ("fmt = '{}'\nfmt.format(1)", "format_string"),
        ("from . import x", "banned_import"),
        ("yield 1", "banned_syntax"),
        ("lambda: (yield)", "banned_syntax"),
        ("try:\n    pass\nexcept* Exception:\n    pass", "banned_syntax"),
        ("def f(__x):\n    pass", "dunder_access"),
        ("f(_secret=1)", "private_access"),
        ("import math as _m", "private_access"),
        ("global __builtins__", "dunder_access"),
        ("ｇｅｔａｔｔｒ(1, 'real')", "banned_name"),
        ("f(" * 120 + ")" * 120, "nesting"),
        ("x = " + "not " * 150 + "1", "nesting"),
        *ANNOTATIONS_AS_EXPRESSIONS,
        *EVALUATORS,
        *FROM_IMPORTS,
    ],
)
def test_checker_refusals(code: str, category: str) -> None:
    refusal = check_source(code, max_source_chars=20_000)
    assert refusal is not None, code
    assert refusal.category == category, refusal


def test_checker_reports_syntax_errors() -> None:
    from orchestrator.sandbox.checker import SourceSyntaxError

    with pytest.raises(SourceSyntaxError):
        check_source("def f(:", max_source_chars=20_000)


# --- string annotations (forward references something could evaluate) --------------


@pytest.mark.parametrize(
    "code",
    [
        'def f(x: "().__class__.__base__.__subclasses__()"):\n    pass',
        'def f() -> "evil":\n    pass',
        'def f(x: list["evil"]):\n    pass',
        'def f(x: int | "evil"):\n    pass',
        'def f(x: f"{1}"):\n    pass',
        "def f(x: b'evil'):\n    pass",
        'def f(x, /, y: "evil"):\n    pass',
        'def f(*args: "evil"):\n    pass',
        'def f(*, key: "evil"):\n    pass',
        'def f(**kw: "evil"):\n    pass',
        'def outer():\n    def inner(x: "evil"):\n        pass',
        'x: "evil" = 1',
        'x: dict[str, "evil"]',
    ],
)
def test_string_annotations_are_refused(code: str) -> None:
    refusal = check_source(code, max_source_chars=20_000)
    assert refusal is not None, code
    assert refusal.category == "banned_syntax", refusal
    assert "annotation" in refusal.detail


# --- what the walk of the allowed modules finds -------------------------------------


def test_worker_hides_the_evaluators_from_its_module_copies() -> None:
    from orchestrator.sandbox import Sandbox

    hidden = set(Sandbox(SandboxSettings())._worker_config()["hidden_names"])
    assert {"singledispatch", "singledispatchmethod", "attrgetter", "wraps"} <= hidden


def test_every_other_module_is_refused_as_attribute_and_from_import() -> None:
    """Modules seen as attributes of allowed ones (`fractions.sys`) and submodules of
    allowed packages (`collections.abc`); allowed modules (`fractions.math`) are fine."""
    import importlib
    import pkgutil
    import types

    from orchestrator.sandbox.checker import ALLOWED_MODULES

    found = []
    for name in sorted(ALLOWED_MODULES):
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, types.ModuleType) and attr not in ALLOWED_MODULES:
                found.append((name, attr))
        for sub in pkgutil.iter_modules(getattr(module, "__path__", None) or []):
            found.append((name, sub.name))
    assert ("fractions", "sys") in found and ("collections", "abc") in found
    for module, attr in found:
        as_attribute = check_source(f"import {module}\n{module}.{attr}", max_source_chars=1000)
        as_import = check_source(f"from {module} import {attr}", max_source_chars=1000)
        assert as_attribute is not None, f"{module}.{attr}"
        assert as_import is not None, f"from {module} import {attr}"


def test_other_names_for_refused_functions_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    import functools
    import statistics

    from orchestrator.sandbox import checker

    monkeypatch.setattr(statistics, "dispatcher", functools.singledispatch, raising=False)
    monkeypatch.setattr(statistics, "evaluate", eval, raising=False)
    names = checker._module_attribute_names()
    assert {"dispatcher", "evaluate"} <= names
    assert "mean" not in names and "Fraction" not in names
