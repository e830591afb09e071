"""Sandbox worker: run as `python -I -S _worker.py CONFIG_JSON`, never imported.

Standard library only, and it must stay that way: the worker is a clean interpreter
that never loads the service's modules. It reads one job per line (JSON) on stdin and
answers with JSON lines on stdout:

    {"event": "ready", "pid": ..., "layers": {...}}             once, after start-up
    {"event": "started", "pid": CHILD_PID}                      per job, right after fork
    {"event": "done", "status": ..., "result": ..., ...}        per job

Each job runs in a fresh child forked from this worker. Before any job code runs, the
child: joins its own process group, replaces fds 0-2 with /dev/null and closes every
other fd except its result pipe, chroots into an empty temporary directory (root only),
drops to uid/gid 65534 (root only), arms a parent-death SIGKILL, sets rlimits (address
space, CPU seconds, no new processes, no file writes, few fds, no core dumps), sets
no_new_privs and installs Landlock (no filesystem access; no TCP where sockets are
blocked) and a seccomp filter (no process creation, exec, ptrace, signals to others,
namespace or mount changes, file creation or modification, and no sockets where
sockets are blocked). The network namespace is created once, here, for the worker and
so for all its children. The worker never runs job code itself.
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
import shutil
import signal
import struct
import sys
import tempfile
import time
import types

CONFIG = json.loads(sys.argv[1])
NOBODY = 65534
_libc = ctypes.CDLL(None, use_errno=True)

# --- constants from <linux/...> -------------------------------------------------------
CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_RESTRICT_SELF = 446

# x86_64 syscall numbers refused with EPERM in the job child.
_X86_64_DENY = {
    # process creation and program execution
    "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
    # other processes
    "kill": 62, "tkill": 200, "tgkill": 234, "ptrace": 101, "process_vm_readv": 310,
    "process_vm_writev": 311, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
    # filesystem changes
    "creat": 85, "mkdir": 83, "mkdirat": 258, "rmdir": 84, "unlink": 87, "unlinkat": 263,
    "rename": 82, "renameat": 264, "renameat2": 316, "link": 86, "linkat": 265,
    "symlink": 88, "symlinkat": 266, "chmod": 90, "fchmod": 91, "fchmodat": 268,
    "chown": 92, "fchown": 93, "lchown": 94, "fchownat": 260, "truncate": 76,
    "ftruncate": 77, "mknod": 133, "mknodat": 259, "fallocate": 285, "utimensat": 280,
    "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197,
    # namespaces, mounts, privileges, kernel interfaces
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272,
    "setns": 308, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250,
    "add_key": 248, "request_key": 249, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "personality": 135, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "reboot": 169,
    "swapon": 167, "swapoff": 168, "acct": 163, "settimeofday": 164, "clock_settime": 227,
    "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173, "quotactl": 179,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "fanotify_init": 300,
    "move_mount": 429, "open_tree": 428, "fsopen": 430, "fsmount": 432, "fsconfig": 431,
    "mount_setattr": 442, "memfd_create": 319, "memfd_secret": 447,
}  # fmt: skip
_X86_64_SOCKET_CALLS = {"socket": 41, "socketpair": 53}
_X86_64_ENOSYS = {"clone3": 435, "openat2": 437}  # glibc falls back to clone/openat
_X86_64_OPEN = 2  # open(path, flags, mode): flags in args[1]
_X86_64_OPENAT = 257  # openat(dirfd, path, flags, mode): flags in args[2]
# O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_TMPFILE's __O_TMPFILE bit
_OPEN_WRITE_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000 | 0o20000000


def _bpf_program(block_sockets: bool) -> bytes:
    """Assemble the seccomp BPF filter for x86_64 (see the module docstring)."""
    ld_w_abs, jmp_jeq, jmp_jge, jmp_jset, ret_k = 0x20, 0x15, 0x35, 0x45, 0x06
    deny = dict(_X86_64_DENY)
    if block_sockets:
        deny.update(_X86_64_SOCKET_CALLS)
    # Instructions as (code, jt_label_or_0, jf_label_or_0, k); labels resolved below.
    prog: list[tuple[int, object, object, int]] = [
        (ld_w_abs, 0, 0, 4),  # A = seccomp_data.arch
        (jmp_jeq, 0, "kill", AUDIT_ARCH_X86_64),
        (ld_w_abs, 0, 0, 0),  # A = seccomp_data.nr
        (jmp_jge, "eperm", 0, 0x40000000),  # x32 ABI numbers
        (jmp_jeq, "open", 0, _X86_64_OPEN),
        (jmp_jeq, "openat", 0, _X86_64_OPENAT),
    ]
    prog += [(jmp_jeq, "enosys", 0, nr) for nr in sorted(_X86_64_ENOSYS.values())]
    prog += [(jmp_jeq, "eperm", 0, nr) for nr in sorted(deny.values())]
    labels: dict[str, int] = {}
    prog.append((ret_k, 0, 0, SECCOMP_RET_ALLOW))
    labels["eperm"] = len(prog)
    prog.append((ret_k, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM))
    labels["enosys"] = len(prog)
    prog.append((ret_k, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS))
    labels["kill"] = len(prog)
    prog.append((ret_k, 0, 0, SECCOMP_RET_KILL_PROCESS))
    labels["open"] = len(prog)
    prog.append((ld_w_abs, 0, 0, 16 + 8 * 1))  # low 32 bits of args[1]
    prog.append((jmp_jset, "+1", 0, _OPEN_WRITE_FLAGS))  # BPF jumps only forward
    prog.append((ret_k, 0, 0, SECCOMP_RET_ALLOW))
    prog.append((ret_k, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM))
    labels["openat"] = len(prog)
    prog.append((ld_w_abs, 0, 0, 16 + 8 * 2))  # low 32 bits of args[2]
    prog.append((jmp_jset, "+1", 0, _OPEN_WRITE_FLAGS))
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
    _libc.syscall.restype = ctypes.c_long
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
    """A copy of an allowed module without private names and without other modules.

    `fractions.sys`, `statistics.random`, `re.enum` ... would lead to `sys.modules`.
    """
    view = types.ModuleType(module.__name__)
    for attr, value in vars(module).items():
        if attr.startswith("_") or isinstance(value, types.ModuleType) or attr in _HIDDEN:
            continue
        setattr(view, attr, value)
    return view


_VIEWS = {name: _module_view(sys.modules[name]) for name in sorted(ALLOWED_MODULES)}


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level != 0 or name not in _VIEWS:
        raise ImportError(f"import of {name!r} is not allowed")
    return _VIEWS[name]


def _safe_builtins() -> dict:
    table = {name: getattr(builtins, name) for name in _SAFE_BUILTIN_NAMES}
    table["__import__"] = _guarded_import
    return table


def _to_jsonable(value, max_chars: int, depth: int = 0):
    """Convert a result to JSON-safe data; raise OverflowError past the output cap."""
    import datetime
    import decimal
    import fractions
    import math

    if depth > 50:
        raise OverflowError("result is nested too deeply")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if value.bit_length() > max_chars * 3.33:
            raise OverflowError("integer result is longer than the output cap")
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
                raise OverflowError("result is longer than the output cap")
        return out
    if isinstance(value, list | tuple | range | set | frozenset):
        items = list(value)
        if len(items) > max_chars:
            raise OverflowError("result is longer than the output cap")
        if isinstance(value, set | frozenset):
            try:
                items.sort()
            except TypeError:
                pass
        return [_to_jsonable(item, max_chars, depth + 1) for item in items]
    text = repr(value)
    if len(text) > max_chars:
        raise OverflowError("result is longer than the output cap")
    return text


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
        tail = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            tail = ast.Expression(tree.body.pop().value)
        assigns_result = any(
            isinstance(node, ast.Name) and node.id == "result" and isinstance(node.ctx, ast.Store)
            for node in ast.walk(tree)
        )
        exec(compile(tree, "<sandbox>", "exec"), namespace)
        if tail is not None:
            ast.fix_missing_locations(tail)
            result = eval(compile(tail, "<sandbox>", "eval"), namespace)
        if assigns_result and "result" in namespace:
            result = namespace["result"]
        result = _to_jsonable(result, max_chars)
        if len(dumps(result, ensure_ascii=False)) > max_chars:
            raise OverflowError("result is longer than the output cap")
    except MemoryError:
        status, result, error, category = "error", None, "MemoryError: out of memory", "memory"
    except RecursionError as exc:
        status, result, category = "error", None, "recursion"
        error = f"RecursionError: {exc}"
    except OverflowError as exc:
        status, result = "error", None
        error = f"OverflowError: {exc}"
        category = "output_limit" if "output cap" in str(exc) else None
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


def _confine_child(
    job_dir: str, result_fd: int, job_fd: int, layers: dict, worker_pid: int
) -> None:
    """Apply every layer to the freshly forked child.

    Afterwards fd 3 is the result pipe (write end), fd 4 the job pipe (read end), fds 0-2
    are /dev/null and no other fd is open.
    """
    os.setpgid(0, 0)
    devnull = os.open("/dev/null", os.O_RDWR)
    # Move the pipes above the range they end up in, so dup2 never clobbers one.
    result_fd, job_fd = os.dup(result_fd), os.dup(job_fd)
    result_fd, job_fd = os.dup2(result_fd, 1000), os.dup2(job_fd, 1001)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.dup2(result_fd, 3)
    os.dup2(job_fd, 4)
    os.closerange(5, 1 << 16)
    os.chdir(job_dir)
    if layers["chroot"]:
        os.chroot(job_dir)
        os.chdir("/")
    if layers["setuid"]:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if os.getppid() != worker_pid:
        os._exit(70)
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
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
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


def _send(message: dict) -> None:
    sys.stdout.buffer.write(json.dumps(message, ensure_ascii=False).encode() + b"\n")
    sys.stdout.buffer.flush()


class _Spare:
    """A child forked and confined ahead of its job, blocked reading the job from fd 4."""

    __slots__ = ("job_dir", "job_w", "pid", "pidfd", "result_r")

    def __init__(self, pid: int, pidfd: int, job_w: int, result_r: int, job_dir: str) -> None:
        self.pid, self.pidfd, self.job_w, self.result_r, self.job_dir = (
            pid,
            pidfd,
            job_w,
            result_r,
            job_dir,
        )

    def dead(self) -> bool:
        return bool(select.select([self.pidfd], [], [], 0)[0])


def _read_job(fd: int) -> dict | None:
    data = bytearray()
    while chunk := os.read(fd, 1 << 16):
        data += chunk
    os.close(fd)
    return json.loads(data) if data else None


def _prefork(layers: dict, worker_pid: int) -> _Spare:
    """Fork the child for the next job and confine it before it sees any job data.

    Taking the fork and the confinement off the job's path is what keeps a call cheap;
    every child still runs exactly one job, so nothing persists between jobs.
    """
    job_dir = tempfile.mkdtemp(prefix=f"job-{worker_pid}-", dir=CONFIG["tmp_root"])
    job_r, job_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(job_w)
            os.close(result_r)
            _confine_child(job_dir, result_w, job_r, layers, worker_pid)
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
        if job is None:  # the worker is shutting down
            os._exit(0)
        if job.get("probe"):
            os.write(3, b'{"status": "ok", "result": null, "stdout": "", "error": null}')
            os._exit(0)
        _child_main(job, 3, layers)
        os._exit(72)
    os.close(job_r)
    os.close(result_w)
    try:
        os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
    except OSError:
        pass
    return _Spare(pid, os.pidfd_open(pid), job_w, result_r, job_dir)


def _discard_spare(spare: _Spare) -> None:
    try:
        os.killpg(spare.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(spare.pid, 0)
    for fd in (spare.pidfd, spare.job_w, spare.result_r):
        try:
            os.close(fd)
        except OSError:
            pass
    _remove_dir(spare.job_dir)


def _remove_dir(path: str) -> None:
    try:
        os.rmdir(path)  # the child cannot create anything in it
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _run_job(job: dict, spare: _Spare) -> dict:
    """Hand the job to the spare child, watch it, and return the 'done' message."""
    pid, pidfd, read_fd = spare.pid, spare.pidfd, spare.result_r
    if not job.get("probe"):
        _send({"event": "started", "pid": pid})
    deadline = time.monotonic() + float(job.get("timeout_s", 1.0)) + 0.05
    try:
        payload = json.dumps(job).encode()
        view = memoryview(payload)
        while view:
            view = view[os.write(spare.job_w, view) :]
    except BrokenPipeError:
        pass  # the child is gone; the loop below sees it exit
    finally:
        os.close(spare.job_w)
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
            fds = [pidfd] if eof else [read_fd, pidfd]
            ready, _, _ = select.select(fds, [], [], remaining)
            if pidfd in ready:
                exited = True
            if read_fd in ready:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    eof = True
                else:
                    data += chunk
                    if len(data) > cap:
                        killed_for = "output_limit"
                        break
            if exited and not eof:
                # The child is gone, so the pipe has no writer left: drain it.
                os.set_blocking(read_fd, False)
                try:
                    while chunk := os.read(read_fd, 65536):
                        data += chunk
                        if len(data) > cap:
                            killed_for = "output_limit"
                            break
                except BlockingIOError:
                    pass
                eof = True
    finally:
        if killed_for is not None or not exited:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, wait_status = os.waitpid(pid, 0)
        os.close(pidfd)
        os.close(read_fd)
        _remove_dir(spare.job_dir)
    return _report(data, wait_status, killed_for)


def _report(data: bytes | bytearray, wait_status: int, killed_for: str | None) -> dict:
    base = {"event": "done", "result": None, "stdout": "", "error": None, "category": None}
    if killed_for == "timeout":
        return base | {"status": "timeout", "error": "wall-clock timeout", "category": "timeout"}
    if killed_for == "output_limit":
        return base | {
            "status": "error",
            "error": "output exceeded the cap",
            "category": "output_limit",
        }
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return base | {
                "status": "timeout",
                "error": f"killed by {signal.Signals(sig).name} (CPU or wall-clock limit)",
                "category": "timeout",
            }
        return base | {
            "status": "error",
            "error": f"killed by {signal.Signals(sig).name}",
            "category": "crash",
        }
    try:
        payload = json.loads(data.decode("utf-8", "replace")) if data else None
    except (ValueError, RecursionError):
        payload = None
    if not isinstance(payload, dict) or "status" not in payload:
        code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None
        detail = payload.get("setup_error") if isinstance(payload, dict) else None
        return base | {
            "status": "error",
            "error": f"the job process ended without a result (exit {code}): {detail or ''}",
            "category": "crash",
        }
    return base | {
        "status": payload["status"] if payload["status"] in ("ok", "error") else "error",
        "result": payload.get("result"),
        "stdout": str(payload.get("stdout") or ""),
        "error": payload.get("error"),
        "category": payload.get("category"),
    }


def _setup_worker() -> dict:
    """Create the worker-wide layers and find out which per-child layers this host allows."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(CONFIG["parent_pid"]):
        sys.exit(0)
    mode = CONFIG["network_isolation"]
    netns = False
    if mode in ("auto", "netns"):
        for flags in (CLONE_NEWNET | CLONE_NEWIPC, CLONE_NEWNET):
            if _libc.unshare(flags) == 0:
                netns = True
                break
    root = os.geteuid() == 0
    seccomp_ok = platform.machine() == "x86_64"
    if seccomp_ok:  # assembled once here, installed in every child
        _PROGRAMS[True] = _prepare_seccomp(True)
        _PROGRAMS[False] = _prepare_seccomp(False)
    return {
        "netns": netns,
        "chroot": root,
        "setuid": root,
        "seccomp": seccomp_ok,
        "landlock": _landlock_abi(),
        "block_sockets": mode in ("auto", "seccomp"),
    }


