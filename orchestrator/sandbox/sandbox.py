"""The Python sandbox the `python` tool runs model-written code in.

Layer 1 (`checker.py`) refuses code that uses anything outside a small allowlist. Layer 2
is the boundary: `_worker.py` processes, started clean (`python -I -S`, empty
environment, own session) and kept in a pool. Each worker lives in its own user, pid,
mount, IPC, UTS and network namespaces; its jobs run in children forked by a zygote
that never sees a job, inside an empty read-only root, under a seccomp allowlist (see
`_worker.py` and README.md in this package). This module is the service side: it checks
the code, hands jobs to idle workers as JSON lines, waits for the worker's answer
(the worker enforces the job's time limit), replaces broken workers with backoff,
reports the pool's health and logs a `SECURITY_ALERT` for what only an attack causes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import keyword
import os
import platform
import signal
import sys
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import structlog
from prometheus_client import Counter, Gauge

from orchestrator.sandbox.checker import (
    ALLOWED_MODULES,
    BANNED_ATTRIBUTES,
    SourceSyntaxError,
    check_source,
)
from orchestrator.sandbox.events import limit_reached, security_alert

log = structlog.get_logger(__name__)

Status = Literal["ok", "error", "timeout", "refused"]
NetworkIsolation = Literal["auto", "netns", "seccomp", "none"]

_WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
# Time the worker gets past a job's deadline to report the job killed, before the
# service gives up on the worker and kills it (and with it everything it started).
_KILL_GRACE_S = 2.0
_START_TIMEOUT_S = 30.0
# Replacing a broken worker is retried until it works: first after this, then twice as
# long each time, at most _RESPAWN_MAX_S apart.
_RESPAWN_FIRST_S = 0.1
_RESPAWN_MAX_S = 30.0
_MAX_ERROR_CHARS = 2000
# Sources up to this size are checked inline (well under 1 ms); longer ones in a thread.
_INLINE_CHECK_CHARS = 4000
# Outcomes only hostile code (or a broken sandbox) produces: logged as SECURITY_ALERT.
_ALERT_CATEGORIES = frozenset({"crash", "blocked_syscall", "output_flood", "protocol"})
# Limits honest code hits too: logged as an ordinary `tool_limit` line.
_LIMIT_CATEGORIES = frozenset({"timeout", "memory", "recursion", "output_limit", "busy"})
# What a worker may report; anything else is a protocol violation.
_WORKER_CATEGORIES = _ALERT_CATEGORIES | _LIMIT_CATEGORIES | {None, "cancelled"}
# The namespace layer: without all of these the sandbox refuses to start.
_REQUIRED_LAYERS = ("userns", "pidns", "empty_root")
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
# Every job's outcome by status and category. Both are bounded: every category is a
# literal of this package (the checker's refusals, this module's, and the worker's, which
# `_result` checks against _WORKER_CATEGORIES, refusing any other as a protocol error).
JOBS = Counter("sandbox_jobs_total", "Sandbox jobs by outcome", ["status", "category"])
RESTARTS = Counter("sandbox_worker_restarts_total", "Broken sandbox workers replaced", ["outcome"])
WORKERS = Gauge("sandbox_workers_live", "Sandbox workers started, checked and not replaced")
_STARTED: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # the process's sandboxes
WORKERS.set_function(lambda: sum(sandbox.live_workers for sandbox in list(_STARTED)))


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
    # Every mode runs jobs in their own user, pid, mount and IPC namespaces; this setting
    # only decides about the network:
    # "auto": a network namespace (only a down loopback) plus sockets refused by the
    #         seccomp allowlist and Landlock TCP rules.
    # "netns": the network namespace only; sockets can be created but there is no
    #         interface to use.
    # "seccomp": no network namespace; socket()/socketpair() kill the job (x86_64) and
    #         Landlock refuses TCP bind/connect (kernel ABI >= 4).
    # "none": jobs share the host's network and may use sockets; logged at start.
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


class _WorkerLost(Exception):
    """The worker was gone before it started the job."""


class _ProtocolError(Exception):
    """The worker sent something that is not a well-formed message."""


def _reject_constant(name: str) -> None:
    # NaN and Infinity are not JSON: the worker never sends them, and the HTTP layer
    # could not serialise them.
    raise ValueError(f"{name} is not JSON")


class _Worker:
    """One worker process, its JSON-lines channel and a pidfd of its zygote."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.layers: dict[str, Any] = {}
        self.ready = False  # started and checked; False again once retired
        self.retired = False  # being replaced: never handed a job again
        self.zygote_pidfd: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def read_message(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise ConnectionError("worker closed its channel")
        try:
            message = json.loads(line, parse_constant=_reject_constant)
        except Exception as exc:  # RecursionError (too deep) and UnicodeDecodeError too
            raise _ProtocolError(f"worker sent unparseable data: {type(exc).__name__}") from exc
        if not isinstance(message, dict):
            raise _ProtocolError("worker sent a malformed message")
        return message

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()

    def cancel_job(self) -> None:
        """Ask the worker to stop the job in flight (it answers with the job's 'done')."""
        if self.alive and self.proc.stdin is not None and not self.proc.stdin.is_closing():
            with contextlib.suppress(ConnectionError, RuntimeError):
                self.proc.stdin.write(b'{"cancel": true}\n')

    def kill(self) -> None:
        """SIGKILL the worker and its zygote: the pid namespace and every job in it die."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        if self.zygote_pidfd is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.zygote_pidfd, signal.SIGKILL)

    async def wait_gone(self, timeout_s: float) -> None:
        """Wait until the worker and everything in its pid namespace have exited.

        The zygote is the namespace's init: the kernel reports its exit only after it
        has killed and reaped every other process in the namespace.
        """
        with contextlib.suppress(ProcessLookupError, TimeoutError):
            await asyncio.wait_for(self.proc.wait(), timeout=timeout_s)
        pidfd, self.zygote_pidfd = self.zygote_pidfd, None  # one waiter closes it
        if pidfd is None:
            return
        loop = asyncio.get_running_loop()
        gone = loop.create_future()
        loop.add_reader(pidfd, lambda: gone.done() or gone.set_result(None))
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gone, timeout=timeout_s)
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)


class Sandbox:
    """Run untrusted Python in confined, pre-forked worker processes.

    Use: `sb = Sandbox(settings); await sb.start(); r = await sb.run(code, {"s1": 3}, 2.0)`;
    `await sb.close()` on shutdown. `values` are bound as variables (by step id) from
    JSON, never pasted into the source. The result is the value of a variable named
    `result` when the code assigns one, otherwise the value of the last statement when
    it is an expression, otherwise None.
    """

    # How long past its timeout a run can take at most (the worker's kill and report,
    # or the service killing an unresponsive worker): callers that put their own
    # timeout around `run` give it this much more, so that the sandbox's fires first.
    timeout_grace_s = _KILL_GRACE_S + 0.5

    def __init__(
        self,
        settings: SandboxSettings = SandboxSettings(),
        *,
        _ast_check: bool = True,
        _restricted: bool | None = None,
        _preload: tuple[str, ...] = (),
        _without: tuple[str, ...] = (),
    ) -> None:
        # The underscore arguments exist for tests of the boundary: they turn off the
        # static check and (unless `_restricted` says otherwise) the restricted
        # builtins, pre-import extra modules in the worker, or leave out optional
        # per-job layers ("landlock", "seccomp"), so that the tests can show what the
        # other layers hold on their own (`_ast_check=False, _restricted=True`: the
        # restricted builtins and module copies without the static check in front).
        self.settings = settings
        self._ast_check = _ast_check
        self._restricted = _ast_check if _restricted is None else _restricted
        self._preload = tuple(_preload)
        self._without = tuple(_without)
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: set[_Worker] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # replacements and recoveries
        self._watchers: set[asyncio.Task[None]] = set()  # one per live worker
        self._started = False
        self._closed = False
        self._restart_failures = 0
        self.layers: dict[str, Any] = {}

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        undumpable = _make_undumpable()
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
        _STARTED.add(self)
        self.layers["service_undumpable"] = undumpable
        log.info(
            "sandbox started",
            **{
                "event.action": "sandbox.start",
                "labels.workers": self.settings.workers,
                "labels.network_isolation": self.settings.network_isolation,
                "labels.layers": self.layers,
            },
        )

    async def close(self) -> None:
        self._closed = True
        _STARTED.discard(self)
        tasks = [*self._tasks, *self._watchers]
        for task in tasks:
            task.cancel()
        for task in tasks:
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

    # --- health --------------------------------------------------------------------

    @property
    def live_workers(self) -> int:
        """Workers started, checked and not being replaced."""
        return sum(1 for worker in self._workers if worker.ready and worker.alive)

    @property
    def healthy(self) -> bool:
        """Started, not closed, and every configured worker is live."""
        return self._started and not self._closed and self.live_workers >= self.settings.workers

    def health(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "workers": self.live_workers,
            "configured": self.settings.workers,
            "restart_failures": self._restart_failures,
        }

    # --- workers -------------------------------------------------------------------

    def _worker_config(self) -> dict[str, Any]:
        return {
            "parent_pid": os.getpid(),
            "memory_mb": self.settings.memory_mb,
            "cpu_s": self.settings.cpu_s,
            "max_output_chars": self.settings.max_output_chars,
            "network_isolation": self.settings.network_isolation,
            "allowed_modules": sorted(ALLOWED_MODULES),
            # Every plain attribute name the check refuses (REFLECTIVE_FUNCTIONS among
            # them) is left out of the module copies too.
            "hidden_names": sorted(BANNED_ATTRIBUTES),
            "preload": list(self._preload),
            "restricted": self._restricted,
            "without": list(self._without),
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
        worker = _Worker(proc)
        self._workers.add(worker)
        try:
            async with asyncio.timeout(_START_TIMEOUT_S):
                message = await worker.read_message()
            if message.get("event") == "failed":
                raise SandboxUnavailableError(
                    f"the sandbox cannot isolate jobs here: {message.get('error')}"
                )
            if message.get("event") != "ready":
                raise SandboxUnavailableError(f"sandbox worker failed to start: {message}")
            layers = dict(message.get("layers") or {})
            if message.get("dropped"):
                log.warning(
                    "sandbox layers unavailable",
                    **{"event.action": "sandbox.layers", "labels.dropped": message["dropped"]},
                )
            self._check_isolation(layers)
            worker.zygote_pidfd = os.pidfd_open(int(message["zygote_pid"]))
        except BaseException as exc:
            await self._discard(worker)
            if isinstance(
                exc,
                ConnectionError | TimeoutError | ValueError | KeyError | OSError | _ProtocolError,
            ):
                raise SandboxUnavailableError(f"sandbox worker failed to start: {exc}") from exc
            raise
        worker.layers = layers
        worker.ready = True
        self.layers = dict(self.layers, **layers)
        self._track(self._watch(worker), self._watchers)
        return worker

    def _check_isolation(self, layers: dict[str, Any]) -> None:
        missing = [name for name in _REQUIRED_LAYERS if not layers.get(name)]
        if missing:
            raise SandboxUnavailableError(
                f"the sandbox worker lacks the isolation layers {', '.join(missing)}; "
                "refusing to run jobs without them"
            )
        seccomp_wanted = "seccomp" not in self._without  # only tests leave it out
        if platform.machine() == "x86_64" and seccomp_wanted and not layers.get("seccomp"):
            raise SandboxUnavailableError(
                "the sandbox's seccomp allowlist could not be installed; refusing to run jobs"
            )
        mode = self.settings.network_isolation
        sockets_blocked = bool(layers.get("block_sockets")) and bool(layers.get("seccomp"))
        if mode == "netns" and not layers.get("netns"):
            raise SandboxUnavailableError("network_isolation=netns: no network namespace")
        if mode == "seccomp" and not sockets_blocked:
            raise SandboxUnavailableError(
                "network_isolation=seccomp needs seccomp filters on x86_64 Linux"
            )
        if mode == "auto" and not (layers.get("netns") or sockets_blocked):
            raise SandboxUnavailableError("no network isolation is possible here")
        if mode == "none":
            log.warning(
                "sandbox without network isolation",
                **{"event.action": "sandbox.layers", "labels.layers": layers},
            )
        if not layers.get("landlock"):
            # The empty root (mount namespace) still keeps every file out of reach.
            log.warning(
                "sandbox without landlock",
                **{"event.action": "sandbox.layers", "labels.layers": layers},
            )

    async def _watch(self, worker: _Worker) -> None:
        """Replace a worker as soon as it dies, even while no job is asking for one."""
        await worker.proc.wait()
        if not self._closed:
            self._replace(worker)

    def _track(self, coro: Any, tasks: set[asyncio.Task[None]] | None = None) -> None:
        tasks = self._tasks if tasks is None else tasks
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _discard(self, worker: _Worker, *, graceful: bool = False) -> None:
        """Stop a worker and everything under it.

        Graceful: close the worker's stdin, so that it stops the job in flight and exits,
        and kill it only if it does not within a second. Either way this returns once the
        worker and every process of its pid namespace are gone.
        """
        self._workers.discard(worker)
        worker.ready = False
        worker.retired = True
        if graceful and worker.alive and worker.proc.stdin is not None:
            worker.proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.proc.wait(), timeout=1.0)
        worker.kill()
        await worker.wait_gone(5.0)
        if worker.proc.stdin is not None:
            worker.proc.stdin.close()

    def _replace(self, worker: _Worker) -> None:
        """Kill a broken worker and start another in the background, until one starts."""
        if worker.retired:
            return
        worker.retired = True
        worker.ready = False

        async def replace() -> None:
            await self._discard(worker)
            delay = _RESPAWN_FIRST_S
            while not self._closed:
                try:
                    fresh = await self._spawn()
                except Exception as exc:
                    self._restart_failures += 1
                    RESTARTS.labels("failure").inc()
                    log.error(
                        "sandbox worker restart failed",
                        **{
                            "event.action": "sandbox.worker.restart",
                            "event.outcome": "failure",
                            "error.type": type(exc).__name__,
                            "error.message": str(exc),
                            "labels.retry_in_s": delay,
                            "labels.workers": self.live_workers,
                            "labels.configured": self.settings.workers,
                        },
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _RESPAWN_MAX_S)
                    continue
                self._restart_failures = 0
                RESTARTS.labels("success").inc()
                if self._closed:
                    await self._discard(fresh)
                else:
                    self._idle.put_nowait(fresh)
                return

        self._track(replace())

    async def _recover(self, worker: _Worker) -> None:
        """After a cancelled run: wait for the job's 'done', then reuse the worker."""
        try:
            async with asyncio.timeout(_KILL_GRACE_S):
                while (await worker.read_message()).get("event") != "done":
                    pass
        except Exception:  # whatever went wrong, the worker is not reused
            self._replace(worker)
            return
        if worker.alive and not worker.retired and not self._closed:
            self._idle.put_nowait(worker)
        else:
            self._replace(worker)

    # --- running code --------------------------------------------------------------

    async def run(self, code: str, values: dict[str, Any], timeout_s: float) -> SandboxResult:
        started = time.perf_counter()
        result = await self._run(code, values, timeout_s)
        latency_ms = (time.perf_counter() - started) * 1000.0
        result = replace(result, latency_ms=round(latency_ms, 3))
        report = {"tool": "python", "status": result.status, "detail": result.error}
        JOBS.labels(result.status, _category_label(result.category)).inc()
        if result.status == "refused" or result.category in _ALERT_CATEGORIES:
            security_alert(log, category=result.category or "refused", **report)
        elif result.category in _LIMIT_CATEGORIES:
            limit_reached(log, category=result.category, **report)
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
                    while not worker.alive or worker.retired:
                        self._replace(worker)
                        worker = await self._idle.get()
            except TimeoutError:
                return SandboxResult("timeout", error="no sandbox worker free", category="busy")
            try:
                return await self._execute(worker, json.loads(job), deadline)
            except _WorkerLost:
                # The worker died before it took the job (nothing ran): try another one.
                self._replace(worker)
                continue
        return SandboxResult("error", error="sandbox workers keep failing", category="crash")

    async def _execute(
        self, worker: _Worker, job: dict[str, Any], deadline: float
    ) -> SandboxResult:
        job["timeout_s"] = max(deadline - time.monotonic(), 0.001)
        try:
            # The worker kills the job at the deadline and says so; past the grace the
            # worker itself is stuck, and killing it kills the job with it.
            async with asyncio.timeout_at(_loop_time(deadline + _KILL_GRACE_S)):
                try:
                    await worker.send(job)
                    message = await worker.read_message()
                except (ConnectionError, OSError) as exc:
                    raise _WorkerLost from exc
                if message.get("event") != "started":
                    raise _ProtocolError(f"unexpected worker message {message.get('event')}")
                message = await worker.read_message()
            if message.get("event") != "done":
                raise _ProtocolError(f"unexpected worker message {message.get('event')}")
        except asyncio.CancelledError:
            worker.cancel_job()
            self._track(self._recover(worker))
            raise
        except _WorkerLost:
            raise
        except Exception as exc:
            # Every failure replaces the worker: one that escaped from here would leave
            # it neither idle nor replaced, out of the pool for good.
            if self._closed:  # close() is stopping every worker
                return SandboxResult("error", error="the sandbox was closed", category="closed")
            self._replace(worker)
            if isinstance(exc, ConnectionError | TimeoutError | OSError):
                reason = "did not answer" if isinstance(exc, TimeoutError) else "failed"
                return SandboxResult(
                    "error",
                    error=f"sandbox worker {reason}: {type(exc).__name__}",
                    category="crash",
                )
            return _broke_protocol(exc)
        if self._closed:
            return SandboxResult("error", error="the sandbox was closed", category="closed")
        try:
            result = self._result(message)
        except Exception as exc:  # the worker broke protocol (or lies): not reused
            self._replace(worker)
            return _broke_protocol(exc)
        if worker.alive and not worker.retired:
            self._idle.put_nowait(worker)
        else:
            self._replace(worker)
        return result

    def _result(self, message: dict[str, Any]) -> SandboxResult:
        """The worker's 'done' message as a result; whatever breaks protocol is refused."""
        status = message.get("status")
        category = message.get("category")
        stdout = message.get("stdout") or ""
        error = message.get("error")
        if (
            status not in ("ok", "error", "timeout")
            or category not in _WORKER_CATEGORIES
            or not isinstance(stdout, str)
        ):
            raise _ProtocolError("malformed 'done' message")
        error = None if error is None else str(error)[:_MAX_ERROR_CHARS]
        result = message.get("result") if status == "ok" else None
        if (
            len(stdout) > self.settings.max_output_chars
            # The one measure of a result everywhere: characters of its JSON text.
            or len(json.dumps(result, ensure_ascii=False)) > self.settings.max_output_chars
        ):
            # The worker checks this too; this holds even for a worker that lies.
            return SandboxResult(
                "error", error="result exceeds the output cap", category="output_flood"
            )
        return SandboxResult(status, result, stdout, error, category)


def _category_label(category: str | None) -> str:
    if category is None:
        return "none"
    return category if len(category) <= 32 and category.isidentifier() else "other"


def _broke_protocol(exc: BaseException) -> SandboxResult:
    return SandboxResult(
        "error",
        error=f"the sandbox worker broke protocol: {type(exc).__name__}",
        category="protocol",
    )


def _make_undumpable() -> bool:
    """PR_SET_DUMPABLE 0 for the service process (defence in depth).

    Other processes of the service's uid (as a job would be, were it ever to reach the
    host's /proc) then cannot read its /proc/<pid>/environ or memory, nor ptrace it.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0


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
