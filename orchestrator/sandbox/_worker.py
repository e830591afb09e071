"""Sandbox worker: run as `python -I -S -B _worker.py CONFIG_JSON`, never imported.

Standard library only, and it must stay that way: the worker is a clean interpreter
that never loads the service's modules. It reads one job per line (JSON) on stdin and
answers with JSON lines on stdout:

    {"event": "ready", "pid": ..., "zygote_pid": ..., "layers": {...}, "dropped": {...}}
    {"event": "failed", "error": ...}                           instead of ready
    {"event": "started"}                                        per job, once handed over
    {"event": "done", "status": ..., "result": ..., ...}        per job

While a job runs, the line {"cancel": true} stops it (answered by its "done").

Processes, per worker:

    worker (this script): reads jobs, hands each to a confined spare, watches it, answers.
     |                    It holds job data, so it never forks a job child.
     +- zygote: pid 1 of the worker's own pid namespace, forked before the first job.
         |      It never receives a job: it only forks and confines spares and reaps
         |      them, so every job starts from the same clean memory.
         +- job child: runs exactly one job, then exits
         +- spare: forked and confined ahead of its job, blocked reading it

Isolation, all checked at start (the worker reports "failed" instead of "ready" when a
mandatory layer cannot be set up):

- namespaces (mandatory): a new user namespace (uid/gid 65534 inside, mapped to the
  worker's own uid; a worker started as root first drops to 65534, so that jobs never
  run as the service's uid), pid namespace (jobs see only the zygote and each other;
  when the zygote dies the kernel kills everything in it), mount namespace whose root
  is an empty read-only tmpfs (pivot_root: the host filesystem, /proc included, is
  detached, not hidden), IPC and UTS namespaces, and a network namespace with only a
  down loopback unless network_isolation is "seccomp" or "none";
- per job child: fds 0-2 on /dev/null, 3 the result pipe, 4 the job pipe, nothing else;
  every capability dropped (also from the bounding and ambient sets); rlimits (address
  space, CPU seconds, no processes, no file writes, 8 fds, no core dumps); no_new_privs;
  Landlock (no filesystem access; no TCP where sockets are blocked; scoped signals and
  abstract sockets on ABI >= 6) where the kernel has it; a seccomp ALLOWLIST on x86_64:
  only the calls CPython needs to compute and answer, EPERM for everything else, and
  SIGSYS (a kill the worker reports as `blocked_syscall`) for the calls only an attack
  makes (process creation, exec, ptrace, signals, namespaces, mounts, privilege changes,
  kernel interfaces, sockets where blocked).

The worker enforces each job's wall-clock limit itself, through a pidfd (no pid reuse),
and never reports a job as done before the job's process has exited.
"""

import ast
import builtins
import ctypes
import errno
import gc
import json
import os
import platform
import resource
import select
import signal
import socket
import struct
import sys
import time
import types
from collections import deque

CONFIG = json.loads(sys.argv[1])
NOBODY = 65534
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# --- constants from <linux/...> -------------------------------------------------------
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
SYS_PIVOT_ROOT = 155
SYS_CAPSET = 126
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_RESTRICT_SELF = 446
PROT_EXEC = 0x4

# --- the seccomp allowlist (x86_64) ---------------------------------------------------
# What a job child may call once confined, found by tracing the children over the test
# programs (strace -f) plus what sleeping, signals and big allocations need. Everything
# else fails with EPERM.
_X86_64_ALLOW = {
    "read": 0, "write": 1, "close": 3, "fstat": 5, "lseek": 8, "munmap": 11, "brk": 12,
    "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15, "sched_yield": 24,
    "mremap": 25, "madvise": 28, "nanosleep": 35, "getpid": 39, "exit": 60, "getcwd": 79,
    "gettimeofday": 96, "getuid": 102, "getgid": 104, "geteuid": 107, "getegid": 108,
    "getppid": 110, "sigaltstack": 131, "gettid": 186, "time": 201, "futex": 202,
    "restart_syscall": 219, "clock_gettime": 228, "clock_getres": 229,
    "clock_nanosleep": 230, "exit_group": 231, "newfstatat": 262, "getrandom": 318,
}  # fmt: skip
# mmap and mprotect are allowed only without PROT_EXEC (args[2]): no new machine code.
_X86_64_NO_EXEC = {"mmap": 9, "mprotect": 10}
# Only network_isolation "netns" and "none" let a job use sockets.
_X86_64_SOCKETS = {
    "socket": 41, "connect": 42, "accept": 43, "sendto": 44, "recvfrom": 45, "sendmsg": 46,
    "recvmsg": 47, "shutdown": 48, "bind": 49, "listen": 50, "getsockname": 51,
    "getpeername": 52, "socketpair": 53, "setsockopt": 54, "getsockopt": 55,
    "accept4": 288, "poll": 7, "ppoll": 271, "select": 23, "pselect6": 270, "ioctl": 16,
    "fcntl": 72,
}  # fmt: skip
# Calls no computation makes: the job is killed (SIGSYS) and the attempt reported.
_X86_64_TRIPWIRE = {
    "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "clone3": 435,
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kill": 62,
    "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
    "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "unshare": 272,
    "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "mount_setattr": 442, "bpf": 321, "perf_event_open": 298,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "keyctl": 250, "add_key": 248, "request_key": 249,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
    "kexec_file_load": 320, "open_by_handle_at": 304, "setuid": 105, "setgid": 106,
    "setreuid": 113, "setregid": 114, "setresuid": 117, "setresgid": 119, "setgroups": 116,
    "setfsuid": 122, "setfsgid": 123, "capset": 126, "personality": 135,
}  # fmt: skip
_X86_64_SOCKET_TRIPWIRE = {"socket": 41, "socketpair": 53}
_X32_BIT = 0x40000000


