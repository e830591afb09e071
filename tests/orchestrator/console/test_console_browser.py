"""The web console in a real browser (headless Chromium) against the three real services
on the scripted models: a question's plan drawn as a graph and filled in step by step,
several plans side by side with the vote, replanning rounds as they run, text a model
wrote staying text, a trace opened from its link, and the service's errors shown as it
says them. Keyboard only, and at a phone's width."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Stack, make_stack

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.slow]

NATALIA = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether?"
)
INJECTED = "show me the injected plan"
FAILING = "a plan that always fails"
IDLE = "a plan with a step the answer never reads"
KEY = "browser-test-key-0123456789abcdef"
PWN = "<img src=x onerror=\"document.body.dataset.pwned='yes'\">"


def step(id_: str, tool: str, text: str, deps: list[str]) -> dict[str, Any]:
    return {"id": id_, "tool": tool, "input": text, "depends_on": deps}


DIAMOND = {
    "reasoning": "April is 48; May is half of April; add both months.",
    "steps": [
        step("s1", "calc", "48", []),
        step("s2", "calc", "s1 / 2", ["s1"]),
        step("s3", "calc", "s1 + s2", ["s1", "s2"]),
    ],
    "answer_step": "s3",
}
PYTHON = {
    "reasoning": "One program: May is half of April.",
    "steps": [step("s1", "python", "april = 48\nmay = april // 2\nresult = april + may", [])],
    "answer_step": "s1",
}
SCRIPT = {
    NATALIA: [DIAMOND, PYTHON],
    INJECTED: {
        "reasoning": f"<b>bold?</b> {PWN}",
        "steps": [
            step("s1", "lookup", f"<script>document.body.dataset.pwned='yes'</script>{PWN}", [])
        ],
        "answer_step": "s1",
    },
    IDLE: {
        "reasoning": "s2 is listed as a dependency and never read",
        "steps": [
            step("s1", "calc", "48", []),
            step("s2", "calc", "7", []),
            step("s3", "calc", "s1 + 24", ["s1", "s2"]),
        ],
        "answer_step": "s3",
    },
    FAILING: {
        "reasoning": "divide by zero",
        "steps": [step("s1", "calc", "1 / 0", [])],
        "answer_step": "s1",
    },
}


def start(tmp: Path, **env: str) -> Stack:
    script = tmp / "plans.json"
    script.write_text(json.dumps(SCRIPT))
    return make_stack(tmp, PLANNER_SCRIPT_PATH=str(script), **env).start()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start(tmp_path_factory.mktemp("console"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start(tmp_path_factory.mktemp("console-keyed"), ORCH_API_KEYS=json.dumps({KEY: "team-a"}))
    yield s
    s.stop()


def open_console(page: Any, stack: Stack) -> None:
    page.goto(stack.url("orchestrator") + "/")
    page.wait_for_selector("body.ready")


def ask(page: Any, question: str, *, n_plans: int = 1, cache: bool = False) -> None:
    page.fill("#question", question)
    page.fill("#n_plans", str(n_plans))
    page.set_checked("#use_cache", cache)
    page.click("#ask")


def answered(page: Any) -> str:
    page.wait_for_selector("#answer")
    page.wait_for_function("!document.querySelector('#ask').disabled")
    return page.text_content("#answer")


def test_a_question_draws_its_plan_as_a_graph_and_fills_in_each_step(
    page: Any, stack: Stack
) -> None:
    open_console(page, stack)
    # record the graph's states as the page changes, to see it drawn before its steps
    # ran and filled in one step at a time (each event is drawn in a task of its own)
    page.evaluate(
        """() => {
            window.__seen = [];
            const state = (n) => n.dataset.step + ':' +
                (['ok', 'pending'].find((s) => n.classList.contains(s)) || 'other');
            new MutationObserver(() => {
                const nodes = Array.from(document.querySelectorAll('#rounds .plan .node'));
                const now = nodes.map(state).join(' ');
                if (now && window.__seen[window.__seen.length - 1] !== now) window.__seen.push(now);
            }).observe(document.body, {subtree: true, attributes: true, attributeFilter: ['class'],
                                       childList: true});
        }"""
    )
    ask(page, NATALIA)
    assert answered(page) == "72"
    card = page.locator(".plan").first
    assert card.locator("h4").first.text_content().startswith("Plan 1")
    nodes = card.locator(".node")
    assert nodes.count() == 3
    assert card.locator(".edge").count() == 3  # s1→s2, s1→s3, s2→s3
    assert [nodes.nth(k).get_attribute("data-step") for k in range(3)] == ["s1", "s2", "s3"]
    assert all("ok" in (nodes.nth(k).get_attribute("class") or "") for k in range(3))
    answer = card.locator(".node.answer")
    assert answer.count() == 1 and answer.get_attribute("data-step") == "s3"
    assert "answer" in answer.text_content()
    assert re.search(r"ok · [\d.]+ ms", nodes.nth(0).locator(".node-status").text_content())
    # the nodes were drawn pending, before their steps finished, then filled in
    assert page.evaluate("window.__seen") == [
        "s1:pending s2:pending s3:pending",
        "s1:ok s2:pending s3:pending",
        "s1:ok s2:ok s3:pending",
        "s1:ok s2:ok s3:ok",
    ]
    assert card.get_attribute("class").split().count("served") == 1
    # the verdict, the confidence and what it was made of, the stage timings, the trace
    assert page.text_content("#verdict") == "verified"
    assert page.text_content("#confidence") == "0.750"
    signals = page.text_content(".signals")
    assert "agreement" in signals and "verifier" in signals and "0.750" in signals
    segments = page.locator(".timings .seg")
    assert segments.count() >= 2
    assert re.fullmatch(r"[0-9a-f]{32}", page.text_content("#result .trace-link"))
    # a node's details: source, latency, input as code, output
    nodes.nth(1).click()
    detail = card.locator(".detail")
    assert "s2 · calc" in detail.locator("h5").text_content()
    assert detail.locator("pre.code code").first.text_content() == "s1 / 2"
    assert "24" in detail.text_content() and "tool" in detail.text_content()
    assert not [p for p in page.problems if p.startswith("pageerror")]


def test_asked_for_contributions_a_step_the_answer_does_not_need_is_flagged(
    page: Any, stack: Stack
) -> None:
    open_console(page, stack)
    assert not page.is_checked("#contributions")  # off unless asked: it costs tool calls
    page.set_checked("#contributions", True)
    ask(page, IDLE)
    assert answered(page) == "72"
    card = page.locator(".plan.served")
    idle = card.locator(".node.idle")
    assert idle.count() == 1 and idle.get_attribute("data-step") == "s2"
    assert "no effect" in idle.locator(".node-status").text_content()
    assert "contributes nothing" in (idle.get_attribute("aria-label") or "")
    idle.click()
    assert "contributes nothing to the answer" in card.locator(".detail").text_content()
    card.locator('.node[data-step="s1"]').click()
    assert "the answer depends on it" in card.locator(".detail").text_content()
    assert "contribute" in page.text_content(".timings .legend")
    assert not [p for p in page.problems if p.startswith("pageerror")]


def test_several_plans_stand_side_by_side_with_the_vote(page: Any, stack: Stack) -> None:
    open_console(page, stack)
    ask(page, NATALIA, n_plans=3)
    assert answered(page) == "72"
    cards = page.locator(".round .plan")
    page.wait_for_function("document.querySelectorAll('.plan .vote .mark').length >= 2")
    assert cards.count() == 2  # two of three agree: the vote is settled, no third drawn
    boxes = [cards.nth(k).bounding_box() for k in range(2)]
    assert abs(boxes[0]["y"] - boxes[1]["y"]) < 2 and boxes[0]["x"] < boxes[1]["x"]
    for k in range(2):
        vote = cards.nth(k).locator(".vote").text_content()
        assert "72" in vote and "agrees with the vote" in vote and "verifier 0.75" in vote
    assert cards.nth(1).locator(".node").count() == 1  # the python plan: one step
    summary = page.text_content(".round-summary")
    assert summary.startswith("2 of 2 agree on 72")
    assert "2 of 2 votes agree" in page.text_content("#result")


def test_replanning_rounds_appear_as_they_run(page: Any, stack: Stack) -> None:
    open_console(page, stack)
    ask(page, FAILING)
    assert answered(page) == "no answer"
    rounds = page.locator(".round")
    assert rounds.count() == 3  # the first and two replans (ORCH_MAX_REPLANS)
    assert "replanned: no_answer" in rounds.nth(1).locator("h3").text_content()
    assert "error" in rounds.nth(0).locator(".node").get_attribute("class")
    assert "answer none" in rounds.nth(0).locator(".vote").text_content()
    rounds.nth(0).locator(".node").click()
    assert "error" in rounds.nth(0).locator(".detail").text_content()


def test_html_a_model_wrote_stays_text(page: Any, stack: Stack) -> None:
    open_console(page, stack)
    ask(page, INJECTED)
    answered(page)
    card = page.locator(".plan").first
    assert card.locator(".reasoning").text_content() == SCRIPT[INJECTED]["reasoning"]
    card.locator(".node").first.click()
    shown = card.locator(".detail pre.code code").first.text_content()
    assert shown == SCRIPT[INJECTED]["steps"][0]["input"]  # the literal <script>, as text
    error = card.locator(".detail pre.code-error").text_content()
    assert "<script>" in error  # the lookup's error quotes it back: still text
    # nothing of it became an element, nothing ran
    assert page.locator("#rounds img, #rounds script, #rounds b, #result img").count() == 0
    assert page.evaluate("document.body.dataset.pwned") is None
    # the trace's log lines quote it too (the lookup's warning): text there as well
    page.click("#result .trace-link")
    page.wait_for_selector("#trace-out .span")
    assert "<script>document.body.dataset.pwned" in page.text_content("#trace-out")
    assert page.locator("#trace-out img, #trace-out script").count() == 0
    assert page.evaluate("document.body.dataset.pwned") is None
    assert not [p for p in page.problems if p.startswith("pageerror")]
    # the second line of defence: the page's policy refuses inline script outright
    ran = page.evaluate(
        """() => {
            const s = document.createElement('script');
            s.textContent = "document.body.dataset.inline = 'ran'";
            document.body.append(s);
            return document.body.dataset.inline || null;
        }"""
    )
    assert ran is None
    assert any("Content Security Policy" in p for p in page.problems)


def test_a_trace_opens_from_its_link_with_all_three_services_nested(
    page: Any, stack: Stack
) -> None:
    open_console(page, stack)
    ask(page, NATALIA)
    answered(page)
    trace_id = page.text_content("#result .trace-link")
    page.click("#result .trace-link")
    page.wait_for_selector("#trace-view:not([hidden]) .span")
    assert page.url.endswith(f"#/trace/{trace_id}")
    assert page.input_value("#trace-id") == trace_id
    assert page.is_hidden("#ask-view")
    out = page.locator("#trace-out")
    assert "log lines from the log files" in out.locator(".trace-summary").text_content()
    root = out.locator(":scope > .spans > .span")
    assert root.count() == 1
    assert root.locator(":scope > .span-head strong").text_content() == "orchestrator"
    nested = root.locator(":scope > .spans > .span > .span-head strong").all_text_contents()
    assert {"planner", "verifier"} <= set(nested)
    assert "POST /reason 200" in root.locator(":scope > .lines").text_content()
    # an unknown trace: the service's 404, as it says it
    page.fill("#trace-id", "1" * 32)
    page.press("#trace-id", "Enter")
    page.wait_for_selector("#trace-error:not([hidden])")
    assert page.text_content("#trace-error").startswith("404 not_found: no log lines for trace")
    page.go_back()
    page.wait_for_selector("#trace-out .span")
    assert page.input_value("#trace-id") == trace_id


def test_a_validation_error_is_shown_as_the_service_says_it(page: Any, stack: Stack) -> None:
    open_console(page, stack)
    page.fill("#question", NATALIA)
    page.fill("#deadline_s", "500")
    page.click("#ask")
    page.wait_for_selector("#ask-error:not([hidden])")
    text = page.text_content("#ask-error")
    assert text.startswith("422 validation_error: options.deadline_s:")
    assert "(options.deadline_s)" in text and page.locator("#answer").count() == 0


def test_an_auth_error_is_shown_and_the_key_stays_out_of_urls_and_logs(
    page: Any, keyed: Stack
) -> None:
    open_console(page, keyed)
    assert page.is_visible("#api_key")
    ask(page, NATALIA)
    page.wait_for_selector("#ask-error:not([hidden])")
    assert page.text_content("#ask-error").startswith(
        "401 unauthorized: missing or invalid API key"
    )
    page.fill("#api_key", KEY)
    page.click("#ask")
    assert answered(page) == "72"
    assert page.evaluate("sessionStorage.getItem('reason.apiKey')") == KEY
    assert KEY not in page.url
    page.click("#result .trace-link")  # the trace wants the key too, and gets it
    page.wait_for_selector("#trace-out .span")
    assert KEY not in page.url
    # the tenant's own request, with the planner and verifier spans it called
    root = page.locator("#trace-out > .spans > .span")
    assert root.count() == 1
    nested = root.locator(":scope > .spans > .span > .span-head strong").all_text_contents()
    assert {"planner", "verifier"} <= set(nested)
    page.reload()  # the tab keeps the key for its session
    page.wait_for_selector("body.ready")
    assert page.input_value("#api_key") == KEY
    logged = "".join(p.read_text() for p in keyed.log_dir.glob("*.jsonl"))
    assert "POST /reason 401" in logged and KEY not in logged


def test_a_planner_that_is_down_is_a_503_with_its_retry_time(page: Any, tmp_path: Path) -> None:
    s = start(tmp_path)
    try:
        s.kill("planner")
        open_console(page, s)
        ask(page, NATALIA)
        page.wait_for_selector("#ask-error:not([hidden])")
        text = page.text_content("#ask-error")
        assert text.startswith("503 dependency_unavailable:") and "planner" in text
        assert re.search(r"Retry in \d+ s\.", text)
        assert page.locator("#ask-error .trace-link").count() == 1
    finally:
        s.stop()


def test_everything_works_from_the_keyboard(page: Any, stack: Stack) -> None:
    open_console(page, stack)
    page.focus("#question")
    page.keyboard.type(NATALIA)
    # Tab reaches every control, each with a visible focus style
    order = []
    for _ in range(8):
        page.keyboard.press("Tab")
        focused = page.evaluate(
            """() => {
                const e = document.activeElement;
                const s = getComputedStyle(e);
                return [e.id, s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0];
            }"""
        )
        order.append(focused[0])
        if focused[0] in ("n_plans", "deadline_s", "verify", "use_cache", "ask"):
            assert focused[1], f"{focused[0]} shows no focus"
    assert {"n_plans", "deadline_s", "verify", "use_cache", "ask"} <= set(order)
    page.focus("#use_cache")
    page.keyboard.press("Space")  # off: a fresh answer, not the cache's
    page.focus("#question")
    page.keyboard.press("Enter")  # Enter asks
    assert answered(page) == "72"
    # Tab on to the graph's nodes; a focused node shows its step
    for _ in range(30):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.classList.contains('node')"):
            break
    else:
        pytest.fail("no graph node is reachable with Tab")
    assert page.evaluate("document.activeElement.dataset.step") == "s1"
    detail = page.locator(".plan .detail").first
    assert detail.locator("h5").text_content().startswith("s1 · calc")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    assert detail.locator("h5").text_content().startswith("s2 · calc")


def test_it_reads_at_a_phones_width_without_scrolling_sideways(page: Any, stack: Stack) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    open_console(page, stack)
    ask(page, NATALIA, n_plans=3)
    answered(page)
    page.locator(".plan .node").first.click()

    def fits() -> bool:
        return page.evaluate(
            "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        )

    assert fits()
    cards = page.locator(".round .plan")
    boxes = [cards.nth(k).bounding_box() for k in range(cards.count())]
    assert len(boxes) == 2 and boxes[1]["y"] > boxes[0]["y"]  # one above the other
    assert all(b["x"] >= 0 and b["x"] + b["width"] <= 390 for b in boxes)
    page.click("#result .trace-link")
    page.wait_for_selector("#trace-out .span")
    assert fits()


def test_one_question_at_a_time_even_when_enter_is_pressed_again(page: Any, stack: Stack) -> None:
    open_console(page, stack)
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/reason" in r.url else None)
    page.fill("#question", NATALIA)
    page.fill("#n_plans", "1")
    page.set_checked("#use_cache", False)
    # Enter submits the form whatever the button's state: twice, before any answer
    page.evaluate(
        "() => { const f = document.getElementById('ask-form'); f.requestSubmit(); f.requestSubmit(); }"
    )
    assert answered(page) == "72"
    assert len(asked) == 1
    assert page.locator(".round").count() == 1 and page.locator(".plan").count() == 1


@pytest.mark.parametrize(
    ("fragment", "says"),
    [
        ("..", "not a trace id"),  # a dot segment: the request would go to another path
        ("%E0%A4%A", "422 validation_error: trace_id"),  # a malformed escape in the link
    ],
)
def test_a_trace_link_that_is_no_trace_id_is_an_error_not_a_blank_view(
    page: Any, stack: Stack, fragment: str, says: str
) -> None:
    open_console(page, stack)
    page.goto(stack.url("orchestrator") + "/#/trace/" + fragment)
    page.wait_for_selector("#trace-error:not([hidden])")
    assert says in page.text_content("#trace-error")
    assert page.is_visible("#trace-view") and page.locator("#trace-out .span").count() == 0
    assert not [p for p in page.problems if p.startswith("pageerror")]
