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
    ],
)
def test_checker_accepts_ordinary_programs(code: str) -> None:
    assert check_source(code, max_source_chars=20_000) is None


def test_checker_refuses_before_parsing_oversized_source() -> None:
    refusal = check_source("1" * 30_000, max_source_chars=20_000)
    assert refusal is not None and refusal.category == "source_too_large"


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
