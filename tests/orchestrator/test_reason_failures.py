"""/reason under failure: every dependency that raises, hangs or vanishes yields the
documented status within the deadline plus a small margin, and the service keeps serving."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import httpx
import pytest

from tests.conftest import free_port
from tests.orchestrator.helpers import (
    FakePlanner,
    FakeVerifier,
    ToolSwitch,
    orchestrator_stack,
    plan,
    votes,
)

pytestmark = [pytest.mark.integration]

MARGIN_S = 0.75
REPLAN_REJECTED = ["no_answer", "rejected"]  # a rejected answer is replanned (not the default)


def ask(url: str, question: str, **options) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = httpx.post(f"{url}/reason", json={"question": question, "options": options}, timeout=60)
    return r, time.monotonic() - started


def still_serving(url: str) -> None:
    r, _ = ask(url, "ok?", use_cache=False)
    assert r.status_code == 200 and r.json()["answer"] == "2"


SCRIPT = {
    "ok?": [[plan(("s1", "calc", "1+1", []))]],
    "raises": [[plan(("s1", "fail", "x", []), ("s2", "calc", "s1 + 1", ["s1"]))]],
    "crashes": [[plan(("s1", "crash", "x", []))]],
    "hangs": [[plan(("s1", "hang", "x", []), ("s2", "calc", "2*3", []))]],
    "slow": [[plan(("s1", "sleep", "30", []))]],
}


def test_a_tool_that_raises_or_crashes_is_recorded_and_dependents_skipped(tmp_path) -> None:
    planner = FakePlanner(SCRIPT)
    with orchestrator_stack(tmp_path, planner, FakeVerifier(), max_replans=0) as url:
        r, _ = ask(url, "raises", deadline_s=5)
        assert r.status_code == 200, r.text
        body = r.json()
        assert [s["status"] for s in body["steps"]] == ["error", "skipped"]
        assert "cannot handle x" in body["steps"][0]["error"]
        assert body["answer"] is None and body["verdict"] == "unverified"
        r, _ = ask(url, "crashes", deadline_s=5)
        assert r.status_code == 200
        assert r.json()["steps"][0]["error"] == "crash failed: RuntimeError"
        still_serving(url)


def test_a_tool_that_hangs_times_out_and_the_rest_still_runs(tmp_path) -> None:
    with orchestrator_stack(tmp_path, FakePlanner(SCRIPT), FakeVerifier(), max_replans=0) as url:
        r, took = ask(url, "hangs", deadline_s=5)
        assert took < 0.3 + MARGIN_S  # the hang tool's own timeout is 0.3 s
        steps = r.json()["steps"]
        assert [s["status"] for s in steps] == ["timeout", "ok"]
        still_serving(url)


def test_the_request_deadline_bounds_a_slow_step(tmp_path) -> None:
    with orchestrator_stack(tmp_path, FakePlanner(SCRIPT), FakeVerifier()) as url:
        r, took = ask(url, "slow", deadline_s=1)
        assert took < 1 + MARGIN_S
        assert r.status_code == 200
        assert r.json()["steps"][0]["status"] == "timeout"
        still_serving(url)


@pytest.mark.parametrize("mode", ["hang", "error"])
def test_planner_that_hangs_or_fails_gives_503_within_the_deadline(tmp_path, mode) -> None:
    planner = FakePlanner(SCRIPT)
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        planner.mode = mode
        r, took = ask(url, "ok?", deadline_s=1.5, use_cache=False)
        assert took < 1.5 + MARGIN_S
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "dependency_unavailable"
        planner.mode = "ok"
        still_serving(url)


@pytest.mark.parametrize("mode", ["hang", "error"])
def test_verifier_that_hangs_or_fails_gives_unverified(tmp_path, mode) -> None:
    verifier = FakeVerifier(mode=mode)
    with orchestrator_stack(tmp_path, FakePlanner(SCRIPT), verifier) as url:
        r, took = ask(url, "ok?", deadline_s=1.5, use_cache=False)
        assert took < 1.5 + MARGIN_S
        assert r.status_code == 200
        body = r.json()
        assert body["answer"] == "2" and body["verdict"] == "unverified"
        verifier.mode = "ok"
        r, _ = ask(url, "ok?", use_cache=False)
        assert r.json()["verdict"] == "verified"


def test_rejected_answer_is_replanned_with_the_failed_attempt_as_context(tmp_path) -> None:
    script = {"q": [[plan(("s1", "calc", "2+3", []))], [plan(("s1", "calc", "2+2", []))]]}
    planner = FakePlanner(script)
    verifier = FakeVerifier(by_answer={"5": 0.1, "4": 0.95})
    with orchestrator_stack(tmp_path, planner, verifier, replan_on=REPLAN_REJECTED) as url:
        r, _ = ask(url, "q")
        body = r.json()
        assert body["answer"] == "4" and body["verdict"] == "verified"
        assert body["agreement"]["rounds"] == 2
        assert body["confidence"] == pytest.approx(0.95)
        assert "feedback" not in planner.requests[0]
        assert "rejected the answer '5'" in planner.requests[1]["feedback"]


def test_replanning_stops_after_the_configured_rounds(tmp_path) -> None:
    script = {"q": [[plan(("s1", "calc", "2+3", []))]]}
    planner = FakePlanner(script)
    with orchestrator_stack(
        tmp_path, planner, FakeVerifier(default=0.2), max_replans=2, replan_on=REPLAN_REJECTED
    ) as url:
        body = ask(url, "q")[0].json()
        assert body["verdict"] == "rejected" and body["answer"] == "5"
        assert len(planner.requests) == 3 and body["agreement"]["rounds"] == 3


def test_when_every_round_is_rejected_the_most_trusted_answer_is_served(tmp_path) -> None:
    rounds = [[plan(("s1", "calc", e, []))] for e in ("2+3", "2+4", "2+5")]
    planner = FakePlanner({"q": rounds})
    verifier = FakeVerifier(by_answer={"5": 0.45, "6": 0.2, "7": 0.3})
    with orchestrator_stack(
        tmp_path, planner, verifier, max_replans=2, replan_on=REPLAN_REJECTED
    ) as url:
        body = ask(url, "q", use_cache=False)[0].json()
        assert len(planner.requests) == 3 and body["agreement"]["rounds"] == 3
        assert body["answer"] == "5" and body["verdict"] == "rejected"
        assert body["confidence"] == pytest.approx(0.45)
        assert [s["input"] for s in body["steps"]] == ["2+3"]
        # every round in the order run, each with why it ran and why it was not enough
        rounds = body["replanning"]
        assert [(r["replan_for"], r["answer"], r["verdict"]) for r in rounds] == [
            (None, "5", "rejected"),
            ("rejected", "6", "rejected"),
            ("rejected", "7", "rejected"),
        ]
        assert [r["confidence"] for r in rounds] == pytest.approx([0.45, 0.2, 0.3])
        assert all(r["replan_reasons"] == ["rejected"] for r in rounds)
        assert all(r["samples"] == r["agreeing"] == 1 and r["ms"] > 0 for r in rounds)
        assert sum(r["ms"] for r in rounds) <= body["timings_ms"]["total"]


def test_an_accepted_replan_is_served_over_the_rejected_round(tmp_path) -> None:
    rounds = [[plan(("s1", "calc", "2+3", []))], [plan(("s1", "calc", "2+4", []))]]
    planner = FakePlanner({"q": rounds})
    verifier = FakeVerifier(by_answer={"5": 0.49, "6": 0.7})
    with orchestrator_stack(
        tmp_path, planner, verifier, max_replans=2, replan_on=REPLAN_REJECTED
    ) as url:
        body = ask(url, "q", use_cache=False)[0].json()
        assert body["answer"] == "6" and body["verdict"] == "verified"
        assert body["agreement"]["rounds"] == 2
        assert [(r["answer"], r["replan_reasons"]) for r in body["replanning"]] == [
            ("5", ["rejected"]),
            ("6", []),
        ]


def test_the_served_rounds_vote_is_the_one_reported(tmp_path) -> None:
    first = [plan(("s1", "calc", e, [])) for e in ("2+3", "1+4", "9-4")]  # three say 5
    second = [plan(("s1", "calc", e, [])) for e in ("3+4", "2+2", "1+1")]  # all differ
    planner = FakePlanner({"q": [first, second]})
    verifier = FakeVerifier(by_answer={"5": 0.4, "7": 0.3, "4": 0.2, "2": 0.1})
    with orchestrator_stack(
        tmp_path, planner, verifier, max_replans=1, replan_on=REPLAN_REJECTED
    ) as url:
        body = ask(url, "q", n_plans=3, use_cache=False)[0].json()
        # both rounds rejected; round 1's winner (agreed on, 0.4) is trusted more than
        # round 2's; its first two plans agreed, which settles a vote of three
        assert body["answer"] == "5" and body["verdict"] == "rejected"
        assert body["agreement"] == {
            "plans": 2,
            "agreeing": 2,
            "rounds": 2,
            "votes": votes("5", "5"),
        }
        assert body["signals"]["rounds"] == 1  # the served round, as its confidence saw it


def test_self_consistency_counts_executed_answers(tmp_path) -> None:
    plans = [plan(("s1", "calc", e, [])) for e in ("2*2", "2+3", "1+3", "8/2")]
    planner = FakePlanner({"q": [plans]})
    verifier = FakeVerifier(by_answer={"4": 0.6, "5": 0.9})
    with orchestrator_stack(tmp_path, planner, verifier) as url:
        body = ask(url, "q", n_plans=4)[0].json()
        # three plans say 4, one says 5: the count decides, not the verifier's 0.9
        assert body["answer"] == "4" and body["confidence"] == pytest.approx(0.6)
        assert body["agreement"] == {
            "plans": 4,
            "agreeing": 3,
            "rounds": 1,
            "votes": votes("4", "5", "4", "4"),
        }
        # a majority (3) first; 4, 5, 4 leave it open, so the fourth is drawn
        assert [(r["n"], r.get("offset", 0)) for r in planner.requests] == [(3, 0), (1, 3)]
        assert all(r["distinct"] is False for r in planner.requests)
        assert verifier.calls == 1  # only the leading answer is verified


def test_plans_run_concurrently(tmp_path) -> None:
    plans = [plan(("s1", "sleep", "0.5", [])) for _ in range(4)]
    with orchestrator_stack(tmp_path, FakePlanner({"q": [plans]}), FakeVerifier()) as url:
        r, took = ask(url, "q", n_plans=4)
        assert r.status_code == 200 and took < 1.5


def test_answer_cache_hit_keeps_original_trace_and_bypass_works(tmp_path) -> None:
    planner = FakePlanner(SCRIPT)
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        first = ask(url, "ok?")[0].json()
        second_r = ask(url, "  OK?  ")[0]  # normalized question: same entry
        second = second_r.json()
        assert second["cached"] is True and first["cached"] is False
        assert second["cached_trace_id"] == first["trace_id"]
        assert second["trace_id"] == second_r.headers["x-trace-id"] != first["trace_id"]
        assert len(planner.requests) == 1
        assert ask(url, "ok?", use_cache=False)[0].json()["cached"] is False
        assert ask(url, "ok?", n_plans=2)[0].json()["cached"] is False  # options matter
        assert len(planner.requests) == 3


def test_a_planner_redeployed_with_another_model_misses_the_old_models_answers(
    tmp_path, monkeypatch
) -> None:
    """Answers are cached per planner model, by the planner's GET /info, asked again
    when the last answer is older than INFO_TTL_S: once it names the new model, the old
    model's answers miss, with no readiness probe in between."""
    import orchestrator.service as service_module

    monkeypatch.setattr(service_module, "INFO_TTL_S", 0.0)  # every request asks
    planner = FakePlanner(SCRIPT)
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        assert ask(url, "ok?")[0].json()["cached"] is False
        assert ask(url, "ok?")[0].json()["cached"] is True
        planner.model = "another-model"  # its /info and its plans name it
        assert ask(url, "ok?")[0].json()["cached"] is False
        assert ask(url, "ok?")[0].json()["cached"] is True
        assert len(planner.requests) == 2