def _bpf_program(block_sockets: bool) -> bytes:
    """Assemble the seccomp BPF allowlist for x86_64 (see the module docstring)."""
    ld_w_abs, jmp_jeq, jmp_jge, jmp_jset, ret_k = 0x20, 0x15, 0x35, 0x45, 0x06
    allow = dict(_X86_64_ALLOW)
    tripwire = dict(_X86_64_TRIPWIRE)
    if block_sockets:
        tripwire.update(_X86_64_SOCKET_TRIPWIRE)
    else:
        allow.update(_X86_64_SOCKETS)
    # Instructions as (code, jt_label_or_0, jf_label_or_0, k); labels resolved below.
    prog: list[tuple[int, object, object, int]] = [
        (ld_w_abs, 0, 0, 4),  # A = seccomp_data.arch
        (jmp_jeq, 0, "kill", AUDIT_ARCH_X86_64),  # another ABI: kill
        (ld_w_abs, 0, 0, 0),  # A = seccomp_data.nr
        (jmp_jge, "kill", 0, _X32_BIT),  # x32 numbers: kill
    ]
    prog += [(jmp_jeq, "no_exec", 0, nr) for nr in sorted(_X86_64_NO_EXEC.values())]
    prog += [(jmp_jeq, "allow", 0, nr) for nr in sorted(allow.values())]
    prog += [(jmp_jeq, "kill", 0, nr) for nr in sorted(tripwire.values())]
    labels: dict[str, int] = {}
    prog.append((ret_k, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM))  # the default
    labels["allow"] = len(prog)
    prog.append((ret_k, 0, 0, SECCOMP_RET_ALLOW))
    labels["kill"] = len(prog)
    prog.append((ret_k, 0, 0, SECCOMP_RET_KILL_PROCESS))
    labels["no_exec"] = len(prog)
    prog.append((ld_w_abs, 0, 0, 16 + 8 * 2))  # low 32 bits of args[2] (prot)
    prog.append((jmp_jset, "+1", 0, PROT_EXEC))  # BPF jumps only forward
    prog.append((ret_k, 0, 0, SECCOMP_RET_ALLOW))
    prog.append((ret_k, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM))
    out = b""
    for index, (code, jt, jf, k) in enumerate(prog):
        offsets = []
        for target in (jt, jf):
            if isinstance(target, str):
                offset = 1 if target == "+1" else labels[target] - index - 1
                if not 0 <= offset <= 255:
                    raise RuntimeError("seccomp jump out of range")
                offsets.append(offset)
            else:
                offsets.append(0)
        out += struct.pack("=HBBI", code, offsets[0], offsets[1], k)
    return out


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


# Filters assembled once in the worker (buffer, sock_fprog), installed in every child.
_PROGRAMS: dict[bool, tuple[ctypes.Array, _SockFprog]] = {}


def _prepare_seccomp(block_sockets: bool) -> tuple[ctypes.Array, _SockFprog]:
    program = _bpf_program(block_sockets)
    buf = ctypes.create_string_buffer(program, len(program))
    return buf, _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))


def _install_seccomp(block_sockets: bool) -> None:
    _buf, fprog = _PROGRAMS.get(block_sockets) or _prepare_seccomp(block_sockets)
    _check(
        _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
        "seccomp",
    )


def _landlock_abi() -> int:
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return int(abi) if abi > 0 else 0


def _install_landlock(abi: int, block_tcp: bool) -> None:
    """Handle every filesystem right with no rule granting any: no file can be opened."""
    fs = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        fs |= 1 << 13  # refer
    if abi >= 3:
        fs |= 1 << 14  # truncate
    if abi >= 5:
        fs |= 1 << 15  # ioctl_dev
    net = 0b11 if (abi >= 4 and block_tcp) else 0  # bind_tcp | connect_tcp
    scoped = 0b11 if abi >= 6 else 0  # abstract unix sockets | signals
    if abi >= 6:
        attr = struct.pack("=QQQ", fs, net, scoped)
    elif abi >= 4:
        attr = struct.pack("=QQ", fs, net)
    else:
        attr = struct.pack("=Q", fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(
        SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        _check(
            _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)),
            "landlock_restrict_self",
        )
    finally:
        os.close(fd)


