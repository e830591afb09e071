"""Escape attempts against the sandbox as the service runs it (both layers on).

Each attempt must be refused by the static check or contained by the process boundary,
must not leak anything (no file contents, no environment, no network), and afterwards
the sandbox must still answer with no job directory or process left behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.sandbox import Sandbox

pytestmark = [pytest.mark.security, pytest.mark.asyncio(loop_scope="module")]


@dataclass(frozen=True)
class Attempt:
    code: str
    status: str | tuple[str, ...]  # expected status (or any of several)
    category: str | tuple[str, ...] | None = None  # expected category, when it matters
    timeout_s: float = 5.0


def refused(code: str, category: str | tuple[str, ...]) -> Attempt:
    return Attempt(code, "refused", category)


ATTEMPTS: dict[str, Attempt] = {
    # --- object-graph walks -----------------------------------------------------------
    "subclasses_via_tuple": refused("().__class__.__bases__[0].__subclasses__()", "dunder_access"),
    "subclasses_via_mro": refused("[].__class__.__mro__[-1].__subclasses__()", "dunder_access"),
    "mro_method": refused("x = 1 .real\nx.mro()", "banned_attribute"),
    "type_builtin": refused("type(1)", "banned_name"),
    "object_builtin": refused("object", "banned_name"),
    "function_globals": refused("(lambda: 0).__globals__", "dunder_access"),
    "builtin_self": refused("print.__self__", "dunder_access"),
    "dict_of_class": refused("int.__dict__", "dunder_access"),
    "private_name": refused("_x = 1", "private_access"),
    "module_sys_from_fractions": refused(
        "import fractions\nfractions.sys.modules['os'].system('id')", "banned_attribute"
    ),
    "module_random_from_statistics": refused(
        "import statistics\nstatistics.random", "banned_attribute"
    ),
    "module_sys_from_datetime": refused("import datetime as d\nd.sys", "banned_attribute"),
    "class_definition": refused("class A:\n    pass", "banned_syntax"),
    "match_class_pattern": refused("match 1:\n    case int(real=r):\n        r", "banned_syntax"),
    # --- frames, generators, tracebacks, code objects -----------------------------------
    "genexpr_gi_frame": refused(
        "g = (i for i in [1])\ng.gi_frame.f_back.f_globals", "banned_attribute"
    ),
    "generator_function": refused("def f():\n    yield 1\nf()", "banned_syntax"),
    "traceback_frame": refused(
        "try:\n    1/0\nexcept Exception as e:\n    t = e.__traceback__", "dunder_access"
    ),
    "traceback_with_traceback": refused(
        "try:\n    1/0\nexcept Exception as e:\n    e.with_traceback(None)", "banned_attribute"
    ),
    "code_object": refused("(lambda: 1).__code__.co_consts", ("dunder_access", "banned_attribute")),
    "coroutine": refused("async def f():\n    pass", "banned_syntax"),
    "sys_getframe": refused("import sys\nsys._getframe()", "banned_import"),
    # --- format strings -----------------------------------------------------------------
    "format_attribute": refused('"{0.__class__}".format(1)', "format_string"),
    "format_index": refused('"{x[0]}".format(x=[1])', "format_string"),
    "format_nested_spec": refused('"{:{0.real}}".format(1)', "format_string"),
    "format_through_variable": refused('s = "{0.__globals__}"\ns.format(len)', "format_string"),
    "format_map": refused('"{a}".format_map({"a": 1})', "banned_attribute"),
    "str_format_unbound": refused('str.format("{0.__class__}", 1)', "format_string"),
    "format_method_reference": refused('f = "{}".format\nf(1)', "format_string"),
    "fstring_dunder": refused('f"{(1).__class__!r}"', "dunder_access"),
    # --- imports, directly and through allowed modules ------------------------------------
    "import_os": refused("import os\nos.system('id')", "banned_import"),
    "import_importlib": refused("import importlib", "banned_import"),
    "from_functools_private": refused("from functools import _lru_cache_wrapper", "private_access"),
    "re_private_compiler": refused("import re\nre._compiler", "private_access"),
    "operator_attrgetter": refused(
        "import operator\noperator.attrgetter('__class__')(1)", "banned_attribute"
    ),
    "from_operator_attrgetter": refused("from operator import attrgetter", "banned_name"),
    "functools_update_wrapper": refused(
        "import functools\nf = functools.partial(len)\n"
        "functools.update_wrapper(f, len, assigned=('__self__',), updated=())",
        "banned_attribute",
    ),
    "from_functools_wraps": refused("from functools import wraps", "banned_name"),
    "star_import": refused("from math import *", "banned_import"),
    "submodule_import": refused("import collections.abc", "banned_import"),
    "dunder_import": refused("__import__('os')", "dunder_access"),
    # --- builtins tricks -------------------------------------------------------------------
    "eval": refused("eval('1+1')", "banned_name"),
    "exec": refused("exec('x = 1')", "banned_name"),
    "compile": refused("compile('1', 's', 'eval')", "banned_name"),
    "getattr": refused("getattr(1, 'real')", "banned_name"),
    "globals": refused("globals()", "banned_name"),
    "vars": refused("vars()", "banned_name"),
    "builtins_name": refused("__builtins__", "dunder_access"),
    "breakpoint": refused("breakpoint()", "banned_name"),
    "eval_by_reference": refused("fns = [eval]\nfns[0]('1')", "banned_name"),
    "open_by_keyword": refused("print(1, file=open('x', 'w'))", "banned_name"),
    # --- unicode identifiers (normalized the way the parser does) ------------------------
    "fullwidth_eval": refused("ｅｖａｌ('1')", "banned_name"),
    "fullwidth_underscore_dunder": refused("()._＿class_＿", "dunder_access"),
    "fullwidth_open": refused("ｏｐｅｎ('/etc/passwd')", "banned_name"),
    "fullwidth_import": refused("import ｏｓ", "banned_import"),
    "mathematical_bold_exec": refused("𝐞𝐱𝐞𝐜('x=1')", "banned_name"),
    # --- pickle, marshal, ctypes -----------------------------------------------------------
    "pickle": refused("import pickle\npickle.loads(b'cos\\nsystem\\n.')", "banned_import"),
    "marshal": refused("import marshal", "banned_import"),
    "ctypes": refused("from ctypes import CDLL", "banned_import"),
    # --- files ----------------------------------------------------------------------------
    "read_passwd": refused("open('/etc/passwd').read()", "banned_name"),
    "write_file": refused("open('/tmp/pwned', 'w').write('x')", "banned_name"),
    "pathlib": refused("import pathlib", "banned_import"),
    "io_module": refused("import io", "banned_import"),
    # --- processes and sockets ------------------------------------------------------------
    "subprocess": refused("import subprocess", "banned_import"),
    "os_fork": refused("from os import fork", "banned_import"),
    "multiprocessing": refused("import multiprocessing", "banned_import"),
    "socket": refused("import socket", "banned_import"),
    "urllib": refused("import urllib.request", "banned_import"),
    # --- exhaustion: contained by the boundary, not refused -------------------------------
    "cpu_loop": Attempt("while True:\n    pass", "timeout", "timeout", timeout_s=1.0),
    "regex_backtracking": Attempt(
        "import re\nre.match('(a+)+$', 'a' * 40 + 'b')", "timeout", "timeout", timeout_s=1.0
    ),
    "memory_bytearray": Attempt("bytearray(10**10)", "error", "memory"),
    "memory_list": Attempt("x = [0] * 10**9", "error", "memory"),
    "memory_string": Attempt("'a' * 10**10", "error", "memory"),
    "memory_growth_loop": Attempt(
        "x = []\nwhile True:\n    x.append('a' * 10**6)",
        ("error", "timeout"),
        ("memory", "timeout"),
    ),
    "output_flood_single": Attempt("print('x' * 10**6)", "error", "output_limit"),
    "output_flood_loop": Attempt("while True:\n    print('flood')", "error", "output_limit"),
    "output_flood_caught": Attempt(
        "try:\n    print('x' * 10**6)\nexcept BaseException:\n    pass\n'ok'",
        "error",
        "output_limit",
    ),
    "huge_pow_tower": Attempt("10**10**10", ("timeout", "error"), ("timeout", "memory"), 1.0),
    "huge_pow_2_2_64": Attempt("2**2**64", ("timeout", "error"), ("timeout", "memory"), 1.0),
    "huge_result": Attempt("result = 10**20000", "error", "output_limit"),
    "huge_int_loop": Attempt(
        "x = 1\nfor i in range(10**7):\n    x *= 10**100", ("timeout", "error"), None, 1.0
    ),
    "deep_recursion": Attempt("def f(n):\n    return f(n + 1)\nf(0)", "error", "recursion"),
    "deep_parentheses": refused("(" * 300 + "1" + ")" * 300, "nesting"),
    "deep_lists": refused("[" * 150 + "]" * 150, "nesting"),
    "deep_unary": refused("-" * 5000 + "1", "nesting"),
    "long_sum_chain": refused("1" + "+1" * 5000, "nesting"),
    "source_too_large": refused("x = 1\n" * 10_000, "source_too_large"),
    "disk_fill": refused(
        "f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * 10**6)", "banned_name"
    ),
}


def _tmp_listing() -> list[str]:
    return os.listdir("/tmp")


def _matches(value: str | None, expected: str | tuple[str, ...] | None) -> bool:
    if expected is None:
        return True
    return value in expected if isinstance(expected, tuple) else value == expected


async def test_at_least_forty_attempts() -> None:
    assert len(ATTEMPTS) >= 40


@pytest.mark.parametrize("name", sorted(ATTEMPTS))
async def test_escape_attempt_is_blocked(name: str, sandbox: Sandbox, check_clean: Any) -> None:
    attempt = ATTEMPTS[name]
    outcome = await sandbox.run(attempt.code, {}, attempt.timeout_s)
    assert _matches(outcome.status, attempt.status), outcome
    assert _matches(outcome.category, attempt.category), outcome
    assert outcome.status != "ok"
    assert outcome.result is None
    text = f"{outcome.stdout} {outcome.error}"
    assert "root:x:0:0" not in text  # /etc/passwd
    assert "uid=" not in text  # output of `id`
    assert outcome.latency_ms < (attempt.timeout_s + 3.0) * 1000
    assert "pwned" not in _tmp_listing()
    await check_clean(sandbox)
