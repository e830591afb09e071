"""Chain-of-thought solutions: the planner model answering on its own, no tools.

`POST /solve` serves them so the orchestrator can put the model's own answers to the
vote beside its executed plans (programs and prose make different mistakes); the
`direct` evaluation baseline is the first of them (greedy). The prompt is the few-shot
chain-of-thought prompt of `planner/prompts/prose.md` (GSM8K train examples), the
answer the last number of the text (`services.answers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

PROSE_MAX_TOKENS = 320  # the worked answers of the few-shot examples are ~60-90 tokens
PROSE_TEMPERATURE = 0.7  # samples after the first (greedy) one


@dataclass(frozen=True)
class ProsePrompt:
    """A system prompt and worked examples, as chat messages."""

    system: str
    examples: tuple[tuple[str, str], ...]  # (question, worked answer)

    def messages(self, question: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.system}]
        for q, a in self.examples:
            messages.append({"role": "user", "content": q})
            messages.append({"role": "assistant", "content": a})
        messages.append({"role": "user", "content": question})
        return messages


def parse_prompt(text: str) -> ProsePrompt:
    """`# system` then `# example <id>` sections with `## question` / `## answer`."""
    if "<!--" in text:
        head, _, rest = text.partition("<!--")
        text = head + rest.partition("-->")[2]
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# ") or line.startswith("## "):
            sections.append((line.strip("# ").strip().lower(), []))
        elif sections:
            sections[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"prompt text before the first section: {line[:60]!r}")
    system = ""
    examples: list[tuple[str, str]] = []
    pending: dict[str, str] = {}
    for name, lines in sections:
        body = "\n".join(lines).strip()
        if name == "system":
            system = body
        elif name.startswith("example"):
            pending = {}
        elif name in ("question", "answer"):
            pending[name] = body
            if "question" in pending and "answer" in pending:
                examples.append((pending["question"], pending["answer"]))
                pending = {}
        else:
            raise ValueError(f"unknown prompt section {name!r}")
    if not system or not examples:
        raise ValueError("the prompt needs a system section and at least one example")
    return ProsePrompt(system, tuple(examples))


@cache
def prose_prompt() -> ProsePrompt:
    text = resources.files("planner.prompts").joinpath("prose.md").read_text(encoding="utf-8")
    return parse_prompt(text)
