"""The result protocol between job child, worker and service, against forged answers.

A job that gets past the static check can write anything to its result pipe: nested past
any parser's depth, lone surrogates, NaN, duplicate keys, limits it did not hit. None of
that may take a worker out of the pool, kill a worker, or pass for an ordinary outcome.
Honest results (non-ASCII text among them) must be measured by the same rule everywhere.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from orchestrator.sandbox import Sandbox, SandboxSettings
from orchestrator.sandbox import sandbox as sandbox_module

pytestmark = [pytest.mark.security, pytest.mark.asyncio(loop_scope="module")]

SETTINGS = SandboxSettings(workers=2, memory_mb=256, cpu_s=2)


@pytest_asyncio.fixture(loop_scope="module")
async def fresh_raw_sandbox() -> AsyncIterator[Sandbox]:
    """A raw sandbox of its own: these tests break workers on purpose."""
    sb = Sandbox(SETTINGS, _ast_check=False)
    await sb.start()
    try:
        yield sb
    finally:
        await sb.close()


def _write(payload: bytes) -> str:
    """Job code that writes `payload` to the result pipe and exits."""
    return f"import os\nos.write(3, {payload!r})\nos._exit(0)"


async def _until_healthy(sb: Sandbox) -> None:
    for _ in range(250):
        if sb.healthy and not sb._tasks:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the pool did not recover: {sb.health()}")


async def test_deeply_nested_result_keeps_the_pool(
    fresh_raw_sandbox: Sandbox, check_clean: Any
) -> None:
    sb = fresh_raw_sandbox
    deep = b'{"status":"ok","result":' + b"[" * 990 + b"]" * 990 + b',"stdout":"","error":null}'
    for _ in range(sb.settings.workers):
        with capture_logs() as logs:
            outcome = await sb.run(_write(deep), {}, 5.0)
        assert (outcome.status, outcome.category) == ("error", "protocol"), outcome
        assert outcome.result is None
        assert any(e["event"] == "SECURITY_ALERT" for e in logs), logs
    answer = await sb.run("1+1", {}, 5.0)
    assert (answer.status, answer.result) == ("ok", 2), answer
    await _until_healthy(sb)
    assert sb.health()["workers"] == sb.settings.workers
    await check_clean(sb)


async def test_result_nested_within_the_bound_passes(fresh_raw_sandbox: Sandbox) -> None:
    inner = b"[" * 40 + b"1" + b"]" * 40
    outcome = await fresh_raw_sandbox.run(
        _write(b'{"status":"ok","result":' + inner + b',"stdout":"","error":null}'), {}, 5.0
    )
    assert outcome.status == "ok", outcome
    assert json.dumps(outcome.result, separators=(",", ":")) == inner.decode()


@pytest.mark.parametrize(
    "payload",
    [
        # A lone surrogate cannot be encoded as UTF-8: it used to kill the worker.
        b'{"status":"ok","result":"\\ud800","stdout":"","error":null}',
        b'{"status":"ok","result":"x","stdout":"\\udfff","error":null}',
        b'{"status":"error","result":null,"stdout":"","error":"\\ud800"}',
        # Not JSON data for any other parser (the HTTP layer serialises the answer).
        b'{"status":"ok","result":NaN,"stdout":"","error":null}',
        b'{"status":"ok","result":[1,-Infinity],"stdout":"","error":null}',
        # Duplicate keys: which one counts depends on the parser.
        b'{"status":"ok","status":"error","result":1,"stdout":"","error":null}',
        b'{"status":"ok","result":{"a":1,"a":2},"stdout":"","error":null}',
    ],
)
async def test_malformed_strings_and_values_are_protocol_violations(
    fresh_raw_sandbox: Sandbox, payload: bytes
) -> None:
    sb = fresh_raw_sandbox
    workers = {worker.proc.pid for worker in sb._workers}
    outcome = await sb.run(_write(payload), {}, 5.0)
    assert (outcome.status, outcome.category) == ("error", "protocol"), outcome
    # The worker survived and is still in the pool.
    assert {worker.proc.pid for worker in sb._workers} == workers
    assert all(worker.alive for worker in sb._workers)
    answer = await sb.run("1+1", {}, 5.0)
    assert (answer.status, answer.result) == ("ok", 2), answer


@pytest.mark.parametrize(
    "payload",
    [
        b'{"status":"ok","result":"forged","stdout":"","error":null,"category":"memory"}',
        b'{"status":"ok","result":1,"stdout":"","error":null,"category":"recursion"}',
        b'{"status":"ok","result":1,"stdout":"","error":null,"category":"output_limit"}',
    ],
)
async def test_limit_categories_only_with_an_error(
    fresh_raw_sandbox: Sandbox, payload: bytes
) -> None:
    outcome = await fresh_raw_sandbox.run(_write(payload), {}, 5.0)
    assert (outcome.status, outcome.category) == ("error", "protocol"), outcome
    assert outcome.result is None


async def test_output_limit_cannot_be_claimed_by_message(sandbox: Sandbox) -> None:
    outcome = await sandbox.run('raise OverflowError("output cap")', {}, 5.0)
    assert (outcome.status, outcome.category) == ("error", None), outcome
    assert outcome.error == "OverflowError: output cap"
    # The real cap still reports output_limit.
    outcome = await sandbox.run("result = 10 ** 40000", {}, 5.0)
    assert (outcome.status, outcome.category) == ("error", "output_limit"), outcome
    outcome = await sandbox.run("result = list(range(20000))", {}, 5.0)
    assert (outcome.status, outcome.category) == ("error", "output_limit"), outcome


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ('result = "é" * 2000', "é" * 2000),
        ('result = ["日本"] * 1000', ["日本"] * 1000),
        ('result = {"ключ": "значение" * 900}', {"ключ": "значение" * 900}),
        ('print("ü" * 9000)\nresult = 1', 1),
    ],
)
async def test_non_ascii_results_are_measured_in_characters(
    sandbox: Sandbox, code: str, expected: Any
) -> None:
    outcome = await sandbox.run(code, {}, 5.0)
    assert (outcome.status, outcome.category) == ("ok", None), outcome
    assert outcome.result == expected


async def test_non_ascii_result_over_the_cap_is_output_limit(sandbox: Sandbox) -> None:
    cap = sandbox.settings.max_output_chars
    outcome = await sandbox.run(f'result = "é" * {cap}', {}, 5.0)
    assert (outcome.status, outcome.category) == ("error", "output_limit"), outcome
    outcome = await sandbox.run(f'result = "é" * {cap - 2}', {}, 5.0)  # quotes make the cap
    assert outcome.status == "ok" and outcome.result == "é" * (cap - 2), outcome


class _Lines:
    """A stand-in for a worker's stdout that answers fixed lines."""

    def __init__(self, *lines: bytes) -> None:
        self.lines = list(lines)

    async def readline(self) -> bytes:
        return self.lines.pop(0) if self.lines else b""