def _drop_capabilities() -> None:
    """Drop every capability the child holds in its user namespace, for good."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:  # EINVAL past the last one
        cap += 1
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient caps")
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # effective, permitted, inheritable: all empty (two 32-bit words)
    _check(_libc.syscall(SYS_CAPSET, header, data), "capset")


# --- the environment the job code sees --------------------------------------------------

ALLOWED_MODULES = frozenset(CONFIG["allowed_modules"])
for _name in [*sorted(ALLOWED_MODULES), "_strptime", "encodings.idna", *CONFIG["preload"]]:
    __import__(_name)

_SAFE_BUILTIN_NAMES = (
    "abs all any ascii bin bool bytearray bytes callable chr complex dict divmod enumerate filter "
    "float format frozenset hash hex int isinstance issubclass iter len list map max min "
    "next oct ord pow print range repr reversed round set slice sorted str sum tuple zip "
    "ArithmeticError AssertionError AttributeError Exception IndexError KeyError "
    "LookupError NameError NotImplementedError OverflowError RecursionError RuntimeError "
    "StopIteration TypeError ValueError ZeroDivisionError True False None NotImplemented "
    "Ellipsis"
).split()


_HIDDEN = frozenset(CONFIG["hidden_names"])


def _module_view(module: types.ModuleType) -> types.ModuleType:
    """A copy of an allowed module without private names, other modules or hidden names.

    `fractions.sys`, `statistics.random`, `re.enum` ... would lead to `sys.modules`;
    the hidden names are every plain attribute name the static check refuses
    (`datetime.datetime_CAPI`, `functools.wraps`, aliases found by its module walk).
    The copy's `__name__` is no key of `sys.modules` (nor is any "<name>.<attr>"), so
    the interpreter's fallback of `from X import Y` to `sys.modules["X.Y"]` finds
    nothing from a copy.
    """
    view = types.ModuleType(f"<sandbox {module.__name__}>")
    for attr, value in vars(module).items():
        if attr.startswith("_") or isinstance(value, types.ModuleType) or attr in _HIDDEN:
            continue
        setattr(view, attr, value)
    return view


_VIEWS = {name: _module_view(sys.modules[name]) for name in sorted(ALLOWED_MODULES)}

# Modules that C code of allowed modules imports through the job's `__import__`:
# datetime's strftime, __format__ and timetuple import `time`, strptime imports
# `_strptime`. The C caller does not use what `__import__` returns:
# PyImport_Import only lets `__import__` run and then takes the module from
# `sys.modules` (both are loaded before the first job). So they are served as empty
# modules: the import passes and the code gets nothing (no `time.sleep`, no module
# references of `_strptime`). The static check refuses `import time` from the code.
_INTERNAL_IMPORTS = {name: types.ModuleType(f"<sandbox {name}>") for name in ("time", "_strptime")}


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    view = _VIEWS.get(name) or _INTERNAL_IMPORTS.get(name)
    if level != 0 or view is None:
        raise ImportError(f"import of {name!r} is not allowed")
    # `from X import Y` with Y missing from the copy would fall back to
    # sys.modules["X.Y"] (the real `collections.abc` for `from collections import abc`).
    for attr in fromlist or ():
        if not isinstance(attr, str) or attr not in vars(view):
            raise ImportError(f"cannot import name {attr!r} from {name!r}")
    return view


def _safe_builtins() -> dict:
    table = {name: getattr(builtins, name) for name in _SAFE_BUILTIN_NAMES}
    table["__import__"] = _guarded_import
    return table


class _OutputCap(Exception):
    """The child's own output-cap check. Job code has no name for this class, so a job
    cannot claim `output_limit` by raising something with the right message."""


# How deeply a result may nest. The child refuses deeper results (OverflowError); the
# worker refuses (as a protocol violation) any result nested past _MAX_RESULT_DEPTH,
# which leaves room above this bound and stays far below any JSON parser's recursion.
_TO_JSONABLE_DEPTH = 50
_MAX_RESULT_DEPTH = 64


def _to_jsonable(value, max_chars: int, depth: int = 0):
    """Convert a result to JSON-safe data; raise _OutputCap past the output cap."""
    import datetime
    import decimal
    import fractions
    import math

    if depth > _TO_JSONABLE_DEPTH:
        raise OverflowError("result is nested too deeply")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if value.bit_length() > max_chars * 3.33:
            raise _OutputCap("integer result is longer than the output cap")
        # Integers longer than the interpreter's int/str conversion limit come back as
        # a decimal string, so that the service can always print them.
        if value.bit_length() <= 4300 * 3.32:
            return int(value)
        sys.set_int_max_str_digits(0)
        return str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, fractions.Fraction):
        if value.denominator == 1:
            return _to_jsonable(value.numerator, max_chars, depth + 1)
        return str(value)
    if isinstance(value, decimal.Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return _to_jsonable(int(value), max_chars, depth + 1)
        return str(value)
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return str(value)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out[str(_to_jsonable(key, max_chars, depth + 1))] = _to_jsonable(
                item, max_chars, depth + 1
            )
            if len(out) > max_chars:
                raise _OutputCap("result is longer than the output cap")
        return out
    if isinstance(value, list | tuple | range | set | frozenset):
        items = list(value)
        if len(items) > max_chars:
            raise _OutputCap("result is longer than the output cap")
        if isinstance(value, set | frozenset):
            try:
                items.sort()
            except TypeError:
                pass
        return [_to_jsonable(item, max_chars, depth + 1) for item in items]
    text = repr(value)
    if len(text) > max_chars:
        raise _OutputCap("result is longer than the output cap")
    return text


def python_sets_result(tree: ast.Module) -> bool:
    """Whether the program assigns a variable named `result` (at run time only a value
    the program's own namespace ends up holding counts, not a function's local)."""
    return any(
        isinstance(node, ast.Name) and node.id == "result" and isinstance(node.ctx, ast.Store)
        for node in ast.walk(tree)
    )


def _child_main(job: dict, write_fd: int, layers: dict) -> None:
    """Run one job in the forked child. Never returns: leaves through os._exit."""
    exit_ = os._exit
    write = os.write
    dumps = json.dumps
    max_chars = int(CONFIG["max_output_chars"])

    def emit(payload: dict) -> None:
        data = dumps(payload, ensure_ascii=False).encode("utf-8", "replace")
        view = memoryview(data)
        while view:
            written = write(write_fd, view)
            view = view[written:]
        exit_(0)

    chunks: list[str] = []
    size = [0]

    class CappedStdout:
        def write(self, text):
            text = str(text)
            if size[0] + len(text) > max_chars:
                chunks.append(text[: max_chars - size[0]])
                emit(
                    {
                        "status": "error",
                        "result": None,
                        "stdout": "".join(chunks),
                        "error": f"output exceeded {max_chars} characters",
                        "category": "output_limit",
                    }
                )
            chunks.append(text)
            size[0] += len(text)
            return len(text)

        def flush(self):
            return None

    sys.stdout = sys.stderr = CappedStdout()
    values = job["values"]
    namespace: dict = {"__name__": "__sandbox__"}
    if CONFIG["restricted"]:
        namespace["__builtins__"] = _safe_builtins()
    else:
        namespace["__builtins__"] = builtins
    namespace.update(values)
    status, result, error, category = "ok", None, None, None
    try:
        tree = ast.parse(job["code"], mode="exec")
        # services.toolspecs.PYTHON_ANSWER_RULE: the last line's value when it is an
        # expression that is not None, else the variable `result` the program set
        sets_result = python_sets_result(tree)
        tail = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            tail = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<sandbox>", "exec"), namespace)
        if tail is not None:
            ast.fix_missing_locations(tail)
            result = eval(compile(tail, "<sandbox>", "eval"), namespace)
        if result is None and sets_result and "result" in namespace:
            result = namespace["result"]
        result = _to_jsonable(result, max_chars)
        # The one measure of a result, here, in the worker and in the service: the
        # characters of its JSON text (non-ASCII characters count one each).
        if len(dumps(result, ensure_ascii=False)) > max_chars:
            raise _OutputCap("result is longer than the output cap")
    except _OutputCap as exc:  # raised only by the checks above, never by job code
        status, result = "error", None
        error = f"OverflowError: {exc}"
        category = "output_limit"
    # A job can raise MemoryError or RecursionError itself and be reported as having hit
    # that limit: both are ordinary limits (a tool_limit line, no alert), so the claim
    # gains it nothing that running out of memory or stack for real would not.
    except MemoryError:
        status, result, error, category = "error", None, "MemoryError: out of memory", "memory"
    except RecursionError as exc:
        status, result, category = "error", None, "recursion"
        error = f"RecursionError: {exc}"
    except BaseException as exc:
        status, result = "error", None
        try:
            error = f"{type(exc).__name__}: {exc}"[:2000]
        except BaseException:
            error = type(exc).__name__
    emit(
        {
            "status": status,
            "result": result,
            "stdout": "".join(chunks),
            "error": error,
            "category": category,
        }
    )


def _confine_child(result_fd: int, job_fd: int, devnull: int, layers: dict) -> None:
    """Apply the per-child layers to a freshly forked child of the zygote.

    Afterwards fd 3 is the result pipe (write end), fd 4 the job pipe (read end), fds 0-2
    are /dev/null and no other fd is open.
    """
    # Move the pipes above the range they end up in, so dup2 never clobbers one.
    result_fd, job_fd = os.dup2(result_fd, 1000), os.dup2(job_fd, 1001)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.dup2(result_fd, 3)
    os.dup2(job_fd, 4)
    os.closerange(5, 1 << 16)
    os.chdir("/")
    memory = int(CONFIG["memory_mb"]) * 1024 * 1024
    cpu_s = int(CONFIG["cpu_s"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (8, 8))
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    _drop_capabilities()
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # Inherited from the worker already; stated here so that it holds for each child
    # whatever its ancestors did: no ptrace or core dump of a job by a sibling.
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable")
    if layers["landlock"]:
        _install_landlock(layers["landlock"], layers["block_sockets"])
    if layers["seccomp"]:
        _install_seccomp(layers["block_sockets"])


def _fd_is_pipe(fd: int) -> bool:
    try:
        import stat

        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _read_job(fd: int) -> dict | None:
    data = bytearray()
    while chunk := os.read(fd, 1 << 16):
        data += chunk
    os.close(fd)
    return json.loads(data) if data else None


# --- the zygote: pid 1 of the worker's pid namespace ------------------------------------


class SetupError(Exception):
    """A mandatory isolation layer could not be set up."""


def _enter_empty_root() -> None:
    """Make an empty read-only tmpfs the root of a new mount namespace.

    The host's filesystem (and its /proc) is detached from this namespace, not hidden
    under it: nothing a child does can reach it again.
    """
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    # Any directory serves as the mount point (this namespace is private): the first one
    # that exists and that this uid may enter.
    for base in ("/tmp", "/dev", "/mnt", "/run"):
        if os.path.isdir(base) and os.access(base, os.X_OK):
            break
    else:
        raise SetupError("no directory to mount the sandbox root on (/tmp, /dev, /mnt, /run)")
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _check(
        _libc.mount(b"sandbox", base.encode(), b"tmpfs", flags, b"size=4k,nr_inodes=2,mode=0555"),
        f"mount tmpfs on {base}",
    )
    os.chdir(base)
    _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount the old root")
    os.chdir("/")
    _check(
        _libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, None),
        "remount the sandbox root read-only",
    )
    if os.listdir("/") or os.path.exists("/proc/self"):
        raise SetupError("the sandbox root is not empty")


def _fork_child(layers: dict, devnull: int) -> tuple[int, int, int, int]:
    """Fork a spare, confine it and return (pid, pidfd, job pipe, result pipe) of it."""
    job_r, job_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            _confine_child(result_w, job_r, devnull, layers)
        except BaseException as exc:
            try:
                # The result pipe is fd 3 once the confinement has moved it there.
                target = 3 if _fd_is_pipe(3) else result_w
                os.write(target, json.dumps({"setup_error": repr(exc)}).encode())
            finally:
                os._exit(71)
        try:
            job = _read_job(4)
        except BaseException:
            os._exit(73)
        if job is None:  # discarded before it got a job
            os._exit(0)
        if job.get("probe"):
            os.write(3, b'{"status": "ok", "result": null, "stdout": "", "error": null}')
            os._exit(0)
        _child_main(job, 3, layers)
        os._exit(72)
    os.close(job_r)
    os.close(result_w)
    return pid, os.pidfd_open(pid), job_w, result_r


def _zygote_main(sock: socket.socket, devnull: int) -> None:
    """Fork confined spares on request and report each one's exit. Never sees a job."""
    for fd in (0, 1, 2):  # nothing of the worker's channel to the service
        os.dup2(devnull, fd)
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _enter_empty_root()
        _libc.sethostname(b"sandbox", 7)
        if os.getpid() != 1:
            raise SetupError("the zygote is not pid 1 of a new pid namespace")
        gc.collect()
        gc.freeze()  # children then share these pages instead of copying them
        sock.send(json.dumps({"ready": True}).encode())
        children: dict[int, int] = {}  # pidfd -> pid
        while True:
            ready, _, _ = select.select([sock.fileno(), *children], [], [])
            for fd in ready:
                if fd != sock.fileno():
                    pid = children.pop(fd)
                    os.close(fd)
                    _, status = os.waitpid(pid, 0)
                    sock.send(json.dumps({"exit": pid, "status": status}).encode())
                    continue
                request = sock.recv(65536)
                if not request:  # the worker is gone: so is everything in this namespace
                    os._exit(0)
                pid, pidfd, job_w, result_r = _fork_child(json.loads(request)["fork"], devnull)
                message = json.dumps({"spare": pid}).encode()
                socket.send_fds(sock, [message], [job_w, result_r, pidfd])
                os.close(job_w)
                os.close(result_r)
                children[pidfd] = pid
    except BaseException as exc:
        try:
            sock.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        finally:
            os._exit(1)


