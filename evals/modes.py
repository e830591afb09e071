"""The evaluation modes and the runner behind each.

All modes run on the same planner model:

- `direct`: the planner model answers on its own with chain-of-thought, no tools: the
  prompt of the planner's `/solve` (`planner/prompts/prose.md`), greedy, with a bounded
  number of new tokens. The model is loaded in-process through the planner's backend
  machinery, so the baseline can run on its own core beside the services.
- `plan`: `POST /reason` with one plan, executed, no verifier.
- `plan+verify`: one plan, executed, verified (the orchestrator may replan on rejection).
- `plan+verify+sc5`: up to five plans (adaptive: three first, two more only when
  those leave the vote open), executed; the answer most of them agree on, verified.
- `plan+verify+mixed5`: programs and prose, five samples: two plans, executed, and
  three chain-of-thought solutions (the first greedy), one vote each; the answer most
  of them agree on, verified. The mix the sampling study chose in the `json` plan format
  (docs/eval/dev).
- `plan+verify+mixed7`: four plans and three chain-of-thought solutions (adaptive: three
  plans with the solutions first, the fourth only when those leave the vote open),
  verified. The mix the sampling study in the `draft` plan format chose (docs/eval/dev).
- `votes4x4`: the sampling study, not a served setting: four plans and four
  chain-of-thought solutions (the first greedy: the `direct` answer), all drawn
  (adaptive off), verified. Its lines keep every vote (`agreement.votes`), so any vote
  over up to four of each kind can be replayed from them (`evals/votes.py`).

The pipeline modes never use the answer cache unless asked to, so every item is a
fresh measurement.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from evals.data import Item
from evals.extract import extract_number, is_correct
from planner.backends.base import GenerationRequest, PlanBackend
from planner.prose import PROSE_MAX_TOKENS, ProsePrompt, prose_prompt
from services.schemas import Plan
from services.settings import PlannerSettings


@dataclass(frozen=True)
class PipelineMode:
    n_plans: int
    verify: bool
    n_prose: int = 0
    adaptive: bool = True


MODES: dict[str, PipelineMode | None] = {
    "direct": None,
    "plan": PipelineMode(n_plans=1, verify=False),
    "plan+verify": PipelineMode(n_plans=1, verify=True),
    "plan+verify+sc5": PipelineMode(n_plans=5, verify=True),
    "plan+verify+mixed5": PipelineMode(n_plans=2, verify=True, n_prose=3),
    "plan+verify+mixed7": PipelineMode(n_plans=4, verify=True, n_prose=3),
    "votes4x4": PipelineMode(n_plans=4, verify=True, n_prose=4, adaptive=False),
}

DIRECT_MAX_TOKENS = PROSE_MAX_TOKENS
ANSWER_TEXT_MAX_CHARS = 4000
PLAN_FAILURE_TYPES = {"planning_failed", "plan_invalid"}

Runner = Callable[[Item], Awaitable[dict[str, Any]]]


class EvalAborted(RuntimeError):
    """The run cannot go on (the service is unreachable); finished lines are kept."""


def base_record(item: Item, *, dataset: str, mode: str, model: str) -> dict[str, Any]:
    return {
        "id": item.id,
        "dataset": dataset,
        "mode": mode,
        "model": model,
        "question": item.question,
        "gold": item.gold,
        "answer_text": None,
        "predicted": None,
        "correct": False,
        "verdict": None,
        "confidence": None,
        "signals": None,
        "schema_valid": None,
        "n_steps": 0,
        "step_statuses": [],
        "latency_ms": {"plan": None, "execute": None, "verify": None, "total": None},
        "cached": False,
        "agreement": None,
        "trace_id": None,
        "error": None,
    }


def score(record: dict[str, Any], answer_text: str | None, gold: int | float) -> None:
    record["answer_text"] = None if answer_text is None else answer_text[:ANSWER_TEXT_MAX_CHARS]
    record["predicted"] = extract_number(answer_text)
    record["correct"] = is_correct(record["predicted"], gold)


# --------------------------------------------------------------------------- pipeline


class ReasonRunner:
    """Sends each item to a live orchestrator's `/reason`."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        mode: str,
        *,
        dataset: str,
        model: str,
        deadline_s: float = 120.0,
        use_cache: bool = False,
        api_key: str | None = None,
    ) -> None:
        pipeline = MODES.get(mode)
        if pipeline is None:
            raise ValueError(f"{mode!r} is not a pipeline mode")
        self.client = client
        self.url = url.rstrip("/")
        self.mode = mode
        self.dataset = dataset
        self.model = model
        self.options: dict[str, Any] = {
            "n_plans": pipeline.n_plans,
            "verify": pipeline.verify,
            "use_cache": use_cache,
            "deadline_s": deadline_s,
        }
        if pipeline.n_prose:
            self.options["n_prose"] = pipeline.n_prose
        if not pipeline.adaptive:
            self.options["adaptive"] = False
        self.timeout_s = deadline_s + 30.0
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def __call__(self, item: Item) -> dict[str, Any]:
        record = base_record(item, dataset=self.dataset, mode=self.mode, model=self.model)
        body = {"question": item.question, "options": self.options}
        started = time.perf_counter()
        try:
            r = await self.client.post(
                f"{self.url}/reason", json=body, headers=self.headers, timeout=self.timeout_s
            )
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            raise EvalAborted(f"cannot reach {self.url}: {type(exc).__name__}: {exc}") from exc
        except httpx.TimeoutException as exc:
            record["error"] = f"client timeout after {self.timeout_s:.0f} s ({type(exc).__name__})"
            record["latency_ms"]["total"] = _ms_since(started)
            return record
        client_ms = _ms_since(started)
        try:
            data = r.json()
        except ValueError:
            data = {}
        if r.status_code != 200:
            detail = data.get("error", {}) if isinstance(data, dict) else {}
            record["error"] = (
                f"{r.status_code} {detail.get('type', 'error')}: {detail.get('message', r.text[:300])}"
            )
            record["trace_id"] = data.get("trace_id") if isinstance(data, dict) else None
            # Only a planner that gave up on producing a valid plan counts against plan
            # validity; a timeout or an unreachable dependency says nothing about it.
            if detail.get("type") in PLAN_FAILURE_TYPES:
                record["schema_valid"] = False
            record["latency_ms"]["total"] = client_ms
            return record
        score(record, data.get("answer"), item.gold)
        steps = data.get("steps") or []
        timings = data.get("timings_ms") or {}
        record.update(
            verdict=data.get("verdict"),
            confidence=data.get("confidence"),
            signals=data.get("signals"),
            schema_valid=plan_validity(data),
            n_steps=len(steps),
            step_statuses=[s.get("status") for s in steps],
            cached=bool(data.get("cached")),
            agreement=data.get("agreement"),
            trace_id=data.get("trace_id"),
        )
        if data.get("replanning"):  # every round, when the request replanned
            record["replanning"] = data["replanning"]
        record["latency_ms"] = {
            "plan": timings.get("plan"),
            "solve": timings.get("solve") if self.options.get("n_prose") else None,
            "execute": timings.get("execute"),
            "verify": timings.get("verify") if self.options["verify"] else None,
            "total": timings.get("total"),
            "client": client_ms,
        }
        return record


