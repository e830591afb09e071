"""Planning logic: prompt, constrained generation, validation, bounded retry."""

from __future__ import annotations

import ast
import asyncio
import time
from dataclasses import dataclass, field, replace

import structlog
from prometheus_client import Counter, Histogram

from planner.backends.base import Generation, GenerationRequest, PlanBackend, Usage
from planner.drafts import (
    DRAFT_STOP,
    DraftRefused,
    DraftWithoutCode,
    draft_reasoning,
    plan_from_draft,
)
from planner.prompting import (
    FORMATS,
    build_messages,
    program_messages,
    transcription_messages,
)
from planner.prose import PROSE_MAX_TOKENS, PROSE_TEMPERATURE, prose_prompt
from planner.repair import repair_plan, undefined_names
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
from services.toolspecs import DEFAULT_TOOLS, python_gives_answer, tool_names

log = structlog.get_logger("planner")

MAX_TRANSCRIBED_CHARS = 8000  # a longer draft is not pasted into a second prompt
# The question of the warm-up generation: only the prompt before it is kept cached.
WARM_UP_QUESTION = "How many days are in two weeks?"

PLANS = Counter("planner_plans_total", "Plans generated", ["outcome"])
REPAIRED = Counter(
    "planner_plans_repaired_total",
    "Valid plans the planner repaired before taking them (planner.repair)",
)
SOLUTIONS = Counter("planner_solutions_total", "Chain-of-thought solutions", ["answered"])
PLAN_LATENCY = Histogram("planner_generation_seconds", "Backend generation latency")


@dataclass
class _PlanJob:
    """One `/plan` request's progress over its attempts."""

    request: PlanRequest
    tools: list[ToolSpec]
    feedback: str | None
    plans: list[Plan] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # plans taken, as JSON
    errors: list[str] = field(default_factory=list)
    weak: list[Plan] = field(default_factory=list)  # valid, but failing check_python_steps
    duplicates: int = 0
    attempts: int = 0
    usage: Usage = field(default_factory=Usage)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    def fill_with_weak(self) -> None:
        """Valid plans that failed only the python check, as a last resort."""
        for plan in self.weak:
            key = plan.model_dump_json()
            if len(self.plans) < self.request.n and key not in self.seen:
                self.seen.add(key)
                self.plans.append(plan)


