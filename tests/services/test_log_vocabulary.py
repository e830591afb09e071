"""Every log line the services write speaks ECS: its fields are dotted ECS names
(`event.action`, `labels.*`, `error.*`, `gen_ai.*`, ...), never plain snake_case keys, and
its message is a sentence rather than an identifier. Checked on the source, so a new log
call that slips back to plain keys fails here before it reaches Elasticsearch."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "planner", "verifier", "services", "cli", "evals", "training")
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
ALLOWED_PLAIN = {"exc_info", "stack_info", "stacklevel"}
# Messages that are alerting keys by contract (orchestrator/sandbox/events.py).
KEYED_MESSAGES = {"SECURITY_ALERT", "tool_limit"}


def log_calls() -> list[tuple[str, ast.Call]]:
    calls = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LEVELS
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in ("log", "logger")
                ):
                    calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return calls


def problems(call: ast.Call) -> list[str]:
    found = []
    for keyword in call.keywords:
        if keyword.arg is not None:
            if keyword.arg not in ALLOWED_PLAIN:
                found.append(f"plain key {keyword.arg}=")
        elif isinstance(keyword.value, ast.Dict):
            for key in keyword.value.keys:
                if isinstance(key, ast.Constant) and "." not in str(key.value):
                    found.append(f"undotted key {key.value!r}")
    if call.args and isinstance(call.args[0], ast.Constant):
        message = call.args[0].value
        if isinstance(message, str) and message not in KEYED_MESSAGES:
            if re.fullmatch(r"[a-z0-9_]+", message):
                found.append(f"identifier message {message!r}")
    return found


def test_the_scan_sees_the_services_log_calls() -> None:
    where = {place.split(":")[0] for place, _ in log_calls()}
    assert len(where) >= 15
    assert "orchestrator/sandbox/sandbox.py" in where
    assert "planner/backends/llamacpp.py" in where


def test_every_log_call_uses_ecs_fields() -> None:
    bad = {place: found for place, call in log_calls() if (found := problems(call))}
    assert bad == {}


def test_the_check_catches_plain_keys() -> None:
    call = ast.parse('log.info("sandbox_started", workers=2, **{"tool": "x"})').body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    assert problems(call.value) == [
        "plain key workers=",
        "undotted key 'tool'",
        "identifier message 'sandbox_started'",
    ]
