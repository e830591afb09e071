"""Screenshot of the web console answering the README's example question.

By default it starts the three services on the scripted models (the planner answers
with the plans below, the verifier with its fixed score), asks the question with
`n_plans` 5 in a headless Chromium (the system's `chromium`, driven by Playwright),
selects a step so its details show, and saves the page to docs/images/console.png.
With `--url` it asks a running orchestrator instead (the embedded default models:
minutes of CPU per answer on a small machine).

    python -m scripts.console_screenshot                      # scripted models
    python -m scripts.console_screenshot --url http://127.0.0.1:8000 --deadline-s 120
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cli.main import start_services, stop_services, wait_ready

ROOT = Path(__file__).resolve().parent.parent
QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether?"
)
# How Chromium runs headless here and in the console's browser tests: no GPU, no
# network of its own (updates, sync, QUIC), no sandbox (CI runs as root, where
# Chromium's sandbox cannot start).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _step(id_: str, tool: str, text: str, deps: list[str]) -> dict[str, Any]:
    return {"id": id_, "tool": tool, "input": text, "depends_on": deps}


# Three plans of the kind the planner writes for this question: the scripted planner
# hands them out in this order, one per sample.
PLANS = [
    {
        "reasoning": "April is 48; May is half of April; add both months.",
        "steps": [
            _step("s1", "calc", "48", []),
            _step("s2", "calc", "s1 / 2", ["s1"]),
            _step("s3", "calc", "s1 + s2", ["s1", "s2"]),
        ],
        "answer_step": "s3",
    },
    {
        "reasoning": "May sales are half of April's 48; add both months.",
        "steps": [_step("s1", "python", "april = 48\nmay = april / 2\nresult = april + may", [])],
        "answer_step": "s1",
    },
    {
        "reasoning": "Half of 48 in May, 48 in April.",
        "steps": [
            _step("s1", "calc", "48 / 2", []),
            _step("s2", "calc", "48 + s1", ["s1"]),
        ],
        "answer_step": "s2",
    },
]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shoot(
    url: str, out: Path, *, width: int, chromium: str, deadline_s: float | None = None
) -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": width, "height": 900},
            device_scale_factor=1,
        )
        page = context.new_page()
        page.set_default_timeout(600_000)  # the real models take minutes
        page.goto(url.rstrip("/") + "/")
        page.wait_for_selector("body.ready")
        page.fill("#question", QUESTION)
        page.fill("#n_plans", "5")
        if deadline_s is not None:
            page.fill("#deadline_s", f"{deadline_s:g}")
        page.set_checked("#verify", True)
        page.set_checked("#use_cache", False)
        page.click("#ask")
        page.wait_for_selector("#answer")
        page.wait_for_function("!document.querySelector('#ask').disabled")
        page.locator(".plan").first.locator(".node.answer").click()
        page.mouse.move(0, 0)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True)
        context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running orchestrator (default: start scripted ones)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "console.png")
    parser.add_argument("--width", type=int, default=1280, help="viewport width, px")
    parser.add_argument(
        "--chromium", default=shutil.which("chromium") or "/usr/bin/chromium", help="browser"
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="the request's deadline (default: the page's)",
    )
    args = parser.parse_args()
    if args.url:
        shoot(
            args.url, args.out, width=args.width, chromium=args.chromium, deadline_s=args.deadline_s
        )
        print(f"wrote {args.out} from {args.url}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "plans.json"
        script.write_text(json.dumps({QUESTION: PLANS}))
        ports = {"planner": free_port(), "verifier": free_port(), "orchestrator": free_port()}
        env = {
            "PLANNER_BACKEND": "scripted",
            "PLANNER_SCRIPT_PATH": str(script),
            "VERIFIER_BACKEND": "scripted",
            "ORCH_REDIS_URL": "",
            "ORCH_DATABASE_URL": "",
            **{f"{p}_LOG_FORMAT": "json" for p in ("PLANNER", "VERIFIER", "ORCH")},
        }
        # the services inherit this environment: no API keys, the shipped calibrator
        for name in ("ORCH_API_KEYS", "ORCH_CONFIDENCE_CALIBRATOR"):
            os.environ.pop(name, None)
        procs = start_services("127.0.0.1", Path(tmp), env, ports)
        try:
            urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
            if not all(wait_ready(urls, 60, procs).values()):
                raise SystemExit("the scripted services did not become ready")
            shoot(urls["orchestrator"], args.out, width=args.width, chromium=args.chromium)
        finally:
            stop_services(procs)
    print(f"wrote {args.out} (scripted planner and verifier)")


if __name__ == "__main__":
    main()
