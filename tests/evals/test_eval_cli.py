"""`reason eval run/report/routing` end to end against the three services with scripted models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.eval import eval_app
from tests.conftest import Stack, free_port, make_stack

runner = CliRunner()


def calc_plan(expr: str, note: str) -> dict[str, Any]:
    return {
        "reasoning": note,
        "steps": [{"id": "s1", "tool": "calc", "input": expr, "depends_on": []}],
        "answer_step": "s1",
    }


ITEMS = [
    {
        "id": "t1",
        "question": "Tom has 3 boxes of 4 apples. How many apples does he have?",
        "answer": "12",
    },
    {
        "id": "t2",
        "question": "A shop sells 7 pens a day for 5 days. How many pens?",
        "answer": "35",
    },
    {"id": "t3", "question": "Ann reads 4 pages a day for 5 days. How many pages?", "answer": "20"},
    {"id": "t4", "question": "What is 6 * 7?", "answer": "42"},  # unscripted: default calc plan
]

# Five distinct plans per scripted question (the planner drops repeated plans).
SCRIPT = {
    ITEMS[0]["question"]: [
        calc_plan("3 * 4", "Boxes times apples per box."),
        calc_plan("4 * 3", "Apples per box times boxes."),
        calc_plan("3 + 4", "Add boxes and apples."),
        calc_plan("(3) * (4)", "Multiply the counts."),
        calc_plan("4 + 3", "Add apples and boxes."),
    ],
    ITEMS[1]["question"]: [
        calc_plan("7 + 5", "Add pens and days."),
        calc_plan("7 * 5", "Pens per day times days."),
        calc_plan("5 * 7", "Days times pens per day."),
        calc_plan("(7) * (5)", "Multiply the counts."),
        calc_plan("5 + 7", "Add days and pens."),
    ],
    ITEMS[2]["question"]: [calc_plan(f"4 + 5 + {k}", f"Wrong sum {k}.") for k in range(5)],
}


@pytest.fixture(scope="module")
def scripted_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("eval-stack")
    script = tmp / "plans.json"
    script.write_text(json.dumps(SCRIPT))
    stack = make_stack(tmp, PLANNER_SCRIPT_PATH=str(script)).start()
    yield stack
    stack.stop()


def invoke(*args: str) -> Any:
    result = runner.invoke(eval_app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.integration
@pytest.mark.slow
def test_run_report_and_routing_against_the_scripted_stack(
    scripted_stack: Stack, tmp_path: Path
) -> None:
    data = tmp_path / "toy" / "test.norm.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(r) + "\n" for r in ITEMS))
    url = scripted_stack.url("orchestrator")
    planner = scripted_stack.url("planner")
    outs = {}
    for mode in ("plan", "plan+verify+sc5"):
        out = tmp_path / f"{mode}.jsonl"
        outs[mode] = out
        common = ["--data", str(data), "--mode", mode, "--out", str(out), "--url", url]
        common += ["--planner-url", planner, "--no-progress", "--concurrency", "2"]
        # Two items first, then the rest: the second run resumes after the first.
        result = invoke("run", *common, "--limit", "2")
        assert result.exit_code == 0, result.output
        assert len(read(out)) == 2
        result = invoke("run", *common)
        assert result.exit_code == 0, result.output
        assert "skipped 2 already done" in result.output
        rows = read(out)
        assert sorted(r["id"] for r in rows) == ["t1", "t2", "t3", "t4"]
        for r in rows:
            assert r["mode"] == mode and r["dataset"] == "toy-test"
            assert r["model"] == "scripted:scripted"
            assert r["error"] is None and r["schema_valid"] is True and r["cached"] is False
            assert r["n_steps"] == 1 and r["step_statuses"] == ["ok"]
            assert r["trace_id"] and len(r["trace_id"]) == 32
            assert r["latency_ms"]["total"] > 0 and r["latency_ms"]["plan"] >= 0
    plan = {r["id"]: r for r in read(outs["plan"])}
    # One plan, no verifier: the first scripted plan decides.
    assert {k: r["correct"] for k, r in plan.items()} == {
        "t1": True,
        "t2": False,
        "t3": False,
        "t4": True,
    }
    assert plan["t2"]["predicted"] == 12 and plan["t2"]["gold"] == 35
    assert all(
        r["verdict"] == "unverified" and r["latency_ms"]["verify"] is None for r in plan.values()
    )
    sc5 = {r["id"]: r for r in read(outs["plan+verify+sc5"])}
    # Five plans, verified, weighted vote: three plans of five agree on the right answer.
    assert sc5["t2"]["correct"] is True and sc5["t2"]["agreement"]["plans"] == 5
    assert sc5["t1"]["correct"] is True and sc5["t3"]["correct"] is False
    assert all(r["verdict"] in ("verified", "rejected") for r in sc5.values())
    assert all(0 <= r["confidence"] <= 1 for r in sc5.values())

    # A third run of a finished file adds nothing.
    before = outs["plan"].read_text()
    result = invoke(
        "run", "--data", str(data), "--mode", "plan", "--out", str(outs["plan"]),
        "--url", url, "--planner-url", planner, "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0 and outs["plan"].read_text() == before

    report_dir = tmp_path / "report"
    result = invoke(
        "report", str(outs["plan"]), str(outs["plan+verify+sc5"]), "--out-dir", str(report_dir)
    )
    assert result.exit_code == 0, result.output
    for name in ("accuracy_latency.png", "reliability.png"):
        assert (report_dir / name).read_bytes()[:4] == b"\x89PNG"
    md = (report_dir / "report.md").read_text()
    assert "| toy-test | plan | 4 | 50.0% [" in md
    assert "| toy-test | plan+verify+sc5 | 4 | 75.0% [" in md
    assert "Oracle accuracy (any mode right): **75.0%**" in md

    result = invoke("routing", str(outs["plan"]), str(outs["plan+verify+sc5"]), "--json")
    assert result.exit_code == 0, result.output
    [rep] = json.loads(result.output)
    assert rep["rescues"]["plan+verify+sc5"]["plan"] == 1  # t2
    assert rep["rescues"]["plan"]["plan+verify+sc5"] == 0
    assert rep["headroom"] == 0.0


@pytest.mark.unit
def test_unreachable_orchestrator_aborts_without_writing(tmp_path: Path) -> None:
    data = tmp_path / "items.jsonl"
    data.write_text(json.dumps(ITEMS[0]) + "\n")
    out = tmp_path / "out.jsonl"
    dead = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(
        eval_app,
        ["run", "--data", str(data), "--mode", "plan", "--out", str(out), "--url", dead,
         "--planner-url", dead, "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "rerun to resume" in " ".join(result.output.split())
    assert not out.exists() or out.read_text() == ""


@pytest.mark.unit
def test_unknown_mode_and_bad_data_are_usage_errors(tmp_path: Path) -> None:
    data = tmp_path / "items.jsonl"
    data.write_text('{"id": "a", "question": "q?", "answer": "lots"}\n')
    out = tmp_path / "out.jsonl"
    result = runner.invoke(
        eval_app, ["run", "--data", str(data), "--mode", "cot", "--out", str(out)]
    )
    assert result.exit_code == 2 and "unknown mode" in result.output
    result = runner.invoke(
        eval_app, ["run", "--data", str(data), "--mode", "plan", "--out", str(out)]
    )
    assert result.exit_code == 2 and "not a number" in result.output


@pytest.mark.unit
def test_direct_mode_with_a_plan_only_backend_fails_clearly(tmp_path: Path) -> None:
    data = tmp_path / "items.jsonl"
    data.write_text(json.dumps(ITEMS[0]) + "\n")
    result = runner.invoke(
        eval_app,
        ["run", "--data", str(data), "--mode", "direct", "--out", str(tmp_path / "o.jsonl"),
         "--backend", "scripted", "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 1 and "free-text" in result.output
