"""Plan repair: steps that read another python step's variables, cite a step they do
not depend on, or end without an answer are fixed deterministically; nothing else is
touched, and every repaired plan is still a valid DAG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.repair import Repairs, free_names, repair_plan, undefined_names
from planner.service import PlannerService
from services.plans import check_plan
from services.schemas import MAX_STEP_INPUT_CHARS, Plan, PlanRequest, PlanResponse
from services.settings import PlannerSettings
from services.toolspecs import tool_names
from tests.planner.test_service import RecordingBackend

pytestmark = pytest.mark.unit

SAMPLES = Path(__file__).resolve().parents[2] / "training" / "samples"


def make_plan(steps: list[tuple[str, str, str, list[str]]], answer: str) -> Plan:
    return Plan(
        reasoning="r",
        steps=[{"id": i, "tool": t, "input": x, "depends_on": d} for i, t, x, d in steps],
        answer_step=answer,
    )


def code_of(plan: Plan, sid: str) -> str:
    return next(s.input for s in plan.steps if s.id == sid)


def deps_of(plan: Plan, sid: str) -> list[str]:
    return next(s.depends_on for s in plan.steps if s.id == sid)


def test_a_program_cut_into_steps_runs_each_step_with_the_code_it_reads() -> None:
    plan = make_plan(
        [
            ("s1", "python", "total_cards = 10 * 20", []),
            ("s2", "python", "uncommon = total_cards / 4", ["s1"]),
            ("s3", "python", "result = uncommon", ["s2"]),
        ],
        "s3",
    )
    fixed, repairs = repair_plan(plan)
    assert code_of(fixed, "s1") == "total_cards = 10 * 20\nresult = total_cards"
    assert code_of(fixed, "s2") == (
        "total_cards = 10 * 20\nuncommon = total_cards / 4\nresult = uncommon"
    )
    # each step's own code once, in plan order, then the reader's own
    assert code_of(fixed, "s3") == (
        "total_cards = 10 * 20\nuncommon = total_cards / 4\nresult = uncommon"
    )
    assert deps_of(fixed, "s3") == ["s2", "s1"]
    assert repairs.notes == [
        "s1 answers with the variable its code assigns last",
        "s2 runs the code of s1 that it reads",
        "s3 runs the code of s1, s2 that it reads",
    ]
    assert undefined_names(fixed) == {}
    check_plan(fixed, tool_names())


def test_an_inlined_result_never_becomes_the_readers_answer() -> None:
    plan = make_plan(
        [
            ("s1", "python", "x = 2\nresult = x", []),
            ("s2", "python", "y = x * 3\nprint(y)", ["s1"]),
        ],
        "s2",
    )
    fixed, _ = repair_plan(plan)
    # s2 answers with what it prints, so the result s1's code set is cleared before it
    assert code_of(fixed, "s2") == "x = 2\nresult = x\nresult = None\ny = x * 3\nprint(y)"


def test_a_reader_of_result_gets_it_from_the_step_that_set_it() -> None:
    plan = make_plan(
        [
            ("s1", "calc", "10 * 20", []),
            ("s2", "python", "result = s1 / 4", ["s1"]),
            ("s3", "python", "result", ["s2"]),
        ],
        "s3",
    )
    fixed, _ = repair_plan(plan)
    assert code_of(fixed, "s3") == "result = s1 / 4\nresult"
    assert deps_of(fixed, "s3") == ["s2", "s1"]  # s2's code reads s1 by its id


def test_result_that_no_step_sets_is_the_one_dependency_s_value() -> None:
    plan = make_plan(
        [
            ("s1", "calc", "2 * 2", []),
            ("s2", "calc", "30 / s1", ["s1"]),
            ("s3", "python", "result", ["s2"]),
        ],
        "s3",
    )
    fixed, repairs = repair_plan(plan)
    assert code_of(fixed, "s3") == "result = s2\nresult"
    assert repairs.notes == ["s3 reads the result of s2 as `result`"]


def test_a_cited_step_becomes_a_dependency_unless_that_makes_a_cycle() -> None:
    plan = make_plan(
        [
            ("s1", "calc", "20 * 2", []),
            ("s2", "calc", "s1 * 2", ["s1"]),
            ("s3", "calc", "s2 + s1", ["s2"]),
            ("s4", "calc", "s3 / 60 + s5", ["s3"]),  # s5 is below s4: never added
            ("s5", "calc", "s4 + 1", ["s4"]),
        ],
        "s5",
    )
    fixed, repairs = repair_plan(plan)
    assert deps_of(fixed, "s3") == ["s2", "s1"]
    assert deps_of(fixed, "s4") == ["s3"]
    assert repairs.notes == ["s3 depends on s1, which it cites"]
    check_plan(fixed, tool_names())


def test_the_nearest_ancestor_defines_a_name_two_steps_assign() -> None:
    plan = make_plan(
        [
            ("s1", "python", "n = 1\nresult = n", []),
            ("s2", "python", "n = 5\nresult = n", []),
            ("s3", "python", "n * 2", ["s1"]),
        ],
        "s3",
    )
    fixed, _ = repair_plan(plan)
    assert code_of(fixed, "s3") == "n = 1\nresult = n\nn * 2"


def test_a_plan_needing_nothing_comes_back_unchanged() -> None:
    plan = make_plan(
        [
            ("s1", "python", "apples = 3\nresult = apples * 2", []),
            ("s2", "calc", "s1 + 1", ["s1"]),
            (
                "s3",
                "python",
                "import math\nvalues = [s2 * k for k in range(3)]\nmath.fsum(values)",
                ["s2"],
            ),
        ],
        "s3",
    )
    fixed, repairs = repair_plan(plan)
    assert fixed == plan and not repairs and repairs.notes == []


def test_code_too_long_once_inlined_is_left_as_written() -> None:
    big = "x = 1\n" + "y = 2\n" * ((MAX_STEP_INPUT_CHARS // 6) - 2)
    plan = make_plan([("s1", "python", big, []), ("s2", "python", "result = x + 1", ["s1"])], "s2")
    fixed, _ = repair_plan(plan)
    assert code_of(fixed, "s2") == "result = x + 1"
    assert undefined_names(fixed) == {"s2": {"x"}}


@pytest.mark.parametrize(
    ("code", "free"),
    [
        ("result = apples * 2", {"apples"}),
        ("total = sum(k for k in range(n))", {"n"}),
        ("def f(a):\n    return a + rate\nresult = f(2)", {"rate"}),
        ("def f(a):\n    return a + rate\nrate = 3\nresult = f(2)", set()),
        ("import math\nmath.ceil(s1 / 3)", {"s1"}),
        ("for i in range(3):\n    pass\ni", set()),
        ("x = (", set()),  # does not parse: the python check reports it, not this
        ("def setup():\n    global rate\n    rate = 3\nsetup()\nrate * 2", set()),
        ("[y := v for v in range(3)]\ny", set()),
    ],
)
def test_free_names(code: str, free: set[str]) -> None:
    assert free_names(code) == free


def test_undefined_names_counts_only_the_steps_a_step_depends_on() -> None:
    plan = make_plan(
        [("s1", "calc", "1 + 1", []), ("s2", "python", "result = s1 + price", [])], "s2"
    )
    assert undefined_names(plan) == {"s2": {"s1", "price"}}
    fixed, _ = repair_plan(plan)
    assert undefined_names(fixed) == {"s2": {"price"}}


def _committed_plans() -> list[dict[str, Any]]:
    plans = []
    for path in sorted(SAMPLES.glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("plan"):
                plans.append(row["plan"])
    return plans


def test_every_committed_sample_plan_repairs_into_a_valid_plan() -> None:
    plans = _committed_plans()
    assert len(plans) > 500
    repaired = 0
    for data in plans:
        fixed, repairs = repair_plan(Plan.model_validate(data))
        check_plan(fixed, tool_names())
        Plan.model_validate(fixed.model_dump())  # within every wire bound
        again, more = repair_plan(fixed)
        assert again == fixed and not more  # repairing twice changes nothing more
        repaired += bool(repairs)
    assert repaired > 0


async def plan_in_one_generation(question: str, written: dict) -> PlanResponse:
    """The planner's response to a model that writes `written`, taken at the first try."""
    backend = RecordingBackend({question: [json.dumps(written)]})
    service = PlannerService(backend, PlannerSettings(plan_format="json"))
    await service.load()
    response = await service.plan(PlanRequest(question=question))
    assert len(backend.requests) == 1
    return response


