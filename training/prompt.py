"""The verifier prompt: how a claim becomes the text whose next token is TRUE or FALSE.

The format is data: `train_lora.py` writes it to `prompt.json` beside the adapter and
the serving side renders claims from that file, so the two cannot drift apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROMPT_FORMAT: dict[str, Any] = {
    "version": 1,
    "header": "Is the claim TRUE or FALSE given the question and context?\n",
    "question_block": "Question: {question}\n",
    "context_block": "Context:\n{context}\n",
    "claim_block": "Claim: {statement}\nVerdict:",
    # The two answers compared at the last position; only their first tokens count.
    "true_text": " TRUE",
    "false_text": " FALSE",
}


def render(
    statement: str,
    context: str = "",
    question: str | None = None,
    fmt: dict[str, Any] = PROMPT_FORMAT,
) -> str:
    """The prompt for one claim (no trailing space: the answer token carries it)."""
    parts = [fmt["header"]]
    if question and question.strip():
        parts.append(fmt["question_block"].format(question=question.strip()))
    if context and context.strip():
        parts.append(fmt["context_block"].format(context=context.strip()))
    parts.append(fmt["claim_block"].format(statement=statement.strip()))
    return "".join(parts)


def answer_token_ids(tokenizer: Any, fmt: dict[str, Any] = PROMPT_FORMAT) -> tuple[int, int]:
    """First token ids of the TRUE and FALSE answers; they must differ."""
    true_ids = tokenizer(fmt["true_text"], add_special_tokens=False)["input_ids"]
    false_ids = tokenizer(fmt["false_text"], add_special_tokens=False)["input_ids"]
    if not true_ids or not false_ids or true_ids[0] == false_ids[0]:
        raise ValueError(
            f"answers {fmt['true_text']!r} and {fmt['false_text']!r} must start with "
            "different tokens; change true_text/false_text in the prompt format"
        )
    return int(true_ids[0]), int(false_ids[0])


def write_prompt_format(directory: Path, tokenizer: Any) -> Path:
    true_id, false_id = answer_token_ids(tokenizer)
    path = directory / "prompt.json"
    path.write_text(
        json.dumps(
            {**PROMPT_FORMAT, "true_token_id": true_id, "false_token_id": false_id}, indent=2
        )
        + "\n"
    )
    return path
