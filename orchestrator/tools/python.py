"""The `python` tool: model-written code run in the sandbox, earlier results as values."""

from __future__ import annotations

from typing import Any

from orchestrator.sandbox import Sandbox
from orchestrator.tools.base import ToolContext, ToolError


class PythonTool:
    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        # The sandbox enforces the step's timeout itself (and keeps its worker): the
        # registry's own timeout waits this much longer, so it only fires if that fails.
        self.timeout_grace_s = sandbox.timeout_grace_s

    def health(self) -> tuple[bool, str]:
        """Ready while every configured sandbox worker is live."""
        health = self.sandbox.health()
        detail = f"sandbox {health['workers']}/{health['configured']} workers live"
        if health["restart_failures"]:
            detail += f", {health['restart_failures']} failed restarts"
        return bool(health["healthy"]), detail

    async def __call__(self, code: str, ctx: ToolContext) -> Any:
        result = await self.sandbox.run(code, ctx.values, ctx.timeout_s)
        if result.status == "ok":
            if result.result is None and result.stdout:
                return result.stdout.strip()
            return result.result
        if result.status == "timeout":
            raise TimeoutError(result.error or "python step timed out")
        if result.status == "refused":
            # The sandbox has already logged the SECURITY_ALERT with its category.
            raise ToolError(f"refused: {result.error}")
        raise ToolError(result.error or "python step failed")