def main() -> None:
    layers = _setup_worker()
    worker_pid = os.getpid()

    def probe(candidate: dict) -> dict:
        return _run_job({"probe": True, "timeout_s": 5.0}, _prefork(candidate, worker_pid))

    # Probe each optional per-child layer on its own, keep those the host allows, then
    # probe the kept set together. What was dropped, and why, goes to the service's log.
    baseline = dict(layers, landlock=0, seccomp=False, chroot=False, setuid=False)
    dropped = {}
    for name in ("landlock", "seccomp", "chroot", "setuid"):
        if not layers[name]:
            continue
        outcome = probe(baseline | {name: layers[name]})
        if outcome["status"] != "ok":
            layers[name] = 0 if name == "landlock" else False
            dropped[name] = outcome.get("error")
    outcome = probe(layers)
    if outcome["status"] != "ok":
        _send({"event": "failed", "error": outcome.get("error"), "layers": layers})
        return
    gc.collect()
    gc.freeze()
    spare: _Spare | None = _prefork(layers, worker_pid)
    _send({"event": "ready", "pid": worker_pid, "layers": layers, "dropped": dropped})
    stdin = sys.stdin.buffer
    try:
        while True:
            line = stdin.readline()
            if not line:
                return
            try:
                job = json.loads(line)
            except ValueError:
                _send({"event": "done", "status": "error", "error": "bad job", "category": "crash"})
                continue
            if spare is None or spare.dead():
                if spare is not None:
                    _discard_spare(spare)
                spare = _prefork(layers, worker_pid)
            used, spare = spare, None
            _send(_run_job(job, used))
            spare = _prefork(layers, worker_pid)
    finally:
        if spare is not None:
            _discard_spare(spare)


if __name__ == "__main__":
    main()