class _Spare:
    """A child forked and confined ahead of its job, blocked reading the job from fd 4."""

    __slots__ = ("job_w", "pid", "pidfd", "result_r")

    def __init__(self, pid: int, pidfd: int, job_w: int, result_r: int) -> None:
        self.pid, self.pidfd, self.job_w, self.result_r = pid, pidfd, job_w, result_r

    def dead(self) -> bool:
        return bool(select.select([self.pidfd], [], [], 0)[0])

    def kill(self) -> None:
        """SIGKILL the child and wait until it has exited (the pidfd pins the process)."""
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        select.select([self.pidfd], [], [], 10.0)

    def close(self) -> None:
        for fd in (self.pidfd, self.job_w, self.result_r):
            try:
                os.close(fd)
            except OSError:
                pass


class ZygoteGone(Exception):
    """The zygote died or broke protocol: the worker cannot run jobs any more."""


class _Zygote:
    """The worker's end of the control socket to the zygote."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid  # in the worker's (the service's) pid namespace
        self.spares: deque[_Spare] = deque()
        self.statuses: dict[int, int | None] = {}  # exit statuses wanted, by child pid

    def _receive(self, timeout: float | None) -> bool:
        if not select.select([self.sock], [], [], timeout)[0]:
            return False
        data, fds, _, _ = socket.recv_fds(self.sock, 65536, 3)
        if not data:
            raise ZygoteGone("the zygote exited")
        message = json.loads(data)
        if "spare" in message and len(fds) == 3:
            pidfd, job_w, result_r = fds[2], fds[0], fds[1]
            self.spares.append(_Spare(int(message["spare"]), pidfd, job_w, result_r))
        elif "exit" in message and not fds:
            if message["exit"] in self.statuses:
                self.statuses[message["exit"]] = int(message["status"])
        else:
            for fd in fds:
                os.close(fd)
            raise ZygoteGone(str(message.get("error") or "the zygote broke protocol"))
        return True

    def wait_ready(self, timeout: float) -> None:
        if not select.select([self.sock], [], [], timeout)[0]:
            raise ZygoteGone("the zygote did not start")
        message = json.loads(self.sock.recv(65536) or b'{"error": "the zygote exited"}')
        if not message.get("ready"):
            raise ZygoteGone(str(message.get("error")))

    def request(self, layers: dict) -> None:
        self.sock.send(json.dumps({"fork": layers}).encode())

    def take(self, layers: dict) -> _Spare:
        """The next live spare (asking for a replacement of any that died waiting)."""
        while True:
            deadline = time.monotonic() + 10.0
            while not self.spares:
                if not self._receive(max(deadline - time.monotonic(), 0)):
                    raise ZygoteGone("the zygote did not fork a spare within 10 s")
            spare = self.spares.popleft()
            if not spare.dead():
                self.statuses[spare.pid] = None
                return spare
            spare.close()
            self.request(layers)

    def exit_status(self, pid: int, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.statuses.get(pid) is None:
            if not self._receive(max(deadline - time.monotonic(), 0)):
                return None
        return self.statuses.pop(pid)

    def forget(self, pid: int) -> None:
        self.statuses.pop(pid, None)

    def stop(self) -> None:
        """Kill the zygote (and so its namespace) and reap it, so its CPU time is counted."""
        for spare in self.spares:
            spare.close()
        self.sock.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ChildProcessError, ProcessLookupError):
            pass


def _start_zygote() -> _Zygote:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    devnull = os.open("/dev/null", os.O_RDWR)
    pid = os.fork()  # the first child after unshare(CLONE_NEWPID): pid 1 in there
    if pid == 0:
        ours.close()
        _zygote_main(theirs, devnull)
        os._exit(1)
    theirs.close()
    os.close(devnull)
    zygote = _Zygote(ours, pid)
    try:
        zygote.wait_ready(10.0)
    except ZygoteGone as exc:
        raise SetupError(
            f"cannot set up the sandbox's empty root: {exc} (in a container, AppArmor's "
            "default profile refuses mount, and kernel.apparmor_restrict_unprivileged_userns"
            "=1 leaves user namespaces without capabilities; see compose.yaml)"
        ) from exc
    return zygote


# --- the worker ----------------------------------------------------------------------


def _send(message: dict) -> None:
    try:
        data = json.dumps(message, ensure_ascii=False).encode() + b"\n"
    except UnicodeEncodeError:
        # A lone surrogate (from a "\\ud800" escape in a job's result) has no UTF-8
        # form. Only the job's 'done' carries text the job chose; the worker lives on.
        message = _BASE | {
            "status": "error",
            "error": "the job wrote text that is not well-formed Unicode",
            "category": "protocol",
        }
        data = json.dumps(message).encode() + b"\n"
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


class _Channel:
    """Job lines from the service on fd 0, read without buffering surprises for select."""

    def __init__(self) -> None:
        self.fd = 0
        self.buffer = bytearray()
        self.closed = False

    def fill(self) -> None:
        chunk = os.read(self.fd, 1 << 16)
        if chunk:
            self.buffer += chunk
        else:
            self.closed = True

    def readline(self) -> bytes | None:
        while b"\n" not in self.buffer:
            if self.closed:
                return None
            self.fill()
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        return line

    def take_cancel(self) -> bool:
        """Consume a complete cancel line already read (it may have come with the job)."""
        if b"\n" not in self.buffer:
            return False
        lines = bytes(self.buffer).split(b"\n")
        for index, line in enumerate(lines[:-1]):
            if _is_cancel(line):
                del lines[index]
                self.buffer = bytearray(b"\n".join(lines))
                return True
        return False

    def poll_cancel(self) -> bool:
        """Read what arrived while a job runs: True for a cancel line, or at EOF."""
        self.fill()
        return self.closed or self.take_cancel()


def _is_cancel(line: bytes) -> bool:
    try:
        message = json.loads(line)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("cancel") is True


def _run_job(job: dict, spare: _Spare, zygote: _Zygote, channel: _Channel | None) -> dict:
    """Hand the job to the spare child, watch it, and return the 'done' message.

    The child has exited (or was killed and has exited) when this returns.
    """
    pidfd, read_fd = spare.pidfd, spare.result_r
    deadline = time.monotonic() + float(job.get("timeout_s", 1.0))
    try:
        payload = json.dumps(job).encode()
        view = memoryview(payload)
        while view:
            view = view[os.write(spare.job_w, view) :]
    except BrokenPipeError:
        pass  # the child is gone; the loop below sees it exit
    finally:
        os.close(spare.job_w)
        spare.job_w = -1
    cap = 16 * int(CONFIG["max_output_chars"]) + 65536
    data = bytearray()
    killed_for = None
    eof = exited = False
    try:
        while not (eof and exited):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                killed_for = "timeout"
                break
            if channel is not None and channel.take_cancel():
                killed_for = "cancelled"
                break
            fds = [pidfd] if eof else [read_fd, pidfd]
            if channel is not None:
                fds.append(channel.fd)
            ready, _, _ = select.select(fds, [], [], remaining)
            if channel is not None and channel.fd in ready and channel.poll_cancel():
                killed_for = "cancelled"
                break
            if pidfd in ready:
                exited = True
            if read_fd in ready:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    eof = True
                else:
                    data += chunk
                    if len(data) > cap:
                        killed_for = "output_flood"
                        break
            if exited and not eof:
                # The child is gone, so the pipe has no writer left: drain it.
                os.set_blocking(read_fd, False)
                try:
                    while chunk := os.read(read_fd, 65536):
                        data += chunk
                        if len(data) > cap:
                            killed_for = "output_flood"
                            break
                except BlockingIOError:
                    pass
                eof = True
    finally:
        if killed_for is not None or not exited:
            spare.kill()
        spare.close()
    try:
        report = _report(data, killed_for)
    except Exception:  # whatever the job wrote, the worker answers and lives on
        report = _MALFORMED
    if report is None:  # no well-formed result: the exit status tells what happened
        report = _report_exit(data, zygote.exit_status(spare.pid, 5.0))
    zygote.forget(spare.pid)
    return report


_BASE = {"event": "done", "result": None, "stdout": "", "error": None, "category": None}
# What a child may report about its own run; anything else is a protocol violation.
# A limit comes only with status "error": "ok" has no category.
_CHILD_CATEGORIES = {"ok": (None,), "error": (None, "memory", "recursion", "output_limit")}
_MALFORMED = _BASE | {
    "status": "error",
    "error": "the job wrote a malformed result",
    "category": "protocol",
}


class _NotJSONData(ValueError):
    """Parseable, but not plain JSON data: a protocol violation, not a missing result."""


def _reject_constant(name: str) -> None:
    raise _NotJSONData(f"{name} is not JSON")  # NaN, Infinity, -Infinity


def _unique_keys(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # which one counts would depend on the parser
        raise _NotJSONData("duplicate key")
    return obj


def _too_deep(value: object, data: bytes | bytearray) -> bool:
    """Whether a result nests past _MAX_RESULT_DEPTH (dicts and lists).

    Text with fewer brackets than the bound cannot nest past it: that count runs at
    memchr speed, so only results with many brackets are walked (level by level).
    """
    if data.count(b"[") + data.count(b"{") <= _MAX_RESULT_DEPTH:
        return False
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > _MAX_RESULT_DEPTH:
            return True
        level = [
            item
            for container in level
            for item in (container.values() if isinstance(container, dict) else container)
            if isinstance(item, dict | list)
        ]
    return False


def _report(data: bytes | bytearray, killed_for: str | None) -> dict | None:
    """The 'done' message from what the child wrote, or None when it wrote no result."""
    if killed_for == "timeout":
        return _BASE | {"status": "timeout", "error": "wall-clock timeout", "category": "timeout"}
    if killed_for == "cancelled":
        return _BASE | {"status": "error", "error": "cancelled", "category": "cancelled"}
    if killed_for == "output_flood":
        return _BASE | {
            "status": "error",
            "error": "the job wrote past the output cap",
            "category": "output_flood",
        }
    try:
        # Strictly JSON data: no NaN or Infinity, no duplicate keys (_NotJSONData).
        payload = (
            json.loads(
                data.decode("utf-8", "replace"),
                parse_constant=_reject_constant,
                object_pairs_hook=_unique_keys,
            )
            if data
            else None
        )
    except _NotJSONData:
        return _MALFORMED
    except (ValueError, RecursionError):
        payload = None
    if not isinstance(payload, dict) or "status" not in payload:
        return None  # not a result at all: the exit status tells what happened
    max_chars = int(CONFIG["max_output_chars"])
    status, category = payload["status"], payload.get("category")
    stdout, error = payload.get("stdout") or "", payload.get("error")
    if (
        not isinstance(status, str)
        or category not in _CHILD_CATEGORIES.get(status, ())
        or not isinstance(stdout, str)
        or not (error is None or isinstance(error, str))
    ):
        return _MALFORMED
    result = payload.get("result") if status == "ok" else None
    if _too_deep(result, data):
        return _BASE | {
            "status": "error",
            "error": f"the job wrote a result nested deeper than {_MAX_RESULT_DEPTH}",
            "category": "protocol",
        }
    # Measured as the child measures it: characters of the JSON text.
    if len(stdout) > max_chars or len(json.dumps(result, ensure_ascii=False)) > max_chars:
        # The child's own checks refuse this; only code writing to the pipe gets here.
        return _BASE | {
            "status": "error",
            "error": "the job wrote a result past the output cap",
            "category": "output_flood",
        }
    return _BASE | {
        "status": status,
        "result": result,
        "stdout": stdout,
        "error": error,
        "category": category,
    }


def _report_exit(data: bytes | bytearray, wait_status: int | None) -> dict:
    if wait_status is not None and os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return _BASE | {
                "status": "timeout",
                "error": f"killed by {signal.Signals(sig).name} (CPU limit)",
                "category": "timeout",
            }
        if sig == signal.SIGSYS:
            return _BASE | {
                "status": "error",
                "error": "killed by SIGSYS: a system call the sandbox forbids",
                "category": "blocked_syscall",
            }
        return _BASE | {
            "status": "error",
            "error": f"killed by {signal.Signals(sig).name}",
            "category": "crash",
        }
    code = os.WEXITSTATUS(wait_status) if wait_status is not None else None
    try:
        payload = json.loads(data.decode("utf-8", "replace")) if data else None
    except (ValueError, RecursionError):
        payload = None
    detail = payload.get("setup_error") if isinstance(payload, dict) else None
    return _BASE | {
        "status": "error",
        "error": f"the job process ended without a result (exit {code}): {detail or ''}",
        "category": "crash",
    }


def _drop_root() -> int:
    """A worker started as root becomes uid/gid 65534 before it creates any namespace.

    The user namespace maps the worker's own uid, so this is what keeps jobs from
    running as root (kuid 0) on the host. Returns the uid jobs have on the host.
    """
    if os.geteuid() != 0:
        return os.geteuid()
    try:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    except PermissionError:  # root without CAP_SETUID; mapping uid 0 then fails below
        return 0
    # Changing uid made the process undumpable, which makes /proc/self/uid_map root's.
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    return NOBODY


def _enter_namespaces(netns: bool) -> dict:
    uid, gid = _drop_root(), os.getegid()
    flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
    if netns:
        flags |= CLONE_NEWNET
    if _libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise SetupError(
            f"cannot create the sandbox's namespaces: unshare(CLONE_NEWUSER|CLONE_NEWPID|"
            f"CLONE_NEWNS...) failed: {os.strerror(err)}. Unprivileged user namespaces are "
            "needed: check sysctl user.max_user_namespaces (> 0), "
            "kernel.unprivileged_userns_clone and kernel.apparmor_restrict_unprivileged_userns"
            " (0), and in a container the seccomp profile (Docker's default refuses "
            "CLONE_NEWUSER; see docker/seccomp/orchestrator.json)"
        )
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{NOBODY} {uid} 1"),
                           ("gid_map", f"{NOBODY} {gid} 1")):  # fmt: skip
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError as exc:
        hint = (
            " (mapping uid 0 needs CAP_SETFCAP: run the service as a non-root user, or as"
            " root with CAP_SETUID and CAP_SETGID so that the worker can become 65534)"
            if uid == 0
            else ""
        )
        raise SetupError(f"cannot map the sandbox's uid {uid}: {exc}{hint}") from exc
    # Other processes of this uid (on the host: the jobs' uid) cannot read this one's memory.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return {"userns": True, "pidns": True, "ipcns": True, "netns": netns, "host_uid": uid}


def _setup_worker() -> tuple[dict, _Zygote]:
    """Create the worker's namespaces and zygote; find out which per-child layers work."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(CONFIG["parent_pid"]):
        sys.exit(0)
    mode = CONFIG["network_isolation"]
    seccomp_ok = platform.machine() == "x86_64"
    if seccomp_ok:  # assembled once here, installed in every child
        _PROGRAMS[True] = _prepare_seccomp(True)
        _PROGRAMS[False] = _prepare_seccomp(False)
    landlock = _landlock_abi()
    layers = _enter_namespaces(netns=mode in ("auto", "netns"))
    zygote = _start_zygote()
    layers |= {
        "empty_root": True,
        "seccomp": seccomp_ok,
        "landlock": landlock,
        "block_sockets": mode in ("auto", "seccomp"),
    }
    for name in CONFIG.get("without", ()):  # tests: show what the other layers hold alone
        layers[name] = 0 if name == "landlock" else False
    return layers, zygote


