"""The claim the verifier judges has one writer and one reader (`services.claims`): the
orchestrator writes it for both kinds of attempt, `training.data` writes its GSM8K claims
with it, the verifier's symbolic checks read it back, and training and serving render it
into the same prompt."""

from __future__ import annotations

import asyncio
import json
import random
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.executor import Execution, PlanExecutor
from orchestrator.service import Attempt, claim
from orchestrator.tools.calc import calc
from orchestrator.tools.registry import Tool, ToolRegistry
from services import claims, toolspecs
from services.schemas import Plan, Solution, StepResult, VerifyRequest
from services.settings import VerifierSettings
from training import data
from verifier.backends.base import Claim
from verifier.backends.model import EMBEDDED_ADAPTERS, ModelVerifier
from verifier.symbolic import check

pytestmark = [pytest.mark.unit]


def execution(outputs: dict[str, object]) -> Execution:
    plan = Plan.model_validate(
        {
            "reasoning": "multiply then double",
            "steps": [
                {"id": "s1", "tool": "calc", "input": "17*23+4", "depends_on": []},
                {"id": "s2", "tool": "calc", "input": "s1 * 2", "depends_on": ["s1"]},
            ],
            "answer_step": "s2",
        }
    )
    steps = [
        StepResult(id=k, tool="calc", input=s.input, status="ok", output=str(v))
        for (k, v), s in zip(outputs.items(), plan.steps, strict=True)
    ]
    return Execution(plan, steps, dict(outputs))


# --------------------------------------------------------------------------- writer


def test_an_executed_plan_s_claim_is_written_by_services_claims() -> None:
    e = execution({"s1": 395, "s2": 790})
    assert claim("q", e) == claims.plan_claim("q", "790", e.plan.reasoning, e.steps, "s2")
    assert claim("q", Attempt(execution=e)) == claim("q", e)
    assert claim("q", e) == {
        "question": "q",
        "statement": "The answer is 790.",
        "context": "Plan: multiply then double\nSteps:\n"
        "s1 [calc] '17*23+4' -> '395'\ns2 [calc] 's1 * 2' -> '790'\nanswer_step: s2",
    }


def test_a_worked_solution_s_claim_is_written_by_services_claims() -> None:
    solution = Solution(text="48 / 2 = 24, and 48 + 24 = 72.", answer="72")
    c = claim("How many?", Attempt(solution=solution))
    assert c == claims.solution_claim("How many?", "72", solution.text)
    assert c == {
        "question": "How many?",
        "statement": "The answer is 72.",
        "context": "Worked solution:\n48 / 2 = 24, and 48 + 24 = 72.",
    }


def test_a_failed_step_shows_its_status() -> None:
    e = execution({"s1": 395, "s2": 790})
    e.steps[1] = e.steps[1].model_copy(update={"status": "timeout", "output": None})
    context = claim("q", e)["context"]
    assert "s2 [calc] 's1 * 2' -> timeout" in context.splitlines()
    steps, answer = claims.parse_steps(context) or ([], "")
    assert (steps[1].output, answer) == ("timeout", "s2")


# --------------------------------------------------------------------------- reader


def test_consistent_work_is_passed_to_the_model() -> None:
    c = claim("q", execution({"s1": 395, "s2": 790}))
    result = check(c["statement"], c["context"], c["question"])
    assert result is not None and result.verdict and not result.decisive


def test_a_wrong_step_on_the_answer_path_is_rejected_exactly() -> None:
    c = claim("q", execution({"s1": 396, "s2": 792}))
    result = check(c["statement"], c["context"], c["question"])
    assert result is not None and result.decisive and not result.verdict


def test_a_stated_answer_other_than_the_answer_step_s_is_rejected_exactly() -> None:
    e = execution({"s1": 395, "s2": 790})
    c = claims.plan_claim("q", "791", e.plan.reasoning, e.steps, "s2")
    result = check(c["statement"], c["context"], c["question"])
    assert result is not None and result.decisive and not result.verdict


FIELD = st.text(st.characters(codec="utf-8"), max_size=300)  # 12 of them fit the context


