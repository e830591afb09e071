"""`reason eval`: run the evaluation modes, report on the results, analyse routing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import typer
from rich.console import Console
from rich.table import Table

from evals.data import DataError, Item, dataset_name, done_keys, load_items, load_results
from evals.harness import RunSummary, run_items
from evals.modes import (
    DIRECT_MAX_TOKENS,
    MODES,
    DirectRunner,
    EvalAborted,
    ReasonRunner,
    load_direct_backend,
    planner_model_name,
)
from evals.report import summarize, summary_table, write_report
from evals.routing import routing_analysis, routing_markdown
from services.settings import PlannerSettings

eval_app = typer.Typer(
    help="Evaluate the pipeline on GSM8K/SVAMP-style items and report on the results.",
    no_args_is_help=True,
)
console = Console()
err = Console(stderr=True, soft_wrap=True)


@eval_app.command("run")
def run(
    data: Path = typer.Option(..., "--data", exists=True, dir_okay=False, help="Items JSONL."),
    mode: str = typer.Option(..., "--mode", help=f"One of: {', '.join(MODES)}."),
    out: Path = typer.Option(..., "--out", dir_okay=False, help="Results JSONL (appended)."),
    url: str = typer.Option("http://127.0.0.1:8000", envvar="REASON_URL", help="Orchestrator."),
    planner_url: str = typer.Option(
        "http://127.0.0.1:8001", help="Planner, asked only for the model name it serves."
    ),
    model_name: str | None = typer.Option(None, help="Model label for the results."),
    api_key: str | None = typer.Option(None, envvar="REASON_API_KEY"),
    limit: int | None = typer.Option(None, min=0, help="Evaluate at most this many items."),
    offset: int = typer.Option(0, min=0, help="Skip this many items first."),
    concurrency: int = typer.Option(2, min=1, max=64, help="Items in flight at once."),
    deadline_s: float = typer.Option(120.0, min=0.1, max=120.0, help="Per-item /reason deadline."),
    use_cache: bool = typer.Option(False, "--use-cache/--no-cache", help="Allow cached answers."),
    retry_errors: bool = typer.Option(False, help="Rerun items whose earlier line has an error."),
    dataset: str | None = typer.Option(None, help="Dataset label (default: from the file name)."),
    backend: str = typer.Option(
        "llamacpp", envvar="PLANNER_BACKEND", help="direct mode: planner backend to load."
    ),
    max_tokens: int = typer.Option(
        DIRECT_MAX_TOKENS, min=16, max=2048, help="direct mode: new-token bound."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Run items through one mode, appending a result line per item as it finishes.

    Resumable: items already in --out for this dataset and mode are skipped."""
    if mode not in MODES:
        err.print(f"[red]unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        raise typer.Exit(2)
    try:
        items = load_items(data, offset=offset, limit=limit)
    except DataError as exc:
        err.print(f"[red]{exc}")
        raise typer.Exit(2) from None
    name = dataset or dataset_name(data)
    try:
        if MODES[mode] is None:
            summary = asyncio.run(
                _run_direct(items, out, name, backend, max_tokens, retry_errors, progress)
            )
        else:
            summary = asyncio.run(
                _run_pipeline(
                    items,
                    out,
                    name,
                    mode,
                    url=url,
                    planner_url=planner_url,
                    model_name=model_name,
                    api_key=api_key,
                    concurrency=concurrency,
                    deadline_s=deadline_s,
                    use_cache=use_cache,
                    retry_errors=retry_errors,
                    progress=progress,
                )
            )
    except EvalAborted as exc:
        err.print(f"[red]{exc}; finished items are in {out}, rerun to resume")
        raise typer.Exit(1) from None
    except (ValueError, RuntimeError) as exc:
        err.print(f"[red]{exc}")
        raise typer.Exit(1) from None
    acc = "—" if summary.accuracy is None else f"{100 * summary.accuracy:.1f}%"
    console.print(
        f"{name} {mode}: ran {summary.ran}, skipped {summary.skipped} already done, "
        f"correct {summary.correct}/{summary.ran} ({acc}), errors {summary.errors}, "
        f"{summary.wall_s:.1f} s -> {out}"
    )


async def _run_pipeline(
    items: list[Item],
    out: Path,
    dataset: str,
    mode: str,
    *,
    url: str,
    planner_url: str,
    model_name: str | None,
    api_key: str | None,
    concurrency: int,
    deadline_s: float,
    use_cache: bool,
    retry_errors: bool,
    progress: bool,
) -> RunSummary:
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(limits=limits) as client:
        model = model_name or await planner_model_name(client, planner_url)
        runner = ReasonRunner(
            client,
            url,
            mode,
            dataset=dataset,
            model=model,
            deadline_s=deadline_s,
            use_cache=use_cache,
            api_key=api_key,
        )
        return await run_items(
            items,
            runner,
            out,
            dataset=dataset,
            mode=mode,
            concurrency=concurrency,
            retry_errors=retry_errors,
            show_progress=progress,
        )


async def _run_direct(
    items: list[Item],
    out: Path,
    dataset: str,
    backend_name: str,
    max_tokens: int,
    retry_errors: bool,
    progress: bool,
) -> RunSummary:
    done = done_keys(out, include_errors=not retry_errors)
    if all((dataset, "direct", it.id) in done for it in items):
        return RunSummary(total=len(items), skipped=len(items))  # nothing to load a model for
    settings = PlannerSettings(backend=backend_name)  # type: ignore[arg-type]
    backend = load_direct_backend(settings)
    await backend.load()
    try:
        runner = DirectRunner(backend, dataset=dataset, max_tokens=max_tokens, seed=settings.seed)
        # one model context generates one answer at a time: more in flight only queue
        return await run_items(
            items,
            runner,
            out,
            dataset=dataset,
            mode="direct",
            concurrency=1,
            retry_errors=retry_errors,
            show_progress=progress,
        )
    finally:
        await backend.close()


@eval_app.command("report")
def report(
    results: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="Results JSONL."),
    out_dir: Path = typer.Option(Path("docs/eval"), "--out-dir", help="Where to write."),
) -> None:
    """Write report.md, summary.json and PNG plots for one or more results files.

    Accuracy (Wilson 95%), schema-valid plans, stage latency P50/P95, cache hits, verifier
    calibration (ECE, reliability diagram) and the routing analysis."""
    records = load_results(results)
    if not records:
        err.print("[red]no result lines in the given files")
        raise typer.Exit(1)
    written = write_report(results, out_dir, records)
    console.print(summary_table(summarize(records)), markup=False, highlight=False)
    for kind, path in written.items():
        console.print(f"{kind:<17} {path}")


