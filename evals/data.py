"""Evaluation items in, result lines out.

Items are JSON lines `{"id", "question", "answer", ...}` (the datasets' `*.norm.jsonl`;
extra fields are ignored). Results are JSON lines, one per item and mode, appended as
each item finishes; a line is keyed by (dataset, mode, id). A run that was interrupted
may leave a torn last line: readers skip lines that are not complete JSON objects, and
the writer starts a fresh line before appending.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.extract import extract_number

SPLIT_NAMES = {"test", "train", "dev", "validation", "val"}

ResultKey = tuple[str, str, str]


class DataError(ValueError):
    """An items file that cannot be evaluated; the message names the file and line."""


@dataclass(frozen=True)
class Item:
    id: str
    question: str
    gold: int | float
    gold_text: str


def dataset_name(path: Path) -> str:
    """`gsm8k/test.norm.jsonl` -> `gsm8k-test`; `svamp/svamp.norm.jsonl` -> `svamp`."""
    stem = path.name.split(".", 1)[0]
    if stem.lower() in SPLIT_NAMES and path.parent.name:
        return f"{path.parent.name}-{stem}"
    return stem


def load_items(path: Path, *, offset: int = 0, limit: int | None = None) -> list[Item]:
    """Items `offset .. offset+limit` of the file, in file order."""
    if offset < 0 or (limit is not None and limit < 0):
        raise DataError("offset and limit must not be negative")
    items: list[Item] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                item_id, question, answer = str(row["id"]), row["question"], str(row["answer"])
            except (ValueError, KeyError, TypeError) as exc:
                raise DataError(f"{path}:{lineno}: not an item line ({exc})") from None
            if not isinstance(question, str) or not question.strip():
                raise DataError(f"{path}:{lineno}: empty question")
            gold = extract_number(answer)
            if gold is None:
                raise DataError(f"{path}:{lineno}: answer {answer!r} is not a number")
            if item_id in seen:
                raise DataError(f"{path}:{lineno}: duplicate id {item_id!r}")
            seen.add(item_id)
            items.append(Item(item_id, question, gold, answer))
    end = None if limit is None else offset + limit
    return items[offset:end]


def result_key(record: dict[str, Any]) -> ResultKey:
    return (str(record.get("dataset", "")), str(record["mode"]), str(record["id"]))


def iter_records(path: Path, *keys: str) -> Iterator[dict[str, Any]]:
    """Complete JSON-object lines of a file that have all of `keys`; a torn line (the
    last one of an interrupted run) or a foreign one is skipped."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                continue  # torn last line of an interrupted run
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and all(k in record for k in keys):
                yield record


def iter_results(path: Path) -> Iterator[dict[str, Any]]:
    """Complete result lines of a file; a torn or foreign line is skipped."""
    return iter_records(path, "id", "mode")


def load_results(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every result of the files; when a key repeats (a retried item) the last line wins."""
    latest: dict[ResultKey, dict[str, Any]] = {}
    for path in paths:
        for record in iter_results(path):
            key = result_key(record)
            latest.pop(key, None)  # keep insertion order = order of the last occurrence
            latest[key] = record
    return list(latest.values())


def done_keys(path: Path, *, include_errors: bool = True) -> set[ResultKey]:
    """Keys already in the output; with include_errors=False, failed items count as not done."""
    return {result_key(r) for r in iter_results(path) if include_errors or r.get("error") is None}


class ResultWriter:
    """Appends one JSON line per finished item and flushes it at once."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torn = path.exists() and path.stat().st_size > 0 and not _ends_with_newline(path)
        self._file = path.open("a", encoding="utf-8")
        if torn:
            self._file.write("\n")  # the torn line stays unreadable instead of swallowing ours

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def write_all(self, records: list[dict[str, Any]]) -> None:
        """Append the lines of several records in one `write(2)` on the append-only file,
        so a killed process leaves all of them or none (at worst a torn last line)."""
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        self._file.flush()
        os.write(self._file.fileno(), data.encode("utf-8"))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"
