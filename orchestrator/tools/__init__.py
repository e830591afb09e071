"""Tool implementations and the registry that runs them.

`build_registry` attaches implementations, fallbacks, and the timeouts and cache TTLs
of `OrchestratorSettings`, to the shared tool specs of `services.toolspecs`, the one
place a tool's name, description and input format are written.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from orchestrator.cache import Cache
from orchestrator.tools.registry import Tool, ToolRegistry
from services import toolspecs
from services.settings import OrchestratorSettings


async def build_registry(
    settings: OrchestratorSettings, cache: Cache, stack: AsyncExitStack
) -> ToolRegistry:
    """Start the tools' resources (sandbox workers, SQL pool) and register every tool.

    Resources are closed by `stack` when the service stops.
    """
    from orchestrator.sandbox import Sandbox, SandboxSettings
    from orchestrator.tools.calc import calc
    from orchestrator.tools.lookup import lookup
    from orchestrator.tools.python import PythonTool
    from orchestrator.tools.sql.tool import SqlTool

    sandbox = Sandbox(
        SandboxSettings(
            workers=settings.sandbox_workers,
            memory_mb=settings.sandbox_memory_mb,
            network_isolation=settings.sandbox_network_isolation,
        )
    )
    await sandbox.start()
    stack.push_async_callback(sandbox.close)
    sql = SqlTool(settings.database_url, settings.sqlite_path)
    await sql.start()
    stack.push_async_callback(sql.close)

    registry = ToolRegistry(cache)
    registry.register(
        Tool(toolspecs.PYTHON, PythonTool(sandbox), timeout_s=settings.python_timeout_s)
    )
    # An arithmetic expression is also a Python program: the sandbox backs calc up.
    registry.register(
        Tool(toolspecs.CALC, calc, timeout_s=settings.calc_timeout_s, fallback="python")
    )
    registry.register(
        Tool(
            toolspecs.SQL,
            sql,
            timeout_s=settings.io_tool_timeout_s,
            cache_ttl_s=settings.sql_cache_ttl_s,
        )
    )
    registry.register(
        Tool(
            toolspecs.LOOKUP,
            lookup,
            timeout_s=settings.io_tool_timeout_s,
            cache_ttl_s=settings.lookup_cache_ttl_s,
        )
    )
    return registry
