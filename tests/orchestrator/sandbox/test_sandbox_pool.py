"""The worker pool: no job outlives its call or its worker, and the pool heals itself.

A job is killed at its timeout while its worker stays; a worker that dies takes every
process of its pid namespace with it; a worker that cannot be replaced is retried with
backoff, and until it is, `Sandbox.healthy` and the orchestrator's /readyz say so.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from orchestrator.app import create_app
from orchestrator.sandbox import Sandbox, SandboxSettings, SandboxUnavailableError
from orchestrator.sandbox import sandbox as sandbox_module
from orchestrator.tools.python import PythonTool
from orchestrator.tools.registry import Tool, ToolRegistry
from services.settings import OrchestratorSettings
from services.toolspecs import PYTHON
from tests.orchestrator.helpers import FakePlanner, ServerThread

on_module_loop = pytest.mark.asyncio(loop_scope="module")

# A job that tries to get away: no parent-death signal, and into its parent's process
# group (a kill of its own group then misses it), then it spins.
ESCAPING_JOB = """
import ctypes, os
libc = ctypes.CDLL(None)
libc.prctl(1, 0, 0, 0, 0)
libc.setpgid(0, os.getppid())
while True:
    pass
"""


async def _eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


@pytest.fixture
def spinning(process_tree: Any, state_of: Any) -> Callable[[int], set[int]]:
    """`spinning(worker_pid)`: the processes below the worker that are running."""
    return lambda worker_pid: {pid for pid in process_tree(worker_pid) if state_of(pid) == "R"}


@pytest_asyncio.fixture(loop_scope="module")
async def escapable() -> AsyncIterator[Sandbox]:
    """One worker, raw mode with ctypes: jobs can try every trick to get away."""
    sb = Sandbox(SandboxSettings(workers=1, cpu_s=10), _ast_check=False, _preload=("ctypes",))
    await sb.start()
    try:
        yield sb
    finally:
        await sb.close()


@pytest.mark.security
@on_module_loop
async def test_a_timed_out_job_is_gone_and_its_worker_kept(
    escapable: Sandbox, process_tree: Any, spinning: Any
) -> None:
    (worker,) = escapable._workers
    before = process_tree(worker.proc.pid)
    outcome = await escapable.run(ESCAPING_JOB, {}, 0.5)
    assert (outcome.status, outcome.category) == ("timeout", "timeout"), outcome
    assert outcome.latency_ms < 1500, outcome
    # The worker answered only once the job had exited: nothing of it is left.
    assert spinning(worker.proc.pid) == set()
    assert escapable._workers == {worker} and not escapable._tasks and escapable.healthy
    assert len(process_tree(worker.proc.pid) - before) == 1  # the next job's spare


@pytest.mark.security
@on_module_loop
async def test_a_dead_worker_takes_its_running_job_with_it(
    escapable: Sandbox, process_tree: Any, state_of: Any, spinning: Any
) -> None:
    (worker,) = escapable._workers
    job = asyncio.create_task(escapable.run(ESCAPING_JOB, {}, 30.0))
    await _eventually(lambda: bool(spinning(worker.proc.pid)))
    await asyncio.sleep(0.1)  # well into its loop, past every escape attempt
    running = spinning(worker.proc.pid)
    tree = process_tree(worker.proc.pid)
    os.kill(worker.proc.pid, signal.SIGKILL)
    outcome = await asyncio.wait_for(job, 10.0)
    assert (outcome.status, outcome.category) == ("error", "crash"), outcome
    # Its zygote was the init of the pid namespace: the kernel killed all of it.
    await _eventually(lambda: all(state_of(pid) in ("gone", "Z") for pid in tree), 10.0)
    assert {pid: state_of(pid) for pid in running} == dict.fromkeys(running, "gone")
    await _eventually(lambda: escapable.healthy)  # and the pool replaced the worker
    assert (await escapable.run("1 + 1", {}, 5.0)).result == 2


@pytest.mark.integration
@on_module_loop
async def test_a_failing_replacement_is_retried_with_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sandbox_module, "_RESPAWN_FIRST_S", 0.01)
    sb = Sandbox(SandboxSettings(workers=2))
    await sb.start()
    try:
        assert sb.health() == {
            "healthy": True,
            "workers": 2,
            "configured": 2,
            "restart_failures": 0,
        }
        real_spawn, allowed = sb._spawn, asyncio.Event()

        async def spawn() -> Any:
            if not allowed.is_set():
                raise SandboxUnavailableError("cannot create the sandbox's namespaces")
            return await real_spawn()

        monkeypatch.setattr(sb, "_spawn", spawn)
        victim = next(iter(sb._workers))
        with capture_logs() as logs:
            os.kill(victim.proc.pid, signal.SIGKILL)  # noticed without any job asking
            await _eventually(lambda: sb.health()["restart_failures"] >= 3)
            assert not sb.healthy and sb.live_workers == 1
            # The pool still serves with what it has.
            assert (await sb.run("2 + 2", {}, 5.0)).result == 4
            allowed.set()
            await _eventually(lambda: sb.healthy)
        assert sb.health() == {
            "healthy": True,
            "workers": 2,
            "configured": 2,
            "restart_failures": 0,
        }
        failed = [e for e in logs if e.get("event.action") == "sandbox.worker.restart"]
        delays = [entry["labels.retry_in_s"] for entry in failed]
        assert len(delays) >= 3 and delays[:3] == [0.01, 0.02, 0.04], delays
        assert all(e["labels.workers"] == 1 and e["labels.configured"] == 2 for e in failed)
        assert all(e["event.outcome"] == "failure" and e["error.message"] for e in failed)
        outcomes = await asyncio.gather(*(sb.run(f"{i} * 2", {}, 5.0) for i in range(4)))
        assert [o.result for o in outcomes] == [0, 2, 4, 6]
    finally:
        await sb.close()


@pytest.mark.integration
def test_readyz_reports_a_short_sandbox_pool(tmp_path: Path) -> None:
    made: dict[str, Sandbox] = {}

    async def tools(settings: OrchestratorSettings, cache: Any, stack: Any) -> ToolRegistry:
        sandbox = Sandbox(SandboxSettings(workers=1))
        await sandbox.start()
        stack.push_async_callback(sandbox.close)
        made["sandbox"] = sandbox
        registry = ToolRegistry(cache)
        registry.register(Tool(PYTHON, PythonTool(sandbox), timeout_s=2.0))
        return registry

    def readyz(url: str) -> tuple[int, str]:
        r = httpx.get(f"{url}/readyz", timeout=5.0)
        return r.status_code, r.json()["reason"]

    def wait_for(url: str, status: int) -> str:
        deadline = time.monotonic() + 10.0
        while (answer := readyz(url))[0] != status:
            assert time.monotonic() < deadline, answer
            time.sleep(0.02)
        return answer[1]

    with ServerThread(FakePlanner().app()) as planner:
        config = OrchestratorSettings(
            planner_url=planner.url, verifier_url=planner.url, log_dir=tmp_path, log_format="json"
        )
        with ServerThread(create_app(config, tools_factory=tools)) as orchestrator:
            assert "python: sandbox 1/1 workers live" in wait_for(orchestrator.url, 200)
            sandbox = made["sandbox"]
            real_spawn = sandbox._spawn

            async def broken_spawn() -> Any:
                raise SandboxUnavailableError("cannot create the sandbox's namespaces")

            sandbox._spawn = broken_spawn  # type: ignore[method-assign]
            (worker,) = sandbox._workers
            os.kill(worker.proc.pid, signal.SIGKILL)
            reason = wait_for(orchestrator.url, 503)
            assert "planner ready" in reason and "python: sandbox 0/1 workers live" in reason
            sandbox._spawn = real_spawn  # type: ignore[method-assign]
            assert "python: sandbox 1/1 workers live" in wait_for(orchestrator.url, 200)


@pytest.mark.security
@on_module_loop
async def test_a_cancelled_run_stops_its_job_and_keeps_the_worker(
    escapable: Sandbox, spinning: Any
) -> None:
    """A caller giving up (a client gone, a request timeout) stops the job, not the pool."""
    (worker,) = escapable._workers
    for delay in (0.0, 0.2):  # before the worker took the job, and while it runs
        run = asyncio.create_task(escapable.run(ESCAPING_JOB, {}, 30.0))
        await asyncio.sleep(delay)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await _eventually(lambda: not escapable._tasks)
        assert spinning(worker.proc.pid) == set()
        assert escapable._workers == {worker} and escapable.healthy
        assert (await escapable.run("6 * 7", {}, 5.0)).result == 42
