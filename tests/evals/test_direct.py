"""The direct (no tools) mode: prompt file, generation request, scoring, backend choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.data import Item
from evals.datasets import GSM8K_TEST, GSM8K_TRAIN
from evals.modes import (
    DIRECT_MAX_TOKENS,
    DirectRunner,
    load_direct_backend,
)
from planner.backends.base import Generation, GenerationRequest
from planner.prose import parse_prompt, prose_prompt
from services.settings import PlannerSettings

pytestmark = pytest.mark.unit


class FakeModel:
    name = "fake"
    model = "toy-0.5b"

    def __init__(self, text: str) -> None:
        self.text = text
        self.requests: list[GenerationRequest] = []

    async def load(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        return Generation([self.text], prompt_tokens=400, completion_tokens=37)


def test_prompt_file_has_system_and_train_examples_only() -> None:
    prompt = prose_prompt()
    assert "The answer is N." in prompt.system
    assert len(prompt.examples) >= 3
    train = {}
    with GSM8K_TRAIN.open() as f:
        for line in f:
            row = json.loads(line)
            train[row["question"]] = row["answer"]
    for question, answer in prompt.examples:
        assert question in train, "few-shot examples must come from GSM8K train"
        assert answer.rstrip().endswith(f"The answer is {train[question]}.")
    with GSM8K_TEST.open() as f:
        test_questions = {json.loads(line)["question"] for line in f}
    assert not test_questions & {q for q, _ in prompt.examples}


def test_parse_prompt_rejects_malformed_files() -> None:
    good = "# system\n\nBe brief.\n\n# example a\n\n## question\n\nQ?\n\n## answer\n\nA 1.\n"
    prompt = parse_prompt("<!-- comment -->\n" + good)
    assert prompt.system == "Be brief." and prompt.examples == (("Q?", "A 1."),)
    with pytest.raises(ValueError, match="unknown prompt section"):
        parse_prompt(good + "# notes\n\nx\n")
    with pytest.raises(ValueError, match="at least one example"):
        parse_prompt("# system\n\nBe brief.\n")


async def test_direct_runner_scores_the_last_number_of_the_completion() -> None:
    model = FakeModel("Natalia sold 48/2 = 24 clips in May.\n48 + 24 = 72.\nThe answer is 72.")
    runner = DirectRunner(model, dataset="gsm8k-test")
    record = await runner(Item("x1", "How many clips?", 72, "72"))
    assert record["mode"] == "direct" and record["model"] == "fake:toy-0.5b"
    assert record["predicted"] == 72 and record["correct"] is True
    assert record["verdict"] is None and record["schema_valid"] is None
    assert record["latency_ms"]["total"] >= 0 and record["latency_ms"]["plan"] is None
    assert record["completion_tokens"] == 37
    [request] = model.requests
    assert request.temperature == 0.0 and request.n == 1
    assert request.json_schema is None  # free text, even on a constrained backend
    assert request.max_tokens == DIRECT_MAX_TOKENS
    assert request.messages[0]["role"] == "system"
    assert request.messages[-1] == {"role": "user", "content": "How many clips?"}
    roles = [m["role"] for m in request.messages[1:-1]]
    assert roles == ["user", "assistant"] * (len(roles) // 2) and roles


async def test_direct_runner_wrong_or_missing_number() -> None:
    runner = DirectRunner(FakeModel("I am not sure."), dataset="svamp")
    record = await runner(Item("x2", "How many?", 5, "5"))
    assert record["predicted"] is None and record["correct"] is False


def test_direct_mode_needs_a_free_text_backend(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="PLANNER_BACKEND=llamacpp"):
        load_direct_backend(PlannerSettings(backend="scripted"))
    backend = load_direct_backend(
        PlannerSettings(backend="llamacpp", model_path=tmp_path / "m.gguf")
    )
    assert backend.name == "llamacpp"
    assert backend.constrained is False  # type: ignore[attr-defined]
