"""Deployment files checked without a Docker engine, a GPU or a cluster.

- compose.yaml through `docker-compose config` (1.29.2, its own venv: scripts/ci_tools.sh),
  with the required secrets given, and refused with their message when they are not;
- the Kubernetes manifests against the API schemas (kubernetes-validate, strict);
- the Dockerfiles, Filebeat config and Kibana export parsed and checked for what matters;
- the GPU check against fake nvidia-smi outputs, the PostgreSQL init script against the
  real local PostgreSQL, the model preparation against a synthetic checkpoint.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "POSTGRES_PASSWORD": "pg-" + "a" * 24,
    "REASON_READER_PASSWORD": "rd" + "b" * 24,
    "REDIS_PASSWORD": "rs" + "c" * 24,
    "ORCH_API_KEYS": '{"k3y-0123456789abcdefghij":"acme"}',
    "ELASTIC_PASSWORD": "el" + "d" * 24,
    "KIBANA_SYSTEM_PASSWORD": "kb" + "e" * 24,
    "GRAFANA_ADMIN_PASSWORD": "gf" + "f" * 24,
}


def tool(name: str) -> str:
    """Path of a CI tool, building its venv on first use (about a minute, once)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ci_tools.sh"), name],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode != 0:
        pytest.fail(f"scripts/ci_tools.sh {name} failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SECRETS and not k.startswith("COMPOSE_")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def compose_bin() -> str:
    return tool("compose")


def compose_config(
    compose_bin: str, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [compose_bin, "-f", str(ROOT / "compose.yaml"), *args, "config"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


# ---------------------------------------------------------------- compose


@pytest.mark.integration
def test_compose_config_is_valid_with_every_profile(compose_bin: str) -> None:
    out = compose_config(
        compose_bin,
        clean_env(**SECRETS),
        "--profile",
        "elk",
        "--profile",
        "prepare",
        "--profile",
        "monitoring",
    )
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    services = config["services"]
    assert {"planner", "verifier", "orchestrator", "redis", "postgres", "gpu-check"} <= set(
        services
    )
    assert {"elasticsearch", "kibana", "filebeat", "elk-setup"} <= set(services)
    assert {"prometheus", "grafana"} <= set(services)
    assert services["grafana"]["depends_on"]["prometheus"] == {"condition": "service_healthy"}
    grafana_env = services["grafana"]["environment"]
    assert grafana_env["GF_SECURITY_ADMIN_PASSWORD"] == SECRETS["GRAFANA_ADMIN_PASSWORD"]
    for name in ("prometheus", "grafana"):  # on the host's loopback only, as Kibana
        ports = services[name]["ports"]
        assert ports and all(
            (p["host_ip"] if isinstance(p, dict) else p).startswith("127.0.0.1") for p in ports
        ), ports

    def gpu_ids(name: str) -> list[str]:
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
        return devices[0]["device_ids"]

    assert gpu_ids("planner") == ["0"]
    assert gpu_ids("verifier") == ["1"]
    assert sorted(gpu_ids("gpu-check")) == ["0", "1"]
    for gpu_service in ("planner", "verifier"):
        assert services[gpu_service]["depends_on"]["gpu-check"] == {
            "condition": "service_completed_successfully"
        }
    assert {k: v["condition"] for k, v in services["orchestrator"]["depends_on"].items()} == {
        "planner": "service_healthy",
        "verifier": "service_healthy",
        "redis": "service_healthy",
        "postgres": "service_healthy",
    }
    orch_env = services["orchestrator"]["environment"]
    assert orch_env["ORCH_PLANNER_URL"] == "http://planner:8001"
    assert SECRETS["REDIS_PASSWORD"] in orch_env["ORCH_REDIS_URL"]
    assert orch_env["ORCH_DATABASE_URL"].startswith("postgresql://reason_reader:")
    assert json.loads(orch_env["ORCH_API_KEYS"]) == json.loads(SECRETS["ORCH_API_KEYS"])
    for name in ("planner", "verifier", "orchestrator"):
        assert "/readyz" in " ".join(services[name]["healthcheck"]["test"])
    # every volume mounted from the repository exists
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.get("source", "") if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith(str(ROOT)) and "models" not in source:
                assert Path(source).exists(), source
    # the elk and monitoring profiles only run with their profile
    plain = compose_config(compose_bin, clean_env(**SECRETS), "--services")
    assert not {"elasticsearch", "prometheus", "grafana"} & set(plain.stdout.split())


@pytest.mark.integration
@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_a_missing_secret_with_its_message(compose_bin: str, missing: str) -> None:
    env = {k: v for k, v in SECRETS.items() if k != missing}
    out = compose_config(compose_bin, clean_env(**env))
    assert out.returncode != 0
    assert f"set {missing}" in out.stderr, out.stderr


@pytest.mark.unit
def test_compose_keys_stay_within_what_both_compose_implementations_read() -> None:
    """No version key (obsolete in Compose v2) and no keys docker-compose 1.29 rejects."""
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert "version" not in doc
    for name, service in doc["services"].items():
        assert "start_interval" not in service.get("healthcheck", {}), name
        assert "develop" not in service and "models" not in service, name
        image = service.get("image", "")
        assert image and not image.endswith(":latest") and ":" in image, name


# ---------------------------------------------------------------- kubernetes


K8S_FILES = sorted(
    p for p in (ROOT / "deploy" / "k8s").glob("*.yaml") if p.name != "kustomization.yaml"
)


@pytest.fixture(scope="module")
def k8s_validate() -> str:
    return tool("k8s")


@pytest.mark.integration
def test_kubernetes_manifests_pass_strict_schema_validation(k8s_validate: str) -> None:
    out = subprocess.run(
        [k8s_validate, "--strict", "-k", "1.30.0", *map(str, K8S_FILES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("passed") >= 10


@pytest.mark.integration
def test_kubernetes_validation_catches_a_broken_manifest(k8s_validate: str, tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy/k8s/orchestrator.yaml").read_text()))
    docs[0]["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["prot"] = 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    out = subprocess.run(
        [k8s_validate, "--strict", "-k", "1.30.0", str(bad)], capture_output=True, text=True
    )
    assert out.returncode != 0


def load_k8s() -> dict[tuple[str, str], dict]:
    objects = {}
    for path in K8S_FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


@pytest.mark.unit
def test_kubernetes_gpu_requests_probes_hpa_and_secret_refs() -> None:
    objects = load_k8s()
    kustomize = yaml.safe_load((ROOT / "deploy/k8s/kustomization.yaml").read_text())
    assert sorted(kustomize["resources"]) == sorted(p.name for p in K8S_FILES)
    for name in ("planner", "verifier", "orchestrator"):
        deployment = objects[("Deployment", name)]
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert not container["image"].endswith(":latest")
        assert {"configMapRef": {"name": "reason-config"}} in container["envFrom"]
        assert (
            objects[("Service", name)]["spec"]["selector"]
            == deployment["spec"]["selector"]["matchLabels"]
        )
        gpus = container["resources"]["limits"].get("nvidia.com/gpu")
        assert gpus == (1 if name != "orchestrator" else None)
    hpa = objects[("HorizontalPodAutoscaler", "orchestrator")]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "orchestrator"
    assert hpa["spec"]["minReplicas"] >= 2
    orch_env = objects[("Deployment", "orchestrator")]["spec"]["template"]["spec"]["containers"][0][
        "env"
    ]
    secret_vars = {e["name"] for e in orch_env if "valueFrom" in e}
    assert secret_vars == {"ORCH_API_KEYS", "ORCH_REDIS_URL", "ORCH_DATABASE_URL"}
    assert objects[("Deployment", "planner")]["spec"]["replicas"] >= 2


# ---------------------------------------------------------------- python sandbox

SECCOMP_PROFILE = ROOT / "docker/seccomp/orchestrator.json"
# What the sandbox calls to build its namespaces and confine its jobs; the container
# profile must not refuse any of these (orchestrator/sandbox/_worker.py).
SANDBOX_CALLS = {
    "unshare", "mount", "umount2", "pivot_root", "sethostname", "clone", "seccomp",
    "prctl", "capset", "landlock_create_ruleset", "landlock_restrict_self", "pidfd_open",
    "pidfd_send_signal", "setresuid", "setresgid", "setgroups", "sendmsg", "recvmsg",
}  # fmt: skip
# What Docker's default profile refuses an unprivileged container and the orchestrator
# never needs: the profile must keep refusing these.
PRIVILEGED_CALLS = {
    "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "keyctl",
    "add_key", "request_key", "kexec_load", "init_module", "finit_module", "delete_module",
    "userfaultfd", "io_uring_setup", "open_by_handle_at", "setns", "acct", "swapon",
    "reboot", "settimeofday", "clock_settime", "iopl", "ioperm", "quotactl", "syslog",
}  # fmt: skip


def seccomp_denied(profile: dict) -> set[str]:
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    denied: set[str] = set()
    for rule in profile["syscalls"]:
        assert rule["action"] == "SCMP_ACT_ERRNO" and rule["errnoRet"] == 1, rule
        assert "args" not in rule and "includes" not in rule and "excludes" not in rule
        denied |= set(rule["names"])
    return denied


@pytest.mark.unit
def test_orchestrator_seccomp_profile_refuses_privileged_calls_but_not_the_sandboxs() -> None:
    denied = seccomp_denied(json.loads(SECCOMP_PROFILE.read_text()))
    assert SANDBOX_CALLS.isdisjoint(denied), SANDBOX_CALLS & denied
    assert PRIVILEGED_CALLS <= denied, PRIVILEGED_CALLS - denied


@pytest.mark.unit
def test_compose_gives_only_the_orchestrator_the_sandbox_profile() -> None:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    orchestrator = services["orchestrator"]
    options = orchestrator["security_opt"]
    assert "no-new-privileges:true" in options and "apparmor=unconfined" in options
    (seccomp,) = [o for o in options if o.startswith("seccomp")]
    assert (ROOT / seccomp.split("=", 1)[1]).resolve() == SECCOMP_PROFILE
    assert orchestrator["cap_drop"] == ["ALL"] and "cap_add" not in orchestrator
    assert not orchestrator.get("privileged") and "user" not in orchestrator
    for name, service in services.items():
        if name != "orchestrator":
            assert not any(
                o.startswith(("seccomp", "apparmor")) for o in service.get("security_opt", [])
            ), name


@pytest.mark.unit
def test_kubernetes_gives_the_orchestrator_the_same_profile() -> None:
    objects = load_k8s()
    for name in ("planner", "verifier", "orchestrator"):
        pod = objects[("Deployment", name)]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        profile = pod["securityContext"]["seccompProfile"]
        if name != "orchestrator":
            assert profile == {"type": "RuntimeDefault"}, name
            assert "appArmorProfile" not in container["securityContext"], name
            continue
        # The kubelet reads it from /var/lib/kubelet/seccomp/<localhostProfile>.
        assert profile == {"type": "Localhost", "localhostProfile": "reason/orchestrator.json"}
        assert container["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["securityContext"]["runAsUser"] != 0
    manifest = (ROOT / "deploy/k8s/orchestrator.yaml").read_text()
    assert "docker/seccomp/orchestrator.json" in manifest
    assert "/var/lib/kubelet/seccomp/reason/orchestrator.json" in manifest


def syscall_numbers() -> dict[str, int]:
    header = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    if platform.machine() != "x86_64" or not header.exists():
        pytest.skip("needs x86_64 and its syscall table (linux-libc-dev)")
    return {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+) (\d+)", header.read_text())}


def compile_profile(denied: set[str]) -> bytes:
    """The profile as the runtime applies it on x86_64: a BPF filter, default allow.

    Names the architecture lacks are skipped, as runc does.
    """
    numbers = syscall_numbers()
    nrs = sorted(numbers[name] for name in denied if name in numbers)
    ld_nr, jeq, ret = (0x20, 0, 0, 0), 0x15, 0x06
    prog = [ld_nr]
    for index, nr in enumerate(nrs):
        prog.append((jeq, len(nrs) - index, 0, nr))  # to the EPERM return after the ALLOW
    prog += [(ret, 0, 0, 0x7FFF0000), (ret, 0, 0, 0x00050000 | 1)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in prog)


_UNDER_PROFILE = r"""
import asyncio, ctypes, sys
from orchestrator.sandbox import Sandbox, SandboxSettings, SandboxUnavailableError

class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

code = bytes.fromhex(sys.argv[1])
buf = ctypes.create_string_buffer(code, len(code))
libc = ctypes.CDLL(None)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # no_new_privs, as the container has
fprog = Fprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0  # inherited by every worker

async def main():
    sandbox = Sandbox(SandboxSettings(workers=1))
    try:
        await sandbox.start()
    except SandboxUnavailableError as exc:
        print("refused:", exc)
        return
    outcome = await sandbox.run("6 * 7", {}, 5.0)
    await sandbox.close()
    print(outcome.status, outcome.result)

asyncio.run(main())
"""


def run_under(denied: set[str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _UNDER_PROFILE, compile_profile(denied).hex()],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.integration
def test_the_sandbox_runs_under_the_orchestrator_seccomp_profile() -> None:
    denied = seccomp_denied(json.loads(SECCOMP_PROFILE.read_text()))
    assert run_under(denied) == "ok 42"
    # The same filter with unshare refused, as under the runtime's default profile: the
    # sandbox refuses to start (so the run above did go through the filter).
    refused = run_under(denied | {"unshare"})
    assert refused.startswith("refused:") and "namespaces" in refused, refused


# ---------------------------------------------------------------- dockerfiles


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))


@pytest.mark.unit
def test_there_is_an_image_per_service() -> None:
    assert [p.name for p in DOCKERFILES] == [
        "orchestrator.Dockerfile",
        "planner.Dockerfile",
        "verifier.Dockerfile",
    ]


@pytest.mark.unit
@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_is_non_root_healthchecked_pinned_and_multi_stage(path: Path) -> None:
    instructions = dockerfile_instructions(path)
    args = {}
    for word, rest in instructions:
        if word == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            args[key] = value
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert len(froms) >= 2, "multi-stage: a build stage and a runtime stage"
    for base in froms:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), base.split()[0])
        if image in ("build",) or "$" in image:
            continue
        assert ":" in image and not image.endswith(":latest"), image
        assert re.search(r":\d+\.\d+", image), f"{image}: pin a version tag"
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    health = [rest for word, rest in instructions if word == "HEALTHCHECK"]
    assert len(health) == 1 and "/readyz" in health[0]
    # every pip install pins its packages (==) or installs a hash-locked file
    for word, rest in instructions:
        if word != "RUN" or "pip install" not in rest:
            continue
        for command in rest.split("&&"):
            if "pip install" not in command:
                continue
            if "--require-hashes" in command:
                continue
            packages = [
                tok.strip("\"'")
                for tok in command.split("pip install", 1)[1].split()
                if not tok.startswith("-") and not tok.startswith("/tmp/")
            ]
            for package in packages:
                assert "==" in package or package.startswith("huggingface-hub>="), (
                    f"{path.name}: unpinned {package}"
                )
    copies = " ".join(rest for word, rest in instructions if word == "COPY")
    assert "tests" not in copies and ". /app" not in copies


SERVICES = {"orchestrator": 8000, "planner": 8001, "verifier": 8002}


@pytest.mark.unit
@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_launch_path_runs_the_service_under_services_serve(service: str) -> None:
    # services.serve adds the header-size and header-read-time bounds plain uvicorn lacks
    instructions = dockerfile_instructions(ROOT / "docker" / f"{service}.Dockerfile")
    cmd = json.loads([rest for word, rest in instructions if word == "CMD"][-1])
    assert cmd[1:4] == ["-m", "services.serve", service], cmd
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert cmd[cmd.index("--port") + 1] == str(SERVICES[service])
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"][service]
    assert "command" not in compose and "entrypoint" not in compose
    for doc in yaml.safe_load_all((ROOT / "deploy/k8s" / f"{service}.yaml").read_text()):
        if doc and doc.get("kind") == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                assert "command" not in container and "args" not in container


@pytest.mark.unit
def test_orchestrator_lock_covers_the_project_dependencies() -> None:
    import tomllib

    lock = (ROOT / "docker/requirements/orchestrator.txt").read_text()
    pinned = {
        m.group(1).lower().replace("_", "-"): m.group(2)
        for m in re.finditer(
            r"^([A-Za-z0-9_.-]+)==(\S+) \\\n\s+--hash=sha256:[0-9a-f]{64}", lock, re.M
        )
    }
    entries = [line for line in lock.splitlines() if line and not line.startswith(("#", " "))]
    assert len(entries) == len(pinned), "every entry is name==version with a sha256"
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        name = re.match(r"[A-Za-z0-9_.-]+", dep).group(0).lower().replace("_", "-")
        assert name in pinned, f"{name} is missing from the lock: run scripts/lock_requirements.py"


@pytest.mark.unit
def test_dockerignore_keeps_secrets_models_and_venvs_out_of_the_context() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for pattern in ("**/.git", "**/.venv", ".env", "models/", "logs/", "tests/"):
        assert pattern in ignored


# ---------------------------------------------------------------- elk


@pytest.mark.unit
def test_filebeat_decodes_the_ecs_json_lines_of_the_shared_log_volume() -> None:
    config = yaml.safe_load((ROOT / "docker/elk/filebeat.yml").read_text())
    (inp,) = config["filebeat.inputs"]
    assert inp["type"] == "filestream" and inp["id"]
    assert inp["paths"] == ["/var/log/reason/*.jsonl"]
    (parser,) = [p["ndjson"] for p in inp["parsers"] if "ndjson" in p]
    assert parser["target"] == ""  # ECS fields at the root: trace.id, not json.trace.id
    assert parser["overwrite_keys"] is True  # the line's own @timestamp wins
    assert parser["expand_keys"] is True  # "log.level" becomes log.level
    assert parser["add_error_key"] is True
    assert config["output.elasticsearch"]["index"].startswith("reason-logs-")
    assert config["setup.template.pattern"] == "reason-logs-*"
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    mounts = compose["services"]["filebeat"]["volumes"]
    assert "logs:/var/log/reason:ro" in mounts
    for name in ("planner", "verifier", "orchestrator"):
        assert "logs:/var/log/reason" in compose["services"][name]["volumes"]
        prefix = {"orchestrator": "ORCH"}.get(name, name.upper())
        assert compose["services"][name]["environment"][f"{prefix}_LOG_DIR"] == "/var/log/reason"


@pytest.mark.unit
def test_kibana_export_has_a_trace_lookup_saved_search() -> None:
    lines = (ROOT / "docker/elk/kibana-saved-objects.ndjson").read_text().splitlines()
    objects = [json.loads(line) for line in lines]
    summary = objects[-1]
    assert summary["exportedCount"] == len(objects) - 1 and summary["missingRefCount"] == 0
    by_type = {o["type"]: o for o in objects[:-1]}
    data_view = by_type["index-pattern"]
    assert data_view["attributes"]["title"] == "reason-logs-*"
    assert data_view["attributes"]["timeFieldName"] == "@timestamp"
    search = by_type["search"]
    attrs = search["attributes"]
    assert "trace.id" in attrs["columns"] and "service.name" in attrs["columns"]
    assert attrs["sort"] == [["@timestamp", "asc"]]
    source = json.loads(attrs["kibanaSavedObjectMeta"]["searchSourceJSON"])
    assert source["query"]["language"] == "kuery"
    assert source["query"]["query"].startswith("trace.id")
    (ref,) = search["references"]
    assert ref["name"] == source["indexRefName"] and ref["id"] == data_view["id"]
    setup = (ROOT / "docker/elk/elk-setup.sh").read_text()
    assert "/api/saved_objects/_import?overwrite=true" in setup and "kbn-xsrf" in setup


# ---------------------------------------------------------------- gpu check


def fake_smi(tmp_path: Path, rows: str | None, status: int = 0) -> dict[str, str]:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{rows or ''}\nEOF\nexit {status}\n")
    smi.chmod(0o755)
    return clean_env(NVIDIA_SMI=str(smi))


def gpu_check(env: dict[str, str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_check.sh")],
        capture_output=True,
        text=True,
        env={**env, **extra},
        timeout=30,
    )


TWO_L4 = "0, NVIDIA L4, 580.82.07, 8.9, 23034\n1, NVIDIA L4, 580.82.07, 8.9, 23034"


@pytest.mark.unit
def test_gpu_check_passes_on_two_recent_gpus(tmp_path: Path) -> None:
    out = gpu_check(fake_smi(tmp_path, TWO_L4))
    assert out.returncode == 0, out.stderr
    assert "GPU 1 NVIDIA L4: compute capability 8.9" in out.stdout


@pytest.mark.unit
@pytest.mark.parametrize(
    ("rows", "extra", "message"),
    [
        (TWO_L4.replace("580.82.07", "550.54.15"), {}, "driver 550.54.15 is older than 580.65.06"),
        ("0, NVIDIA L4, 580.82.07, 8.9, 23034", {}, "found 1 GPU(s), need 2"),
        (
            TWO_L4.replace("1, NVIDIA L4, 580.82.07, 8.9", "1, Tesla V100, 580.82.07, 7.0"),
            {},
            "compute capability 7.0",
        ),
        (TWO_L4.replace("8.9, 23034\n1", "8.9, 4096\n1"), {}, "has 4096 MiB"),
        (TWO_L4, {"REQUIRED_GPUS": "two"}, "positive integer"),
        ("", {}, "lists no GPUs"),
        ("garbage", {}, "unexpected nvidia-smi output"),
    ],
)
def test_gpu_check_refuses_with_a_clear_message(
    tmp_path: Path, rows: str, extra: dict[str, str], message: str
) -> None:
    out = gpu_check(fake_smi(tmp_path, rows), **extra)
    assert out.returncode == 1
    assert message in out.stderr, out.stderr


@pytest.mark.unit
def test_gpu_check_without_nvidia_smi_or_with_a_failing_one(tmp_path: Path) -> None:
    out = gpu_check(clean_env(NVIDIA_SMI=str(tmp_path / "absent")))
    assert out.returncode == 1 and "nvidia-smi not found" in out.stderr
    out = gpu_check(fake_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate", 9))
    assert out.returncode == 1 and "nvidia-smi failed" in out.stderr


@pytest.mark.unit
def test_gpu_check_one_gpu_box_with_required_gpus_1(tmp_path: Path) -> None:
    out = gpu_check(fake_smi(tmp_path, "0, NVIDIA A10G, 580.65.06, 8.6, 23028"), REQUIRED_GPUS="1")
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------- postgres init


def psql(*args: str, db: str = "postgres", user: str = "postgres", check: bool = True):
    return subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", user, "-d", db, "-v", "ON_ERROR_STOP=1", "-qtA", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


@pytest.mark.integration
def test_postgres_init_loads_the_seed_and_makes_a_read_only_role() -> None:
    if shutil.which("psql") is None or psql("-c", "select 1", check=False).returncode != 0:
        pytest.skip("local PostgreSQL is not reachable")
    suffix = uuid.uuid4().hex[:8]
    db, role = f"reason_init_{suffix}", f"reason_reader_{suffix}"
    psql("-c", f"CREATE DATABASE {db}")
    try:
        env = clean_env(
            PGHOST="127.0.0.1",
            POSTGRES_USER="postgres",
            POSTGRES_DB=db,
            READER_ROLE=role,
            SEED_FILE=str(ROOT / "orchestrator/data/seed.sql"),
            REASON_READER_PASSWORD="p'w\"; DROP ROLE postgres; --",
        )
        script = str(ROOT / "docker/postgres/10-reason-data.sh")
        for _ in range(2):  # idempotent
            out = subprocess.run(
                ["bash", script], capture_output=True, text=True, env=env, timeout=60
            )
            assert out.returncode == 0, out.stderr
        tables = psql(
            "-c",
            "select count(*) from information_schema.tables where table_schema='reason_data'",
            db=db,
        )
        assert int(tables.stdout) >= 1
        # ... the tables and columns the planner is told of (services.toolspecs.SQL)
        from services.toolspecs import SQL_SCHEMA, SQL_TABLES

        columns = psql(
            "-c",
            "select table_name, string_agg(column_name, ',' order by ordinal_position) "
            f"from information_schema.columns where table_schema = '{SQL_SCHEMA}' "
            "group by table_name",
            db=db,
        ).stdout.split()
        provisioned = dict(line.split("|") for line in columns)
        assert provisioned == {t: ",".join(c) for t, c in SQL_TABLES.items()}
        # the reader can read, in its schema by default ...
        first_table = psql(
            "-c",
            "select table_name from information_schema.tables where table_schema='reason_data' order by 1 limit 1",
            db=db,
        ).stdout.strip()
        assert psql("-c", f"select count(*) from {first_table}", db=db, user=role).returncode == 0
        # ... and cannot write, even when it switches its session to read-write
        for sql in (
            f"insert into {first_table} default values",
            f"begin read write; delete from {first_table}; commit",
            "set default_transaction_read_only = off; create table reason_data.x (i int)",
            "set default_transaction_read_only = off; create table public.x (i int)",
            "set default_transaction_read_only = off; create temp table x (i int)",
        ):
            out = psql("-c", sql, db=db, user=role, check=False)
            assert out.returncode != 0, sql
            assert "read-only" in out.stderr or "permission denied" in out.stderr, out.stderr
        # the hostile password was stored as a password, not run as SQL
        assert (
            psql("-c", "select count(*) from pg_roles where rolname='postgres'").stdout.strip()
            == "1"
        )
        settings = psql("-c", f"select rolconfig from pg_roles where rolname='{role}'").stdout
        assert "default_transaction_read_only=on" in settings
        assert "statement_timeout=5000ms" in settings and "lock_timeout=1000ms" in settings
        # the same role settings the SQL tool's own `db init` gives the reader
        from orchestrator.provisioning import ROLE_SETTINGS, ROLE_TEMP_FILE_LIMIT

        for name, value in (*ROLE_SETTINGS, ("temp_file_limit", ROLE_TEMP_FILE_LIMIT)):
            assert f"{name}={value}" in settings, (name, value, settings)
        # a role membership granted later is taken away by the next run
        psql("-c", f"GRANT pg_read_all_data TO {role}")
        out = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        members = psql(
            "-c", f"select count(*) from pg_auth_members where member = '{role}'::regrole"
        )
        assert members.stdout.strip() == "0"
    finally:
        psql("-c", f"DROP DATABASE IF EXISTS {db}", check=False)
        psql("-c", f"DROP ROLE IF EXISTS {role}", check=False)


# ---------------------------------------------------------------- model preparation


def write_safetensors(path: Path, tensors: dict[str, int], truncate: int = 0) -> None:
    header, offset = {}, 0
    for name, nbytes in tensors.items():
        header[name] = {"dtype": "U8", "shape": [nbytes], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x01" * (offset - truncate))


def fake_awq(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(
        json.dumps(
            {"model_type": "phi3", "quantization_config": {"quant_method": "awq", "bits": 4}}
        )
    )
    (directory / "tokenizer.json").write_text("{}")
    write_safetensors(directory / "model-00001-of-00002.safetensors", {"a.qweight": 64})
    write_safetensors(directory / "model-00002-of-00002.safetensors", {"b.qweight": 32})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "a.qweight": "model-00001-of-00002.safetensors",
                    "b.qweight": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    return directory


def prepare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts/prepare_models.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.unit
def test_prepare_planner_from_a_local_awq_checkpoint(tmp_path: Path) -> None:
    src, dest = fake_awq(tmp_path / "src"), tmp_path / "models"
    out = prepare("planner", "--dest", str(dest), "--planner-from", str(src))
    assert out.returncode == 0, out.stderr
    target = dest / "phi-3.5-mini-instruct-awq"
    manifest = json.loads((target / ".reason-manifest.json").read_text())
    assert manifest["facts"] == {"quantization": "awq", "tensors": 2}
    assert set(manifest["files"]) == {p.name for p in src.iterdir()}
    # a second run finds it prepared and copies nothing
    out = prepare("planner", "--dest", str(dest), "--planner-from", str(src))
    assert out.returncode == 0 and "already prepared" in out.stdout
    assert prepare("planner", "--dest", str(dest), "--verify-only").returncode == 0
    # a changed byte is caught at start
    shard = target / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x02")
    out = prepare("planner", "--dest", str(dest), "--verify-only")
    assert out.returncode == 1 and "sha256" in out.stderr
    assert not list(dest.glob(".phi-3.5*")), "no staging directories left behind"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: write_safetensors(
                d / "model-00001-of-00002.safetensors", {"a.qweight": 64}, truncate=10
            ),
            "outside the file",
        ),
        (lambda d: (d / "model-00002-of-00002.safetensors").unlink(), "missing"),
        (
            lambda d: (d / "config.json").write_text(json.dumps({"model_type": "phi3"})),
            "not a 4-bit AWQ",
        ),
        (
            lambda d: (d / "config.json").write_text(
                json.dumps(
                    {
                        "model_type": "llama",
                        "quantization_config": {"quant_method": "awq", "bits": 4},
                    }
                )
            ),
            "model_type 'llama'",
        ),
        (lambda d: (d / "tokenizer.json").unlink(), "tokenizer"),
    ],
)
def test_prepare_refuses_broken_or_wrong_checkpoints(tmp_path: Path, mutate, message: str) -> None:
    src = fake_awq(tmp_path / "src")
    mutate(src)
    out = prepare("planner", "--dest", str(tmp_path / "models"), "--planner-from", str(src))
    assert out.returncode == 1
    assert message in out.stderr, out.stderr
    assert not (tmp_path / "models" / "phi-3.5-mini-instruct-awq").exists()


@pytest.mark.unit
def test_prepare_verifier_base_and_adapter(tmp_path: Path) -> None:
    base, adapter = tmp_path / "tinyllama", tmp_path / "adapter"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (base / "tokenizer.model").write_bytes(b"sp")
    write_safetensors(base / "model.safetensors", {"w": 16})
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps(
            {"peft_type": "LORA", "base_model_name_or_path": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}
        )
    )
    write_safetensors(adapter / "adapter_model.safetensors", {"lora_A": 8, "lora_B": 8})
    dest = tmp_path / "models"
    out = prepare(
        "verifier", "--dest", str(dest), "--base-from", str(base), "--adapter-from", str(adapter)
    )
    assert out.returncode == 0, out.stderr
    assert prepare("verifier", "--dest", str(dest), "--verify-only").returncode == 0
    assert prepare("planner", "--dest", str(dest), "--verify-only").returncode == 1


@pytest.mark.unit
def test_prepare_from_the_hub_is_refused_offline(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/prepare_models.py"),
            "planner",
            "--dest",
            str(tmp_path),
            "--planner-repo",
            "org/phi-awq",
        ],
        capture_output=True,
        text=True,
        env=clean_env(HF_HUB_OFFLINE="1"),
        timeout=60,
    )
    assert out.returncode == 1 and "HF_HUB_OFFLINE" in out.stderr
