"""The process boundary on its own: the static check and restricted builtins are OFF.

The `raw_sandbox` fixture runs code with full builtins and with `socket`, `ctypes`,
`subprocess`, `pickle`, `marshal` and `threading` already imported in the worker, as an
attacker who got past the static check would have them. Everything here must still be
contained by the forked, confined child.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

from orchestrator.sandbox import Sandbox, SandboxSettings

pytestmark = [pytest.mark.security, pytest.mark.asyncio(loop_scope="module")]


REPO = Path(__file__).resolve().parents[3]


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _listing(path: Path) -> list[str]:
    return os.listdir(path)


async def _run(sb: Sandbox, code: str, timeout_s: float = 5.0) -> Any:
    outcome = await sb.run(code, {}, timeout_s)
    return outcome


def _effective_capabilities() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("\nCapEff:")[1].split()[0], 16)


async def test_layers_reported(raw_sandbox: Sandbox) -> None:
    """Every layer the host permits is in force (all of them as root with full caps)."""
    layers = raw_sandbox.layers
    caps = _effective_capabilities()
    cap_setuid, cap_sys_chroot, cap_sys_admin = 1 << 7, 1 << 18, 1 << 21
    if caps & cap_sys_admin:
        assert layers["netns"], layers
    if caps & cap_sys_chroot:
        assert layers["chroot"], layers
    if caps & cap_setuid and os.geteuid() == 0:
        assert layers["setuid"], layers
    if os.uname().machine == "x86_64":
        assert layers["seccomp"] and layers["block_sockets"], layers
    assert layers["seccomp"] or layers["netns"]


async def test_code_really_runs_unrestricted(
    raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any
) -> None:
    # Proof that the static check is off: a dunder walk runs instead of being refused.
    outcome = await _run(raw_sandbox, "len(().__class__.__bases__[0].__subclasses__()) > 10")
    assert outcome.status == "ok" and outcome.result is True
    await check_clean(raw_sandbox, tmp_root)


async def test_reading_files_fails(raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any) -> None:
    for path in ("/etc/passwd", "/proc/self/environ", "/work/main/pyproject.toml"):
        outcome = await _run(raw_sandbox, f"open({path!r}).read()")
        assert outcome.status == "error", outcome
        assert outcome.result is None
        assert "root:" not in (outcome.error or "")
    outcome = await _run(raw_sandbox, "import os\nos.listdir('/')")
    assert outcome.status == "error" and "PermissionError" in (outcome.error or ""), outcome
    await check_clean(raw_sandbox, tmp_root)


async def test_writing_files_fails(raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any) -> None:
    target = f"/tmp/sandbox-escape-{uuid.uuid4().hex}"
    for code in (
        f"open({target!r}, 'w').write('x')",
        "open('relative.txt', 'w').write('x')",
        "import os\nos.mkdir('d')",
        f"import os\nos.open({target!r}, os.O_CREAT | os.O_WRONLY)",
    ):
        outcome = await _run(raw_sandbox, code)
        assert outcome.status == "error", (code, outcome)
    assert not _exists(target)
    await check_clean(raw_sandbox, tmp_root)


async def test_no_new_processes(raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any) -> None:
    marker = f"/tmp/sandbox-escape-{uuid.uuid4().hex}"
    outcome = await _run(raw_sandbox, "import os\nos.fork()")
    assert outcome.status == "error" and "PermissionError" in (outcome.error or ""), outcome
    outcome = await _run(raw_sandbox, "import subprocess\nsubprocess.run(['id'])")
    assert outcome.status == "error", outcome
    outcome = await _run(raw_sandbox, f"import os\nos.system('touch {marker}')")
    assert outcome.status == "ok" and outcome.result != 0, outcome
    outcome = await _run(raw_sandbox, "import ctypes\nctypes.CDLL(None).fork()")
    assert outcome.status == "ok" and outcome.result == -1, outcome
    outcome = await _run(raw_sandbox, "import os\nos.execv('/bin/sh', ['sh', '-c', 'id'])")
    assert outcome.status == "error", outcome
    outcome = await _run(raw_sandbox, "import threading\nthreading.Thread(target=print).start()")
    assert outcome.status == "error", outcome
    assert not _exists(marker)
    await check_clean(raw_sandbox, tmp_root)


async def test_no_signals_to_other_processes(
    raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any
) -> None:
    for target in ("os.getppid()", "1", str(os.getpid())):
        outcome = await _run(raw_sandbox, f"import os\nos.kill({target}, 9)")
        assert outcome.status == "error", outcome
    await check_clean(raw_sandbox, tmp_root)


async def test_no_network(raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any) -> None:
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "s.settimeout(1)\n"
        "s.connect(('127.0.0.1', 6379))\n"
        "'connected'"
    )
    outcome = await _run(raw_sandbox, code)
    assert outcome.status == "error", outcome
    outcome = await _run(raw_sandbox, "import socket\nsocket.getaddrinfo('example.com', 80)")
    assert outcome.status == "error", outcome
    outcome = await _run(
        raw_sandbox, "import socket\nsocket.socket(socket.AF_UNIX).connect('\\0x')"
    )
    assert outcome.status == "error", outcome
    await check_clean(raw_sandbox, tmp_root)


async def test_network_namespace_alone_blocks_network(tmp_path: Path) -> None:
    """With sockets allowed by seccomp, the empty network namespace still stops a connect."""
    sb = Sandbox(
        SandboxSettings(workers=1, network_isolation="netns"),
        _ast_check=False,
        _preload=("socket",),
        _tmp_root=str(tmp_path),
    )
    try:
        await sb.start()
    except Exception as exc:  # pragma: no cover - depends on the host
        pytest.skip(f"no network namespace here: {exc}")
    try:
        # A listener the service side can reach, on loopback of the host namespace.
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            port = server.getsockname()[1]
            outcome = await sb.run(
                f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))", {}, 5.0
            )
        assert outcome.status == "error", outcome
        assert (
            "unreachable" in (outcome.error or "").lower()
            or "refused" in (outcome.error or "").lower()
        ), outcome
    finally:
        await sb.close()


async def test_environment_not_inherited(
    raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any
) -> None:
    outcome = await _run(raw_sandbox, "import os\ndict(os.environ)")
    assert outcome.status == "ok"
    # Only what the interpreter sets for itself (locale coercion), nothing of ours.
    assert set(outcome.result) <= {"LC_CTYPE"}, outcome.result
    outcome = await _run(raw_sandbox, "import os\n[os.getuid(), os.getgid(), os.getcwd()]")
    if os.geteuid() == 0:
        assert outcome.result == [65534, 65534, "/"], outcome
    await check_clean(raw_sandbox, tmp_root)


async def test_no_inherited_file_descriptors(
    raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any
) -> None:
    code = (
        "import os\n"
        "open_fds = []\n"
        "for fd in range(64):\n"
        "    try:\n"
        "        os.fstat(fd)\n"
        "        open_fds.append(fd)\n"
        "    except OSError:\n"
        "        pass\n"
        "[open_fds, os.read(0, 10)]"
    )
    outcome = await _run(raw_sandbox, code)
    assert outcome.status == "ok", outcome
    # 0-2 are /dev/null, 3 is the result pipe; stdin reads nothing.
    assert outcome.result[0] == [0, 1, 2, 3]
    assert outcome.result[1] == "b''"
    await check_clean(raw_sandbox, tmp_root)


async def test_privileges_cannot_be_regained(
    raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any
) -> None:
    for code in (
        "import os\nos.setuid(0)",
        "import os\nos.chroot('/')",
        "import ctypes\nctypes.CDLL(None).unshare(0x40000000)",
    ):
        outcome = await _run(raw_sandbox, code)
        assert outcome.status == "error" or outcome.result == -1, (code, outcome)
    await check_clean(raw_sandbox, tmp_root)


async def test_memory_bombs_contained(
    raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any
) -> None:
    outcome = await _run(raw_sandbox, "bytearray(10**10)")
    assert outcome.status == "error" and outcome.category == "memory", outcome
    outcome = await _run(raw_sandbox, "x = b'a' * (512 * 1024 * 1024)")
    assert outcome.status == "error" and outcome.category == "memory", outcome
    await check_clean(raw_sandbox, tmp_root)


async def test_cpu_and_sleep_contained(
    raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any
) -> None:
    outcome = await _run(raw_sandbox, "while True:\n    pass", timeout_s=0.5)
    assert outcome.status == "timeout" and outcome.category == "timeout", outcome
    outcome = await _run(raw_sandbox, "import time\ntime.sleep(30)", timeout_s=0.5)
    assert outcome.status == "timeout", outcome
    assert outcome.latency_ms < 3000
    # Ignoring SIGXCPU does not outlive the hard CPU limit or the wall-clock kill.
    outcome = await _run(
        raw_sandbox,
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
        timeout_s=4.0,
    )
    assert outcome.status == "timeout", outcome
    await check_clean(raw_sandbox, tmp_root)


async def test_crashes_contained(raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any) -> None:
    outcome = await _run(raw_sandbox, "import ctypes\nctypes.string_at(0)")
    assert outcome.status == "error" and outcome.category == "crash", outcome
    outcome = await _run(raw_sandbox, "import os\nos.abort()")
    assert outcome.status == "error" and outcome.category == "crash", outcome
    outcome = await _run(raw_sandbox, "import os\nos._exit(3)")
    assert outcome.status == "error" and outcome.category == "crash", outcome
    await check_clean(raw_sandbox, tmp_root)


async def test_raw_output_flood_contained(
    raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any
) -> None:
    # Writing straight to the result pipe, past the cap.
    outcome = await _run(
        raw_sandbox, "import os\nwhile True:\n    os.write(3, b'x' * 65536)", timeout_s=3.0
    )
    assert outcome.status == "error" and outcome.category == "output_limit", outcome
    # A forged result larger than the cap, written before the child's own checks run.
    forged = (
        "import os, json\n"
        "os.write(3, json.dumps({'status': 'ok', 'result': ['x' * 1000] * 50}).encode())\n"
        "os._exit(0)"
    )
    outcome = await _run(raw_sandbox, forged)
    assert outcome.status == "error" and outcome.category == "output_limit", outcome
    # Forged garbage on the result pipe is reported as a crash, not parsed as a result.
    outcome = await _run(raw_sandbox, "import os\nos.write(3, b'not json')\nos._exit(0)")
    assert outcome.status == "error" and outcome.category == "crash", outcome
    await check_clean(raw_sandbox, tmp_root)


async def test_pickle_and_marshal_stay_inside(
    raw_sandbox: Sandbox, tmp_root: Path, check_clean: Any
) -> None:
    payload = "import pickle\npickle.loads(b\"cos\\nsystem\\n(S'id'\\ntR.\")"
    outcome = await _run(raw_sandbox, payload)
    # os.system ran inside the child and could not start a shell.
    assert outcome.status == "ok" and outcome.result != 0, outcome
    outcome = await _run(
        raw_sandbox,
        "import marshal\nexec(marshal.loads(marshal.dumps(compile('open(\"/etc/passwd\")', 'x', 'exec'))))",
    )
    assert outcome.status == "error", outcome
    await check_clean(raw_sandbox, tmp_root)


_NO_CAPS_SCRIPT = """
import asyncio, json, sys
from orchestrator.sandbox import Sandbox, SandboxSettings

