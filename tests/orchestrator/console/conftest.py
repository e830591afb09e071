"""A headless Chromium for the console's browser tests: the system's `chromium` (Debian's
package), driven by Playwright; Playwright's own browser downloads are never used.

Where Chromium or Playwright is missing the tests skip, saying what to install, except in
CI (`CI=true`), where a missing browser is a failure: scripts/test.sh installs it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts.console_screenshot import CHROMIUM_ARGS


def _missing(what: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what}; CI must run the browser tests (scripts/test.sh installs it)")
    pytest.skip(what)


def chromium_path() -> str:
    found = os.environ.get("REASON_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(found).is_file():
        _missing("chromium is not installed (apt-get install -y chromium)")
    return found


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One browser per test module: Playwright's sync API runs an event loop of its own
    while it is open, which would stop every later test that calls `asyncio.run`."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install playwright; the dev extra has it)")
    executable = chromium_path()
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        context.set_default_timeout(15_000)
        yield context
        context.close()


@pytest.fixture
def page(browser_context: Any) -> Iterator[Any]:
    """A fresh tab; what the page logged as an error or threw is collected in
    `page.problems` (an escaped page never throws, nor loads a blocked script)."""
    tab = browser_context.new_page()
    tab.problems = []
    tab.on("pageerror", lambda exc: tab.problems.append(f"pageerror: {exc}"))
    tab.on(
        "console",
        lambda msg: (
            tab.problems.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None
        ),
    )
    yield tab
    tab.close()
