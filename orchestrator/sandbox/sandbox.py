"""The Python sandbox the `python` tool runs model-written code in.

Layer 1 (`checker.py`) refuses code that uses anything outside a small allowlist. Layer 2
is the boundary: `_worker.py` processes, started clean (`python -I -S`, empty
environment, own session) and kept in a pool; each job runs in a child forked from a
worker and confined there (see `_worker.py` and README.md in this package). This module
is the service side: it checks the code, hands jobs to idle workers as JSON lines,
kills the job's process group at the wall-clock timeout, replaces broken workers and
logs a `SECURITY_ALERT` for every refusal or kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import keyword
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from orchestrator.sandbox.checker import (
    ALLOWED_MODULES,
    REFLECTIVE_FUNCTIONS,
    SourceSyntaxError,
    check_source,
)

log = structlog.get_logger(__name__)

Status = Literal["ok", "error", "timeout", "refused"]
NetworkIsolation = Literal["auto", "netns", "seccomp", "none"]

_WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
# Time a worker gets to report after its job was killed before it is replaced.
_KILL_GRACE_S = 2.0
_START_TIMEOUT_S = 30.0
_MAX_ERROR_CHARS = 2000
# Sources up to this size are checked inline (well under 1 ms); longer ones in a thread.
_INLINE_CHECK_CHARS = 4000
# Categories of errors that are ordinary mistakes of the code, not containment events.
_QUIET_CATEGORIES = frozenset({None, "syntax_error", "closed"})


class SandboxUnavailableError(RuntimeError):
    """The sandbox cannot provide the isolation its settings ask for, or is not started."""


@dataclass(frozen=True)
class SandboxSettings:
    """Limits and isolation of the sandbox (built from the orchestrator's settings)."""

    workers: int = 2  # pre-started worker processes (concurrent jobs)
    memory_mb: int = 256  # RLIMIT_AS of each job process, MiB
    cpu_s: int = 5  # RLIMIT_CPU of each job process, seconds
    max_output_chars: int = 10_000  # cap on captured stdout and on the JSON result
    max_source_chars: int = 20_000  # longer source is refused before parsing
    # "auto": a network namespace where permitted, plus sockets refused by seccomp and
    #         Landlock where available; at least one of the two is required.
    # "netns": a network namespace is required (root or CAP_SYS_ADMIN); sockets can be
    #         created but there is no interface to use (loopback is down).
    # "seccomp": no namespace; socket()/socketpair() fail with EPERM (x86_64) and
    #         Landlock refuses TCP bind/connect (kernel ABI >= 4).
    # "none": no network isolation at all; only for hosts that can do neither.
    network_isolation: NetworkIsolation = "auto"

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        if self.memory_mb < 64:
            raise ValueError("memory_mb must be at least 64 (the interpreter needs ~30 MiB)")
        if self.cpu_s < 1:
            raise ValueError("cpu_s must be at least 1")
        if self.max_output_chars < 100 or self.max_source_chars < 100:
            raise ValueError("max_output_chars and max_source_chars must be at least 100")
        if self.network_isolation not in ("auto", "netns", "seccomp", "none"):
            raise ValueError("network_isolation must be one of auto, netns, seccomp, none")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one run. `category` names the reason of a refusal, kill or limit."""

    status: Status
    result: Any = None  # JSON-safe value (None unless status == "ok")
    stdout: str = ""
    error: str | None = None
    category: str | None = None
    latency_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("extra")
        return data


class _WorkerLost(Exception):
    """The worker was gone before it started the job."""


class _Worker:
    """One worker process and its JSON-lines channel."""

    def __init__(self, proc: asyncio.subprocess.Process, layers: dict[str, Any]) -> None:
        self.proc = proc
        self.layers = layers
        self.job_pid: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def read_message(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise ConnectionError("worker closed its channel")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ConnectionError("worker sent a malformed message")
        return message

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()

    def kill_job(self) -> None:
        """SIGKILL the current job's whole process group (the child and anything it made)."""
        if self.job_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.job_pid, signal.SIGKILL)

    def kill(self) -> None:
        self.kill_job()
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()


