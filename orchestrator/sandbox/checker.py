"""Layer 1 of the Python sandbox: a static check of the source before it is run.

This is defence in depth only. The boundary that must hold is the worker process
(`_worker.py`): a forked child with resource limits, no network, no filesystem and no
privileges. The check exists to refuse the obvious early, with a clear category, and to
make every known in-process escape path (object-graph walks through dunders, frames of
generators, `str.format` field traversal, imports of internals) fail before a process
is involved at all.

The check is an allowlist: only listed node types may appear, only listed modules may be
imported, no identifier or attribute may start with an underscore, and a few builtins
and attribute names that reach frames, code objects, globals, attribute lookup by
string or evaluation of strings are refused. Identifiers are NFKC-normalized (the parser
already does this; it is repeated so that the check never depends on it) before they
are compared.

Two rules close paths by which allowed library code would do for the job what the job
may not write itself:

- `from X import Y` is checked like the attribute `X.Y` (and `Y` like a name): it binds
  `X.Y` without any Attribute node in the tree, and at run time the interpreter falls
  back from a missing attribute to `sys.modules["X.Y"]`, so `from collections import
  abc` would hand out the real `collections.abc` module, past the worker's module copy
  (the worker's `__import__` now refuses that too; the check does not rely on it).
- Annotations are ordinary expressions, evaluated when the `def` runs and checked like
  any other; string literals (str, bytes, f-strings) anywhere inside an annotation are
  refused. A string annotation is a forward reference: something may `eval` it later
  (`typing.get_type_hints`, which `functools.singledispatch(...).register(f)` calls,
  evaluates `def f(x: "().__class__.__base__.__subclasses__()")` with dunder access).
  Refusing literals is not enough on its own (`s = "..."; def f(x: s)` stores a string
  too), so the evaluator itself is refused: `singledispatch`, `singledispatchmethod`
  and `register` (see `REFLECTIVE_FUNCTIONS`). Nothing else the job can reach evaluates
  annotations: `typing`, `inspect` and `dataclasses` cannot be imported.
"""

from __future__ import annotations

import ast
import string
import unicodedata
from dataclasses import dataclass

# Modules the code may import. Each is pre-imported in the worker; nothing else can be
# loaded there (the child has no filesystem).
ALLOWED_MODULES: frozenset[str] = frozenset(
    {
        "math",
        "cmath",
        "fractions",
        "decimal",
        "statistics",
        "itertools",
        "functools",
        "re",
        "datetime",
        "collections",
        "heapq",
        "bisect",
        "operator",
    }
)

# Builtins that reach code execution, frames, globals, attribute lookup by string,
# object internals or I/O. They are refused as names anywhere in the code, and they
# are also absent from the builtins the worker gives the code.
BANNED_NAMES: frozenset[str] = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "open",
        "input",
        "breakpoint",
        "globals",
        "locals",
        "vars",
        "dir",
        "getattr",
        "setattr",
        "delattr",
        "hasattr",
        "help",
        "memoryview",
        "type",
        "object",
        "super",
        "classmethod",
        "staticmethod",
        "property",
        "exit",
        "quit",
        "copyright",
        "credits",
        "license",
    }
)

# Functions of allowed modules that read or write attributes named by a string
# (getattr/setattr in disguise) or evaluate strings. Refused as names, as attributes
# (`functools.singledispatch`, also under an alias of the module) and as from-imports,
# and left out of the module copies that the worker hands to the code (the service
# passes BANNED_ATTRIBUTES, which includes this set, to the worker as the names to hide).
#
# - `attrgetter`, `methodcaller`: `getattr` by string.
# - `update_wrapper`, `wraps`: `getattr`/`setattr` of the attribute names given in
#   `assigned`/`updated` (`assigned=("__globals__",)` copies a function's globals).
# - `singledispatch`, `singledispatchmethod`: `register(f)` reads the dispatch type from
#   `f`'s annotations through `typing.get_type_hints`, which `eval`s string annotations
#   in `f`'s globals, dunders and all. A string can get into an annotation without a
#   string literal (`s = "..."; def f(x: s)`), so the evaluator goes, not just the
#   literal. (Where the job's child cannot read files, the `from typing import ...`
#   inside `register` happens to fail, because the worker does not preload `typing`;
#   where it can, for instance without chroot and Landlock, the escape works.)
REFLECTIVE_FUNCTIONS: frozenset[str] = frozenset(
    {
        "attrgetter",
        "methodcaller",
        "update_wrapper",
        "wraps",
        "singledispatch",
        "singledispatchmethod",
    }
)

