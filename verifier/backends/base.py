"""The interface every verifier model backend implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Claim:
    statement: str
    context: str = ""
    question: str | None = None


class VerifierBackend(Protocol):
    name: str
    model: str

    async def load(self) -> None: ...

    async def score(self, claims: list[Claim]) -> list[float]:
        """Calibrated probability that each claim is true, in input order."""

    async def close(self) -> None: ...
