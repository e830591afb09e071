"""The `lookup` tool: exact answers from the knowledge base the product ships.

`orchestrator/data/knowledge.json` holds entities (constants, units, countries, planets,
elements), each with aliases and facts. A query is normalized (case, punctuation,
possessives, question words, articles) and matched exactly against phrasings built from
every entity alias and attribute alias: `capital of France`, `France's population`,
`speed of light`, `feet in a mile`, `mile to kilometers`. A phrasing that two different
facts would answer is dropped as ambiguous. There is no fuzzy matching: an unknown
query raises `ToolError("not found: ...")`, never a guess.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from orchestrator.tools.base import ToolContext, ToolError

MAX_QUERY_CHARS = 200

# Words that ask rather than name: dropped from the start of a query.
_LEADING = (
    "what is",
    "what are",
    "whats",
    "what s",
    "how many",
    "how much",
    "tell me",
    "give me",
    "look up",
    "lookup",
    "find",
    "what",
    "which",
)
_DROPPED_WORDS = {"the", "is", "are", "there", "exactly"}
_ONE_WORDS = {"a", "an", "one"}


@dataclass(frozen=True)
class Fact:
    entity: str
    attribute: str
    value: str
    unit: str = ""
    note: str = ""

    def answer(self) -> str:
        return f"{self.value} {self.unit}".strip()


def normalize(text: str) -> str:
    """Lower-case, ASCII-fold, drop punctuation, question words and articles."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).lower()
    text = re.sub(r"['’`]s\b", "", text)  # possessive: France's -> France
    text = re.sub(r"[^a-z0-9.^ ]+", " ", text)
    text = re.sub(r"(?<![0-9])\.|\.(?![0-9])", " ", text)
    words = text.split()
    joined = " ".join(words)
    for lead in _LEADING:
        if joined == lead or joined.startswith(lead + " "):
            words = words[len(lead.split()) :]
            break
    out: list[str] = []
    for word in words:
        if word in _DROPPED_WORDS:
            continue
        out.append("1" if word in _ONE_WORDS else word)
    return " ".join(out)


def _phrasings(entity: str, attribute: str) -> list[str]:
    if attribute == "value":
        return [entity, f"1 {entity}", f"value of {entity}", f"{entity} value"]
    return [
        f"{attribute} of {entity}",
        f"{attribute} of 1 {entity}",
        f"{entity} {attribute}",
        f"{attribute} in {entity}",
        f"{attribute} in 1 {entity}",
        f"{attribute} per {entity}",
        f"{entity} in {attribute}",
        f"1 {entity} in {attribute}",
        f"{entity} to {attribute}",
        f"1 {entity} to {attribute}",
    ]


class KnowledgeBase:
    def __init__(self, data: dict[str, Any]) -> None:
        attr_aliases: dict[str, list[str]] = {
            name: [name, *aliases] for name, aliases in data["attribute_aliases"].items()
        }
        index: dict[str, Fact] = {}
        ambiguous: set[str] = set()
        self.entities: dict[str, list[str]] = {}
        self.facts: list[Fact] = []
        for item in data["entities"]:
            names = [item["name"], *item.get("aliases", [])]
            self.entities[item["name"]] = sorted(item["facts"])
            for attribute, raw in item["facts"].items():
                fact = Fact(
                    entity=item["name"],
                    attribute=attribute,
                    value=str(raw["value"]),
                    unit=raw.get("unit", ""),
                    note=raw.get("note", ""),
                )
                self.facts.append(fact)
                for entity_name in names:
                    for attr_name in attr_aliases.get(attribute, [attribute]):
                        if attribute == "value":
                            attr_name = "value"
                        for phrase in _phrasings(normalize(entity_name), normalize(attr_name)):
                            if not phrase:
                                continue
                            known = index.get(phrase)
                            if known is not None and known.answer() != fact.answer():
                                ambiguous.add(phrase)
                            index.setdefault(phrase, fact)
        for phrase in ambiguous:
            del index[phrase]
        self._index = index
        self.ambiguous = frozenset(ambiguous)
        self._entity_names = {
            normalize(name): item["name"]
            for item in data["entities"]
            for name in [item["name"], *item.get("aliases", [])]
            if len(normalize(name)) > 2
        }

    def find(self, query: str) -> Fact | None:
        return self._index.get(normalize(query))

    def entity_mentioned(self, query: str) -> str | None:
        """The entity a query names, if any, to list what is known about it."""
        padded = f" {normalize(query)} "
        best = None
        for alias, name in self._entity_names.items():
            if f" {alias} " in padded and (best is None or len(alias) > len(best[0])):
                best = (alias, name)
        return best[1] if best else None


@cache
def knowledge_base() -> KnowledgeBase:
    text = resources.files("orchestrator.data").joinpath("knowledge.json").read_text("utf-8")
    return KnowledgeBase(json.loads(text))


async def lookup(input: str, ctx: ToolContext) -> str:
    query = input.strip()
    if not query:
        raise ToolError("empty query; ask for e.g. 'capital of France'")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query is longer than {MAX_QUERY_CHARS} characters")
    kb = knowledge_base()
    fact = kb.find(query)
    if fact is not None:
        return fact.answer()
    entity = kb.entity_mentioned(query)
    if entity is not None:
        known = ", ".join(a for a in kb.entities[entity] if a != "value")
        raise ToolError(f"not found: {query!r} (known for {entity}: {known})")
    raise ToolError(f"not found: {query!r}")
