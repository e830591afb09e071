"""Sample the pipeline's own work: executed plans and worked solutions, labelled right or wrong.

For each question of a dataset (GSM8K train by default), the planner service, in-process
on the configured backend (`PLANNER_*` settings; the embedded default is llama.cpp with
the default model), draws `--plans` plans the way self-consistency draws them (one
`/plan` request, independent samples at the planner's temperature, repeats kept) and
`--prose` chain-of-thought solutions the way `/solve` draws them (the first greedy, the
rest sampled). All of a question's samples are asked for at once, so the llama.cpp
engine decodes them as one batch. The orchestrator's executor runs every plan with its
real tools (python in the sandbox, calc, SQL, lookup). Each sample's answer is labelled
against the gold answer by the evaluation's one rule (`evals.extract`), and its claim is
written by `orchestrator.service.claim`, the function the orchestrator asks the verifier
with, so the verifier is trained on the bytes it is later asked about.

Output: one JSON line per sample (`Sample`), a question's lines appended in one write
once all its samples are done, so a killed run leaves a question whole or absent. A rerun
skips the questions already in the file, so a stopped run (Ctrl-C, a session's end,
`--max-seconds`) resumes where it stopped. A question no valid plan can be made for is
written with samples that have no answer (labelled wrong: the orchestrator would have
none either); a planner that fails otherwise leaves the question out, for a rerun. Questions the
planner's prompts show as examples, and by default the dev split the orchestrator's
answer calibrator is fitted on, are never sampled.

    python -m training.sample_pipeline --limit 400 --plans 4 --prose 2 \
        --out var/pipeline-samples/gsm8k-train.jsonl --max-seconds 9000
    python -m training.sample_pipeline --report var/pipeline-samples/gsm8k-train.jsonl
    python -m training.sample_pipeline --claims var/verifier-pipeline-data \
        --report var/pipeline-samples/gsm8k-train.jsonl

`--report` gives the label balance: samples, distinct answers of a question, and
questions whose samples are all right, all wrong or mixed (all of them count). With
`--claims DIR` it also writes the labelled claims as the verifier's training scripts read
them (`train.jsonl`, `val.jsonl`, `test.jsonl` and `recipe.json`, the layout
`training.data` writes): each distinct claim once, every claim of a question in the same
split (split by a seeded hash of the question id), so validation, calibration and test
claims come from questions training never saw; `--claims-split gsm8k_test` puts every
claim of the files in that one split instead (claims for reporting only).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evals.data import Item, ResultWriter, iter_records, load_items
from evals.datasets import GSM8K_TRAIN
from evals.extract import extract_number, is_correct
from orchestrator.executor import Execution, PlanExecutor
from orchestrator.limits import ToolBudget
from orchestrator.service import Attempt, claim
from planner.prompting import few_shot
from planner.prose import prose_prompt
from planner.service import PlannerService
from services.answers import answer_key
from services.errors import PlanningFailed, ServiceError
from services.schemas import PlanRequest, Solution, SolveRequest
from services.settings import OrchestratorSettings, PlannerSettings

REPO = Path(__file__).resolve().parents[1]
DEV_SPLIT = REPO / "evals" / "splits" / "gsm8k-train-dev.jsonl"
EXECUTE_TIMEOUT_S = 30.0  # a plan's whole run; each tool has its own timeout within it
RECIPE = "pipeline-samples/2"  # bump when what a line holds, or how it is made, changes


# (settings, cache, exit stack) -> tool registry: `orchestrator.tools.build_registry`'s shape
ToolsFactory = Callable[[OrchestratorSettings, Any, AsyncExitStack], Awaitable[Any]]


@dataclass
class Sample:
    """One executed plan or worked solution of one question, labelled."""

    id: str  # the question's id in its dataset
    dataset: str
    kind: str  # "plan" or "prose"
    sample: int  # its index among the question's samples of its kind (seeds follow it)
    seed: int  # the planner's base seed (PLANNER_SEED), which with the question decides its samples
    model: str
    # How the planner was asked to write its plans (PLANNER_PLAN_FORMAT): the verifier
    # must be trained on what the serving planner produces. Recipe 1 did not write it;
    # the committed files of that recipe have it added from how they were drawn.
    plan_format: str
    answer: str | None  # as the pipeline would serve it (None: no answer)
    predicted: float | int | None  # the number the evaluation's rule reads from it
    gold: float | int
    label: bool  # the answer is right
    # The first sample of the question with this answer (answer_key): distinct answers
    # of a question are its first-of-answer samples.
    first_of_answer: bool
    claim: dict[str, str] | None  # what the orchestrator would ask /verify (None: no answer)
    plan: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    solution: str | None = None
    error: str | None = None  # why a plan sample has no plan (planning failed)
    seconds: float = 0.0  # the question's wall time, all its samples together
    recipe: str = RECIPE


def shown_questions() -> set[str]:
    """Questions a planner prompt shows as a worked example: never sampled."""
    return {e["question"] for e in few_shot()} | {q for q, _ in prose_prompt().examples}


def excluded_ids(paths: Iterable[Path]) -> set[str]:
    ids: set[str] = set()
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                ids.add(str(json.loads(line)["id"]))
    return ids


def done_ids(path: Path) -> set[str]:
    return {r["id"] for r in read_samples(path)}


def check_same_source(path: Path, planner: PlannerService) -> None:
    """Refuse to add samples of another model or plan format to a file, or to a file whose
    lines do not say their format: a file is one population of the planner's work."""
    model, fmt = planner.backend.model, planner.settings.plan_format
    for r in read_samples(path):
        if r["model"] != model or r.get("plan_format") != fmt:
            raise SystemExit(
                f"{path} holds samples of {r['model']} in plan format "
                f"{r.get('plan_format', '?')}; this run samples {model} in {fmt}: "
                "write them to another file"
            )


