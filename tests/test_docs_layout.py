"""The README's layout table and docs/architecture.md name only paths that exist, and
every top-level package of the repository is in the layout table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(r"`((?:[a-z_0-9.-]+/)+[a-zA-Z_0-9.-]*)`")


def named_paths(text: str) -> set[str]:
    found = set()
    for match in PATH.findall(text):
        if "*" in match or match.startswith(("http", "~", "/")):
            continue
        found.add(match.rstrip("/"))
    return found


def layout_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Layout")
    end = readme.find("\n## ", start + 1)
    return readme[start : end if end != -1 else None]


@pytest.mark.parametrize("doc", ["README.md#layout", "docs/architecture.md"])
def test_every_named_path_exists(doc: str) -> None:
    text = layout_section() if doc.startswith("README") else (ROOT / doc).read_text()
    paths = named_paths(text)
    assert len(paths) >= 10
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert missing == []


def test_every_package_is_in_the_layout_table() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} | {"datasets"}
    listed = {p.split("/")[0] for p in named_paths(layout_section())}
    assert packages - listed == set()


def test_the_check_sees_a_missing_path() -> None:
    assert named_paths("see `nowhere/at_all.py` and `services/`") == {
        "nowhere/at_all.py",
        "services",
    }
