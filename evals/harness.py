"""Run items through a mode with bounded concurrency, appending one line per finished item.

Resumable: items whose (dataset, mode, id) is already in the output are skipped, so an
interrupted run picks up where it stopped. Lines are written by the event loop thread
only, each in one write followed by a flush, so concurrent items never interleave.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import structlog
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from evals.data import Item, ResultWriter, done_keys
from evals.modes import EvalAborted, Runner, base_record

log = structlog.get_logger(__name__)


@dataclass
class RunSummary:
    total: int  # items asked for
    skipped: int  # already in the output
    ran: int = 0
    correct: int = 0
    errors: int = 0
    wall_s: float = 0.0

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.ran if self.ran else None


async def run_items(
    items: list[Item],
    runner: Runner,
    out: Path,
    *,
    dataset: str,
    mode: str,
    concurrency: int = 2,
    retry_errors: bool = False,
    show_progress: bool = True,
) -> RunSummary:
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    done = done_keys(out, include_errors=not retry_errors)
    todo = [it for it in items if (dataset, mode, it.id) not in done]
    summary = RunSummary(total=len(items), skipped=len(items) - len(todo))
    if not todo:
        return summary
    queue: asyncio.Queue[Item] = asyncio.Queue()
    for it in todo:
        queue.put_nowait(it)
    started = time.perf_counter()
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not show_progress,
    )
    task = progress.add_task(f"{dataset} {mode}", total=len(todo), acc="-")

    with ResultWriter(out) as writer, progress:

        async def worker() -> None:
            while True:
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                try:
                    record = await runner(item)
                except EvalAborted:
                    raise
                except Exception as exc:  # one item's failure is a result, not the run's end
                    log.warning(
                        "item failed",
                        **{
                            "event.action": "eval.item",
                            "labels.item_id": item.id,
                            "labels.mode": mode,
                            "error.type": type(exc).__name__,
                            "error.message": str(exc)[:300],
                        },
                    )
                    record = base_record(item, dataset=dataset, mode=mode, model="unknown")
                    record["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
                record["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
                writer.write(record)
                summary.ran += 1
                summary.correct += bool(record["correct"])
                summary.errors += record.get("error") is not None
                progress.update(
                    task, advance=1, acc=f"{summary.correct}/{summary.ran} err {summary.errors}"
                )

        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(min(concurrency, len(todo))):
                    group.create_task(worker())
        except* EvalAborted as eg:
            raise eg.exceptions[0] from None
        finally:
            summary.wall_s = time.perf_counter() - started
    return summary
