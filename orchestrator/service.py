"""`/reason`: plan, execute, vote across plans, verify, replan where it pays, cache.

With `n_plans > 1` the answer is the one most executed plans agree on (self-consistency
over executed answers); the verifier's score only breaks ties. Sampling is adaptive.
Plans alone: a majority of the plans is drawn first, and the rest only when those leave
the vote open, so the answer is the one the full draw's vote would give. With
`n_prose > 0` the planner's chain-of-thought solutions (`/solve`, no tools) vote beside
the plans, one vote each: programs and prose make different mistakes. Then the first plan
and the greedy solution are drawn first, and when they agree that is the answer; only
when they disagree are the other plans and solutions drawn, together, and all of them
vote (`first_stage`, chosen on the GSM8K train dev split: docs/eval/dev).
An answer an executed plan gave is served with that plan's steps; one only prose gave,
with its solution. A round is replanned (with the failed attempt as feedback) only for
the reasons in `replan_on`; replanning rounds draw plans only.

Every outside call gets what is left of the request's deadline as its timeout. The
planner being down is an error (there is nothing to run: 503); a question it cannot plan
is another (422 `planning_failed`, not retryable); the verifier being down, slow or
answering outside its schema only makes the answer `unverified`. Every request has a
budget of tool calls over all its plans and rounds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import structlog
from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from orchestrator.cache import Cache, cache_get, make_key
from orchestrator.confidence import Calibrator, Calibrators
from orchestrator.contribution import contributions
from orchestrator.executor import Execution, PlanExecutor, StepCallback
from orchestrator.limits import TenantSemaphore, ToolBudget
from orchestrator.tools.registry import ToolRegistry
from services import tracing
from services.answers import answer_key, normalize_text, vote_weight
from services.claims import plan_claim, solution_claim
from services.errors import (
    ClientClosed,
    DeadlineExceeded,
    DependencyUnavailable,
    PlanningFailed,
    ServiceError,
    Unplannable,
    error_label,
)
from services.http import ServiceClient
from services.plans import check_plan
from services.schemas import (
    STREAM_EVENT_NAMES,
    VOTE_ANSWER_CHARS,
    Agreement,
    ModelInfo,
    Plan,
    PlanEvent,
    PlanResponse,
    ReasonRequest,
    ReasonResponse,
    ReplanReason,
    RoundEnd,
    RoundStart,
    RoundSummary,
    RoundVote,
    Signals,
    Solution,
    SolveResponse,
    StepEvent,
    StepResult,
    StreamEvent,
    Timings,
    Verdict,
    VerifyBatchResponse,
    VerifyResponse,
    Vote,
)

log = structlog.get_logger("orchestrator")

REQUESTS = Counter("reason_requests_total", "/reason requests", ["verdict", "cached"])
STAGE_LATENCY = Histogram(
    "reason_stage_duration_seconds",
    "Latency of each /reason stage",
    ["stage"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
REPLANS = Counter("reason_replans_total", "Replanning rounds", ["reason"])
PLANS_DRAWN = Counter("reason_plans_drawn_total", "Plans drawn and executed", ["batch"])
# By error type (services.errors, bounded by error_label): a stream that ends in an error
# says 200 in http_requests_total, this says how it ended.
REQUEST_ERRORS = Counter(
    "reason_request_errors_total", "/reason requests that ended in an error", ["type"]
)

UNVERIFIED_CONFIDENCE = 0.5
LOW_AGREEMENT = 0.5  # the served answer has fewer than half of the round's plans
VERIFY_MIN_BUDGET_S = 0.05
VERIFY_RESERVE_S = 2.5  # left for the verifier after more plans (the model verifier: ~2 s)
PLAN_MIN_BUDGET_S = 0.05
STAGES = ("plan", "solve", "execute", "verify", "contribute")
# tool calls the counterfactual runs of one request may make (option `contributions`),
# out of what is left of its tool-call budget
CONTRIBUTION_MAX_CALLS = 24
# The planner's GET /info names the model it serves; answers are cached per model, and the
# orchestrator asks again when its last answer is older than this (a planner redeployed
# with another model: its old answers miss within this many seconds)
INFO_TTL_S = 5.0
INFO_TIMEOUT_S = 1.0  # GET /info of the planner and the verifier


EventCallback = Callable[[str, StreamEvent], Awaitable[None] | None]


@dataclass(frozen=True)
class Run:
    """What every plan of one request runs with (`round`: the round it is in)."""

    trace_id: str
    tenant: str
    on_step: StepCallback | None
    budget: ToolBudget
    limits_tenant: str  # whose sandbox share the steps count against
    on_event: EventCallback | None = None
    round: int = 1
    # Why the answer came without plans for a passing reason (the planner's /plan timed
    # out or failed while its solutions answered): such an answer is served, not cached.
    # One list shared by every round's copy of the run.
    degraded: list[str] = field(default_factory=list)
    # The model(s) the planner answered with (its plan and solve responses name it): the
    # confidence is calibrated for the first. Shared by every round's copy, as above.
    models: list[str] = field(default_factory=list)

    def saw_model(self, model: str) -> None:
        if model not in self.models:
            self.models.append(model)

    async def emit(self, event: StreamEvent) -> None:
        """Tell the stream (services.schemas: the /reason stream's events)."""
        if self.on_event is not None:
            maybe = self.on_event(STREAM_EVENT_NAMES[type(event)], event)
            if maybe is not None:
                await maybe


@dataclass(frozen=True)
class Outcome:
    """One round's result: the voted answer, how it would be served, and why it might be
    worth another round."""

    best: Attempt
    attempts: list[Attempt]
    agreeing: int
    signals: Signals
    confidence: float  # calibrated
    verdict: Verdict  # as served

    @property
    def trust(self) -> tuple[bool, bool, float, float]:
        """Orders rounds: an answer beats none, then not rejected beats rejected, then the
        calibrated confidence, then the share of plans agreeing."""
        return (
            self.best.answer is not None,
            self.verdict != "rejected",
            self.confidence,
            self.agreeing / max(len(self.attempts), 1),
        )

    def replan_reasons(self) -> list[ReplanReason]:
        """Every reason the round could be worth another round, most serious first:
        no answer; an answer served as rejected (the verifier said no and the calibrated
        confidence does not overrule it); fewer than half of its plans agreeing."""
        if self.best.answer is None:
            return ["no_answer"]
        reasons: list[ReplanReason] = []
        if self.verdict == "rejected":
            reasons.append("rejected")
        drawn = len(self.attempts)
        if drawn > 1 and self.agreeing / drawn < LOW_AGREEMENT:
            reasons.append("low_agreement")
        return reasons


@dataclass
class Attempt:
    """One sample of a round: an executed plan, or a chain-of-thought solution."""

    execution: Execution | None = None
    solution: Solution | None = None
    verdict: Verdict = "unverified"  # the verifier's, for this answer
    confidence: float = UNVERIFIED_CONFIDENCE  # the verifier's score (ties, rounds)
    verifier: float | None = None  # the verifier's score when it answered

    @property
    def answer(self) -> str | None:
        if self.execution is not None:
            return self.execution.answer
        return self.solution.answer if self.solution is not None else None

    @property
    def source(self) -> Literal["plan", "prose"]:
        return "plan" if self.execution is not None else "prose"

    @property
    def complete(self) -> bool:
        """Its work finished: every step of its plan ran, or its solution states an
        answer."""
        if self.execution is not None:
            return self.execution.complete
        return self.answer is not None

    @property
    def steps_ok(self) -> int:
        if self.execution is None:
            return -1
        return sum(s.status == "ok" for s in self.execution.steps)


@contextmanager
def timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    """Add the block's wall time to `timings[stage]`, in ms, on `time.perf_counter()`
    (the event loop's clock ticks in whole milliseconds under uvloop)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] += (time.perf_counter() - t0) * 1000


class ReasonService:
    def __init__(
        self,
        *,
        planner: ServiceClient,
        verifier: ServiceClient,
        registry: ToolRegistry,
        cache: Cache,
        cache_ttl_s: int = 300,
        max_replans: int = 2,
        replan_on: tuple[ReplanReason, ...] | list[ReplanReason] = ("no_answer",),
        max_tool_calls: int = 32,
        sandbox_jobs_per_tenant: int | None = None,
        calibrator: Calibrator | Calibrators | None = None,
    ) -> None:
        self.planner = planner
        self.verifier = verifier
        self.registry = registry
        slots = TenantSemaphore(sandbox_jobs_per_tenant) if sandbox_jobs_per_tenant else None
        self.executor = PlanExecutor(registry, sandbox_slots=slots)
        self.cache = cache
        self.cache_ttl_s = cache_ttl_s
        self.max_replans = max_replans
        self.replan_on = frozenset(replan_on)
        # one calibrator for every model (an operator's, a test's), or one per model
        if isinstance(calibrator, Calibrator):
            calibrator = Calibrators.of([calibrator], default=calibrator)
        self.calibrators = calibrator or Calibrators.load()
        self.max_tool_calls = max_tool_calls
        # The model the planner serves, by its GET /info (`planner_model_now`), or, from a
        # planner without /info, as its last response named it. None: not known yet, and
        # no cached answer is looked up.
        self.planner_model: str | None = None
        self._info_asked = -INFO_TTL_S  # monotonic time of the last GET /info
        self._info_answers = False  # whether the planner has answered GET /info

    async def planner_model_now(self) -> str | None:
        """The model the planner serves: its GET /info, asked at most every INFO_TTL_S
        (one request asks, the others meanwhile take the last answer), the last answer
        when it does not answer in time."""
        now = time.monotonic()
        if now - self._info_asked >= INFO_TTL_S:
            self._info_asked = now
            info = await fetch_info(self.planner)
            if info is not None:
                self.planner_model = info.model
                self._info_answers = True
        return self.planner_model

    def _answer_cache_key(self, request: ReasonRequest, tenant: str, model: str) -> str:
        o = request.options
        # the planner's model (another model answers otherwise), the calibrators'
        # versions (a refit changes confidences and verdicts) and the vote's rule (a new
        # rule changes the answer)
        return make_key(
            "answer",
            tenant,
            model,
            normalize_text(request.question),
            o.n_plans,
            o.n_prose,
            o.verify,
            o.adaptive,
            o.contributions,
            self.calibrators.version,
            VOTE_RULE,
        )

    async def reason(
        self,
        request: ReasonRequest,
        *,
        tenant: str = "default",
        on_step: StepCallback | None = None,
        limits_tenant: str | None = None,
        on_event: EventCallback | None = None,
    ) -> ReasonResponse:
        """Answer `request`. `tenant` namespaces the caches; `limits_tenant` (default:
        `tenant`) is who the per-tenant sandbox share counts. `on_step` hears of every
        step as it finishes; `on_event` gets the /reason stream's events (name and
        payload, services.schemas): rounds as they start and end, each plan as soon as it
        is made, each step, with its round and plan, as it finishes."""
        try:
            return await self._reason(
                request,
                tenant=tenant,
                on_step=on_step,
                limits_tenant=limits_tenant,
                on_event=on_event,
            )
        except ServiceError as exc:
            REQUEST_ERRORS.labels(error_label(exc)).inc()
            raise
        except asyncio.CancelledError:  # the client went away (or the server is stopping)
            REQUEST_ERRORS.labels(ClientClosed.error_type).inc()
            raise
        except Exception:
            REQUEST_ERRORS.labels(ServiceError.error_type).inc()
            raise

    async def _reason(
        self,
        request: ReasonRequest,
        *,
        tenant: str,
        on_step: StepCallback | None,
        limits_tenant: str | None,
        on_event: EventCallback | None,
    ) -> ReasonResponse:
        # the deadline is on the loop's clock (asyncio.timeout_at); the timings are not:
        # uvloop's clock ticks in whole milliseconds, cached per loop iteration
        started = time.perf_counter()
        deadline = asyncio.get_running_loop().time() + request.options.deadline_s
        trace_id = tracing.current_trace_id()
        model = await self.planner_model_now() if request.options.use_cache else None
        if model is not None:
            key = self._answer_cache_key(request, tenant, model)
            cached = await self._cached_answer(key, trace_id, started)
            if cached is not None:
                return cached
        run = Run(
            trace_id,
            tenant,
            on_step,
            ToolBudget(self.max_tool_calls),
            limits_tenant or tenant,
            on_event,
        )
        timings = dict.fromkeys(STAGES, 0.0)
        chosen, summaries = await self._rounds(request, deadline, timings, run)
        measured = None
        if request.options.contributions and chosen.best.execution is not None:
            with timed(timings, "contribute"):
                measured = await contributions(
                    self.executor,
                    chosen.best.execution,
                    deadline=deadline,
                    budget=run.budget,
                    max_calls=CONTRIBUTION_MAX_CALLS,
                    trace_id=trace_id,
                    tenant=tenant,
                    limits_tenant=run.limits_tenant,
                )
        total_ms = (time.perf_counter() - started) * 1000
        response = self._response(request, chosen, summaries, timings, total_ms, trace_id)
        if measured is not None:
            response.steps = [
                s.model_copy(update={"contribution": measured.get(s.id)}) for s in response.steps
            ]
        _observe(response, timings, total_ms)
        if run.models and not self._info_answers:
            self.planner_model = run.models[0]  # a planner without /info
        if (
            request.options.use_cache
            and len(run.models) == 1  # one model made it (not a rollout's two replicas)
            and not run.degraded
            and _cacheable(response, chosen)
        ):
            # under the model that answered, which may not be the one looked up under
            key = self._answer_cache_key(request, tenant, run.models[0])
            await self.cache.set(key, response.model_dump_json(), self.cache_ttl_s)
        return response

    async def _cached_answer(
        self, key: str, trace_id: str, started: float
    ) -> ReasonResponse | None:
        """The cached response for the request, re-stamped for this request, or None."""
        response = await cache_get(self.cache, key, "answer", ReasonResponse.model_validate_json)
        if response is None:
            return None
        response.cached_trace_id = response.cached_trace_id or response.trace_id
        response.trace_id = trace_id
        response.cached = True
        response.timings_ms = Timings(total=round((time.perf_counter() - started) * 1000, 3))
        REQUESTS.labels(response.verdict, "true").inc()
        log.info(
            "answer served from cache",
            **{
                "event.action": "reason.cache_hit",
                "labels.cached_trace_id": response.cached_trace_id,
            },
        )
        return response

    async def _rounds(
        self, request: ReasonRequest, deadline: float, timings: dict[str, float], run: Run
    ) -> tuple[Outcome, list[RoundSummary]]:
        """Run rounds until one leaves no replan reason in `replan_on`, the replans are
        used up, or the budget or the time for another round is; return the most trusted
        round (when every round is rejected, the answer served is the one the verifier
        trusted most, not whatever the last replan produced) and a summary of each round
        run."""
        chosen: Outcome | None = None
        feedback: str | None = None
        reason: ReplanReason | None = None  # why the round about to run is a replan
        summaries: list[RoundSummary] = []
        for round_no in range(self.max_replans + 1):
            if round_no > 0 and not self._another_round_fits(deadline, timings, run, round_no):
                break
            if reason is not None:
                REPLANS.labels(reason).inc()
            started = time.perf_counter()
            this = replace(run, round=round_no + 1)
            await this.emit(RoundStart(round=this.round, replan_for=reason))
            try:
                attempts = await self._round(
                    request, deadline, feedback, timings, this, prose=round_no == 0
                )
            except (DependencyUnavailable, DeadlineExceeded, PlanningFailed) as exc:
                failed = _failed_round(reason, exc, time.perf_counter() - started)
                await this.emit(RoundEnd(**failed.model_dump(), round=this.round))
                if chosen is None:
                    raise
                # keep the answer we have; the replan just failed (and still took time)
                summaries.append(failed)
                break
            outcome = self._outcome(request.question, attempts, round_no + 1, run)
            summary = _summary(outcome, reason, time.perf_counter() - started)
            summaries.append(summary)
            await this.emit(
                RoundEnd(**summary.model_dump(), round=this.round, votes=_round_votes(outcome))
            )
            if chosen is None or outcome.trust > chosen.trust:
                chosen = outcome
            due = [r for r in outcome.replan_reasons() if r in self.replan_on]
            if not due:
                break
            reason = due[0]
            feedback = describe_failure(outcome.best, reason, attempts)
        assert chosen is not None
        return chosen, summaries

    def _another_round_fits(
        self, deadline: float, timings: dict[str, float], run: Run, rounds_done: int
    ) -> bool:
        """Whether the tool-call budget and the deadline leave room for another round:
        twice the time an average round so far took (at least 50 ms)."""
        if run.budget.spent:
            log.info(
                "tool-call budget spent, no further round",
                **{"event.action": "reason.replan_skip"},
            )
            return False
        remaining = deadline - asyncio.get_running_loop().time()
        spent_s = (timings["plan"] + timings["execute"] + timings["verify"]) / 1000
        if remaining < 2 * max(spent_s / rounds_done, 0.05):
            log.info("no time left for another round", **{"event.action": "reason.replan_skip"})
            return False
        return True

    def _response(
        self,
        request: ReasonRequest,
        chosen: Outcome,
        summaries: list[RoundSummary],
        timings: dict[str, float],
        total_ms: float,
        trace_id: str,
    ) -> ReasonResponse:
        """The response serving the chosen round's answer: with its plan's steps, or its
        solution, the vote when there was one to show, and every round when there were
        several."""
        best = chosen.best
        rounds = len(summaries)
        options = request.options
        shows_vote = options.n_plans > 1 or bool(options.n_prose) or rounds > 1
        return ReasonResponse(
            trace_id=trace_id,
            answer=best.answer,
            verdict=chosen.verdict,
            confidence=round(chosen.confidence, 6),
            # what the served confidence was computed from: the served round's own
            # (the round it is, not how many ran: `agreement` and `replanning` say that)
            signals=chosen.signals,
            plan=best.execution.plan if best.execution else None,
            steps=best.execution.steps if best.execution else [],
            solution=best.solution,
            cached=False,
            agreement=_agreement(chosen, rounds) if shows_vote else None,
            replanning=summaries if rounds > 1 else None,
            timings_ms=Timings(
                **{stage: round(ms, 3) for stage, ms in timings.items()}, total=round(total_ms, 3)
            ),
        )

    def _outcome(self, question: str, attempts: list[Attempt], round_no: int, run: Run) -> Outcome:
        """The round's vote, its confidence, calibrated for the model that planned it, and
        the verdict it would be served with."""
        best, agreeing = vote(attempts, question)
        answered = best.answer is not None
        signals = Signals(
            agreement=agreeing / len(attempts) if answered else 0.0,
            plans=len(attempts),
            complete=best.complete,
            verifier=best.verifier,
            rounds=round_no,
        )
        calibrator = self.calibrators.pick(run.models[0] if run.models else None)
        confidence = calibrator.confidence(signals, answered=answered)
        verdict = served_verdict(best, confidence, calibrator.threshold)
        return Outcome(best, attempts, agreeing, signals, confidence, verdict)

    async def _round(
        self,
        request: ReasonRequest,
        deadline: float,
        feedback: str | None,
        timings: dict[str, float],
        run: Run,
        *,
        prose: bool = True,
    ) -> list[Attempt]:
        """One round: draw plans (adaptively) and, with `prose`, the chain-of-thought
        solutions beside the first ones; execute the plans; verify the leading answers."""
        options = request.options
        n = options.n_plans
        n_prose = options.n_prose if prose else 0
        staged = two_stage(n, n_prose, options.adaptive)
        first, first_prose = first_stage(n, n_prose, options.adaptive)
        t0 = time.perf_counter()
        executions, solutions, unplanned = await self._first_draw(
            request, deadline, feedback, timings, run, first, first_prose, staged
        )
        first_draw_s = time.perf_counter() - t0
        answers = [answer_key(e.answer) for e in executions]
        answers += [answer_key(s.answer) for s in solutions]
        weights = [vote_weight(x.answer, request.question) for x in (*executions, *solutions)]
        remaining = deadline - asyncio.get_running_loop().time()
        # the rest only with time left for a draw like the first and the verifier after it
        time_left = remaining > first_draw_s + VERIFY_RESERVE_S and not run.budget.spent
        if staged:
            # programs and prose: the first plan and the greedy solution agreed, or the
            # rest of both are drawn together
            if not unanimous(answers, first + first_prose) and time_left:
                more_plans, more_prose = await asyncio.gather(
                    self._draw_more(
                        request,
                        deadline - (VERIFY_RESERVE_S if options.verify else 0.0),
                        feedback,
                        timings,
                        run,
                        n - first,
                        first,
                        len(executions),
                    )
                    if first < n
                    else _nothing(),
                    # a planner that gave no solution (down, or without /solve) is not
                    # asked again: the plans decide
                    self._solve(request, deadline, n_prose - first_prose, timings, run, first_prose)
                    if solutions
                    else _nothing(),
                )
                executions += more_plans
                solutions += more_prose
            if unplanned is not None and not executions:
                if not any(s.answer is not None for s in solutions):
                    raise unplanned
                _answer_without_plans(run, unplanned)
        elif (
            executions
            and first < n
            and not settled(answers, n + len(solutions), weights)
            and time_left
        ):
            # more plans only while they can still change the vote (none when no plan
            # could be made: a draw gives one at least)
            executions += await self._draw_more(
                request,
                deadline,
                feedback,
                timings,
                run,
                n - len(executions),
                first,
                len(executions),
            )
        # plans first: an answer both kinds gave is verified, and served, with its plan
        attempts = [Attempt(execution=e) for e in executions]
        attempts += [Attempt(solution=s) for s in solutions]
        with timed(timings, "verify"):
            await self._verify_all(request, attempts, deadline)
        return attempts

    async def _first_draw(
        self,
        request: ReasonRequest,
        deadline: float,
        feedback: str | None,
        timings: dict[str, float],
        run: Run,
        n: int,
        n_prose: int,
        more_to_come: bool,
    ) -> tuple[list[Execution], list[Solution], ServiceError | None]:
        """`n` plans, executed, and the first `n_prose` solutions, drawn together. A
        question the planner cannot plan, or a plan that does not come in time (or a
        failing `/plan`), still has its solutions' answers: then no plans, and the
        planner's error beside them; without an answered solution that error is raised,
        unless `more_to_come` (a second stage may still plan or answer)."""
        # with solutions beside, a plan that does not come must leave the verifier its
        # time to check the answer they give instead
        plan_deadline = deadline
        if n_prose and request.options.verify:
            plan_deadline -= VERIFY_RESERVE_S
        drawn, solved = await asyncio.gather(
            self._draw(request, plan_deadline, feedback, timings, n, 0, run, 0),
            self._solve(request, deadline, n_prose, timings, run),
            return_exceptions=True,
        )
        if isinstance(solved, BaseException):  # _solve degrades; anything else is a bug
            raise solved
        if not isinstance(drawn, BaseException):
            return drawn, solved, None
        answered = any(s.answer is not None for s in solved)
        degradable = PlanningFailed | DependencyUnavailable | DeadlineExceeded
        if not isinstance(drawn, degradable) or not (answered or more_to_come):
            raise drawn
        if not more_to_come:
            _answer_without_plans(run, drawn)
        return [], solved, drawn

    async def _draw_more(
        self,
        request: ReasonRequest,
        deadline: float,
        feedback: str | None,
        timings: dict[str, float],
        run: Run,
        n: int,
        offset: int,
        index: int,
    ) -> list[Execution]:
        """The rest of the plans, executed; none when they cannot be drawn (the vote goes
        on with the plans drawn first). `index`: the first one's place in the vote."""
        try:
            return await self._draw(request, deadline, feedback, timings, n, offset, run, index)
        except (DependencyUnavailable, DeadlineExceeded, PlanningFailed) as exc:
            log.warning(
                "no further plans could be drawn; voting on those drawn",
                **{"event.action": "reason.sample_more", "error.message": exc.message},
            )
            return []

    async def _solve(
        self,
        request: ReasonRequest,
        deadline: float,
        n: int,
        timings: dict[str, float],
        run: Run,
        offset: int = 0,
    ) -> list[Solution]:
        """Chain-of-thought solutions `offset`.. `offset + n - 1` from the planner (the
        first of all greedy), or none: they are extra votes, and a planner that cannot
        give them leaves the plans to decide."""
        if n == 0:
            return []
        remaining = deadline - asyncio.get_running_loop().time()
        # a planner slow to solve must not take the verifier's time: the votes are extra
        if request.options.verify:
            remaining = max(remaining - VERIFY_RESERVE_S, remaining / 2)
        if remaining < PLAN_MIN_BUDGET_S:
            return []
        try:
            with timed(timings, "solve"):
                body: dict[str, Any] = {"question": request.question, "n": n}
                if offset:
                    body["offset"] = offset
                data = await self.planner.post_json("/solve", body, timeout_s=remaining)
                # model output through the planner: held to its schema, strictly
                solved = SolveResponse.model_validate(data, strict=True)
                solutions = solved.solutions[:n]
        except (ServiceError, ValueError) as exc:
            _degraded("no chain-of-thought solutions; voting on the plans alone", "solve", exc)
            return []
        run.saw_model(solved.model)
        return solutions

    async def _draw(
        self,
        request: ReasonRequest,
        deadline: float,
        feedback: str | None,
        timings: dict[str, float],
        n: int,
        offset: int,
        run: Run,
        index: int,
    ) -> list[Execution]:
        """`n` plans (samples `offset`..), executed; `index`: the first one's place in the
        round's vote, which names it in the stream's events."""
        with timed(timings, "plan"):
            plans = await self._plan(request, deadline, feedback, n, offset, run)
        PLANS_DRAWN.labels("first" if offset == 0 else "more").inc(len(plans))
        for k, plan in enumerate(plans):  # drawn in the stream before any step runs
            await run.emit(PlanEvent(**plan.model_dump(), round=run.round, plan=index + k))
        with timed(timings, "execute"):
            return await self._execute_all(plans, deadline, run, index)

    async def _plan(
        self,
        request: ReasonRequest,
        deadline: float,
        feedback: str | None,
        n: int,
        offset: int,
        run: Run,
    ) -> list[Plan]:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining < PLAN_MIN_BUDGET_S:
            raise DeadlineExceeded("the request deadline passed before a plan could be made")
        body: dict[str, Any] = {
            "question": request.question,
            "n": n,
            "tools": [spec.model_dump() for spec in self.registry.specs()],
        }
        if request.options.n_plans > 1:  # votes need independent samples, repeats kept
            body["distinct"] = False
        if offset:
            body["offset"] = offset
        if feedback:
            body["feedback"] = feedback[:16000]
        data = await self.planner.post_json("/plan", body, timeout_s=remaining)
        try:
            response = PlanResponse.model_validate(data, strict=True)
        except ValueError:
            raise DependencyUnavailable("planner answered with a malformed plan response") from None
        run.saw_model(response.model)
        plans = []
        # the planner's output is model output: check it again, and run no more than asked
        for plan in response.plans[:n]:
            try:
                check_plan(plan, self.registry.names)
            except ServiceError as exc:
                log.warning("planner returned an invalid plan", **{"error.message": exc.message})
                continue
            plans.append(plan)
        if not plans:
            raise Unplannable("the planner returned no plan that passes validation")
        return plans

    async def _execute_all(
        self, plans: list[Plan], deadline: float, run: Run, index: int = 0
    ) -> list[Execution]:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(
                    self.executor.run(
                        plan,
                        deadline=deadline,
                        trace_id=run.trace_id,
                        tenant=run.tenant,
                        on_step=_step_listener(run, index + k),
                        budget=run.budget,
                        limits_tenant=run.limits_tenant,
                    )
                )
                for k, plan in enumerate(plans)
            ]
        return [t.result() for t in tasks]

    async def _verify_all(
        self, request: ReasonRequest, attempts: list[Attempt], deadline: float
    ) -> None:
        """Set the verifier's verdict and score on `attempts`, in place."""
        if not request.options.verify:
            return
        # Ask once per answer that can win the vote: those most plans agree on (the
        # plans that produced an answer share its verdict; the verifier breaks ties).
        leaders = leading_answers(attempts, request.question)
        distinct: dict[str, Attempt] = {}
        for attempt in attempts:
            k = answer_key(attempt.answer)
            if k in leaders and k not in distinct:
                distinct[k] = attempt
        for attempt in attempts:
            if attempt.answer is None:  # nothing to verify; the round may be replanned
                attempt.confidence = 0.0
        if not distinct:
            return
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining < VERIFY_MIN_BUDGET_S:
            log.warning("no time left to verify", **{"event.action": "reason.verify_skip"})
            return
        items = [claim(request.question, a) for a in distinct.values()]
        try:
            # The verifier's reply is held to its schema, strictly: "verdict": "false" is
            # not a verdict, and a confidence must be a finite number in [0, 1].
            if len(items) == 1:
                data = await self.verifier.post_json("/verify", items[0], timeout_s=remaining)
                results = [VerifyResponse.model_validate(data, strict=True)]
            else:
                data = await self.verifier.post_json(
                    "/verify/batch", {"items": items}, timeout_s=remaining
                )
                results = VerifyBatchResponse.model_validate(data, strict=True).results
            verdicts = {
                k: (r.verdict, r.confidence) for k, r in zip(distinct, results, strict=True)
            }
        except (ServiceError, ValueError) as exc:
            _degraded(
                "verifier unavailable or its reply invalid, answer left unverified", "verify", exc
            )
            return
        for attempt in attempts:
            k = answer_key(attempt.answer)
            if k in verdicts:
                ok, confidence = verdicts[k]
                attempt.verdict = "verified" if ok else "rejected"
                attempt.confidence = attempt.verifier = confidence


