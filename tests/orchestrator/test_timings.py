"""timings_ms come from time.perf_counter(), not the event loop's clock (uvloop's ticks in
whole milliseconds, cached per loop iteration), so the stages add up within the total."""

from __future__ import annotations

import httpx
import pytest

from tests.orchestrator.helpers import FakePlanner, FakeVerifier, orchestrator_stack, plan

pytestmark = [pytest.mark.integration]


def test_stage_timings_are_fine_grained_and_add_up(tmp_path) -> None:
    script = {"q": [[plan(("s1", "calc", "1+1", []))]]}
    with orchestrator_stack(tmp_path, FakePlanner(script), FakeVerifier()) as url:
        bodies = [
            httpx.post(
                f"{url}/reason", json={"question": "q", "options": {"use_cache": False}}
            ).json()
            for _ in range(5)
        ]
    for body in bodies:
        t = body["timings_ms"]
        stages = [t["plan"], t["execute"], t["verify"]]
        assert all(v > 0 for v in stages)
        assert sum(stages) <= t["total"]
        assert t["execute"] >= body["steps"][0]["latency_ms"]
    # on a millisecond clock every figure is a whole number of milliseconds
    values = [v for b in bodies for v in b["timings_ms"].values()]
    assert any(v != round(v) for v in values)
