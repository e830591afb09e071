"""The namespace layer: jobs of an unprivileged service cannot reach the service.

Production runs the orchestrator as an unprivileged uid with every capability dropped;
CI runs as root. The tests here run the service side in a subprocess that is such an
unprivileged uid (dropping to 65534 itself when the tests run as root), so the path
production takes is the path tested. They also show that a job never sees another job's
data, and that the sandbox refuses to start where it cannot isolate jobs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from orchestrator.sandbox import Sandbox, SandboxSettings

pytestmark = [pytest.mark.security, pytest.mark.asyncio(loop_scope="module")]

REPO = Path(__file__).resolve().parents[3]

# The service side, as an unprivileged process holding a secret in its environment.
_SERVICE_SCRIPT = r"""
import asyncio, ctypes, json, os, subprocess, sys
import structlog
from orchestrator.sandbox import Sandbox, SandboxSettings

structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
if os.geteuid() == 0:
    # Become what production runs: uid 65534, no capabilities, no new privileges. The
    # imports above are done: the interpreter's own directory may be closed to 65534.
    libc = ctypes.CDLL(None, use_errno=True)
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: as a service started as 65534 would be
    if not os.access(sys.executable, os.X_OK):
        sys.executable = sys.argv[1]  # the worker needs the standard library only
assert open("/proc/self/status").read().split("CapEff:")[1].split()[0] == "0" * 16

async def main():
    me = os.getpid()
    probe = f'''
import os
seen = {{"pid": os.getpid(), "ppid": os.getppid(), "proc": os.path.exists("/proc/{me}")}}
for name, path in (("root", "/"), ("proc_list", "/proc")):
    try:
        seen[name] = os.listdir(path)
    except OSError as exc:
        seen[name] = type(exc).__name__
try:
    seen["environ"] = open("/proc/{me}/environ", "rb").read().decode("latin-1")
except OSError as exc:
    seen["environ"] = type(exc).__name__
seen
'''
    out = {"service_uid": os.geteuid()}
    for label, without in (("all_layers", ()), ("namespaces_alone", ("landlock", "seccomp"))):
        try:
            sb = Sandbox(SandboxSettings(workers=1), _ast_check=False,
                         **({"_without": without} if without else {}))
            await sb.start()
        except Exception as exc:
            out[label] = {"status": "not started", "error": repr(exc)}
            continue
        try:
            r = await sb.run(probe, {}, 10.0)
            out[label] = {"layers": sb.layers, "status": r.status, "seen": r.result,
                          "error": r.error}
        finally:
            await sb.close()
    # Another process of the same uid, outside any sandbox, cannot read it either.
    cat = subprocess.run(["cat", f"/proc/{me}/environ"], capture_output=True)
    out["same_uid_cat"] = [cat.returncode, cat.stdout.decode("latin-1")]
    print(json.dumps(out))

asyncio.run(main())
"""


def _python_for_uid_65534() -> str | None:
    """An interpreter uid 65534 can run (the worker needs the standard library only)."""
    for path in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(path).exists() and _open_to_others(Path(path), 0o001):
            return path
    return None


def _open_to_others(path: Path, bits: int) -> bool:
    """Every directory above `path` may be entered by others, and `path` has `bits`."""
    resolved = path.resolve()
    if any(not parent.stat().st_mode & 0o001 for parent in resolved.parents):
        return False
    return bool(resolved.stat().st_mode & bits)


async def test_jobs_of_an_unprivileged_service_cannot_see_or_read_it() -> None:
    if os.geteuid() == 0:
        python = _python_for_uid_65534()
        if python is None:
            pytest.skip("no Python interpreter here that uid 65534 may execute")
        if not _open_to_others(REPO / "orchestrator" / "sandbox" / "_worker.py", 0o004):
            pytest.skip(f"uid 65534 cannot read {REPO}")
    else:
        python = sys.executable
    secret = f"service-secret-{uuid.uuid4().hex}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SERVICE_SCRIPT, python,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd="/",
        env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", ""),
             "SERVICE_SECRET": secret},
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    out = json.loads(stdout.decode().strip().splitlines()[-1])
    assert out["service_uid"] != 0
    for label in ("all_layers", "namespaces_alone"):
        run = out[label]
        assert run["status"] == "ok", run
        seen = run["seen"]
        assert secret not in json.dumps(run)
        # Its own pid namespace: the zygote is pid 1, the job a low pid, the service absent.
        assert seen["ppid"] == 1 and 1 < seen["pid"] < 100, seen
        assert seen["proc"] is False, seen
        assert run["layers"]["userns"] and run["layers"]["pidns"] and run["layers"]["empty_root"]
        assert run["layers"]["host_uid"] == out["service_uid"]
    # With every layer, opening anything is refused (Landlock, then seccomp)...
    seen = out["all_layers"]["seen"]
    assert seen["root"] == seen["proc_list"] == seen["environ"] == "PermissionError", seen
    # ...and without Landlock and seccomp the empty root still has nothing to open.
    seen = out["namespaces_alone"]["seen"]
    assert seen["root"] == [], seen
    assert seen["proc_list"] == seen["environ"] == "FileNotFoundError", seen
    # The service made itself undumpable: same-uid processes cannot read its environment.
    returncode, text = out["same_uid_cat"]
    assert returncode != 0 and secret not in text


_REFUSE_SCRIPT = r"""
import asyncio, ctypes, struct, sys
from orchestrator.sandbox import Sandbox, SandboxSettings, SandboxUnavailableError