def _step_listener(run: Run, plan: int) -> StepCallback | None:
    """What hears of plan `plan`'s steps: the caller's `on_step`, and the stream, which
    learns the round and the plan of each step."""
    if run.on_step is None and run.on_event is None:
        return None

    async def heard(step: StepResult) -> None:
        if run.on_step is not None:
            maybe = run.on_step(step)
            if maybe is not None:
                await maybe
        await run.emit(StepEvent(**step.model_dump(), round=run.round, plan=plan))

    return heard


def _round_votes(outcome: Outcome) -> list[RoundVote]:
    """Every sample's vote in the round: the plans first, in the order drawn (their
    index is their place here), then the solutions."""
    served = answer_key(outcome.best.answer)
    votes = []
    for k, a in enumerate(outcome.attempts):
        key = answer_key(a.answer)
        votes.append(
            RoundVote(
                source=a.source,
                answer=_vote_answer(a.answer),
                plan=k if a.execution is not None else None,
                verifier=a.verifier,
                agrees=key is not None and key == served,
            )
        )
    return votes


def _degraded(message: str, stage: str, exc: Exception) -> None:
    """A dependency that failed or answered outside its schema: logged, and the answer
    goes on without it."""
    log.warning(
        message,
        **{
            "event.action": f"reason.{stage}",
            "error.type": type(exc).__name__,
            "error.message": str(exc)[:300],
        },
    )