class _Proc:
    returncode = None
    pid = 0

    def __init__(self, *lines: bytes) -> None:
        self.stdout = _Lines(*lines)


@pytest.mark.parametrize(
    "line",
    [
        b'{"event":"done","status":"ok","result":' + b"[" * 5000 + b"]" * 5000 + b"}\n",
        b'{"event":"done","status":"ok","result":NaN}\n',
        b"[1]\n",
        b"not json\n",
        b"\xff\xfe\n",
    ],
)
async def test_service_treats_unparseable_worker_lines_as_protocol(line: bytes) -> None:
    worker = sandbox_module._Worker(_Proc(line))  # type: ignore[arg-type]
    with pytest.raises(sandbox_module._ProtocolError):
        await worker.read_message()


async def test_any_failure_while_executing_replaces_the_worker(
    fresh_raw_sandbox: Sandbox, monkeypatch: Any
) -> None:
    sb = fresh_raw_sandbox

    async def broken(self: Any) -> dict[str, Any]:
        raise RuntimeError("anything")

    monkeypatch.setattr(sandbox_module._Worker, "read_message", broken)
    with capture_logs() as logs:
        outcome = await sb.run("1+1", {}, 5.0)
    monkeypatch.undo()
    assert any(e["event"] == "SECURITY_ALERT" for e in logs), logs
    assert (outcome.status, outcome.category) == ("error", "protocol"), outcome
    answer = await sb.run("1+1", {}, 5.0)
    assert (answer.status, answer.result) == ("ok", 2), answer
    await _until_healthy(sb)