def block_unshare():
    # What Docker's default seccomp profile does to unshare() without CAP_SYS_ADMIN.
    prog = [(0x20, 0, 0, 0), (0x15, 0, 1, 272), (0x06, 0, 0, 0x00050000 | 1),
            (0x06, 0, 0, 0x7FFF0000)]
    code = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(code, len(code))
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Fprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0
    assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0

async def main():
    if sys.argv[1] == "seccomp":
        block_unshare()
    try:
        await Sandbox(SandboxSettings(workers=1)).start()
    except SandboxUnavailableError as exc:
        print(exc)
        return
    print("STARTED")

asyncio.run(main())
"""


async def _refusal(*prefix: str, mode: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        *prefix, sys.executable, "-c", _REFUSE_SCRIPT, mode,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")},
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    return stdout.decode().strip().splitlines()[-1]


async def test_refuses_to_start_without_user_namespaces() -> None:
    """Where unshare(CLONE_NEWUSER) is refused (Docker's default profile), no jobs run."""
    message = await _refusal(mode="seccomp")
    assert message != "STARTED"
    assert "cannot create the sandbox's namespaces" in message, message
    assert "docker/seccomp/orchestrator.json" in message, message


async def test_root_without_capabilities_refuses_to_start() -> None:
    """Root without CAP_SETUID cannot become 65534, and may not map uid 0: no jobs run."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root, and setpriv to drop every capability")
    message = await _refusal("setpriv", "--bounding-set=-all", "--inh-caps=-all", mode="plain")
    assert message != "STARTED"
    assert "cannot map the sandbox's uid 0" in message and "CAP_SETFCAP" in message, message


@pytest_asyncio.fixture(loop_scope="module")
async def one_worker() -> AsyncIterator[Sandbox]:
    """Raw mode (no static check, full builtins), one worker: every job on the same one."""
    sb = Sandbox(SandboxSettings(workers=1), _ast_check=False)
    await sb.start()
    try:
        yield sb
    finally:
        await sb.close()


# Looks through everything the job's interpreter holds: every object the collector
# tracks, and the locals of every frame on the stack (the fork point included).
_SCAN = r"""
import gc, re, sys
pattern = re.compile("tenant" + "A-[0-9a-f]{32}")
found = set()

def look(value, depth=0):
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("latin-1")
    if isinstance(value, str):
        found.update(pattern.findall(value))
    elif depth < 4 and isinstance(value, dict):
        for key, item in list(value.items()):
            look(key, depth + 1)
            look(item, depth + 1)
    elif depth < 4 and isinstance(value, list | tuple | set | frozenset):
        for item in list(value):
            look(item, depth + 1)

for obj in gc.get_objects() + gc.get_referents(*gc.get_objects()):
    look(obj)
frame = sys._getframe()
while frame is not None:
    look(dict(frame.f_locals))
    frame = frame.f_back
sorted(found)
"""


async def test_a_job_never_sees_the_previous_job(one_worker: Sandbox) -> None:
    secret_code, secret_value = (f"tenantA-{uuid.uuid4().hex}" for _ in range(2))
    first = await one_worker.run(
        f"secret = {secret_code!r}\nresult = [len(secret), len(s1[0])]",
        {"s1": [secret_value, {"nested": [secret_value]}]},
        5.0,
    )
    assert first.status == "ok" and first.result == [len(secret_code), len(secret_value)]
    for _ in range(2):  # the next job, and the one after it (the spare forked meanwhile)
        second = await one_worker.run(_SCAN, {}, 10.0)
        assert second.status == "ok", second
        assert second.result == [], second


async def test_job_children_hold_no_capability_in_their_namespace() -> None:
    """Without seccomp and Landlock, the dropped capabilities still stop mounts and maps."""
    sb = Sandbox(
        SandboxSettings(workers=1), _ast_check=False, _preload=("ctypes",),
        _without=("landlock", "seccomp"),
    )  # fmt: skip
    await sb.start()
    try:
        code = (
            "import ctypes, os, struct\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "header = ctypes.create_string_buffer(struct.pack('=Ii', 0x20080522, 0))\n"
            "data = ctypes.create_string_buffer(24)\n"
            "assert libc.syscall(125, header, data) == 0\n"  # capget
            "mounted = libc.mount(b'none', b'/', b'tmpfs', 0, None)\n"
            "[data.raw.hex(), mounted, ctypes.get_errno(), os.listdir('/')]"
        )
        outcome = await sb.run(code, {}, 5.0)
        assert outcome.status == "ok", outcome
        # No effective, permitted or inheritable capability; the mount is refused (EPERM).
        assert outcome.result == ["00" * 24, -1, 1, []], outcome
    finally:
        await sb.close()