def _observe(response: ReasonResponse, timings: dict[str, float], total_ms: float) -> None:
    """The request's metrics: its verdict and every stage's latency."""
    for stage, ms in timings.items():
        STAGE_LATENCY.labels(stage).observe(ms / 1000)
    STAGE_LATENCY.labels("total").observe(total_ms / 1000)
    REQUESTS.labels(response.verdict, "false").inc()


def _cacheable(response: ReasonResponse, chosen: Outcome) -> bool:
    """An answer is cached when its work finished and the verifier did not reject it, and
    not while a step's contribution is unknown (what did not fit this time may fit the
    next)."""
    unmeasured = any(
        s.contribution is not None
        and "unknown" in (s.contribution.perturbed, s.contribution.removed)
        for s in response.steps
    )
    return (
        response.answer is not None
        and chosen.best.complete
        and response.verdict != "rejected"
        and not unmeasured
    )


def _agreement(chosen: Outcome, rounds: int) -> Agreement:
    return Agreement(
        plans=len(chosen.attempts),
        agreeing=chosen.agreeing,
        rounds=rounds,
        votes=[Vote(source=a.source, answer=_vote_answer(a.answer)) for a in chosen.attempts],
    )


def claim(question: str, attempt: Attempt | Execution) -> dict[str, str]:
    """The claim the verifier is asked about (`services.claims`): the answer, with the
    work shown as context (the plan's steps and their results, or the worked solution)."""
    execution = attempt if isinstance(attempt, Execution) else attempt.execution
    if execution is None:
        assert isinstance(attempt, Attempt) and attempt.solution is not None
        return solution_claim(question, attempt.solution.answer, attempt.solution.text)
    plan = execution.plan
    return plan_claim(question, execution.answer, plan.reasoning, execution.steps, plan.answer_step)