def test_a_planner_without_info_has_its_answers_cached_by_the_model_its_plans_name(
    tmp_path, monkeypatch
) -> None:
    import orchestrator.service as service_module

    monkeypatch.setattr(service_module, "INFO_TTL_S", 0.0)
    planner = FakePlanner(SCRIPT, info=None)  # GET /info: 404
    with orchestrator_stack(tmp_path, planner, FakeVerifier()) as url:
        assert ask(url, "ok?")[0].json()["cached"] is False
        assert ask(url, "ok?")[0].json()["cached"] is True
        assert len(planner.requests) == 1


def test_tenants_never_share_cached_answers(tmp_path) -> None:
    keys = {"key-aaaaaaaaaaaaaaaa": "tenant-a", "key-bbbbbbbbbbbbbbbb": "tenant-b"}
    planner = FakePlanner(SCRIPT)
    with orchestrator_stack(tmp_path, planner, FakeVerifier(), api_keys=keys) as url:

        def ask_as(key: str | None) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return httpx.post(f"{url}/reason", json={"question": "ok?"}, headers=headers)

        assert ask_as(None).status_code == 401
        assert ask_as("wrong-key-wrong-key").json()["error"]["type"] == "unauthorized"
        assert ask_as("key-aaaaaaaaaaaaaaaa").json()["cached"] is False
        assert ask_as("key-aaaaaaaaaaaaaaaa").json()["cached"] is True
        assert ask_as("key-bbbbbbbbbbbbbbbb").json()["cached"] is False
        r = httpx.post(f"{url}/tools/calc/run", json={"input": "1+1"})
        assert r.status_code == 401