def read_samples(path: Path) -> Iterator[dict[str, Any]]:
    """Complete sample lines of a file; a torn last line (a killed run) is skipped."""
    return iter_records(path, "id", "label")


def label(answer: str | None, gold: float | int) -> tuple[float | int | None, bool]:
    predicted = extract_number(answer)
    return predicted, is_correct(predicted, gold)


def _step(step: Any) -> dict[str, Any]:
    return {
        "id": step.id,
        "tool": step.tool,
        "input": step.input,
        "status": step.status,
        "output": step.output,
        "error": step.error,
    }


class Sampler:
    """Draws and labels one question's samples with the planner service and the
    orchestrator's executor."""

    def __init__(
        self,
        planner: PlannerService,
        executor: PlanExecutor,
        *,
        dataset: str,
        max_tool_calls: int = OrchestratorSettings().max_tool_calls_per_request,
    ) -> None:
        self.planner = planner
        self.max_tool_calls = max_tool_calls
        self.executor = executor
        self.dataset = dataset

    async def sample(self, item: Item, n_plans: int, n_prose: int) -> list[Sample]:
        started = time.perf_counter()
        plans, solutions = await asyncio.gather(
            self._plans(item, n_plans), self._solutions(item, n_prose)
        )
        seconds = round(time.perf_counter() - started, 3)
        samples = [*plans, *solutions]
        seen: set[str] = set()
        for s in samples:
            key = answer_key(s.answer)
            s.first_of_answer = key is not None and key not in seen
            if key is not None:
                seen.add(key)
            s.seconds = seconds
        return samples

    def _base(self, item: Item, kind: str, k: int, answer: str | None) -> dict[str, Any]:
        predicted, right = label(answer, item.gold)
        return {
            "id": item.id,
            "dataset": self.dataset,
            "kind": kind,
            "sample": k,
            "seed": self.planner.settings.seed,
            "model": self.planner.backend.model,
            "plan_format": self.planner.settings.plan_format,
            "answer": answer,
            "predicted": predicted,
            "gold": item.gold,
            "label": right,
            "first_of_answer": False,
        }

    async def _plans(self, item: Item, n: int) -> list[Sample]:
        """`n` plan samples, executed as the orchestrator executes a request's plans (one
        tool-call budget for all of them). A question no valid plan can be made for gives
        `n` samples without an answer, as does each plan the planner could not make;
        any other planner failure is raised (the question is not written)."""
        if n == 0:
            return []
        request = PlanRequest(question=item.question, n=n, distinct=False)
        try:
            plans = (await self.planner.plan(request)).plans[:n]
        except PlanningFailed as exc:
            return [self._no_plan(item, k, exc.message) for k in range(n)]
        loop = asyncio.get_running_loop()
        budget = ToolBudget(self.max_tool_calls)
        executions: list[Execution] = await asyncio.gather(
            *(
                self.executor.run(p, deadline=loop.time() + EXECUTE_TIMEOUT_S, budget=budget)
                for p in plans
            )
        )
        samples = [
            Sample(
                **self._base(item, "plan", k, e.answer),
                claim=claim(item.question, e) if e.answer is not None else None,
                plan=e.plan.model_dump(),
                steps=[_step(s) for s in e.steps],
            )
            for k, e in enumerate(executions)
        ]
        missing = f"the planner made {len(plans)} valid plans of the {n} asked for"
        return samples + [self._no_plan(item, k, missing) for k in range(len(plans), n)]

    def _no_plan(self, item: Item, k: int, error: str) -> Sample:
        return Sample(**self._base(item, "plan", k, None), claim=None, error=error)

    async def _solutions(self, item: Item, n: int) -> list[Sample]:
        if n == 0:
            return []
        solutions: list[Solution] = (
            await self.planner.solve(SolveRequest(question=item.question, n=n))
        ).solutions
        return [
            Sample(
                **self._base(item, "prose", k, s.answer),
                claim=claim(item.question, Attempt(solution=s)) if s.answer is not None else None,
                solution=s.text,
            )
            for k, s in enumerate(solutions)
        ]