def _summary(outcome: Outcome, replan_for: ReplanReason | None, seconds: float) -> RoundSummary:
    return RoundSummary(
        replan_for=replan_for,
        answer=_vote_answer(outcome.best.answer),
        samples=len(outcome.attempts),
        agreeing=outcome.agreeing,
        confidence=round(outcome.confidence, 6),
        verdict=outcome.verdict,
        replan_reasons=outcome.replan_reasons(),
        ms=round(seconds * 1000, 3),
    )


def _failed_round(
    replan_for: ReplanReason | None, exc: ServiceError, seconds: float
) -> RoundSummary:
    return RoundSummary(
        replan_for=replan_for,
        answer=None,
        samples=0,
        agreeing=0,
        confidence=0.0,
        verdict="unverified",
        ms=round(seconds * 1000, 3),
        error=exc.error_type,
    )


def _vote_answer(answer: str | None) -> str | None:
    if answer is None or len(answer) <= VOTE_ANSWER_CHARS:
        return answer
    return answer[:VOTE_ANSWER_CHARS] + "…"


# The vote's counting rule, in the answer cache's key: a cached answer was voted by the
# rule of its time. Change it with `vote`, `settled` or `services.answers.vote_weight`.
VOTE_RULE = "whole-weighted/3"  # /3: float noise read away (services.answers.VOTE_DIGITS)


