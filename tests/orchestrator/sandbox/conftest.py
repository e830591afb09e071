"""Fixtures for the sandbox tests: module-scoped sandboxes and a leak check."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from orchestrator.sandbox import Sandbox, SandboxSettings

TEST_SETTINGS = SandboxSettings(workers=2, memory_mb=256, cpu_s=2, max_output_chars=10_000)


def process_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (ppid, state, real uid) of every process, read from /proc."""
    table: dict[int, tuple[int, str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may contain spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        uid = int(status.split("\nUid:")[1].split()[0])
        table[int(entry)] = (int(fields[1]), fields[0], uid)
    return table


def proc_state(pid: int) -> str:
    """The state letter of a process (R, S, Z, ...), or "gone"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2]


def descendants(root_pid: int) -> set[int]:
    """Every process below `root_pid` (zombies included: they still hold their pid)."""
    table = process_table()
    found: set[int] = set()
    frontier = {root_pid}
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in table.items() if ppid in frontier} - found
        found |= frontier
    return found


def host_uid_of_jobs() -> int:
    """The uid job processes have on the host: 65534 for a root service, else its own."""
    return 65534 if os.geteuid() == 0 else os.geteuid()


async def assert_clean(sandbox: Sandbox) -> None:
    """The sandbox still answers, and no process was left behind.

    Each worker has exactly one child, its zygote (pid 1 of the worker's pid namespace),
    and each zygote exactly one child: the spare for the next job, forked and confined
    ahead of it and blocked reading it. Anything beyond that (a second child, a
    grandchild, a job still running after its answer) is a leak.
    """
    answer = await sandbox.run("1+1", {}, 10.0)
    assert answer.status == "ok", answer
    assert answer.result == 2
    workers = {worker.proc.pid for worker in sandbox._workers}
    assert len(workers) == sandbox.settings.workers
    for _ in range(100):  # the next spare is forked while the job runs
        table = process_table()
        zygotes = {pid for pid, (ppid, _, _) in table.items() if ppid in workers}
        spares = {pid for pid, (ppid, _, _) in table.items() if ppid in zygotes}
        settled = all(table[pid][1] == "S" for pid in spares)
        if not sandbox._tasks and len(spares) == len(workers) and settled:
            break
        await asyncio.sleep(0.02)
    assert descendants(os.getpid()) == workers | zygotes | spares, "a process was left behind"
    assert sorted(table[pid][0] for pid in zygotes) == sorted(workers), "one zygote per worker"
    assert sorted(table[pid][0] for pid in spares) == sorted(zygotes), "one spare per zygote"
    for pid in spares:
        _, state, uid = table[pid]
        assert state == "S", f"spare {pid} is {state}, not blocked on its job pipe"
        assert uid == host_uid_of_jobs()


@pytest.fixture
def job_uid() -> int:
    return host_uid_of_jobs()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox() -> AsyncIterator[Sandbox]:
    """The sandbox as the service runs it: static check on, restricted builtins."""
    sb = Sandbox(TEST_SETTINGS)
    await sb.start()
    try:
        yield sb
    finally:
        await sb.close()
    assert descendants(os.getpid()) == set()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def raw_sandbox() -> AsyncIterator[Sandbox]:
    """Static check and restricted builtins OFF, dangerous modules pre-imported.

    Whatever these tests stop is stopped by the process boundary alone.
    """
    sb = Sandbox(
        TEST_SETTINGS,
        _ast_check=False,
        _preload=("socket", "ctypes", "subprocess", "pickle", "marshal", "threading"),
    )
    await sb.start()
    try:
        yield sb
    finally:
        await sb.close()
    assert descendants(os.getpid()) == set()


@pytest.fixture
def process_tree() -> object:
    """`process_tree(pid)`: every process below `pid` (see `descendants`)."""
    return descendants


@pytest.fixture
def state_of() -> object:
    """`state_of(pid)`: the state letter of a process, or "gone" (see `proc_state`)."""
    return proc_state


@pytest.fixture
def check_clean() -> object:
    """`await check_clean(sandbox)` after each attempt (see `assert_clean`)."""
    return assert_clean