@given(
    st.lists(
        st.tuples(st.sampled_from(["calc", "python", "sql", "lookup"]), FIELD, FIELD),
        min_size=1,
        max_size=12,
    ),
    st.text(max_size=200).filter(lambda r: "\n" not in r and "\r" not in r),
)
def test_what_the_writer_writes_the_reader_reads_back(
    raw: list[tuple[str, str, str]], reasoning: str
) -> None:
    steps = [
        claims.Step(f"s{k}", tool, text, output) for k, (tool, text, output) in enumerate(raw, 1)
    ]
    answer_step = steps[-1].id
    context = claims.plan_context(reasoning, steps, answer_step)
    assert claims.parse_steps(context) == (steps, answer_step)


def test_cut_fields_are_read_back_cut() -> None:
    long = "7" * (claims.FIELD_CHARS + 500)
    step = claims.Step("s1", "python", long, long)
    parsed = claims.parse_steps(claims.plan_context("r", [step], "s1"))
    cut = long[: claims.FIELD_CHARS] + "…"
    assert parsed == ([claims.Step("s1", "python", cut, cut)], "s1")


# --------------------------------------------------------------------------- training and serving

GSM8K_ITEMS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half "
        "as many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "72",
        "solution": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = "
        "<<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 "
        "minutes of babysitting. How much did she earn?",
        "answer": "10",
        "solution": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, "
        "she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
    },
    {
        "question": "Ten liters of juice are shared equally among 3 jugs, and each jug's juice "
        "fills 6 glasses per liter. How many glasses are filled in all?",
        "answer": "60",
        "solution": "Each jug holds 10/3 = <<10/3=3.33>>3.33 liters.\nThey fill 10/3 * 6 * 3 = "
        "<<10/3*6*3=60>>60 glasses.\n#### 60",
    },
]


def training_claim(item: dict[str, str]) -> dict[str, object]:
    """The gold claim `training.data` generates for `item`, with its worked steps."""
    for seed in range(100):
        gold = data.gen_gsm8k(random.Random(seed), item)[0]
        if gold["context"]:
            return gold
    raise AssertionError("the generator never showed the steps")


def served_execution(item: dict[str, str]) -> Execution:
    """What the orchestrator's executor makes of a plan with the item's calculator steps,
    run by the real calc tool."""
    steps = data.gsm8k_steps(item["solution"])
    plan = Plan.model_validate(
        {
            "reasoning": data.solution_reasoning(item["solution"]),
            "steps": [
                {"id": f"s{k}", "tool": "calc", "input": expr, "depends_on": []}
                for k, (expr, _) in enumerate(steps, 1)
            ],
            "answer_step": f"s{len(steps)}",
        }
    )
    registry = ToolRegistry()
    registry.register(Tool(toolspecs.CALC, calc, timeout_s=5.0))

    async def run() -> Execution:
        loop = asyncio.get_running_loop()
        return await PlanExecutor(registry).run(plan, deadline=loop.time() + 10)

    return asyncio.run(run())


def served_prompt(wire: dict[str, str]) -> str:
    """The prompt the verifier's model backend renders for a claim sent over `/verify`,
    in the format of the default model's committed adapter."""
    request = VerifyRequest.model_validate_json(json.dumps(wire))
    settings = VerifierSettings(backend="model")
    verifier = ModelVerifier(settings)
    adapter = Path(EMBEDDED_ADAPTERS[settings.base_model])
    verifier._fmt = json.loads((adapter / "prompt.json").read_text())
    verifier._tokenizer = lambda text: {"input_ids": text.split()}
    (prompt,) = verifier._encode([Claim(request.statement, request.context, request.question)])
    return prompt


@pytest.mark.parametrize("item", GSM8K_ITEMS, ids=["integers", "decimals", "thirds"])
def test_training_and_serving_give_the_verifier_the_same_prompt(item: dict[str, str]) -> None:
    scoring = pytest.importorskip("training.scoring")  # needs torch
    trained = training_claim(item)
    e = served_execution(item)
    assert e.complete and e.answer == data.fmt(Fraction(item["answer"]))
    served = claim(item["question"], e)
    assert {k: trained[k] for k in served} == served
    assert scoring.claim_prompt(trained).encode() == served_prompt(served).encode()