async def make_executor(stack: AsyncExitStack, tools: ToolsFactory | None = None) -> PlanExecutor:
    """The orchestrator's executor over the tools it builds at startup (`tools`: the
    orchestrator's own factory, `build_registry`, unless a test brings its own), with the
    orchestrator's settings from the environment and an in-process cache."""
    from orchestrator.cache import MemoryCache
    from orchestrator.tools import build_registry

    registry = await (tools or build_registry)(OrchestratorSettings(), MemoryCache(), stack)
    return PlanExecutor(registry)


def pending_items(args: argparse.Namespace) -> list[Item]:
    """The items still to sample among the first `--limit` of the file (after
    `--offset`): the same command, run again, resumes the same set and then has nothing
    left to do, as `reason eval run --limit` does."""
    items = load_items(args.data, offset=args.offset, limit=args.limit)
    skip = excluded_ids(args.exclude) | done_ids(args.out)
    shown = shown_questions()
    return [i for i in items if i.id not in skip and i.question not in shown]


async def run(
    args: argparse.Namespace,
    planner: PlannerService | None = None,
    tools: ToolsFactory | None = None,
) -> int:
    """Sample until every pending question is done or the time is up; returns how many
    questions were sampled. `planner` defaults to the service on the configured backend,
    `tools` to the orchestrator's own."""
    from evals.data import dataset_name
    from planner.backends import create_backend

    todo = pending_items(args)
    if not todo:
        print(f"nothing to do: every question is already in {args.out}", file=sys.stderr)
        return 0
    if planner is None:
        settings = PlannerSettings()
        if settings.backend == "scripted":
            raise SystemExit(
                "the planner backend is `scripted` (the settings default, for tests): set "
                "PLANNER_BACKEND=llamacpp (the embedded default), vllm or openai to sample "
                "a model"
            )
        planner = PlannerService(create_backend(settings), settings)
    await planner.load()
    if not planner.ready:
        raise SystemExit(f"the planner model did not load: {planner.load_error}")
    check_same_source(args.out, planner)  # after loading: a backend may learn its model then
    started = time.monotonic()
    sampled = failed = 0
    bar = None
    if args.progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc="questions", unit="q")
    try:
        async with AsyncExitStack() as stack:
            executor = await make_executor(stack, tools)
            sampler = Sampler(
                planner,
                executor,
                dataset=dataset_name(args.data),
                max_tool_calls=OrchestratorSettings().max_tool_calls_per_request,
            )
            with ResultWriter(args.out) as writer:
                for item in todo:
                    if (
                        sampled
                        and args.max_seconds
                        and time.monotonic() - started > args.max_seconds
                    ):
                        print(f"time is up after {sampled} questions; rerun to resume")
                        break
                    try:
                        samples = await sampler.sample(item, args.plans, args.prose)
                    except ServiceError as exc:  # a planner failure, not the question's
                        failed += 1
                        print(f"{item.id}: not sampled ({exc.message}); a rerun retries it")
                        continue
                    writer.write_all([asdict(s) for s in samples])
                    sampled += 1
                    if bar is not None:
                        right = sum(s.label for s in samples)
                        bar.set_postfix_str(f"{item.id}: {right}/{len(samples)} right")
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        await planner.backend.close()
    if failed:
        print(f"{failed} questions were not sampled for planner failures; rerun to retry them")
    return sampled


