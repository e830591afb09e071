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


def descendants(root_pid: int) -> set[int]:
    """Every live process below `root_pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may contain spaces and parentheses.
        # A zombie still holds its pid, so it counts as left behind too.
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    stack = [root_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def leftover_files(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


async def assert_clean(sandbox: Sandbox, tmp_root: Path) -> None:
    """The sandbox still answers, and no job directory or process was left behind."""
    answer = await sandbox.run("1+1", {}, 10.0)
    assert answer.status == "ok", answer
    assert answer.result == 2
    for _ in range(100):  # a replaced worker may still be starting
        if not sandbox._spawning:
            break
        await asyncio.sleep(0.05)
    assert leftover_files(tmp_root) == [], "a job directory was left behind"
    workers = {worker.proc.pid for worker in sandbox._workers}
    assert len(workers) == sandbox.settings.workers
    assert descendants(os.getpid()) == workers, "a process was left behind"


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