BANNED_NAMES = BANNED_NAMES | REFLECTIVE_FUNCTIONS

# Attribute names refused everywhere (in addition to anything starting with "_").
BANNED_ATTRIBUTES: frozenset[str] = REFLECTIVE_FUNCTIONS | frozenset(
    {
        "format_map",
        "mro",
        # The method of a singledispatch function that evaluates annotations (see
        # REFLECTIVE_FUNCTIONS); refused too in case a dispatcher is ever reachable in
        # another way (a library function decorated with @singledispatch).
        "register",
        # A PyCapsule holding the C API's function pointers: of no use to arithmetic.
        "datetime_CAPI",
        # The value of a closure cell (reached from `__closure__`): another function's
        # variables.
        "cell_contents",
        "with_traceback",
        "func_globals",
        "func_code",
        "f_back",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_code",
        "gi_frame",
        "gi_code",
        "tb_frame",
        "tb_next",
    }
)


# The modules that define REFLECTIVE_FUNCTIONS (for finding other names for them).
REFLECTIVE_SOURCES: tuple[str, ...] = ("functools", "operator")


def _module_attribute_names() -> frozenset[str]:
    """Attribute names of allowed modules that lead somewhere the code may not go.

    - Other modules (`fractions.sys`, `statistics.random`, `re.enum` ...): they lead to
      `sys.modules` and so to everything.
    - Submodules of allowed packages (`collections.abc`), whether or not they are set
      as attributes: `from collections import abc` falls back to
      `sys.modules["collections.abc"]` when the attribute is missing.
    - Other names for a refused builtin or reflective function (`X.wraps = wraps`), so
      that `from X import alias` or `X.alias` cannot reach what the name is refused for.

    They are refused as attribute names and as from-imports. Found by walking the
    allowed modules once, plus a fixed list so that the check does not depend on the
    walk.
    """
    import builtins
    import importlib
    import pkgutil
    import types

    names = {"sys", "os", "builtins", "importlib", "random", "types", "gc", "inspect", "abc"}
    modules = {name: importlib.import_module(name) for name in ALLOWED_MODULES}
    refused = [getattr(builtins, name) for name in BANNED_NAMES if hasattr(builtins, name)]
    for module_name in REFLECTIVE_SOURCES:
        for attr in sorted(REFLECTIVE_FUNCTIONS & set(dir(modules[module_name]))):
            refused.append(getattr(modules[module_name], attr))
    for module in modules.values():
        for attr in dir(module):
            if not attr.startswith("_"):
                value = getattr(module, attr, None)
                if isinstance(value, types.ModuleType) and attr not in ALLOWED_MODULES:
                    names.add(attr)
                elif any(value is target for target in refused):
                    names.add(attr)
        for submodule in pkgutil.iter_modules(getattr(module, "__path__", None) or []):
            names.add(submodule.name)
    return frozenset(names)


BANNED_ATTRIBUTES = BANNED_ATTRIBUTES | _module_attribute_names()

# Prefixes of the attributes of frames, code objects, generators, coroutines and
# tracebacks (gi_frame, f_back, co_code, tb_frame, cr_frame, ag_frame ...).
BANNED_ATTRIBUTE_PREFIXES: tuple[str, ...] = ("_", "f_", "co_", "gi_", "cr_", "ag_", "tb_")

