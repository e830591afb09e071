"""A deterministic verifier backend for tests and for running without a model.

A script (statement -> probability true) answers known statements; any other claim gets
a fixed probability, so the same claim always gets the same score.
"""

from __future__ import annotations

import json
from pathlib import Path

from verifier.backends.base import Claim

DEFAULT_PROBABILITY = 0.75


class ScriptedVerifier:
    name = "scripted"

    def __init__(self, script: dict[str, float] | None = None, script_path: Path | None = None):
        self.model = "scripted"
        self._script = dict(script or {})
        self._script_path = script_path

    async def load(self) -> None:
        if self._script_path is not None:
            self._script.update(json.loads(self._script_path.read_text()))

    async def score(self, claims: list[Claim]) -> list[float]:
        return [float(self._script.get(c.statement, DEFAULT_PROBABILITY)) for c in claims]

    async def close(self) -> None:
        return None
