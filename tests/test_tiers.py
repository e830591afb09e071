"""Every test carries its tier: the collection check in tests/conftest.py refuses a test
without one and a test marked unit together with integration or model, and the tiers
it checks are the markers pyproject.toml defines."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import conftest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


@dataclass
class FakeItem:
    nodeid: str
    marks: list[str] = field(default_factory=list)

    def iter_markers(self) -> list[pytest.Mark]:
        return [getattr(pytest.mark, name).mark for name in self.marks]


def check(*items: FakeItem) -> None:
    conftest.pytest_collection_modifyitems(None, list(items))  # type: ignore[arg-type]


def test_tiered_tests_pass_the_check() -> None:
    check(
        FakeItem("a", ["unit"]),
        FakeItem("b", ["integration", "slow"]),
        FakeItem("c", ["model", "slow", "parametrize"]),
        FakeItem("d", ["security"]),
        FakeItem("e", ["unit", "security"]),
        FakeItem("f", ["integration", "security"]),
    )


def test_a_test_without_a_tier_fails_the_session() -> None:
    with pytest.raises(pytest.UsageError, match=r"no tier marker .*: tests/x\.py::t$"):
        check(FakeItem("tests/ok.py::t", ["unit"]), FakeItem("tests/x.py::t", ["slow"]))
    with pytest.raises(pytest.UsageError, match=r"no tier marker .*: tests/y\.py::t$"):
        check(FakeItem("tests/y.py::t", ["browser", "slow"]))


@pytest.mark.parametrize("other", ["integration", "model"])
def test_unit_beside_integration_or_model_fails_the_session(other: str) -> None:
    with pytest.raises(pytest.UsageError, match=r"unit and integration/model at once: t$"):
        check(FakeItem("t", ["unit", other]))


def test_the_tiers_are_the_markers_pyproject_defines() -> None:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    defined = {line.split(":", 1)[0] for line in ini["markers"]}
    assert defined == {*conftest.TIERS, *conftest.BESIDE_A_TIER}
    assert "--strict-markers" in ini["addopts"]