class Sandbox:
    """Run untrusted Python in confined, pre-forked worker processes.

    Use: `sb = Sandbox(settings); await sb.start(); r = await sb.run(code, {"s1": 3}, 2.0)`;
    `await sb.close()` on shutdown. `values` are bound as variables (by step id) from
    JSON, never pasted into the source. The result is the value of a variable named
    `result` when the code assigns one, otherwise the value of the last statement when
    it is an expression, otherwise None.
    """

    def __init__(
        self,
        settings: SandboxSettings = SandboxSettings(),
        *,
        _ast_check: bool = True,
        _preload: tuple[str, ...] = (),
        _tmp_root: str | None = None,
    ) -> None:
        # The underscore arguments exist for tests of the boundary: they turn off the
        # static check and the restricted builtins, or pre-import extra modules in the
        # worker, so that the tests can show the process confinement holds on its own.
        self.settings = settings
        self._ast_check = _ast_check
        self._preload = tuple(_preload)
        self._tmp_root = _tmp_root
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: set[_Worker] = set()
        self._spawning: set[asyncio.Task[None]] = set()
        self._started = False
        self._closed = False
        self.layers: dict[str, Any] = {}

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        workers = await asyncio.gather(
            *(self._spawn() for _ in range(self.settings.workers)), return_exceptions=True
        )
        failures = [w for w in workers if isinstance(w, BaseException)]
        for worker in workers:
            if isinstance(worker, _Worker):
                self._idle.put_nowait(worker)
        if failures:
            await self.close()
            raise SandboxUnavailableError(str(failures[0])) from failures[0]
        self._started = True
        log.info(
            "sandbox_started",
            workers=self.settings.workers,
            network_isolation=self.settings.network_isolation,
            layers=self.layers,
        )

    async def close(self) -> None:
        self._closed = True
        for task in list(self._spawning):
            task.cancel()
        for task in list(self._spawning):
            with contextlib.suppress(BaseException):
                await task
        await asyncio.gather(
            *(self._discard(worker, graceful=True) for worker in list(self._workers))
        )
        self._started = False

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _worker_config(self) -> dict[str, Any]:
        return {
            "parent_pid": os.getpid(),
            "memory_mb": self.settings.memory_mb,
            "cpu_s": self.settings.cpu_s,
            "max_output_chars": self.settings.max_output_chars,
            "network_isolation": self.settings.network_isolation,
            "allowed_modules": sorted(ALLOWED_MODULES),
            "hidden_names": sorted(REFLECTIVE_FUNCTIONS),
            "preload": list(self._preload),
            "restricted": self._ast_check,
            "tmp_root": self._tmp_root or tempfile.gettempdir(),
        }

    async def _spawn(self) -> _Worker:
        limit = 16 * self.settings.max_output_chars + (1 << 20)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            "-B",
            str(_WORKER_SCRIPT),
            json.dumps(self._worker_config()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={},
            cwd="/",
            start_new_session=True,
            limit=limit,
        )
        worker = _Worker(proc, {})
        self._workers.add(worker)
        try:
            async with asyncio.timeout(_START_TIMEOUT_S):
                message = await worker.read_message()
            if message.get("event") != "ready":
                raise SandboxUnavailableError(f"sandbox worker failed to start: {message}")
            layers = dict(message.get("layers") or {})
            if message.get("dropped"):
                log.warning("sandbox_layers_unavailable", dropped=message["dropped"])
            self._check_isolation(layers)
        except BaseException as exc:
            await self._discard(worker)
            if isinstance(exc, ConnectionError | TimeoutError | ValueError):
                raise SandboxUnavailableError(f"sandbox worker failed to start: {exc}") from exc
            raise
        worker.layers = layers
        self.layers = layers
        return worker

    def _check_isolation(self, layers: dict[str, Any]) -> None:
        mode = self.settings.network_isolation
        sockets_blocked = bool(layers.get("block_sockets")) and bool(layers.get("seccomp"))
        if mode == "netns" and not layers.get("netns"):
            raise SandboxUnavailableError(
                "network_isolation=netns needs root or CAP_SYS_ADMIN to unshare a network namespace"
            )
        if mode == "seccomp" and not sockets_blocked:
            raise SandboxUnavailableError(
                "network_isolation=seccomp needs seccomp filters on x86_64 Linux"
            )
        if mode == "auto" and not (layers.get("netns") or sockets_blocked):
            raise SandboxUnavailableError(
                "no network isolation is possible here (no network namespace, no seccomp); "
                "set network_isolation=none to run without it"
            )
        if mode == "none":
            log.warning("sandbox_without_network_isolation", layers=layers)
        if not layers.get("chroot") and not layers.get("landlock"):
            # Neither chroot (root) nor Landlock (Linux >= 5.13): job code can read every
            # file the service's user can read. Writes stay blocked (RLIMIT_FSIZE, seccomp).
            log.warning("sandbox_filesystem_readable", layers=layers)

    async def _discard(self, worker: _Worker, *, graceful: bool = False) -> None:
        """Stop a worker and everything under it, and remove its job directories.

        Graceful: kill the job in flight, close the worker's stdin so that it discards
        its spare child and exits, and kill it only if it does not within a second.
        """
        self._workers.discard(worker)
        worker.kill_job()
        if graceful and worker.alive and worker.proc.stdin is not None:
            worker.proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.proc.wait(), timeout=1.0)
        worker.kill()
        with contextlib.suppress(ProcessLookupError, TimeoutError):
            await asyncio.wait_for(worker.proc.wait(), timeout=5.0)
        if worker.proc.stdin is not None:
            worker.proc.stdin.close()
        # A killed worker cannot remove the directories of its children; they are named
        # after it (job-<worker pid>-...), and its children die with it (PDEATHSIG).
        self._remove_job_dirs(worker.proc.pid)

    def _remove_job_dirs(self, worker_pid: int) -> None:
        root = Path(self._tmp_root or tempfile.gettempdir())
        for leftover in root.glob(f"job-{worker_pid}-*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def _replace(self, worker: _Worker) -> None:
        """Kill a broken worker and start another in the background."""

        async def replace() -> None:
            await self._discard(worker)
            if self._closed:
                return
            try:
                fresh = await self._spawn()
            except Exception as exc:
                log.error("sandbox_worker_restart_failed", error=str(exc))
                return
            if self._closed:
                await self._discard(fresh)
            else:
                self._idle.put_nowait(fresh)

        task = asyncio.get_running_loop().create_task(replace())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    # --- running code --------------------------------------------------------------

    async def run(self, code: str, values: dict[str, Any], timeout_s: float) -> SandboxResult:
        started = time.perf_counter()
        result = await self._run(code, values, timeout_s)
        latency_ms = (time.perf_counter() - started) * 1000.0
        result = SandboxResult(
            status=result.status,
            result=result.result,
            stdout=result.stdout,
            error=result.error,
            category=result.category,
            latency_ms=round(latency_ms, 3),
        )
        if result.status in ("refused", "timeout") or result.category not in _QUIET_CATEGORIES:
            log.warning(
                "SECURITY_ALERT",
                category=result.category,
                detail=result.error,
                status=result.status,
                tool="python",
            )
        return result

    async def _run(self, code: str, values: dict[str, Any], timeout_s: float) -> SandboxResult:
        if not self._started or self._closed:
            raise SandboxUnavailableError("the sandbox is not started")
        if not isinstance(code, str):
            return SandboxResult("error", error="code must be a string", category="bad_input")
        if self._ast_check:
            if len(code) > self.settings.max_source_chars:
                return SandboxResult(
                    "refused",
                    error=f"source exceeds {self.settings.max_source_chars} characters",
                    category="source_too_large",
                )
            try:
                if len(code) <= _INLINE_CHECK_CHARS:
                    refusal = check_source(code, max_source_chars=self.settings.max_source_chars)
                else:
                    # Hostile source can take tens of ms to parse and walk: keep the event
                    # loop answering other requests meanwhile.
                    refusal = await asyncio.to_thread(
                        check_source, code, max_source_chars=self.settings.max_source_chars
                    )
            except SourceSyntaxError as exc:
                return SandboxResult("error", error=str(exc), category="syntax_error")
            if refusal is not None:
                return SandboxResult("refused", error=refusal.message, category=refusal.category)
        bad_name = next((name for name in values if not _valid_value_name(name)), None)
        if bad_name is not None:
            return SandboxResult(
                "refused", error=f"invalid value name {bad_name!r}", category="bad_input"
            )
        try:
            job = json.dumps({"code": code, "values": values, "timeout_s": timeout_s})
        except (TypeError, ValueError) as exc:
            return SandboxResult(
                "error", error=f"values are not JSON data: {exc}", category="bad_input"
            )
        deadline = time.monotonic() + timeout_s
        for _attempt in range(3):
            try:
                async with asyncio.timeout_at(_loop_time(deadline)):
                    worker = await self._idle.get()
                    while not worker.alive:
                        self._replace(worker)
                        worker = await self._idle.get()
            except TimeoutError:
                return SandboxResult("timeout", error="no sandbox worker free", category="busy")
            try:
                return await self._execute(worker, json.loads(job), deadline)
            except _WorkerLost:
                # The worker died before it took the job (nothing ran): try another one.
                continue
        return SandboxResult("error", error="sandbox workers keep failing", category="crash")

    async def _execute(
        self, worker: _Worker, job: dict[str, Any], deadline: float
    ) -> SandboxResult:
        job["timeout_s"] = max(deadline - time.monotonic(), 0.001)
        healthy = False
        try:
            try:
                await worker.send(job)
                message = await worker.read_message()
            except (ConnectionError, OSError) as exc:
                raise _WorkerLost from exc
            if message.get("event") != "started":
                raise ConnectionError(f"unexpected worker message {message.get('event')}")
            worker.job_pid = int(message["pid"])
            timed_out = False
            try:
                async with asyncio.timeout_at(_loop_time(deadline)):
                    message = await worker.read_message()
            except TimeoutError:
                # The wall-clock kill: the whole process group of the job.
                timed_out = True
                worker.kill_job()
                async with asyncio.timeout(_KILL_GRACE_S):
                    message = await worker.read_message()
            if message.get("event") != "done":
                raise ConnectionError(f"unexpected worker message {message.get('event')}")
            healthy = True
        except asyncio.CancelledError:
            worker.kill_job()
            raise
        except (ConnectionError, TimeoutError, ValueError, KeyError, OSError) as exc:
            return SandboxResult(
                "error", error=f"sandbox worker failed: {type(exc).__name__}", category="crash"
            )
        finally:
            worker.job_pid = None
            if healthy and worker.alive and not self._closed:
                self._idle.put_nowait(worker)
            else:
                self._replace(worker)
        if self._closed:
            return SandboxResult("error", error="the sandbox was closed", category="closed")
        if timed_out:
            return SandboxResult("timeout", error="wall-clock timeout", category="timeout")
        reported = message.get("status")
        status: Status = reported if reported in ("ok", "error", "timeout") else "error"
        stdout = str(message.get("stdout") or "")[: self.settings.max_output_chars]
        error = message.get("error")
        error = None if error is None else str(error)[:_MAX_ERROR_CHARS]
        category = message.get("category")
        category = None if category is None else str(category)[:40]
        result = message.get("result") if status == "ok" else None
        if status == "ok" and len(json.dumps(result)) > self.settings.max_output_chars:
            # The child checks this too; this holds even for a child that lies.
            return SandboxResult(
                "error",
                stdout=stdout,
                error="result exceeds the output cap",
                category="output_limit",
            )
        return SandboxResult(status, result, stdout, error, category)


def _valid_value_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and name.isidentifier()
        and name.isascii()
        and not name.startswith("_")
        and not keyword.iskeyword(name)
    )


def _loop_time(monotonic_deadline: float) -> float:
    """Convert a time.monotonic() deadline to the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_deadline - time.monotonic())
