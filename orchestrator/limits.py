"""Bounds on the work one request and one tenant can ask of the orchestrator.

- `ToolBudget`: tool calls one `/reason` request may make over all its plans and
  replanning rounds (`ORCH_MAX_TOOL_CALLS_PER_REQUEST`); the steps past it are skipped.
- `TenantCounter`: requests a tenant may have in flight; past its share the request is
  refused (429 with Retry-After).
- `TenantSemaphore`: sandbox jobs a tenant may run at once; past its share its next job
  waits for one of the tenant's own slots, so no tenant occupies every sandbox worker
  and no tenant waits on another's slow jobs.

Tenants are the API keys' tenants; with no keys configured each client address is its
own tenant for these limits (see `orchestrator.app`).
"""

from __future__ import annotations

import asyncio

from services import toolspecs

# Tools whose every call is a sandbox job.
SANDBOX_TOOLS = frozenset({toolspecs.PYTHON.name})


class ToolBudget:
    def __init__(self, calls: int) -> None:
        self.limit = calls
        self.left = calls

    def take(self, calls: int = 1) -> bool:
        """Take `calls` calls at once, or none when fewer are left."""
        if calls > self.left:
            return False
        self.left -= calls
        return True

    @property
    def spent(self) -> bool:
        return self.left <= 0


class TenantCounter:
    """At most `per_tenant` at once per tenant; `try_enter` refuses past it."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._held: dict[str, int] = {}

    def try_enter(self, tenant: str) -> bool:
        held = self._held.get(tenant, 0)
        if held >= self.per_tenant:
            return False
        self._held[tenant] = held + 1
        return True

    def leave(self, tenant: str) -> None:
        held = self._held.get(tenant, 0) - 1
        if held > 0:
            self._held[tenant] = held
        else:
            self._held.pop(tenant, None)


class TenantSemaphore:
    """At most `per_tenant` at once per tenant; `acquire` waits for one of its own slots."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._sems: dict[str, tuple[asyncio.Semaphore, int]] = {}  # tenant -> (slots, users)

    async def acquire(self, tenant: str) -> None:
        sem, users = self._sems.get(tenant) or (asyncio.Semaphore(self.per_tenant), 0)
        self._sems[tenant] = (sem, users + 1)
        try:
            await sem.acquire()
        except BaseException:  # cancelled or timed out while waiting
            self._forget(tenant)
            raise

    def release(self, tenant: str) -> None:
        self._sems[tenant][0].release()
        self._forget(tenant)

    def _forget(self, tenant: str) -> None:
        sem, users = self._sems[tenant]
        if users > 1:
            self._sems[tenant] = (sem, users - 1)
        else:
            del self._sems[tenant]  # nobody holds or waits: forget the tenant