async def main():
    sb = Sandbox(SandboxSettings(workers=1), _ast_check=False, _preload=("socket",),
                 _tmp_root=sys.argv[1])
    await sb.start()
    out = {"layers": sb.layers}
    for name, code in [
        ("read", "open('/etc/passwd').read()"),
        ("list", "import os\\nos.listdir('/')"),
        ("write", "open('x', 'w')"),
        ("connect", "import socket\\nsocket.socket().connect(('127.0.0.1', 6379))"),
        ("fork", "import os\\nos.fork()"),
        ("ok", "1 + 1"),
    ]:
        r = await sb.run(code, {}, 5.0)
        out[name] = [r.status, r.result, r.error]
    await sb.close()
    print(json.dumps(out))

asyncio.run(main())
"""


@pytest.mark.slow
async def test_without_capabilities_the_fallback_layers_hold(tmp_path: Path) -> None:
    """As in a container without CAP_SYS_ADMIN: no namespace, no chroot, no setuid."""
    import shutil
    import sys

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop every capability")
    repo = REPO
    proc = await asyncio.create_subprocess_exec(
        "setpriv", "--bounding-set=-all", "--inh-caps=-all",
        sys.executable, "-c", _NO_CAPS_SCRIPT, str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=repo, env={"PYTHONPATH": str(repo), "PATH": os.environ.get("PATH", "")},
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    out = json.loads(stdout.decode().strip().splitlines()[-1])
    layers = out["layers"]
    assert not layers["netns"] and not layers["chroot"] and not layers["setuid"]
    assert layers["seccomp"] and layers["block_sockets"]
    for name in ("read", "list", "write", "connect", "fork"):
        assert out[name][0] == "error", (name, out[name])
    assert out["ok"][:2] == ["ok", 2]
    assert _listing(tmp_path) == []