async def planner_model_name(client: httpx.AsyncClient, planner_url: str) -> str:
    """`backend:model` as the planner's `/readyz` reports it, or "unknown"."""
    try:
        r = await client.get(f"{planner_url.rstrip('/')}/readyz", timeout=5.0)
        reason = str(r.json().get("reason", ""))
    except (httpx.HTTPError, ValueError, AttributeError):
        return "unknown"
    if r.status_code == 200 and reason.endswith(" loaded") and ":" in reason:
        return reason.removesuffix(" loaded")
    return "unknown"


# --------------------------------------------------------------------------- direct


def load_direct_backend(settings: PlannerSettings) -> PlanBackend:
    """The planner's model as a free-text generator (the backend is not loaded yet)."""
    if settings.backend == "llamacpp":
        from planner.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend(settings, constrained=False)
    raise ValueError(
        f"the direct mode needs free-text generation in-process; the {settings.backend!r} "
        "planner backend only produces schema-constrained plans. Use PLANNER_BACKEND=llamacpp "
        "(the embedded default)."
    )


class DirectRunner:
    """Asks the planner model directly for a chain-of-thought answer."""

    def __init__(
        self,
        backend: PlanBackend,
        *,
        dataset: str,
        prompt: ProsePrompt | None = None,
        max_tokens: int = DIRECT_MAX_TOKENS,
        seed: int = 0,
    ) -> None:
        self.backend = backend
        self.dataset = dataset
        self.prompt = prompt or prose_prompt()
        self.max_tokens = max_tokens
        self.seed = seed

    async def __call__(self, item: Item) -> dict[str, Any]:
        model = f"{self.backend.name}:{self.backend.model}"
        record = base_record(item, dataset=self.dataset, mode="direct", model=model)
        request = GenerationRequest(
            messages=self.prompt.messages(item.question),
            json_schema=None,  # free text
            n=1,
            temperature=0.0,
            top_p=1.0,
            max_tokens=self.max_tokens,
            seed=self.seed,
            question=item.question,
        )
        started = time.perf_counter()
        generation = await self.backend.generate(request)
        total = _ms_since(started)
        score(record, generation.texts[0] if generation.texts else None, item.gold)
        record["latency_ms"]["total"] = total
        record["completion_tokens"] = generation.completion_tokens
        return record


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def plan_validity(data: dict[str, Any]) -> bool | None:
    """Whether a 200 response's plan is a valid plan on the wire (`Plan`, checked again
    here, not taken on trust); None for an answer served from the model's own worked
    solution (a mixed mode's prose vote), which carries no plan to judge. A response with
    neither is a plan failure."""
    plan = data.get("plan")
    if plan is None:
        return None if data.get("solution") is not None else False
    try:
        Plan.model_validate(plan)
    except ValidationError:
        return False
    return True