async def test_the_planner_returns_the_repaired_plan_without_asking_again() -> None:
    question = "How many uncommon cards?"
    split = {
        "reasoning": "cards, then a quarter of them",
        "steps": [
            {"id": "s1", "tool": "python", "input": "cards = 10 * 20", "depends_on": []},
            {"id": "s2", "tool": "python", "input": "cards / 4", "depends_on": ["s1"]},
        ],
        "answer_step": "s2",
    }
    response = await plan_in_one_generation(question, split)
    assert code_of(response.plans[0], "s2") == "cards = 10 * 20\ncards / 4"


def test_a_repair_past_a_wire_bound_leaves_the_step_as_written() -> None:
    long = "total = " + "1 + " * 997 + "1"  # 3,997 characters; `result = total` would pass 4,000
    plan = make_plan([("s1", "python", long, [])], "s1")
    fixed, repairs = repair_plan(plan)
    assert fixed == plan and not repairs
    # twelve copies of one dependency, and a citation of another: one of each
    steps = [("s1", "calc", "1 + 1", []), ("s2", "calc", "2 + 2", [])]
    steps.append(("s3", "calc", "s1 + s2", ["s1"] * 12))
    fixed, _ = repair_plan(make_plan(steps, "s3"))
    assert deps_of(fixed, "s3") == ["s1", "s2"]
    PlanResponse.model_validate(
        {"plans": [fixed.model_dump()], "model": "m", "backend": "b", "latency_ms": 1},
        strict=True,
    )