def _probe(zygote: _Zygote, layers: dict) -> dict:
    zygote.request(layers)
    return _run_job({"probe": True, "timeout_s": 5.0}, zygote.take(layers), zygote, None)


def main() -> None:
    try:
        layers, zygote = _setup_worker()
    except (SetupError, ZygoteGone, OSError) as exc:
        _send({"event": "failed", "error": str(exc)})
        return
    try:
        dropped = _probe_layers(layers, zygote)
        zygote.request(layers)
        _send(
            {
                "event": "ready",
                "pid": os.getpid(),
                "zygote_pid": zygote.pid,
                "layers": layers,
                "dropped": dropped,
            }
        )
        _serve(layers, zygote)
    except SetupError as exc:
        _send({"event": "failed", "error": str(exc), "layers": layers})
    finally:
        zygote.stop()


def _probe_layers(layers: dict, zygote: _Zygote) -> dict:
    """Probe each optional per-child layer on its own, keep those the host allows, then
    probe the kept set together. Returns what was dropped and why (for the service's log).
    """
    baseline = dict(layers, landlock=0, seccomp=False)
    dropped = {}
    for name in ("landlock", "seccomp"):
        if not layers[name]:
            continue
        outcome = _probe(zygote, baseline | {name: layers[name]})
        if outcome["status"] != "ok":
            layers[name] = 0 if name == "landlock" else False
            dropped[name] = outcome.get("error")
    outcome = _probe(zygote, layers)
    if outcome["status"] != "ok":
        raise SetupError(f"a confined job child cannot start: {outcome.get('error')}")
    return dropped


def _serve(layers: dict, zygote: _Zygote) -> None:
    """Answer jobs until the service closes the channel."""
    channel = _Channel()
    while True:
        line = channel.readline()
        if line is None:
            return
        if _is_cancel(line):
            continue  # a cancel that arrived after its job was done
        try:
            job = json.loads(line)
            if not isinstance(job, dict):
                raise ValueError("not an object")
        except ValueError:
            _send(_BASE | {"status": "error", "error": "bad job", "category": "protocol"})
            continue
        spare = zygote.take(layers)
        zygote.request(layers)  # the next job's child is forked while this one runs
        _send({"event": "started"})
        _send(_run_job(job, spare, zygote, channel))
        if channel.closed:
            return


if __name__ == "__main__":
    main()