def test_streaming_sends_one_event_per_step_then_the_result(tmp_path) -> None:
    script = {"q": [[plan(("s1", "calc", "2+2", []), ("s2", "calc", "s1*10", ["s1"]))]]}
    with orchestrator_stack(tmp_path, FakePlanner(script), FakeVerifier()) as url:
        with httpx.stream(
            "POST", f"{url}/reason", json={"question": "q"}, headers={"Accept": "text/event-stream"}
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
            assert r.headers["x-trace-id"]
        assert events == ["step", "step", "result"]
        with httpx.stream(
            "POST",
            f"{url}/reason",
            json={"question": "unknown"},
            headers={"Accept": "text/event-stream"},
        ) as r:
            text = r.read().decode()
        assert "event: error" in text


def test_client_disconnect_cancels_the_work(tmp_path) -> None:
    tools = ToolSwitch()
    with orchestrator_stack(tmp_path, FakePlanner(SCRIPT), FakeVerifier(), tools) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/reason", json={"question": "slow"}, timeout=0.5)
        deadline = time.monotonic() + 3
        while tools.cancelled == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tools.started == 1 and tools.cancelled == 1
        still_serving(url)


@pytest.fixture
def spare_redis(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    cmd = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(tmp_path),
    ]

    class Redis:
        url = f"redis://127.0.0.1:{port}/0"
        proc: subprocess.Popen | None = None

        def start(self) -> None:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
            for _ in range(100):
                try:
                    import redis

                    redis.Redis(port=port).ping()
                    return
                except Exception:
                    time.sleep(0.05)
            raise RuntimeError("redis did not start")

        def stop(self) -> None:
            if self.proc and self.proc.poll() is None:
                self.proc.terminate()
                self.proc.wait(5)

    r = Redis()
    r.start()
    yield r
    if r.proc and r.proc.poll() is None:
        os.kill(r.proc.pid, signal.SIGCONT)
    r.stop()


def test_redis_going_away_mid_run_and_coming_back(tmp_path, spare_redis) -> None:
    planner = FakePlanner(SCRIPT)
    with orchestrator_stack(
        tmp_path, planner, FakeVerifier(), redis_url=spare_redis.url, redis_timeout_s=0.2
    ) as url:
        assert ask(url, "ok?")[0].json()["cached"] is False
        assert ask(url, "ok?")[0].json()["cached"] is True  # served from Redis

        spare_redis.stop()  # gone
        r, took = ask(url, "ok?")
        assert r.status_code == 200 and r.json()["cached"] is False and took < 1 + MARGIN_S

        spare_redis.start()  # back (empty): after the back-off the cache works again
        time.sleep(2.1)
        assert ask(url, "ok?")[0].json()["cached"] is False
        assert ask(url, "ok?")[0].json()["cached"] is True

        os.kill(spare_redis.proc.pid, signal.SIGSTOP)  # slow: accepts, never answers
        try:
            r, took = ask(url, "ok?", use_cache=True, deadline_s=5)
            assert r.status_code == 200 and took < 0.2 * 2 + MARGIN_S
        finally:
            os.kill(spare_redis.proc.pid, signal.SIGCONT)
        warnings = [
            json.loads(line)
            for line in (tmp_path / "orchestrator.jsonl").open()
            if "redis unavailable" in line
        ]
        assert warnings and all(w["log.level"] == "warning" for w in warnings)


def test_a_replan_that_fails_is_reported_and_the_first_round_served(tmp_path) -> None:
    # round 2's only plan names a tool the orchestrator does not have: no plan passes
    rounds = [[plan(("s1", "calc", "2+3", []))], [plan(("s1", "nope", "2+4", []))]]
    planner = FakePlanner({"q": rounds})
    verifier = FakeVerifier(by_answer={"5": 0.2})
    with orchestrator_stack(
        tmp_path, planner, verifier, max_replans=1, replan_on=REPLAN_REJECTED
    ) as url:
        body = ask(url, "q", use_cache=False)[0].json()
    assert body["answer"] == "5" and body["verdict"] == "rejected"
    # two rounds ran; the served answer, and what its confidence was computed from, are
    # the first round's
    assert body["agreement"]["rounds"] == 2 and body["signals"]["rounds"] == 1
    first, failed = body["replanning"]
    assert (first["answer"], first["error"]) == ("5", None)
    assert failed["replan_for"] == "rejected" and failed["answer"] is None
    assert (failed["samples"], failed["error"]) == (0, "planning_failed")
    assert failed["ms"] > 0