def test_only_calc_and_python_steps_cite_step_ids() -> None:
    sql = "SELECT s1.name FROM employees s1 JOIN employees s2 ON s1.manager_id = s2.id"
    plan = make_plan(
        [
            ("s1", "calc", "1 + 1", []),
            ("s2", "calc", "2", []),
            ("s3", "sql", sql, []),
            ("s4", "lookup", "s2", []),
        ],
        "s3",
    )
    fixed, repairs = repair_plan(plan)
    assert fixed == plan and not repairs


def test_result_is_never_taken_from_a_step_that_is_not_an_ancestor() -> None:
    plan = make_plan(
        [
            ("s1", "python", "result = 7 * 3", []),
            ("s2", "calc", "40 + 2", []),
            ("s3", "python", "result / 2", ["s2"]),
        ],
        "s3",
    )
    fixed, _ = repair_plan(plan)
    assert code_of(fixed, "s3") == "result = s2\nresult / 2"


def test_a_program_that_prints_keeps_its_printed_answer() -> None:
    printing = "x = 17 * 3\nprint(x)\nleft = x - 50"
    plan = make_plan([("s1", "python", printing, [])], "s1")
    assert repair_plan(plan)[0] == plan
    # inlined prints would become the printed answer of the step that reads them
    plan = make_plan(
        [("s1", "python", "x = 5\nprint(x)", []), ("s2", "python", "y = x * 2\nprint(y)", ["s1"])],
        "s2",
    )
    assert code_of(repair_plan(plan)[0], "s2") == "y = x * 2\nprint(y)"


def test_repairing_twice_changes_nothing_more() -> None:
    plan = make_plan(
        [
            ("s1", "python", "total = 6 * 7", []),
            ("s2", "calc", "1 + 1", []),
            ("s3", "python", "result + s2", ["s1", "s2"]),
        ],
        "s3",
    )
    fixed, _ = repair_plan(plan)
    assert code_of(fixed, "s3") == "total = 6 * 7\nresult = total\nresult + s2"
    assert undefined_names(fixed) == {}
    assert repair_plan(fixed) == (fixed, Repairs())


SNIPPETS = [
    "a = 3",
    "b = a + 1",
    "result = b * 2",
    "result",
    "c = s1 + 1",
    "print(a)",
    "d = [v for v in range(a)]",
    "def f():\n    return b",
    "e = f()",
    "total = a + b + c",
    "s2 * 3",
    "x = y",
]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_repair_always_gives_a_valid_plan_and_a_fixed_point(data) -> None:
    n = data.draw(st.integers(1, 6))
    steps = []
    for k in range(1, n + 1):
        tool = data.draw(st.sampled_from(["python", "python", "calc"]))
        if tool == "python":
            lines = data.draw(st.lists(st.sampled_from(SNIPPETS), min_size=1, max_size=3))
            code = "\n".join(lines)
        else:
            code = data.draw(st.sampled_from(["1 + 1", "s1 * 2", "s2 + s3", "7"]))
        deps = (
            data.draw(st.lists(st.sampled_from([f"s{j}" for j in range(1, k)]), max_size=3))
            if k > 1
            else []
        )
        steps.append((f"s{k}", tool, code, deps))
    plan = make_plan(steps, f"s{n}")
    fixed, _ = repair_plan(plan)
    check_plan(fixed, tool_names())
    Plan.model_validate(fixed.model_dump())
    again, more = repair_plan(fixed)
    assert again == fixed and not more


async def test_a_step_listing_itself_as_a_dependency_loses_that_entry_only() -> None:
    question = "Self?"
    selfish = {
        "reasoning": "r",
        "steps": [{"id": "s1", "tool": "calc", "input": "2 + 2", "depends_on": ["s1"]}],
        "answer_step": "s1",
    }
    response = await plan_in_one_generation(question, selfish)
    assert deps_of(response.plans[0], "s1") == []