def _tally(attempts: list[Attempt], question: str = "") -> tuple[dict[str, int], dict[str, float]]:
    """Each answer's samples, and its votes: each sample counted by
    `services.answers.vote_weight` (a number that is not whole, to a question of whole
    numbers, counts half)."""
    counts: dict[str, int] = {}
    weights: dict[str, float] = {}
    for a in attempts:
        k = answer_key(a.answer)
        if k is not None:
            counts[k] = counts.get(k, 0) + 1
            weights[k] = weights.get(k, 0.0) + vote_weight(a.answer, question)
    return counts, weights


def leading_answers(attempts: list[Attempt], question: str = "") -> set[str]:
    """The answers that lead the vote (several when tied)."""
    _, weights = _tally(attempts, question)
    top = max(weights.values(), default=0.0)
    return {k for k, w in weights.items() if w == top}


def first_draw(n: int, adaptive: bool = True) -> int:
    """Plans a round draws first of its `n`: a majority (adaptive sampling), or all of
    them when there are two or fewer or sampling is not adaptive."""
    return n if n <= 2 or not adaptive else n // 2 + 1


def two_stage(n_plans: int, n_prose: int, adaptive: bool = True) -> bool:
    """Whether a round draws programs and prose in two stages: adaptive, with solutions,
    and more than one plan and one solution to draw."""
    return adaptive and n_prose > 0 and n_plans + n_prose > 2