def report(paths: list[Path]) -> dict[str, Any]:
    """The label balance of sample files (every question counts, whatever its mix)."""
    rows = [r for p in paths for r in read_samples(p)]
    by_question: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_question.setdefault(r["id"], []).append(r)
    mix: Counter[str] = Counter()
    for samples in by_question.values():
        rights = [s["label"] for s in samples]
        mix["all right" if all(rights) else "all wrong" if not any(rights) else "mixed"] += 1
    answered = [r for r in rows if r["answer"] is not None]
    distinct = [r for r in rows if r["first_of_answer"]]
    by_kind = {
        kind: {
            "samples": sum(r["kind"] == kind for r in rows),
            "answered": sum(r["kind"] == kind for r in answered),
            "right": sum(r["kind"] == kind and r["label"] for r in rows),
        }
        for kind in sorted({r["kind"] for r in rows})
    }
    return {
        "questions": len(by_question),
        "samples": len(rows),
        "answered": len(answered),
        "right": sum(r["label"] for r in rows),
        "distinct_answers": len(distinct),
        "distinct_right": sum(r["label"] for r in distinct),
        "questions_by_mix": dict(mix),
        "by_kind": by_kind,
    }


@dataclass(frozen=True)
class ClaimSplit:
    """How sample files become the verifier's claim splits; saved as `recipe.json`."""

    seed: int = 7  # the hash of (seed, question id) decides a question's split
    val: float = 0.15  # share of questions whose claims go to val (calibration)
    test: float = 0.15  # share of questions whose claims go to test (held out)


