"""The lookup tool: exact answers from the shipped knowledge base, 'not found' otherwise."""

from __future__ import annotations

import json
import re
import sqlite3
from fractions import Fraction
from importlib import resources

import pytest

from orchestrator.tools.base import ToolContext, ToolError
from orchestrator.tools.lookup import KnowledgeBase, knowledge_base, lookup, normalize
from services.arith import parse_quantity
from services.toolspecs import LOOKUP

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("query", "answer"),
    [
        ("speed of light", "299792458 m/s"),
        ("Speed of light in a vacuum?", "299792458 m/s"),
        ("capital of France", "Paris"),
        ("What is the capital of Japan?", "Tokyo"),
        ("France population", "68200000 people"),
        ("France's population", "68200000 people"),
        ("population of the USA", "334900000 people"),
        ("capital of Australia", "Canberra"),
        ("currency of Japan", "Japanese yen"),
        ("boiling point of water", "100 °C"),
        ("feet in a mile", "5280 feet"),
        ("How many feet are in a mile?", "5280 feet"),
        ("mile to kilometers", "1.609344 km"),
        ("1 inch in centimeters", "2.54 cm"),
        ("how many seconds in a day", "86400 seconds"),
        ("days in a leap year", "366 days"),
        ("atomic number of gold", "79"),
        ("symbol of iron", "Fe"),
        ("Mars diameter", "6792 km"),
        ("orbital period of Jupiter", "4331 days"),
        ("Avogadro's number", "6.02214076e23 1/mol"),
        ("absolute zero", "-273.15 °C"),
        ("dozen", "12"),
        ("São Paulo population", None),
    ],
)
async def test_answers(query: str, answer: str | None) -> None:
    if answer is None:
        with pytest.raises(ToolError, match="not found"):
            await lookup(query, ToolContext())
    else:
        assert await lookup(query, ToolContext()) == answer


async def test_spec_example() -> None:
    assert await lookup(LOOKUP.example, ToolContext()) == "100 °C"


@pytest.mark.parametrize(
    "query",
    ["population of Atlantis", "capital of Franc", "speed of dark", "Paris", "1 + 1", "x" * 50],
)
async def test_unknown_queries_are_not_found_never_guessed(query: str) -> None:
    with pytest.raises(ToolError, match=r"^not found"):
        await lookup(query, ToolContext())


async def test_not_found_lists_what_is_known_about_the_entity() -> None:
    with pytest.raises(ToolError) as info:
        await lookup("GDP of France", ToolContext())
    assert "known for France: area, capital, continent, currency, population" in str(info.value)


async def test_ambiguous_phrasing_is_not_answered() -> None:
    # "mile in km" could mean 1 mile in km (1.609) or how many miles in a km (0.621).
    assert "mile in km" in knowledge_base().ambiguous
    with pytest.raises(ToolError, match="not found"):
        await lookup("mile in km", ToolContext())
    assert await lookup("kilometers in a mile", ToolContext()) == "1.609344 km"
    assert await lookup("miles in a kilometer", ToolContext()) == "0.621371192237334 miles"


@pytest.mark.parametrize("query", ["", "   ", "q" * 201])
async def test_bad_queries(query: str) -> None:
    with pytest.raises(ToolError):
        await lookup(query, ToolContext())


def test_normalize() -> None:
    assert normalize("What's the Capital of FRANCE?") == "capital of france"
    assert normalize("How many feet are in a mile") == "feet in 1 mile"
    assert normalize("Brasília") == "brasilia"


def test_knowledge_base_is_well_formed() -> None:
    kb = knowledge_base()
    assert len(kb.facts) >= 100
    for fact in kb.facts:
        assert fact.value.strip() and fact.value == fact.value.strip()
        if fact.unit or re.fullmatch(r"-?[\d.e+-]+", fact.value):
            # Every numeric answer is a number followed by its unit, usable by calc.
            parsed = parse_quantity(fact.answer())
            assert parsed is not None, fact
            assert parsed[1] == fact.unit


def test_every_fact_is_reachable_by_its_canonical_phrasing() -> None:
    kb = knowledge_base()
    for fact in kb.facts:
        query = fact.entity if fact.attribute == "value" else f"{fact.attribute} of {fact.entity}"
        found = kb.find(query)
        assert found is not None and found.answer() == fact.answer(), query


def test_exact_si_constants() -> None:
    kb = knowledge_base()

    def value(query: str) -> Fraction:
        fact = kb.find(query)
        assert fact is not None
        return Fraction(fact.value)

    assert value("speed of light") == 299_792_458
    assert value("light year") == 299_792_458 * Fraction("365.25") * 86_400
    assert value("mile to meters") == Fraction("0.0254") * 12 * 5280
    assert value("pound to grams") == Fraction("453.59237")
    assert value("gallon to liters") == 231 * Fraction("2.54") ** 3 / 1000


def test_conflicting_facts_make_a_phrase_ambiguous() -> None:
    kb = KnowledgeBase(
        {
            "attribute_aliases": {"value": []},
            "entities": [
                {"name": "x", "aliases": ["shared"], "facts": {"value": {"value": "1"}}},
                {"name": "y", "aliases": ["shared"], "facts": {"value": {"value": "2"}}},
            ],
        }
    )
    assert kb.find("x") is not None and kb.find("y") is not None
    assert kb.find("shared") is None


def test_country_facts_agree_with_the_sql_sample_data() -> None:
    seed = resources.files("orchestrator.data").joinpath("seed.sql").read_text("utf-8")
    db = sqlite3.connect(":memory:")
    db.executescript(seed)
    rows = {
        name: (capital, continent, population, area, currency)
        for name, capital, continent, population, area, currency in db.execute(
            "SELECT name, capital, continent, population, area_km2, currency FROM countries"
        )
    }
    data = json.loads(
        resources.files("orchestrator.data").joinpath("knowledge.json").read_text("utf-8")
    )
    countries = [e for e in data["entities"] if e["kind"] == "country"]
    assert len(countries) >= 15
    for country in countries:
        capital, continent, population, area, currency = rows[country["name"]]
        facts = country["facts"]
        assert facts["capital"]["value"] == capital
        assert facts["continent"]["value"] == continent
        assert int(facts["population"]["value"]) == population
        assert int(facts["area"]["value"]) == area
        assert facts["currency"]["value"] == currency
