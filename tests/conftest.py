"""Shared fixtures: free ports, and the three services started the way `reason serve` does.

Every test carries its tier, one of the markers `TIERS` (defined in pyproject.toml's
`[tool.pytest.ini_options] markers`): a test without one, or marked `unit` and also
`integration` or `model`, fails the session at collection, so `-m unit` selects them all.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli.main import start_services, stop_services, wait_ready

REPO = Path(__file__).resolve().parents[1]
POSTGRES_DSN = os.environ.get("TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# Redis calls' timeout for tests that check what the cache stores, not how fast it
# answers: the service's 0.25 s default is a latency budget, and a ping on a busy 2-core
# CI machine has overrun it (a miss there is the behaviour under test elsewhere)
REDIS_TEST_TIMEOUT_S = 2.0
# Tests see the verifier's score as the served confidence (tests/data); the shipped
# calibrator artifact has tests of its own (tests/orchestrator/test_confidence.py).
os.environ.setdefault(
    "ORCH_CONFIDENCE_CALIBRATOR", str(REPO / "tests" / "data" / "passthrough-confidence.json")
)


TIERS = ("unit", "integration", "model", "security")
NOT_UNIT = ("integration", "model")
# Markers that say more about a test but are never its tier (pyproject.toml defines them).
BESIDE_A_TIER = ("slow", "browser")


def pytest_configure(config: pytest.Config) -> None:
    registered = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    missing = set(TIERS) - registered
    if missing:
        raise pytest.UsageError(f"tier markers not registered in pyproject.toml: {missing}")


@pytest.hookimpl(tryfirst=True)  # before -m/-k deselect, so every collected test is checked
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered, contradictory = [], []
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        if not marks & set(TIERS):
            untiered.append(item.nodeid)
        elif "unit" in marks and marks & set(NOT_UNIT):
            contradictory.append(item.nodeid)
    problems = [f"no tier marker ({', '.join(TIERS)}): {n}" for n in untiered]
    problems += [f"unit and {'/'.join(NOT_UNIT)} at once: {n}" for n in contradictory]
    if problems:
        raise pytest.UsageError(
            "every test carries its tier (tests/conftest.py):\n  " + "\n  ".join(problems)
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    """Planner, verifier and orchestrator as real processes on free ports."""

    log_dir: Path
    ports: dict[str, int]
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def start(self, timeout_s: float = 60.0) -> Stack:
        self.procs = start_services("127.0.0.1", self.log_dir, self.env, self.ports)
        ready = wait_ready({n: self.url(n) for n in self.ports}, timeout_s, self.procs)
        if not all(ready.values()):
            self.stop()
            raise RuntimeError(f"services not ready: {ready}")
        return self

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.terminate()
        proc.wait(timeout=10)

    def stop(self) -> None:
        stop_services(self.procs)


def make_stack(tmp: Path, **env: str) -> Stack:
    ports = {"planner": free_port(), "verifier": free_port(), "orchestrator": free_port()}
    base = {
        "ORCH_REDIS_URL": "",
        "ORCH_DATABASE_URL": "",
        "PLANNER_BACKEND": "scripted",
        "VERIFIER_BACKEND": "scripted",
        "PLANNER_SCRIPT_PATH": str(REPO / "tests" / "data" / "plans.json"),
        "PLANNER_LOG_FORMAT": "json",
        "VERIFIER_LOG_FORMAT": "json",
        "ORCH_LOG_FORMAT": "json",
    }
    return Stack(tmp, ports, {**base, **env})


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = make_stack(tmp_path_factory.mktemp("logs")).start()
    yield s
    s.stop()
