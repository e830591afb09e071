"""Work per request and per tenant is bounded: a request's tool calls over all its plans
and rounds, a tenant's requests in flight (429 past its share) and its sandbox jobs (its
further jobs wait for its own slots)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from orchestrator.traces import read_trace
from tests.orchestrator.helpers import (
    FakePlanner,
    FakeVerifier,
    ToolSwitch,
    orchestrator_stack,
    plan,
)

pytestmark = [pytest.mark.integration]

KEYS = {"key-aaaaaaaaaaaaaaaa": "tenant-a", "key-bbbbbbbbbbbbbbbb": "tenant-b"}
A, B = (f"Bearer {k}" for k in KEYS)

TWELVE = plan(*[(f"s{i}", "echo", str(i), []) for i in range(1, 13)])
SCRIPT = {
    "wide": [[TWELVE] * 8],
    "slow": [[plan(("s1", "sleep", "1.5", []))]],
    "job": [[plan(("s1", "python", "0.6", []))]],
    "quick": [[plan(("s1", "calc", "1+1", []))]],
}


async def post(url: str, question: str, auth: str | None = None, **options) -> httpx.Response:
    headers = {"Authorization": auth} if auth else {}
    body = {"question": question, "options": {"use_cache": False, **options}}
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(f"{url}/reason", json=body, headers=headers)


def test_one_request_runs_at_most_its_budget_of_tool_calls(tmp_path) -> None:
    tools = ToolSwitch()
    planner = FakePlanner(SCRIPT)
    verifier = FakeVerifier(default=0.1)  # rejected: would replan twice more
    with orchestrator_stack(
        tmp_path, planner, verifier, tools, max_replans=2, replan_on=["no_answer", "rejected"]
    ) as url:
        r = asyncio.run(post(url, "wide", n_plans=8))
        assert r.status_code == 200, r.text
        assert tools.calls == 32  # the default budget, not 8 plans x 12 steps = 96
        assert len(planner.requests) == 1  # the budget is spent: no replanning round
        body = r.json()
        skipped = [s for s in body["steps"] if s["status"] == "skipped"]
        assert all("budget of 32 tool calls" in s["error"] for s in skipped)


def test_the_budget_counts_replanning_rounds_and_is_configurable(tmp_path) -> None:
    tools = ToolSwitch()
    three = plan(*[(f"s{i}", "echo", str(i), []) for i in range(1, 4)])
    planner = FakePlanner({"q": [[three]]})
    verifier = FakeVerifier(default=0.1)
    with orchestrator_stack(
        tmp_path,
        planner,
        verifier,
        tools,
        max_replans=5,
        max_tool_calls_per_request=7,
        replan_on=["no_answer", "rejected"],
    ) as url:
        body = asyncio.run(post(url, "q")).json()
        # 3 + 3 in two rounds, one call left for the third round, none for a fourth
        assert tools.calls == 7 and len(planner.requests) == 3
        assert body["verdict"] == "rejected" and body["answer"] == "3"


def test_a_tenant_over_its_share_of_requests_gets_429(tmp_path) -> None:
    with orchestrator_stack(
        tmp_path, FakePlanner(SCRIPT), FakeVerifier(), api_keys=KEYS, tenant_max_in_flight=1
    ) as url:

        async def scenario() -> list[httpx.Response]:
            slow = asyncio.create_task(post(url, "slow", A))
            await asyncio.sleep(0.5)  # tenant a's one slot is taken
            second_a, first_b = await asyncio.gather(post(url, "quick", A), post(url, "quick", B))
            return [await slow, second_a, first_b, await post(url, "quick", A)]

        slow, second_a, first_b, later_a = asyncio.run(scenario())
        assert slow.status_code == 200
        assert second_a.status_code == 429, second_a.text
        assert int(second_a.headers["retry-after"]) >= 1
        error = second_a.json()
        assert error["error"]["type"] == "too_many_requests" and len(error["trace_id"]) == 32
        assert first_b.status_code == 200  # another tenant is not held back
        assert later_a.status_code == 200  # the slot came back when the request ended


def test_without_keys_each_client_address_has_its_own_share(tmp_path) -> None:
    with orchestrator_stack(
        tmp_path, FakePlanner(SCRIPT), FakeVerifier(), tenant_max_in_flight=1
    ) as url:

        async def scenario() -> tuple[httpx.Response, httpx.Response]:
            slow = asyncio.create_task(post(url, "slow"))
            await asyncio.sleep(0.5)
            second = await post(url, "quick")
            return await slow, second

        slow, second = asyncio.run(scenario())
        assert slow.status_code == 200 and second.status_code == 429


def test_a_stream_holds_its_slot_until_it_ends(tmp_path) -> None:
    with orchestrator_stack(
        tmp_path, FakePlanner(SCRIPT), FakeVerifier(), api_keys=KEYS, tenant_max_in_flight=1
    ) as url:
        for _ in range(3):  # each stream gives its slot back
            with httpx.stream(
                "POST",
                f"{url}/reason",
                json={"question": "quick"},
                headers={"Accept": "text/event-stream", "Authorization": A},
            ) as r:
                assert r.status_code == 200 and "event: result" in r.read().decode()


def test_a_tenant_runs_at_most_its_share_of_sandbox_jobs(tmp_path) -> None:
    tools = ToolSwitch()
    with orchestrator_stack(
        tmp_path, FakePlanner(SCRIPT), FakeVerifier(), tools, api_keys=KEYS, tenant_sandbox_jobs=1
    ) as url:

        async def both(first: str, second: str) -> list[httpx.Response]:
            return list(await asyncio.gather(post(url, "job", first), post(url, "job", second)))

        same = asyncio.run(both(A, A))
        assert [r.json()["steps"][0]["status"] for r in same] == ["ok", "ok"]
        assert tools.max_jobs == 1  # the second job waited for tenant a's one slot

        tools.max_jobs = 0
        other = asyncio.run(both(A, B))
        assert [r.json()["steps"][0]["status"] for r in other] == ["ok", "ok"]
        assert tools.max_jobs == 2  # tenant b does not wait on tenant a

        tools.max_jobs = 0

        async def tool_runs() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30, headers={"Authorization": A}) as client:
                return list(
                    await asyncio.gather(
                        *(
                            client.post(f"{url}/tools/python/run", json={"input": "0.3"})
                            for _ in range(2)
                        )
                    )
                )

        runs = asyncio.run(tool_runs())
        assert [r.json()["status"] for r in runs] == ["ok", "ok"] and tools.max_jobs == 1


def test_a_stream_closed_by_its_client_cancels_its_work_and_gives_its_slot_back(
    tmp_path,
) -> None:
    tools = ToolSwitch()
    script = {**SCRIPT, "long": [[plan(("s1", "sleep", "30", []))]]}
    with orchestrator_stack(
        tmp_path, FakePlanner(script), FakeVerifier(), tools, api_keys=KEYS, tenant_max_in_flight=1
    ) as url:
        with httpx.stream(
            "POST",
            f"{url}/reason?events=all",
            json={"question": "long", "options": {"use_cache": False}},
            headers={"Accept": "text/event-stream", "Authorization": A},
            timeout=10,
        ) as r:
            trace_id = r.headers["x-trace-id"]
            for line in r.iter_lines():  # the plan is drawn, its step is running
                if line == "event: plan":
                    break
        # the client is gone mid-step: its step is cancelled, its slot free again
        deadline = time.monotonic() + 5
        while tools.cancelled == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tools.started, tools.cancelled) == (1, 1)
        again = asyncio.run(post(url, "quick", A))
        assert again.status_code == 200, again.text
    # its trace says the client went away, as a JSON request's does
    actions = [ln.get("event.action") for ln in read_trace(tmp_path, trace_id)]
    assert "request.cancelled" in actions