@eval_app.command("routing")
def routing(
    results: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="Results JSONL."),
    modes: list[str] | None = typer.Option(None, "--mode", help="Compare only these modes."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    out: Path | None = typer.Option(None, "--out", help="Also write the analysis as markdown."),
) -> None:
    """Oracle accuracy over modes, headroom over the best single mode, pairwise rescues."""
    reports = routing_analysis(load_results(results), modes or None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(routing_markdown(reports), encoding="utf-8")
    if as_json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
        return
    if not reports:
        err.print("no dataset has results of two or more modes on shared items")
        raise typer.Exit(1)
    for rep in reports:
        console.print(
            f"[bold]{rep.dataset}[/bold]: {rep.n_items} items in every mode; oracle "
            f"{100 * rep.oracle_accuracy:.1f}%, best single `{rep.best_mode}` "
            f"{100 * rep.accuracy[rep.best_mode]:.1f}%, headroom {100 * rep.headroom:.1f} points, "
            f"none right {rep.none_correct}"
        )
        table = Table("rescues ↓ over →", *rep.modes, "accuracy", "only right")
        for a in rep.modes:
            table.add_row(
                a,
                *("—" if a == b else str(rep.rescues[a][b]) for b in rep.modes),
                f"{100 * rep.accuracy[a]:.1f}%",
                str(rep.only_correct[a]),
            )
        console.print(table)