_ALLOWED_NODES: tuple[type[ast.AST], ...] = (
    # module and statements
    ast.Module,
    ast.Expr,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.For,
    ast.While,
    ast.If,
    ast.Break,
    ast.Continue,
    ast.Pass,
    ast.FunctionDef,
    ast.Return,
    ast.Delete,
    ast.Import,
    ast.ImportFrom,
    ast.alias,
    ast.Try,
    ast.ExceptHandler,
    ast.Raise,
    ast.Assert,
    ast.With,
    ast.withitem,
    ast.Global,
    ast.Nonlocal,
    # expressions
    ast.BoolOp,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.IfExp,
    ast.Call,
    ast.keyword,
    ast.Lambda,
    ast.arguments,
    ast.arg,
    ast.NamedExpr,
    ast.Name,
    ast.Constant,
    ast.Attribute,
    ast.Subscript,
    ast.Slice,
    ast.Starred,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
    ast.comprehension,
    ast.JoinedStr,
    ast.FormattedValue,
    # contexts and operators
    ast.Load,
    ast.Store,
    ast.Del,
    ast.And,
    ast.Or,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.MatMult,
    ast.Div,
    ast.Mod,
    ast.Pow,
    ast.LShift,
    ast.RShift,
    ast.BitOr,
    ast.BitXor,
    ast.BitAnd,
    ast.FloorDiv,
    ast.Invert,
    ast.Not,
    ast.UAdd,
    ast.USub,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.Is,
    ast.IsNot,
    ast.In,
    ast.NotIn,
)

# Deepest AST nesting accepted. Ordinary programs stay under 30; the parser itself
# refuses much deeper input with RecursionError/MemoryError, which is also refused.
MAX_AST_DEPTH = 100
MAX_AST_NODES = 20_000


@dataclass(frozen=True)
class Refusal:
    """Why the code was refused: a category for metrics and alerts, and a message."""

    category: str
    detail: str
    line: int | None = None

    @property
    def message(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"{self.detail}{where}"


class SourceSyntaxError(Exception):
    """The source does not parse; this is the model's mistake, not an attack."""


def _norm(identifier: str) -> str:
    return unicodedata.normalize("NFKC", identifier)


def _check_identifier(name: str, node: ast.AST, *, kind: str) -> Refusal | None:
    name = _norm(name)
    line = getattr(node, "lineno", None)
    if name.startswith("__"):
        return Refusal("dunder_access", f"{kind} {name!r} is not allowed", line)
    if name.startswith("_") and name != "_":
        return Refusal("private_access", f"{kind} {name!r} is not allowed", line)
    if name in BANNED_NAMES:
        return Refusal("banned_name", f"{kind} {name!r} is not allowed", line)
    return None


def _check_attribute(attr: str, node: ast.AST) -> Refusal | None:
    attr = _norm(attr)
    line = getattr(node, "lineno", None)
    if attr.startswith("__"):
        return Refusal("dunder_access", f"attribute {attr!r} is not allowed", line)
    if attr in BANNED_ATTRIBUTES or attr.startswith(BANNED_ATTRIBUTE_PREFIXES):
        category = "private_access" if attr.startswith("_") else "banned_attribute"
        return Refusal(category, f"attribute {attr!r} is not allowed", line)
    return None


def _check_imported_name(name: str, node: ast.AST) -> Refusal | None:
    """`from X import Y` is held to the rules of the attribute `X.Y`.

    `format` is refused outright: `X.format` is allowed only as the callee of a call on
    a string literal, which a from-import never is.
    """
    if _norm(name) == "format":
        return Refusal(
            "format_string",
            "str.format is allowed only as a direct call on a string literal",
            getattr(node, "lineno", None),
        )
    return _check_attribute(name, node)


def _check_annotation(annotation: ast.expr | None) -> Refusal | None:
    """Refuse string literals anywhere in an annotation (they are forward references).

    The annotation is otherwise checked by the main walk like any expression.
    """
    if annotation is None:
        return None
    for node in ast.walk(annotation):
        literal = isinstance(node, ast.JoinedStr) or (
            isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)
        )
        if literal:
            return Refusal(
                "banned_syntax",
                "string annotations are not allowed (a forward reference may be evaluated)",
                getattr(node, "lineno", None),
            )
    return None


def _format_fields_are_plain(fmt: str) -> bool:
    """True when every replacement field of a format string is a bare name or index.

    `"{0.__class__}"`, `"{x[key]}"` and fields nested in format specs that do so
    traverse attributes or items of the arguments; they are refused.
    """
    try:
        parsed = list(string.Formatter().parse(fmt))
    except (ValueError, IndexError):
        return False
    for _literal, field_name, spec, _conversion in parsed:
        if field_name is not None and ("." in field_name or "[" in field_name):
            return False
        if spec and "{" in spec and not _format_fields_are_plain(spec):
            return False
    return True


