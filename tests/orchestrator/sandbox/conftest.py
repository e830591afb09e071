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


def descendants(root_pid: int) -> set[int]:
    """Every process below `root_pid` (zombies included: they still hold their pid)."""
    table = process_table()
    found: set[int] = set()
    frontier = {root_pid}
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in table.items() if ppid in frontier} - found
        found |= frontier
    return found


def leftover_files(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


async def assert_clean(sandbox: Sandbox, tmp_root: Path) -> None:
    """The sandbox still answers, and no job directory or process was left behind.

    Each worker keeps exactly one spare child, forked and confined ahead of its job and
    blocked reading it, with its own empty job directory. Anything beyond that (a second
    child of a worker, a grandchild, an extra directory, a non-empty one) is a leak.
    """
    answer = await sandbox.run("1+1", {}, 10.0)
    assert answer.status == "ok", answer
    assert answer.result == 2
    workers = {worker.proc.pid for worker in sandbox._workers}
    assert len(workers) == sandbox.settings.workers
    for _ in range(100):  # the spares are forked right after each job's answer
        table = process_table()
        spares = {pid for pid, (ppid, _, _) in table.items() if ppid in workers}
        settled = all(table[pid][1] == "S" for pid in spares)
        if not sandbox._spawning and len(spares) == len(workers) and settled:
            break
        await asyncio.sleep(0.02)
    assert descendants(os.getpid()) == workers | spares, "a process was left behind"
    assert sorted(table[pid][0] for pid in spares) == sorted(workers), "one spare per worker"
    for pid in spares:
        _, state, uid = table[pid]
        assert state == "S", f"spare {pid} is {state}, not blocked on its job pipe"
        if os.geteuid() == 0:
            assert uid == 65534
    entries = leftover_files(tmp_root)
    assert len(entries) == len(workers), f"job directories left behind: {entries}"
    for entry in entries:
        assert leftover_files(tmp_root / entry) == [], f"files left in {entry}"


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandbox-jobs")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox(tmp_root: Path) -> AsyncIterator[Sandbox]:
    """The sandbox as the service runs it: static check on, restricted builtins."""
    sb = Sandbox(TEST_SETTINGS, _tmp_root=str(tmp_root))
    await sb.start()
    try:
        yield sb
    finally:
        await sb.close()
    assert descendants(os.getpid()) == set()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def raw_sandbox(tmp_root: Path) -> AsyncIterator[Sandbox]:
    """Static check and restricted builtins OFF, dangerous modules pre-imported.

    Whatever these tests stop is stopped by the process boundary alone.
    """
    sb = Sandbox(
        TEST_SETTINGS,
        _ast_check=False,
        _preload=("socket", "ctypes", "subprocess", "pickle", "marshal", "threading"),
        _tmp_root=str(tmp_root),
    )
    await sb.start()
    try:
        yield sb
    finally:
        await sb.close()
    assert descendants(os.getpid()) == set()


@pytest.fixture
def check_clean() -> object:
    """`await check_clean(sandbox, tmp_root)` after each attempt (see `assert_clean`)."""
    return assert_clean
