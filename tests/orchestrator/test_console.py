"""The web console's files at `/`: served with their security headers, nothing else of
the package served, the vendored library as published, and `GET /console/config`."""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.app import create_app
from orchestrator.cache import Cache
from orchestrator.console import CONSOLE_DIR, CSP
from orchestrator.tools.registry import ToolRegistry
from services.schemas import ConsoleConfig, ReasonOptions
from services.settings import OrchestratorSettings

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DAGRE_SHA256 = "54a503e346f93ca0bb10abe7999587e037262935687aca45eb4e4b0f64bbb578"
KEY = "console-test-key-0123456789"


async def no_tools(s: OrchestratorSettings, cache: Cache, stack: AsyncExitStack) -> ToolRegistry:
    return ToolRegistry(cache)


def client(tmp_path: Path, **settings: object) -> TestClient:
    config = OrchestratorSettings(log_dir=tmp_path, log_format="json", **settings)  # type: ignore[arg-type]
    return TestClient(create_app(config, tools_factory=no_tools))


def test_the_page_is_served_at_the_root_with_its_security_headers(tmp_path: Path) -> None:
    with client(tmp_path) as c:
        r = c.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "default-src 'none'" in CSP
    assert "unsafe-inline" not in CSP and "unsafe-eval" not in CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"
    # no inline script or style for the policy to refuse: everything is a file
    assert not re.search(r"<script(?![^>]*\bsrc=)", r.text)
    assert "<style" not in r.text and " style=" not in r.text
    assert not re.search(r"\son[a-z]+=", r.text)  # no inline event handlers


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
        ("/console/vendor/dagre/dagre.min.js", "text/javascript"),
    ],
)
def test_the_page_files_carry_the_same_headers(tmp_path: Path, path: str, kind: str) -> None:
    with client(tmp_path) as c:
        r = c.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].split(";")[0] in (kind, "application/javascript")
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "path",
    [
        "/console/__init__.py",
        "/console/vendor/dagre/LICENSE",
        "/console/nothing.js",
        "/console/../app.py",
        "/console/%2e%2e/app.py",
        "/console/..%2fapp.py",
    ],
)
def test_nothing_else_is_served_and_a_miss_is_the_error_body(tmp_path: Path, path: str) -> None:
    with client(tmp_path) as c:
        r = c.get(path)
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found"
    assert "import" not in r.text


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_no_page_of_the_consoles_origin_loads_a_script_from_elsewhere(
    tmp_path: Path, path: str
) -> None:
    # the key is in this origin's session storage: FastAPI's API pages, which load their
    # scripts from a CDN under no policy, would share it
    with client(tmp_path) as c:
        r = c.get(path)
        schema = c.get("/openapi.json")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    assert schema.status_code == 200 and "/reason" in schema.json()["paths"]


def test_the_page_never_writes_model_or_client_text_as_markup() -> None:
    script = (CONSOLE_DIR / "console.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink
    assert "new Function" not in script


def test_the_key_is_sent_in_a_header_and_kept_in_session_storage_only() -> None:
    script = (CONSOLE_DIR / "console.js").read_text()
    assert "sessionStorage" in script and "localStorage" not in script
    assert "Authorization: `Bearer ${key}`" in script
    # the form cannot be sent natively (a GET would put the key in the URL): no field
    # has a name, and the policy forbids form submission
    page = (CONSOLE_DIR / "index.html").read_text()
    assert not re.search(r"<(input|textarea|select)[^>]*\sname=", page)
    assert "form-action 'none'" in CSP


def test_the_vendored_graph_library_is_the_published_file_with_its_licence() -> None:
    vendored = CONSOLE_DIR / "vendor" / "dagre"
    assert hashlib.sha256((vendored / "dagre.min.js").read_bytes()).hexdigest() == DAGRE_SHA256
    assert DAGRE_SHA256 in (vendored / "README.md").read_text()
    licence = (vendored / "LICENSE").read_text()
    assert licence.count("Permission is hereby granted") == 2  # dagre and graphlib
    assert "Chris Pettitt" in licence


def test_the_package_data_ships_every_console_file() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    data = project["tool"]["setuptools"]["package-data"]
    patterns = data["orchestrator.console"] + data["*"]
    files = [p for p in CONSOLE_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) >= 7
    for path in files:
        if path.suffix == ".py":
            continue
        rel = path.relative_to(CONSOLE_DIR).as_posix()
        assert any(fnmatch.fnmatch(rel, pattern) for pattern in patterns), rel


def test_the_dockerfile_copies_the_console_with_the_orchestrator() -> None:
    dockerfile = (REPO / "docker" / "orchestrator.Dockerfile").read_text()
    assert "COPY orchestrator /app/orchestrator" in dockerfile
    ignored = (REPO / ".dockerignore").read_text().split()
    assert not any(fnmatch.fnmatch("orchestrator/console/console.js", p) for p in ignored)


def test_the_config_says_whether_keys_are_wanted_and_never_a_key(tmp_path: Path) -> None:
    with client(tmp_path) as c:
        open_ = c.get("/console/config")
    with client(tmp_path, api_keys={KEY: "team-a"}) as c:
        keyed = c.get("/console/config")  # public: the page must learn it before a key
    assert ConsoleConfig.model_validate(open_.json()).auth is False
    assert ConsoleConfig.model_validate(keyed.json()).auth is True
    assert KEY not in keyed.text and "team-a" not in keyed.text
    options = keyed.json()["options"]
    assert set(options) == {"n_plans", "verify", "use_cache", "contributions", "deadline_s"}
    schema = ReasonOptions.model_json_schema()["properties"]
    assert options["n_plans"] == schema["n_plans"]  # the bounds come from the wire schema
    assert (options["deadline_s"]["minimum"], options["deadline_s"]["maximum"]) == (0.1, 120)


def test_ci_says_it_is_ci_so_the_browser_tests_cannot_skip_there() -> None:
    # tests/orchestrator/console/conftest.py skips without a browser unless CI=true
    entry = (REPO / ".ci" / "run").read_text()
    assert re.search(r'^export CI="\$\{CI:-true\}"$', entry, re.M)
    assert entry.index("export CI=") < entry.index("exec scripts/test.sh")
