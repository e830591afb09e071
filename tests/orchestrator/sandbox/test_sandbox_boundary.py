"""The process boundary on its own: the static check and restricted builtins are OFF.

The `raw_sandbox` fixture runs code with full builtins and with `socket`, `ctypes`,
`subprocess`, `pickle`, `marshal` and `threading` already imported in the worker, as an
attacker who got past the static check would have them. Everything here must still be
contained by the forked, confined child.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import pytest

from orchestrator.sandbox import Sandbox, SandboxSettings

pytestmark = [pytest.mark.security, pytest.mark.asyncio(loop_scope="module")]


def _exists(path: str) -> bool:
    return os.path.exists(path)


async def _run(sb: Sandbox, code: str, timeout_s: float = 5.0) -> Any:
    outcome = await sb.run(code, {}, timeout_s)
    return outcome


async def test_layers_reported(raw_sandbox: Sandbox, job_uid: int) -> None:
    """The namespace layer is always in force, whatever the service's privileges."""
    layers = raw_sandbox.layers
    for name in ("userns", "pidns", "ipcns", "netns", "empty_root", "service_undumpable"):
        assert layers[name] is True, (name, layers)
    assert layers["host_uid"] == job_uid
    if os.uname().machine == "x86_64":
        assert layers["seccomp"] and layers["block_sockets"], layers


async def test_code_really_runs_unrestricted(raw_sandbox: Sandbox, check_clean: Any) -> None:
    # Proof that the static check is off: a dunder walk runs instead of being refused.
    outcome = await _run(raw_sandbox, "len(().__class__.__bases__[0].__subclasses__()) > 10")
    assert outcome.status == "ok" and outcome.result is True
    await check_clean(raw_sandbox)


async def test_reading_files_fails(raw_sandbox: Sandbox, check_clean: Any) -> None:
    for path in ("/etc/passwd", "/proc/self/environ", "/work/main/pyproject.toml"):
        outcome = await _run(raw_sandbox, f"open({path!r}).read()")
        assert outcome.status == "error", outcome
        assert outcome.result is None
        assert "root:" not in (outcome.error or "")
    outcome = await _run(raw_sandbox, "import os\nos.listdir('/')")
    assert outcome.status == "error" and "PermissionError" in (outcome.error or ""), outcome
    await check_clean(raw_sandbox)


async def test_writing_files_fails(raw_sandbox: Sandbox, check_clean: Any) -> None:
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
    await check_clean(raw_sandbox)


async def test_no_new_processes(raw_sandbox: Sandbox, check_clean: Any) -> None:
    marker = f"/tmp/sandbox-escape-{uuid.uuid4().hex}"
    # Process creation and exec are tripwires: the job is killed and the attempt reported.
    for code in (
        "import os\nos.fork()",
        f"import os\nos.system('touch {marker}')",
        "import ctypes\nctypes.CDLL(None).fork()",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'id'])",
        "import threading\nthreading.Thread(target=print).start()",
    ):
        outcome = await _run(raw_sandbox, code)
        assert (outcome.status, outcome.category) == ("error", "blocked_syscall"), (code, outcome)
    # subprocess fails earlier: it cannot even create its pipes.
    outcome = await _run(raw_sandbox, "import subprocess\nsubprocess.run(['id'])")
    assert outcome.status == "error" and "PermissionError" in (outcome.error or ""), outcome
    assert not _exists(marker)
    await check_clean(raw_sandbox)


async def test_no_signals_to_other_processes(raw_sandbox: Sandbox, check_clean: Any) -> None:
    for target in ("os.getppid()", "1", str(os.getpid())):
        outcome = await _run(raw_sandbox, f"import os\nos.kill({target}, 9)")
        assert outcome.status == "error", outcome
    await check_clean(raw_sandbox)


async def test_no_network(raw_sandbox: Sandbox, check_clean: Any) -> None:
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
    await check_clean(raw_sandbox)


async def test_network_namespace_alone_blocks_network() -> None:
    """With sockets allowed by seccomp, the empty network namespace still stops a connect."""
    sb = Sandbox(
        SandboxSettings(workers=1, network_isolation="netns"),
        _ast_check=False,
        _preload=("socket",),
    )
    await sb.start()
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
        assert "Network is unreachable" in (outcome.error or ""), outcome
    finally:
        await sb.close()


