"""The seccomp allowlist of the job child, exercised through raw system calls.

The static check is off and `ctypes` is loaded (the `raw_sandbox` fixture), so the job
calls libc directly. What no computation needs fails with EPERM (the default of the
allowlist); what only an attack does kills the job, reported as `blocked_syscall`.
"""

from __future__ import annotations

import platform
from typing import Any

import pytest

from orchestrator.sandbox import Sandbox

pytestmark = [
    pytest.mark.security,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the allowlist is x86_64's"),
]

_PRELUDE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(4096)
def call(fn, *args):
    ctypes.set_errno(0)
    return [int(fn(*args)), ctypes.get_errno()]
"""

# Calls that a denylist left open (or that nothing computing needs): each must fail.
DENIED = {
    "setpgid": "call(libc.setpgid, 0, 0)",
    "setsid": "call(libc.setsid)",
    "prctl_clear_pdeathsig": "call(libc.prctl, 1, 0, 0, 0, 0)",
    "prctl_set_name": "call(libc.prctl, 15, b'x', 0, 0, 0)",
    "prlimit64_of_pid_1": "call(libc.syscall, 302, 1, 0, None, buf)",
    "setrlimit": "call(libc.syscall, 160, 7, buf)",
    "setpriority": "call(libc.setpriority, 0, 0, 19)",
    "sched_setaffinity": "call(libc.syscall, 203, 0, 8, buf)",
    "shmget": "call(libc.shmget, 0, 4096, 0o1600)",
    "semget": "call(libc.semget, 0, 1, 0o1600)",
    "msgget": "call(libc.msgget, 0, 0o1600)",
    "ioctl": "call(libc.ioctl, 0, 0x5401, buf)",
    "fcntl": "call(libc.fcntl, 3, 1)",
    "dup": "call(libc.dup, 3)",
    "pipe": "call(libc.pipe, buf)",
    "openat_read_only": "call(libc.syscall, 257, -100, b'/', 0)",
    "getdents64": "call(libc.syscall, 217, 0, buf, 4096)",
    "memfd_create": "call(libc.syscall, 319, b'x', 0)",
    "mmap_exec": "call(libc.syscall, 9, 0, 4096, 7, 0x22, -1, 0)",
    "mprotect_exec": "call(libc.syscall, 10, ctypes.addressof(buf) & ~4095, 4096, 5)",
    "seccomp_new_filter": "call(libc.syscall, 317, 1, 0, None)",
    "uname": "call(libc.uname, buf)",
}

# Calls only an attack makes: the job is killed on the spot.
TRIPWIRES = {
    "kill_pid_1": "libc.kill(1, 9)",
    "tgkill": "libc.syscall(234, 1, 1, 0)",
    "ptrace": "libc.ptrace(16, 1, None, None)",
    "process_vm_readv": "libc.syscall(310, 1, None, 0, None, 0, 0)",
    "fork": "libc.fork()",
    "clone3": "libc.syscall(435, None, 0)",
    "execve": "libc.execve(b'/bin/sh', None, None)",
    "unshare": "libc.unshare(0x10000000)",
    "setns": "libc.syscall(308, 0, 0)",
    "mount": "libc.mount(b'none', b'/', b'tmpfs', 0, None)",
    "chroot": "libc.chroot(b'/')",
    "setuid": "libc.setuid(0)",
    "capset": "libc.syscall(126, None, None)",
    "socket": "libc.socket(2, 1, 0)",
    "socketpair": "libc.socketpair(1, 1, 0, buf)",
    "bpf": "libc.syscall(321, 0, None, 0)",
    "io_uring_setup": "libc.syscall(425, 1, buf)",
    "userfaultfd": "libc.syscall(323, 0)",
    "pidfd_open": "libc.syscall(434, 1, 0)",
    "x32_getpid": "libc.syscall(0x40000000 | 39)",
}


async def test_calls_outside_the_allowlist_fail(raw_sandbox: Sandbox, check_clean: Any) -> None:
    checks = ",\n".join(f"    {name!r}: {code}" for name, code in DENIED.items())
    outcome = await raw_sandbox.run(f"{_PRELUDE}\n{{\n{checks}\n}}", {}, 5.0)
    assert outcome.status == "ok", outcome
    # errno 1 is EPERM: refused by the filter, not a failure of the call itself.
    assert {name: r for name, r in outcome.result.items() if r != [-1, 1]} == {}
    await check_clean(raw_sandbox)


@pytest.mark.parametrize("name", sorted(TRIPWIRES))
async def test_tripwire_calls_kill_the_job(name: str, raw_sandbox: Sandbox) -> None:
    outcome = await raw_sandbox.run(f"{_PRELUDE}\n{TRIPWIRES[name]}\n'survived'", {}, 5.0)
    assert (outcome.status, outcome.category) == ("error", "blocked_syscall"), outcome


async def test_what_computation_needs_still_works(raw_sandbox: Sandbox, check_clean: Any) -> None:
    code = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
        "time.sleep(0.01)\n"
        "big = bytearray(64 * 1024 * 1024)\n"  # mmap, then munmap
        "del big\n"
        "[len(os.urandom(8)), os.getpid() > 1, time.process_time() >= 0, os.getcwd()]"
    )
    outcome = await raw_sandbox.run(code, {}, 5.0)
    assert (outcome.status, outcome.result) == ("ok", [8, True, True, "/"]), outcome
    await check_clean(raw_sandbox)
