"""Shared frame: trace context parsing, ECS log lines, settings validation, plan checks."""

from __future__ import annotations

import json

import pytest
import structlog

from services import tracing
from services.errors import PlanInvalid
from services.logging import configure_logging
from services.plans import parse_plan
from services.settings import OrchestratorSettings

pytestmark = [pytest.mark.unit]

TID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{TID}-00f067aa0ba902b7-01", (TID, "00f067aa0ba902b7")),
        (f"00-{TID.upper()}-00F067AA0BA902B7-01", (TID, "00f067aa0ba902b7")),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),
        (f"00-{TID}-{'0' * 16}-01", None),
        (f"ff-{TID}-00f067aa0ba902b7-01", None),
        (f"00-{TID}-00f067aa0ba902b7-01\r\nX: y", None),
        (f"00-{TID[:-1]}g-00f067aa0ba902b7-01", None),
        ("", None),
        (None, None),
    ],
)
def test_traceparent_parsing(header, expected) -> None:
    assert tracing.parse_traceparent(header) == expected


def test_context_from_headers_generates_and_keeps() -> None:
    ctx = tracing.context_from_headers(f"00-{TID}-00f067aa0ba902b7-01", "req-1")
    assert (ctx.trace_id, ctx.parent_span_id, ctx.request_id) == (TID, "00f067aa0ba902b7", "req-1")
    assert len(ctx.span_id) == 16 and ctx.traceparent() == f"00-{TID}-{ctx.span_id}-01"
    fresh = tracing.context_from_headers("garbage", "a\nb")
    assert len(fresh.trace_id) == 32 and fresh.request_id is None and fresh.parent_span_id is None
    assert tracing.context_from_headers(None, TID).trace_id == TID  # a 32-hex request id


def test_log_lines_are_ecs_json_with_trace_fields(tmp_path) -> None:
    configure_logging("planner", log_dir=tmp_path, fmt="json")
    token = tracing.activate(tracing.TraceContext(TID, "00f067aa0ba902b7", "1111111111111111"))
    try:
        structlog.get_logger("t").info("hello", **{"event.action": "x", "labels.tool": "calc"})
    finally:
        tracing.deactivate(token)
    line = json.loads((tmp_path / "planner.jsonl").read_text().splitlines()[-1])
    assert line["trace"]["id"] == TID and line["span"]["id"] == "00f067aa0ba902b7"
    assert line["service"]["name"] == "planner" and line["message"] == "hello"
    assert line["log.level"] == "info" and "ecs.version" in line and "@timestamp" in line
    assert line["labels"]["tool"] == "calc" and line["parent"]["id"] == "1111111111111111"


def test_placeholder_or_short_api_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="placeholder or short"):
        OrchestratorSettings(api_keys={"changeme": "t"})
    with pytest.raises(ValueError, match="placeholder or short"):
        OrchestratorSettings(api_keys='{"short": "t"}')
    ok = OrchestratorSettings(api_keys='{"k9f8s7d6f5g4h3j2k1": "t"}')
    assert ok.api_keys == {"k9f8s7d6f5g4h3j2k1": "t"}


TOOLS = ["calc", "python"]


def good(**over) -> dict:
    plan = {
        "reasoning": "r",
        "answer_step": "s2",
        "steps": [
            {"id": "s1", "tool": "calc", "input": "1+1", "depends_on": []},
            {"id": "s2", "tool": "python", "input": "s1*2", "depends_on": ["s1"]},
        ],
    }
    plan.update(over)
    return plan


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "not valid JSON"),
        (json.dumps(good(answer_step="s5")), "answer_step"),
        (
            json.dumps(
                good(
                    steps=[{"id": "s1", "tool": "shell", "input": "x", "depends_on": []}],
                    answer_step="s1",
                )
            ),
            "unknown tool",
        ),
        (
            json.dumps(
                good(
                    steps=[
                        {"id": "s1", "tool": "calc", "input": "x", "depends_on": ["s2"]},
                        {"id": "s2", "tool": "calc", "input": "x", "depends_on": ["s1"]},
                    ]
                )
            ),
            "cycle",
        ),
        (
            json.dumps(
                good(
                    steps=[{"id": "s1", "tool": "calc", "input": "x", "depends_on": ["s9"]}],
                    answer_step="s1",
                )
            ),
            "unknown step",
        ),
        (
            json.dumps(
                good(
                    steps=[
                        {"id": "s1", "tool": "calc", "input": "x", "depends_on": []},
                        {"id": "s1", "tool": "calc", "input": "y", "depends_on": []},
                    ],
                    answer_step="s1",
                )
            ),
            "duplicate",
        ),
        (json.dumps(good(extra=1)), "extra"),
        (json.dumps(good(steps=[])), "steps"),
        (json.dumps(good(reasoning=None)), "reasoning"),
    ],
)
def test_invalid_plans_are_refused_with_a_reason(text, match) -> None:
    with pytest.raises(PlanInvalid, match=match):
        parse_plan(text, TOOLS)


def test_valid_plan_parses() -> None:
    assert parse_plan(json.dumps(good()), TOOLS).answer_step == "s2"