async def test_environment_not_inherited(raw_sandbox: Sandbox, check_clean: Any) -> None:
    outcome = await _run(raw_sandbox, "import os\ndict(os.environ)")
    assert outcome.status == "ok"
    # Only what the interpreter sets for itself (locale coercion), nothing of ours.
    assert set(outcome.result) <= {"LC_CTYPE"}, outcome.result
    outcome = await _run(raw_sandbox, "import os\n[os.getuid(), os.getgid(), os.getcwd()]")
    if os.geteuid() == 0:
        assert outcome.result == [65534, 65534, "/"], outcome
    await check_clean(raw_sandbox)


async def test_no_inherited_file_descriptors(raw_sandbox: Sandbox, check_clean: Any) -> None:
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
    await check_clean(raw_sandbox)


async def test_privileges_cannot_be_regained(raw_sandbox: Sandbox, check_clean: Any) -> None:
    for code in (
        "import os\nos.setuid(0)",
        "import os\nos.chroot('/')",
        "import ctypes\nctypes.CDLL(None).unshare(0x40000000)",
    ):
        outcome = await _run(raw_sandbox, code)
        assert outcome.status == "error" or outcome.result == -1, (code, outcome)
    await check_clean(raw_sandbox)


async def test_memory_bombs_contained(raw_sandbox: Sandbox, check_clean: Any) -> None:
    outcome = await _run(raw_sandbox, "bytearray(10**10)")
    assert outcome.status == "error" and outcome.category == "memory", outcome
    outcome = await _run(raw_sandbox, "x = b'a' * (512 * 1024 * 1024)")
    assert outcome.status == "error" and outcome.category == "memory", outcome
    await check_clean(raw_sandbox)


async def test_cpu_and_sleep_contained(raw_sandbox: Sandbox, check_clean: Any) -> None:
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
    await check_clean(raw_sandbox)


async def test_crashes_contained(raw_sandbox: Sandbox, check_clean: Any) -> None:
    outcome = await _run(raw_sandbox, "import ctypes\nctypes.string_at(0)")
    assert outcome.status == "error" and outcome.category == "crash", outcome
    # abort() signals the process itself with tgkill, which the allowlist does not allow.
    outcome = await _run(raw_sandbox, "import os\nos.abort()")
    assert outcome.status == "error" and outcome.category == "blocked_syscall", outcome
    outcome = await _run(raw_sandbox, "import os\nos._exit(3)")
    assert outcome.status == "error" and outcome.category == "crash", outcome
    await check_clean(raw_sandbox)


def _forged(result: str) -> str:
    """Code that writes `result` (Python source of a dict) as its answer, then exits."""
    return f"import os, json\nos.write(3, json.dumps({result}).encode())\nos._exit(0)"


async def test_raw_output_flood_contained(raw_sandbox: Sandbox, check_clean: Any) -> None:
    # Writing straight to the result pipe, past the cap.
    outcome = await _run(
        raw_sandbox, "import os\nwhile True:\n    os.write(3, b'x' * 65536)", timeout_s=3.0
    )
    assert outcome.status == "error" and outcome.category == "output_flood", outcome
    for forged, category in (
        # A forged result larger than the cap, written before the child's own checks run.
        ("{'status': 'ok', 'result': ['x' * 1000] * 50}", "output_flood"),
        # A forged result claiming an ordinary limit is a protocol violation, not a limit.
        ("{'status': 'error', 'category': 'timeout'}", "protocol"),
    ):
        outcome = await _run(raw_sandbox, _forged(forged))
        assert (outcome.status, outcome.category) == ("error", category), outcome
    # Forged garbage on the result pipe is reported as a crash, not parsed as a result.
    outcome = await _run(raw_sandbox, "import os\nos.write(3, b'not json')\nos._exit(0)")
    assert outcome.status == "error" and outcome.category == "crash", outcome
    await check_clean(raw_sandbox)


async def test_pickle_and_marshal_stay_inside(raw_sandbox: Sandbox, check_clean: Any) -> None:
    payload = "import pickle\npickle.loads(b\"cos\\nsystem\\n(S'id'\\ntR.\")"
    outcome = await _run(raw_sandbox, payload)
    # os.system ran inside the child, and its fork killed the child.
    assert (outcome.status, outcome.category) == ("error", "blocked_syscall"), outcome
    outcome = await _run(
        raw_sandbox,
        "import marshal\nexec(marshal.loads(marshal.dumps(compile('open(\"/etc/passwd\")', 'x', 'exec'))))",
    )
    assert outcome.status == "error", outcome
    await check_clean(raw_sandbox)
