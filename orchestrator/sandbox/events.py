"""The two log lines a tool's containment produces, in one ECS shape.

- `SECURITY_ALERT` (warning): something only hostile code does: a static-check or
  security-check refusal, a system call the sandbox forbids, a crash of the job process,
  a protocol violation or an output flood. Alerting rules key on this message.
- `tool_limit` (info): an ordinary limit that honest code also hits: a timeout, memory,
  recursion depth, the output cap, no free worker.

Both carry the same fields: `event.action` (the message again, for ECS queries),
`event.kind`, `labels.category`, `labels.tool`, `labels.status` and `error.message`.
"""

from __future__ import annotations

from typing import Any

SECURITY_ALERT = "SECURITY_ALERT"
TOOL_LIMIT = "tool_limit"
_MAX_DETAIL_CHARS = 500


def _fields(
    action: str, kind: str, category: str, tool: str, status: str, detail: str | None
) -> dict[str, Any]:
    return {
        "event.action": action,
        "event.kind": kind,
        "labels.category": category,
        "labels.tool": tool,
        "labels.status": status,
        "error.message": (detail or "")[:_MAX_DETAIL_CHARS],
    }


def security_alert(
    logger: Any, *, category: str, tool: str, status: str, detail: str | None
) -> None:
    """Log a containment event that only an attack (or a broken sandbox) causes."""
    logger.warning(
        SECURITY_ALERT, **_fields(SECURITY_ALERT, "alert", category, tool, status, detail)
    )


def limit_reached(
    logger: Any, *, category: str, tool: str, status: str, detail: str | None
) -> None:
    """Log an ordinary limit (timeout, memory, recursion, output cap, busy pool)."""
    logger.info(TOOL_LIMIT, **_fields(TOOL_LIMIT, "event", category, tool, status, detail))
