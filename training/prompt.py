"""The verifier prompt's answer tokens, and the prompt format saved beside the adapter.

The format and its rendering are `services.claims.PROMPT_FORMAT` / `render_prompt`, which
the verifier serves with too: `train_lora.py` writes the format to `prompt.json` beside
the adapter and the verifier renders claims from that file with the same function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.claims import PROMPT_FORMAT as PROMPT_FORMAT


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