def first_stage(n_plans: int, n_prose: int, adaptive: bool = True) -> tuple[int, int]:
    """Plans and solutions a round draws first. In two stages (`two_stage`): the first
    plan and the greedy solution, the rest of both only when those two disagree
    (`unanimous`; chosen on the GSM8K train dev split, docs/eval/dev). Otherwise: plans
    alone, `first_draw` of them and the rest while the vote is not `settled`; every
    solution with them."""
    if two_stage(n_plans, n_prose, adaptive):
        return 1, 1
    return first_draw(n_plans, adaptive), n_prose


def unanimous(answers: list[str | None], drawn: int) -> bool:
    """Whether every one of the `drawn` samples answered, all the same answer (answer
    keys, `services.answers.answer_key`)."""
    return len(answers) == drawn > 0 and None not in answers and len(set(answers)) == 1


def settled(answers: list[str | None], n: int, weights: list[float] | None = None) -> bool:
    """Whether the answers drawn so far decide the vote over `n` plans: the leader keeps
    more votes than the runner-up could reach with every plan still to draw (each
    answer's vote weighed by `weights`, `vote`'s weights of the same samples; a sample
    still to draw counts at most 1)."""
    weights = weights if weights is not None else [1.0] * len(answers)
    totals: dict[str, float] = {}
    for k, w in zip(answers, weights, strict=True):
        if k is not None:
            totals[k] = totals.get(k, 0.0) + w
    leader, runner_up = [*sorted(totals.values(), reverse=True), 0.0, 0.0][:2]
    return leader > runner_up + (n - len(answers))