def _check_module(name: str, node: ast.AST) -> Refusal | None:
    name = _norm(name)
    if name not in ALLOWED_MODULES:
        return Refusal(
            "banned_import", f"import of {name!r} is not allowed", getattr(node, "lineno", None)
        )
    return None


def check_source(code: str, *, max_source_chars: int) -> Refusal | None:
    """Return a `Refusal` when the code must not run, None when it passes the check.

    Raises `SourceSyntaxError` when the code does not parse.
    """
    if len(code) > max_source_chars:
        return Refusal("source_too_large", f"source exceeds {max_source_chars} characters")
    if "\x00" in code:
        return Refusal("syntax", "source contains a NUL character")
    try:
        tree = ast.parse(code, mode="exec")
    except SyntaxError as exc:
        if "too many nested" in str(exc.msg):
            return Refusal("nesting", f"source is nested too deeply: {exc.msg}", exc.lineno)
        raise SourceSyntaxError(f"SyntaxError: {exc.msg} (line {exc.lineno})") from exc
    except (RecursionError, MemoryError):
        return Refusal("nesting", "source is nested too deeply to parse")

    # Attribute nodes that are the callee of an allowed `"literal".format(...)` call.
    allowed_format_attrs: set[int] = set()
    # Iterative walk: the tree of hostile code can be deeper than Python's recursion limit.
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > MAX_AST_DEPTH or seen > MAX_AST_NODES:
            return Refusal("nesting", "source is nested too deeply or is too large")
        line = getattr(node, "lineno", None)
        if not isinstance(node, _ALLOWED_NODES):
            return Refusal(
                "banned_syntax", f"{type(node).__name__} is not allowed in sandboxed code", line
            )
        refusal: Refusal | None = None
        if isinstance(node, ast.Name):
            refusal = _check_identifier(node.id, node, kind="name")
        elif isinstance(node, ast.Attribute):
            attr = _norm(node.attr)
            if attr == "format":
                if id(node) not in allowed_format_attrs:
                    refusal = Refusal(
                        "format_string",
                        "str.format is allowed only as a direct call on a string literal",
                        line,
                    )
            else:
                refusal = _check_attribute(node.attr, node)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and _norm(func.attr) == "format":
                if (
                    isinstance(func.value, ast.Constant)
                    and isinstance(func.value.value, str)
                    and _format_fields_are_plain(func.value.value)
                ):
                    allowed_format_attrs.add(id(func))
                else:
                    refusal = Refusal(
                        "format_string",
                        "format strings may not traverse attributes or items",
                        line,
                    )
        elif isinstance(node, ast.FunctionDef):
            refusal = _check_identifier(node.name, node, kind="function")
            refusal = refusal or _check_annotation(node.returns)
        elif isinstance(node, ast.arg):
            refusal = _check_identifier(node.arg, node, kind="argument")
            refusal = refusal or _check_annotation(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            refusal = _check_annotation(node.annotation)
        elif isinstance(node, ast.keyword):
            if node.arg is not None:
                refusal = _check_identifier(node.arg, node, kind="keyword")
        elif isinstance(node, ast.ExceptHandler):
            if node.name is not None:
                refusal = _check_identifier(node.name, node, kind="name")
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for name in node.names:
                refusal = refusal or _check_identifier(name, node, kind="name")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                refusal = refusal or _check_module(alias.name, node)
                if alias.asname:
                    refusal = refusal or _check_identifier(alias.asname, node, kind="name")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                refusal = Refusal("banned_import", "relative imports are not allowed", line)
            else:
                refusal = _check_module(node.module or "", node)
            for alias in node.names:
                if alias.name == "*":
                    refusal = refusal or Refusal(
                        "banned_import", "star imports are not allowed", line
                    )
                refusal = refusal or _check_identifier(alias.name, node, kind="imported name")
                refusal = refusal or _check_imported_name(alias.name, node)
                if alias.asname:
                    refusal = refusal or _check_identifier(alias.asname, node, kind="name")
        if refusal is not None:
            return refusal
        # Reversed, so that the walk meets statements in source order.
        stack.extend((child, depth + 1) for child in reversed(list(ast.iter_child_nodes(node))))
    return None
