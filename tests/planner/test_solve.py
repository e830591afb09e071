"""`POST /solve`: the planner model's own chain-of-thought solutions, first greedy, the
rest sampled, each with the last number of its text as the answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from planner.app import create_app
from planner.backends.base import Generation, GenerationRequest
from planner.backends.scripted import ScriptedBackend
from planner.prose import PROSE_MAX_TOKENS, PROSE_TEMPERATURE, prose_prompt
from planner.service import PlannerService
from services.errors import NotReady
from services.schemas import SOLUTION_TEXT_CHARS, SolveRequest
from services.settings import PlannerSettings

TEXTS = [
    "48/2 = 24 in May, 48+24 = 72.\nThe answer is 72.",
    "Half of 48 is 24; 48 + 24 = 72 clips.\nThe answer is 72.",
    "I am not sure.",
    "1,234 + 1 = 1,235.\nThe answer is 1,235.",
]


class Recording(ScriptedBackend):
    def __init__(self, prose: dict[str, list[str]]) -> None:
        super().__init__(prose=prose)
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        return await super().generate(request)


async def service_with(backend: ScriptedBackend, **settings) -> PlannerService:
    service = PlannerService(backend, PlannerSettings(**settings))
    await service.load()
    return service


@pytest.mark.unit
async def test_the_first_solution_is_greedy_and_the_rest_are_sampled() -> None:
    backend = Recording({"q": TEXTS})
    service = await service_with(backend, seed=5)
    response = await service.solve(SolveRequest(question="q", n=4))
    assert [s.answer for s in response.solutions] == ["72", "72", None, "1235"]
    assert [s.text for s in response.solutions] == TEXTS
    greedy, sampled = backend.requests
    assert (greedy.n, greedy.first_sample, greedy.temperature) == (1, 0, 0.0)
    assert (sampled.n, sampled.first_sample, sampled.temperature) == (3, 1, PROSE_TEMPERATURE)
    for r in backend.requests:
        assert r.json_schema is None and r.max_tokens == PROSE_MAX_TOKENS and r.seed == 5
        assert r.messages == prose_prompt().messages("q")
        assert r.metadata == {"kind": "prose"}


@pytest.mark.unit
async def test_later_solutions_are_new_samples() -> None:
    backend = Recording({"q": TEXTS})
    service = await service_with(backend)
    response = await service.solve(SolveRequest(question="q", n=2, offset=2, temperature=1.1))
    assert [s.text for s in response.solutions] == TEXTS[2:4]
    (only,) = backend.requests
    assert (only.n, only.first_sample, only.temperature) == (2, 2, 1.1)


@pytest.mark.unit
async def test_one_solution_is_the_greedy_one() -> None:
    backend = Recording({"q": TEXTS})
    response = await (await service_with(backend)).solve(SolveRequest(question="q"))
    assert [s.answer for s in response.solutions] == ["72"]
    assert [(r.n, r.temperature) for r in backend.requests] == [(1, 0.0)]


@pytest.mark.unit
async def test_long_texts_and_long_numbers_are_cut_or_refused() -> None:
    long_text = "x" * (SOLUTION_TEXT_CHARS + 500) + " The answer is 4."
    huge = "The answer is " + "9" * 70 + "."
    backend = Recording({"q": [long_text, huge]})
    response = await (await service_with(backend)).solve(SolveRequest(question="q", n=2))
    first, second = response.solutions
    # the answer is read from the whole text, the text sent cut to the wire's bound
    assert first.answer == "4" and len(first.text) == SOLUTION_TEXT_CHARS
    assert second.answer is None  # a 70-digit number is no answer


@pytest.mark.unit
async def test_solve_before_the_model_is_loaded_is_not_ready() -> None:
    service = PlannerService(ScriptedBackend(), PlannerSettings())
    with pytest.raises(NotReady):
        await service.solve(SolveRequest(question="q"))


@pytest.mark.unit
def test_solve_over_http(tmp_path: Path) -> None:
    settings = PlannerSettings(backend="scripted", log_dir=tmp_path)
    with TestClient(create_app(settings)) as client:
        r = client.post("/solve", json={"question": "What is 2 + 2?", "n": 2})
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["solutions"]) == 2 and body["backend"] == "scripted"
        assert all("answer" not in s for s in body["solutions"])  # no worked solution
        for bad, param in [
            ({"question": "  "}, "question"),
            ({"question": "q", "n": 9}, "n"),
            ({"question": "q", "temperature": 0}, "temperature"),
            ({"question": "q", "extra": 1}, "extra"),
        ]:
            r = client.post("/solve", json=bad)
            assert r.status_code == 422, bad
            assert r.json()["error"]["param"] == param


@pytest.mark.model
@pytest.mark.slow
def test_solve_on_a_real_model_gives_a_greedy_first_solution_and_sampled_others() -> None:
    from cli.pull import pull
    from planner.backends.llamacpp import LlamaCppBackend

    pull("smollm2-135m-instruct")
    settings = PlannerSettings(
        backend="llamacpp", model="smollm2-135m-instruct", n_threads=1, max_batch=4
    )

    async def scenario() -> tuple[list, list]:
        service = PlannerService(LlamaCppBackend(settings), settings)
        await service.load()
        try:
            question = "Tom has 3 apples and buys 4 more. How many apples does he have?"
            first = await service.solve(SolveRequest(question=question, n=3))
            again = await service.solve(SolveRequest(question=question, n=1))
            return first.solutions, again.solutions
        finally:
            await service.backend.close()

    import asyncio

    solutions, again = asyncio.run(scenario())
    assert len(solutions) == 3 and all(s.text.strip() for s in solutions)
    assert again[0].text == solutions[0].text  # the first solution is the greedy one
    for s in solutions:  # each answer is what the shared rule reads from its text
        from services.answers import last_number

        assert s.answer == last_number(s.text)