async def fetch_info(client: Any) -> ModelInfo | None:
    """A service's GET /info, or None when it does not answer in time or in shape (an
    older service without /info, one that is down)."""
    try:
        return ModelInfo.model_validate(await client.get_json("/info", timeout_s=INFO_TIMEOUT_S))
    except (ServiceError, ValidationError):
        return None


async def _nothing() -> list[Any]:
    return []


def _answer_without_plans(run: Run, error: ServiceError) -> None:
    """The solutions answer alone: say why, and mark the run degraded when the reason may
    pass (a planner too slow or failing), so that its answer is not cached."""
    log.warning(
        "no plan could be made; voting on the chain-of-thought solutions",
        **{"event.action": "reason.plan", "error.message": error.message},
    )
    if isinstance(error, DependencyUnavailable | DeadlineExceeded):
        run.degraded.append(error.message)


def vote(attempts: list[Attempt], question: str = "") -> tuple[Attempt, int]:
    """The answer most samples agree on, each sample's vote weighed by
    `services.answers.vote_weight` against `question`; among tied answers, the one the
    verifier trusts most, then the one drawn first. Returns the served attempt (the most
    trusted plan of that answer) and how many samples agree with it (unweighted: the
    agreement the confidence is calibrated on)."""
    counts, weights = _tally(attempts, question)
    if not counts:
        return max(attempts, key=lambda a: a.steps_ok), 0
    order = {k: i for i, k in reversed(list(enumerate(answer_key(a.answer) for a in attempts)))}
    confidence: dict[str, float] = {}
    for a in attempts:
        k = answer_key(a.answer)
        if k is not None:
            confidence[k] = max(confidence.get(k, 0.0), a.confidence)
    winner = max(weights, key=lambda k: (weights[k], confidence[k], -order[k]))
    members = [a for a in attempts if answer_key(a.answer) == winner]
    # an executed plan before a solution of the same answer: its steps show the work
    return max(members, key=lambda a: (a.confidence, a.execution is not None)), counts[winner]