def hash_share(seed: int, question_id: str) -> float:
    """A question's fixed place in [0, 1), from a hash of (seed, id): splits by question
    that do not move when files grow or are reordered."""
    digest = hashlib.sha256(f"{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(question_id: str, recipe: ClaimSplit) -> str:
    u = hash_share(recipe.seed, question_id)
    return "val" if u < recipe.val else "test" if u < recipe.val + recipe.test else "train"


def claim_rows(
    paths: list[Path], recipe: ClaimSplit, only: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The labelled claims of sample files, each distinct claim once, split by question
    (`only`: every claim in that one split, e.g. `gsm8k_test` for reporting claims)."""
    names = [only] if only else ["train", "val", "test"]
    splits: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    seen: set[tuple[str, str, str]] = set()
    for path in paths:
        for r in read_samples(path):
            c = r["claim"]
            if c is None:
                continue  # no answer: the orchestrator never asks the verifier about it
            key = (c["question"], c["statement"], c["context"])
            if key in seen:
                continue
            seen.add(key)
            rows = splits[only or split_of(r["id"], recipe)]
            rows.append(
                {
                    "id": len(rows),
                    **c,
                    "label": bool(r["label"]),
                    "kind": f"pipeline-{r['kind']}",
                    "source": {"id": r["id"], "kind": r["kind"], "sample": r["sample"]},
                }
            )
    return splits


def write_claims(
    out: Path, paths: list[Path], recipe: ClaimSplit, only: str | None = None
) -> dict[str, Any]:
    from training.data import write_jsonl

    splits = claim_rows(paths, recipe, only)
    for name, rows in splits.items():
        write_jsonl(out / f"{name}.jsonl", rows)
    summary = {
        name: {
            "n": len(rows),
            "true": sum(r["label"] for r in rows),
            "kinds": dict(Counter(r["kind"] for r in rows)),
            "questions": len({r["source"]["id"] for r in rows}),
        }
        for name, rows in splits.items()
    }
    record = {
        "recipe": {"pipeline_samples": [str(p) for p in paths], "only": only, **asdict(recipe)},
        "sampler": RECIPE,
        "summary": summary,
    }
    (out / "recipe.json").write_text(json.dumps(record, indent=2) + "\n")
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=GSM8K_TRAIN, help="items (*.norm.jsonl)")
    parser.add_argument("--out", type=Path, help="sample lines (appended; a rerun resumes)")
    parser.add_argument("--plans", type=int, default=4, help="plans per question (0-8)")
    parser.add_argument("--prose", type=int, default=0, help="worked solutions per question (0-8)")
    parser.add_argument("--offset", type=int, default=0, help="first item of the file to consider")
    parser.add_argument(
        "--limit", type=int, default=None, help="only the first N items (after --offset)"
    )
    parser.add_argument(
        "--exclude",
        type=Path,
        nargs="*",
        default=[DEV_SPLIT],
        help="files whose item ids are never sampled (default: the GSM8K train dev split)",
    )
    parser.add_argument("--max-seconds", type=float, default=0.0, help="stop after (0: no limit)")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument(
        "--log-level", default="WARNING", help="the services' log lines printed (ECS JSON)"
    )
    parser.add_argument("--report", type=Path, nargs="+", help="print the label balance and exit")
    parser.add_argument("--claims", type=Path, help="with --report: write the claim splits here")
    parser.add_argument("--split-seed", type=int, default=ClaimSplit.seed)
    parser.add_argument(
        "--claims-split", help="every claim into this one split (e.g. gsm8k_test), not three"
    )
    args = parser.parse_args(argv)
    if args.claims is not None and args.report is None:
        parser.error("--claims needs --report FILES (the sample files to read)")
    if args.offset < 0 or (args.limit is not None and args.limit < 0):
        parser.error("--offset and --limit must not be negative")
    if args.report is None:
        if args.out is None:
            parser.error("--out is required to sample")
        if not (0 <= args.plans <= 8 and 0 <= args.prose <= 8) or args.plans + args.prose == 0:
            parser.error("--plans and --prose are 0-8 each, and at least one sample is needed")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report is not None:
        print(json.dumps(report(args.report), indent=2))
        if args.claims is not None:
            summary = write_claims(
                args.claims, args.report, ClaimSplit(seed=args.split_seed), args.claims_split
            )
            print(json.dumps({"claims": str(args.claims), **summary}, indent=2))
        return 0
    from services.logging import configure_logging

    configure_logging("sample_pipeline", log_dir=None, level=args.log_level, fmt="json")
    sampled = asyncio.run(run(args))
    print(json.dumps({"sampled": sampled, **report([args.out])}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
