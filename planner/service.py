"""Planning logic: prompt, constrained generation, validation, bounded retry."""

from __future__ import annotations

import ast
import asyncio
import time
from dataclasses import replace

import structlog
from prometheus_client import Counter, Histogram

from planner.backends.base import GenerationRequest, PlanBackend, Usage
from planner.drafts import DRAFT_STOP, DraftRefused, plan_from_draft
from planner.prompting import FORMATS, build_messages, transcription_messages
from planner.prose import PROSE_MAX_TOKENS, PROSE_TEMPERATURE, prose_prompt
from services.answers import last_number
from services.errors import InvalidRequest, NotReady, PlanInvalid, PlanningFailed
from services.model_host import ModelHost
from services.plans import parse_plan
from services.schemas import (
    SOLUTION_ANSWER_CHARS,
    SOLUTION_TEXT_CHARS,
    Plan,
    PlanRequest,
    PlanResponse,
    Solution,
    SolveRequest,
    SolveResponse,
    ToolSpec,
    plan_json_schema,
)
from services.settings import PlannerSettings
from services.toolspecs import DEFAULT_TOOLS

log = structlog.get_logger("planner")

MAX_TRANSCRIBED_CHARS = 8000  # a longer draft is not pasted into a second prompt

PLANS = Counter("planner_plans_total", "Plans generated", ["outcome"])
SOLUTIONS = Counter("planner_solutions_total", "Chain-of-thought solutions", ["answered"])
PLAN_LATENCY = Histogram("planner_generation_seconds", "Backend generation latency")