class PlannerService(ModelHost):
    backend: PlanBackend

    def __init__(self, backend: PlanBackend, settings: PlannerSettings) -> None:
        super().__init__(backend)
        self.settings = settings

    async def warm_up(self) -> None:
        """Evaluate the plan prompt's prefix (system prompt, tool list, examples) once, on
        a backend that keeps prefixes cached, so that no request pays for it: on a small
        CPU it is the longest part of a first plan, and a request whose deadline ends
        inside it would be cancelled with it, leaving the next request to pay it again."""
        if not (self.settings.warm_up and getattr(self.backend, "caches_prefixes", False)):
            return
        started = time.perf_counter()
        fmt = self.settings.plan_format
        spec = FORMATS[fmt]
        tools = list(DEFAULT_TOOLS)
        await self.backend.generate(
            GenerationRequest(
                messages=build_messages(WARM_UP_QUESTION, tools, None, fmt, self.settings.few_shot),
                json_schema=plan_json_schema(
                    tool_names(tools), reasoning_chars=spec.reasoning_chars
                )
                if spec.constrained
                else None,
                n=1,
                temperature=0.0,
                max_tokens=1,
                question=WARM_UP_QUESTION,
                metadata={"warm_up": True},
            )
        )
        log.info(
            "plan prompt prefix evaluated",
            **{
                "event.action": "planner.warm_up",
                "event.duration": int((time.perf_counter() - started) * 1e9),
                "labels.plan_format": fmt,
            },
        )

    async def _read_drafts(
        self,
        first: GenerationRequest,
        generation_texts: list[str],
        tools: list[ToolSpec],
        feedback: str | None,
        names: list[str],
    ) -> tuple[list[Plan | str | PlanInvalid], Usage]:
        """The plans the drafts state. A draft in prose only is asked for its program
        (`program_messages`: the model writes the code of its own solution, which is
        read as a draft again); a draft the planner still cannot read is transcribed
        into a JSON plan under the grammar. Each kind of second pass runs one request
        per draft, all in flight together, so the engine decodes them as one batch. A
        draft too long to transcribe, or whose pass the model cannot take, is an
        invalid candidate."""
        out: list[Plan | str | PlanInvalid] = []
        prose: list[tuple[int, str]] = []
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
                    "draft not readable, asking again",
                    **{"error.type": "draft_unreadable", "error.message": exc.message},
                )
                wants_program = isinstance(exc, DraftWithoutCode) and "python" in names
                (prose if wants_program else unread).append((len(out), text))
                out.append(text)
        usage = Usage()
        if prose:
            requests = [
                replace(
                    first,
                    messages=program_messages(
                        first.question, tools, draft, feedback, self.settings.few_shot
                    ),
                    n=1,
                    temperature=0.0,  # the program of this draft, not a new sample
                    stop=list(DRAFT_STOP),
                    metadata={**first.metadata, "program": k},
                )
                for k, (_, draft) in enumerate(prose)
            ]
            for (index, draft), result in zip(prose, await self._passes(requests), strict=True):
                if isinstance(result, InvalidRequest):
                    error = result.message
                else:
                    usage += result.cost()
                    try:
                        plan = plan_from_draft(result.texts[0] if result.texts else "", names)
                        # a program that cannot answer is no better than none: the draft
                        # is transcribed instead
                        check_python_steps(repair_plan(plan)[0])
                    except PlanInvalid as exc:
                        error = exc.message
                    else:
                        # the draft holds the thinking; what the program pass wrote before
                        # its code ("Here is the program:") does not
                        reasoning = draft_reasoning(draft) or plan.reasoning
                        out[index] = plan.model_copy(update={"reasoning": reasoning})
                        continue
                log.info(
                    "program pass gave no plan, transcribing the draft",
                    **{"error.type": "program_unreadable", "error.message": error},
                )
                unread.append((index, draft))
        if not unread:
            return out, usage
        schema = plan_json_schema(names)
        requests = [
            replace(
                first,
                messages=transcription_messages(
                    first.question, tools, draft, feedback, self.settings.few_shot
                ),
                json_schema=schema,
                n=1,
                temperature=0.0,  # a copy of the draft, not a new sample
                stop=[],
                metadata={**first.metadata, "transcription": k},
            )
            for k, (_, draft) in enumerate(unread)
        ]
        for (index, _), result in zip(unread, await self._passes(requests), strict=True):
            if isinstance(result, Exception):
                out[index] = PlanInvalid(f"the draft could not be transcribed: {result}")
            else:
                usage += result.cost()
                out[index] = result.texts[0] if result.texts else ""
        return out, usage

    async def _passes(self, requests: list[GenerationRequest]) -> list[Generation | InvalidRequest]:
        """Second passes over drafts, all in flight together. A pass the model cannot
        take (its prompt outgrew the context) is returned as its error; a failing
        backend fails the request, as it would have for the first pass, and stops the
        other passes."""
        tasks = [asyncio.ensure_future(self.backend.generate(r)) for r in requests]
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    error = task.exception()
                    if error is not None and not isinstance(error, InvalidRequest):
                        raise error
        finally:  # failed or cancelled: the other passes stop too
            for task in tasks:
                task.cancel()
            # every task's end is collected (no "exception never retrieved" warnings)
            await asyncio.gather(*tasks, return_exceptions=True)
        results: list[Generation | InvalidRequest] = []
        for task in tasks:
            error = task.exception()
            results.append(error if isinstance(error, InvalidRequest) else task.result())
        return results

    async def plan(self, request: PlanRequest) -> PlanResponse:
        """Up to `request.n` valid plans, in at most `max_attempts` generations; the
        error of an attempt's last invalid plan is fed back to the next."""
        if not self.ready:
            raise NotReady(f"planner model not ready: {self.load_error or 'loading'}")
        started = time.perf_counter()
        job = _PlanJob(request, list(request.tools or DEFAULT_TOOLS), request.feedback)
        for attempt in range(self.settings.max_attempts):
            job.attempts = attempt + 1
            candidates = await self._generate_candidates(job, attempt)
            for candidate in candidates:
                self._take(job, candidate, attempt)
            if len(job.plans) >= request.n:
                break
            if job.errors:
                job.feedback = _feedback(request.feedback, job.errors[-1])
        job.fill_with_weak()
        self._log_outcome(job, started)
        if not job.plans:
            raise PlanningFailed(
                f"no valid plan after {self.settings.max_attempts} attempts; "
                f"last error: {job.errors[-1] if job.errors else 'none'}"
            )
        return PlanResponse(
            plans=job.plans[: request.n],
            model=self.backend.model,
            backend=self.backend.name,
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def _temperature(self, request: PlanRequest) -> float:
        """The request's temperature, or the planner's; never greedy when more than one
        sample of the question is asked for (distinct samples need sampling, and so do
        later samples of the same question)."""
        temperature = (
            request.temperature if request.temperature is not None else self.settings.temperature
        )
        if request.n + request.offset > 1 and temperature == 0:
            temperature = self.settings.temperature or 0.3
        return temperature

    async def _generate_candidates(
        self, job: _PlanJob, attempt: int
    ) -> list[Plan | str | PlanInvalid]:
        """One generation of the plans still wanted: model texts, or, in the draft format,
        the plans its drafts state (`_read_drafts`)."""
        fmt = self.settings.plan_format
        spec = FORMATS[fmt]
        base = self._temperature(job.request)
        gen_request = GenerationRequest(
            messages=build_messages(
                job.request.question, job.tools, job.feedback, fmt, self.settings.few_shot
            ),
            json_schema=plan_json_schema(job.names, reasoning_chars=spec.reasoning_chars)
            if spec.constrained
            else None,
            n=job.request.n - len(job.plans),
            # Repeated samples: sample a little hotter to get distinct plans.
            temperature=min(base + 0.2 * job.duplicates, 1.5) if job.duplicates else base,
            top_p=self.settings.top_p,
            max_tokens=self.settings.max_tokens,
            seed=self.settings.seed + attempt,
            first_sample=job.request.offset,
            stop=list(DRAFT_STOP) if fmt == "draft" else [],
            question=job.request.question,
            metadata={"attempt": attempt},
        )
        with PLAN_LATENCY.time():
            generation = await self.backend.generate(gen_request)
        job.usage += generation.cost()
        if fmt != "draft":
            return list(generation.texts)
        candidates, cost = await self._read_drafts(
            gen_request, generation.texts, job.tools, job.feedback, job.names
        )
        job.usage += cost
        return candidates

    def _take(self, job: _PlanJob, candidate: Plan | str | PlanInvalid, attempt: int) -> None:
        """Keep a candidate that is a valid plan (new, when distinct plans are asked for);
        one whose python steps cannot answer is kept aside as weak."""
        try:
            plan = candidate_plan(candidate, job.names)
        except PlanInvalid as exc:
            PLANS.labels("invalid").inc()
            job.errors.append(exc.message)
            log.warning(
                "invalid plan from model",
                **{
                    "event.action": "planner.plan",
                    "planner.attempt": attempt,
                    "error.type": "plan_invalid",
                    "error.message": exc.message,
                },
            )
            return
        plan, repairs = repair_plan(plan)
        if repairs:
            REPAIRED.inc()
            log.info(
                "plan repaired",
                **{
                    "event.action": "planner.repair",
                    "planner.attempt": attempt,
                    "planner.repairs": repairs.notes,
                },
            )
        try:
            check_python_steps(plan)
        except PlanInvalid as exc:
            # A valid plan that will likely not answer: ask again, but keep it in case no
            # attempt does better.
            PLANS.labels("weak").inc()
            job.errors.append(exc.message)
            job.weak.append(plan)
            log.warning(
                "weak plan from model",
                **{
                    "event.action": "planner.plan",
                    "planner.attempt": attempt,
                    "error.type": "plan_weak",
                    "error.message": exc.message,
                },
            )
            return
        key = plan.model_dump_json()
        if key in job.seen and job.request.distinct:
            job.duplicates += 1  # n > 1 asks for distinct plans: ask again for the rest
            return
        job.seen.add(key)
        job.plans.append(plan)
        PLANS.labels("valid").inc()

    def _log_outcome(self, job: _PlanJob, started: float) -> None:
        """The request's log line: what its generations cost, summed over attempts."""
        if 0 < len(job.plans) < job.request.n:
            log.warning(
                "fewer distinct plans than requested",
                **{
                    "event.action": "planner.plan",
                    "planner.requested": job.request.n,
                    "planner.distinct": len(job.plans),
                    "planner.duplicates": job.duplicates,
                },
            )
        log.info(
            "plans generated" if job.plans else "no valid plan",
            **{
                "event.action": "planner.plan",
                "event.outcome": "success" if job.plans else "failure",
                "planner.requested": job.request.n,
                "planner.plans": len(job.plans),
                "planner.attempts": job.attempts,
                "event.duration": int((time.perf_counter() - started) * 1e9),
            },
            **job.usage.log_fields(),
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
            **{
                "event.action": "planner.solve",
                "planner.requested": request.n,
                "planner.answered": sum(s.answer is not None for s in solutions),
                "event.duration": int((time.perf_counter() - started) * 1e9),
            },
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


def candidate_plan(candidate: Plan | str | PlanInvalid, names: list[str]) -> Plan:
    """The plan a candidate holds (read from its JSON text when it is one), or its
    `PlanInvalid`. A step listing itself in `depends_on` loses that entry."""
    if isinstance(candidate, PlanInvalid):
        raise candidate
    if isinstance(candidate, Plan):
        return candidate
    return parse_plan(candidate, names, drop_self_dependencies=True)


def check_python_steps(plan: Plan) -> None:
    """Catch python steps that cannot give an answer, so the model is asked again.

    The plan itself is valid (schema and DAG); when no attempt does better, it is still
    returned rather than failing the request.

    The code is only parsed here, never run (the orchestrator's sandbox runs it). A step
    must be valid Python and read no name that neither it nor a step it depends on
    provides (`planner.repair.undefined_names`, checked after `repair_plan`); the answer
    step must give a value by the python tool's rule (`services.toolspecs.
    python_gives_answer`: end with an expression or set `result`), otherwise the sandbox
    would return nothing.
    """
    undefined = undefined_names(plan)
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
        missing = undefined.get(step.id)
        if missing:
            raise PlanInvalid(
                f"python step {step.id} uses {', '.join(sorted(missing))}, which no step "
                "defines: each step sees only its own variables and earlier results by "
                "their step ids"
            )
        if step.id != plan.answer_step or not tree.body:
            continue
        if not python_gives_answer(tree):
            raise PlanInvalid(
                f"python step {step.id} is the answer step but gives no value: "
                "end its code with `result = <final answer>`"
            )