def served_verdict(best: Attempt, confidence: float, threshold: float) -> Verdict:
    """`verified` only for a calibrated confidence at the threshold, and only when the
    verifier answered (a threshold of 1 verifies nothing); `rejected` when the verifier
    said no and the confidence does not overrule it; otherwise `unverified` (no answer,
    not verified, or not confident). A calibrated confidence can overrule the verifier's
    no: the calibrator weighs its score together with the plans' agreement."""
    if best.answer is None or best.verifier is None:
        return "unverified"
    if threshold < 1.0 and confidence >= threshold:
        return "verified"
    return "rejected" if best.verdict == "rejected" else "unverified"


def describe_failure(
    attempt: Attempt, reason: ReplanReason = "rejected", attempts: list[Attempt] | None = None
) -> str:
    if attempt.answer is None:
        verdict = "The plan did not produce an answer."
    elif reason == "low_agreement" and attempts:
        answers, _ = _tally(attempts)
        listed = ", ".join(f"{k!r} ({c} of {len(attempts)})" for k, c in answers.items())
        verdict = f"Plans for this question disagreed on the answer: {listed}."
    else:
        verdict = (
            f"The verifier rejected the answer {attempt.answer!r} "
            f"(confidence it is right: {attempt.confidence:.2f})."
        )
    steps = [
        {
            "id": s.id,
            "tool": s.tool,
            "input": s.input[:500],
            "status": s.status,
            "output": (s.output or "")[:300],
            "error": (s.error or "")[:300],
        }
        for s in (attempt.execution.steps if attempt.execution else [])
    ]
    return f"{verdict} The failed plan and its step results were: {json.dumps(steps)}"