class PlannerService(ModelHost):
    backend: PlanBackend

    def __init__(self, backend: PlanBackend, settings: PlannerSettings) -> None:
        super().__init__(backend)
        self.settings = settings

    async def _read_drafts(
        self,
        first: GenerationRequest,
        generation_texts: list[str],
        tools: list[ToolSpec],
        feedback: str | None,
        names: list[str],
    ) -> tuple[list[Plan | str | PlanInvalid], Usage]:
        """The plans the drafts state. A draft the planner cannot read is transcribed
        into a JSON plan under the grammar (one pass per such draft, all in flight
        together, so the engine decodes them as one batch); one too long to transcribe,
        or whose transcription the model cannot take, is an invalid candidate."""
        out: list[Plan | str | PlanInvalid] = []
        unread: list[tuple[int, str]] = []
        for text in generation_texts:
            try:
                out.append(plan_from_draft(text, names))
            except DraftRefused as exc:
                out.append(exc)
            except PlanInvalid as exc:
                if len(text) > MAX_TRANSCRIBED_CHARS:
                    out.append(DraftRefused(f"{exc.message}; too long to transcribe"))
                    continue
                log.info(
                    "draft not readable, transcribing it",
                    **{"error.type": "draft_unreadable", "error.message": exc.message},
                )
                unread.append((len(out), text))
                out.append(text)
        usage = Usage()
        if not unread:
            return out, usage
        schema = plan_json_schema(names)
        requests = [
            replace(
                first,
                messages=transcription_messages(first.question, tools, draft, feedback),
                json_schema=schema,
                n=1,
                temperature=0.0,  # a copy of the draft, not a new sample
                stop=[],
                metadata={**first.metadata, "transcription": k},
            )
            for k, (_, draft) in enumerate(unread)
        ]
        tasks = [asyncio.ensure_future(self.backend.generate(r)) for r in requests]
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    error = task.exception()
                    # a pass the model cannot take (its prompt outgrew the context) is one
                    # invalid candidate; a failing backend fails the request, as it would
                    # have for the first pass
                    if error is not None and not isinstance(error, InvalidRequest):
                        raise error
        finally:  # failed or cancelled: the other passes stop too
            for task in tasks:
                task.cancel()
        for (index, _), task in zip(unread, tasks, strict=True):
            error = task.exception()
            if error is not None:
                out[index] = PlanInvalid(f"the draft could not be transcribed: {error}")
            else:
                generation = task.result()
                usage += generation.cost()
                out[index] = generation.texts[0] if generation.texts else ""
        return out, usage

    async def plan(self, request: PlanRequest) -> PlanResponse:
        if not self.ready:
            raise NotReady(f"planner model not ready: {self.load_error or 'loading'}")
        started = time.perf_counter()
        tools: list[ToolSpec] = list(request.tools or DEFAULT_TOOLS)
        names = [t.name for t in tools]
        spec = FORMATS[self.settings.plan_format]
        schema = plan_json_schema(names, reasoning_chars=spec.reasoning_chars)
        temperature = (
            request.temperature if request.temperature is not None else self.settings.temperature
        )
        # distinct samples need sampling, and so do later samples of the same question
        if request.n + request.offset > 1 and temperature == 0:
            temperature = self.settings.temperature or 0.3  # distinct samples need sampling
        plans: list[Plan] = []
        seen: set[str] = set()
        feedback = request.feedback
        errors: list[str] = []
        duplicates = 0
        weak: list[Plan] = []
        usage = Usage()
        attempts = 0
        fmt = self.settings.plan_format
        for attempt in range(self.settings.max_attempts):
            attempts = attempt + 1
            want = request.n - len(plans)
            gen_request = GenerationRequest(
                messages=build_messages(request.question, tools, feedback, fmt),
                json_schema=schema if spec.constrained else None,
                n=want,
                # Repeated samples: sample a little hotter to get distinct plans.
                temperature=min(temperature + 0.2 * duplicates, 1.5) if duplicates else temperature,
                top_p=self.settings.top_p,
                max_tokens=self.settings.max_tokens,
                seed=self.settings.seed + attempt,
                first_sample=request.offset,
                stop=list(DRAFT_STOP) if fmt == "draft" else [],
                question=request.question,
                metadata={"attempt": attempt},
            )
            with PLAN_LATENCY.time():
                generation = await self.backend.generate(gen_request)
            usage += generation.cost()
            candidates: list[Plan | str | PlanInvalid] = list(generation.texts)
            if fmt == "draft":
                candidates, cost = await self._read_drafts(
                    gen_request, generation.texts, tools, feedback, names
                )
                usage += cost
            for candidate in candidates:
                try:
                    if isinstance(candidate, PlanInvalid):
                        raise candidate
                    plan = (
                        candidate if isinstance(candidate, Plan) else parse_plan(candidate, names)
                    )
                except PlanInvalid as exc:
                    PLANS.labels("invalid").inc()
                    errors.append(exc.message)
                    log.warning(
                        "invalid plan from model",
                        attempt=attempt,
                        **{"error.type": "plan_invalid", "error.message": exc.message},
                    )
                    continue
                try:
                    check_python_steps(plan)
                except PlanInvalid as exc:
                    # A valid plan that will likely not answer: ask again, but keep it in
                    # case no attempt does better.
                    PLANS.labels("weak").inc()
                    errors.append(exc.message)
                    weak.append(plan)
                    log.warning(
                        "weak plan from model",
                        attempt=attempt,
                        **{"error.type": "plan_weak", "error.message": exc.message},
                    )
                    continue
                key = plan.model_dump_json()
                if key in seen and request.distinct:
                    duplicates += 1
                    continue  # n > 1 asks for distinct plans: ask again for the rest
                seen.add(key)
                plans.append(plan)
                PLANS.labels("valid").inc()
            if len(plans) >= request.n:
                break
            if errors:
                feedback = _feedback(request.feedback, errors[-1])
        for plan in weak:  # valid plans that failed only the python check, as a last resort
            key = plan.model_dump_json()
            if len(plans) < request.n and key not in seen:
                seen.add(key)
                plans.append(plan)
        if 0 < len(plans) < request.n:
            log.warning(
                "fewer distinct plans than requested",
                requested=request.n,
                distinct=len(plans),
                duplicates=duplicates,
            )
        # The request's log line: what its generations cost, summed over attempts.
        log.info(
            "plans generated" if plans else "no valid plan",
            requested=request.n,
            plans=len(plans),
            attempts=attempts,
            **{"event.duration": int((time.perf_counter() - started) * 1e9)},
            **usage.log_fields(),
        )
        if not plans:
            raise PlanningFailed(
                f"no valid plan after {self.settings.max_attempts} attempts; "
                f"last error: {errors[-1] if errors else 'none'}"
            )
        return PlanResponse(
            plans=plans[: request.n],
            model=self.backend.model,
            backend=self.backend.name,
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    async def solve(self, request: SolveRequest) -> SolveResponse:
        """Chain-of-thought solutions `offset .. offset + n - 1` (planner.prose): the
        first greedy, the rest sampled, all in flight together so the engine decodes them
        as one batch."""
        if not self.ready:
            raise NotReady(f"planner model not ready: {self.load_error or 'loading'}")
        started = time.perf_counter()
        messages = prose_prompt().messages(request.question)
        temperature = request.temperature or PROSE_TEMPERATURE

        def generation(first: int, n: int, greedy: bool) -> GenerationRequest:
            return GenerationRequest(
                messages=messages,
                json_schema=None,
                n=n,
                temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else self.settings.top_p,
                max_tokens=PROSE_MAX_TOKENS,
                seed=self.settings.seed,
                first_sample=first,
                question=request.question,
                metadata={"kind": "prose"},
            )

        requests = []
        first, n = request.offset, request.n
        if first == 0:
            requests.append(generation(0, 1, greedy=True))
            first, n = 1, n - 1
        if n:
            requests.append(generation(first, n, greedy=False))
        with PLAN_LATENCY.time():
            generations = await asyncio.gather(*(self.backend.generate(r) for r in requests))
        solutions = []
        usage = Usage()
        for generated in generations:
            usage += generated.cost()
            for text in generated.texts:
                answer = last_number(text)
                if answer is not None and len(answer) > SOLUTION_ANSWER_CHARS:
                    answer = None  # a number that long is no answer (and not on the wire)
                SOLUTIONS.labels(str(answer is not None).lower()).inc()
                solutions.append(Solution(text=text[:SOLUTION_TEXT_CHARS], answer=answer))
        log.info(
            "solutions generated",
            requested=request.n,
            answered=sum(s.answer is not None for s in solutions),
            **{"event.duration": int((time.perf_counter() - started) * 1e9)},
            **usage.log_fields(),
        )
        return SolveResponse(
            solutions=solutions[: request.n],
            model=self.backend.model,
            backend=self.backend.name,
            latency_ms=(time.perf_counter() - started) * 1000,
        )


def _feedback(original: str | None, error: str) -> str:
    note = f"Your last plan was invalid: {error}. Answer with a plan that fixes this."
    return f"{original}\n{note}" if original else note


def check_python_steps(plan: Plan) -> None:
    """Catch python steps that cannot give an answer, so the model is asked again.

    The plan itself is valid (schema and DAG); when no attempt does better, it is still
    returned rather than failing the request.

    The code is only parsed here, never run (the orchestrator's sandbox runs it). A step
    must be valid Python, and the answer step must end with an expression or assign
    `result`, otherwise the sandbox would return nothing.
    """
    for step in plan.steps:
        if step.tool != "python":
            continue
        try:
            tree = ast.parse(step.input)
        except SyntaxError as exc:
            raise PlanInvalid(
                f"python step {step.id} is not valid Python: {exc.msg} (line {exc.lineno})"
            ) from None
        except (ValueError, RecursionError, MemoryError):
            raise PlanInvalid(f"python step {step.id} cannot be parsed") from None
        if step.id != plan.answer_step or not tree.body:
            continue
        last = tree.body[-1]
        assigns_result = any(
            isinstance(node, ast.Name) and node.id == "result" and isinstance(node.ctx, ast.Store)
            for stmt in tree.body
            for node in ast.walk(stmt)
        )
        if not isinstance(last, ast.Expr) and not assigns_result:
            raise PlanInvalid(
                f"python step {step.id} is the answer step but gives no value: "
                "end its code with `result = <final answer>`"
            )
