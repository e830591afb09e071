"""Report what scripts/bench_reason_latency.sh recorded: per run (LABEL, mode), the /reason
latency P50/P95 as the client saw it, the planning stage's share, and the requests that
ran out of their deadline. Per mode, the items compared are the ones every run of that
mode has finished.

    python scripts/bench_reason_latency.py docs/benchmarks/results/reason_latency-*.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

NAME = re.compile(r"reason_latency-(?P<label>[^-]+)-(?P<mode>.+)\.jsonl$")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (the value below which q of the items fall)."""
    ordered = sorted(values)
    rank = max(1, round(q * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


def load(path: Path) -> dict[str, dict[str, Any]]:
    items: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            items[item["id"]] = item  # the last line of an item counts
    return items


def seconds(item: dict[str, Any], stage: str) -> float | None:
    value = (item.get("latency_ms") or {}).get(stage)
    return None if value is None else value / 1000


def report(paths: list[Path]) -> list[dict[str, Any]]:
    runs = {}
    for path in paths:
        match = NAME.search(path.name)
        if match:
            runs[(match["label"], match["mode"])] = load(path)
    rows = []
    for (label, mode), items in sorted(runs.items()):
        # The items every run of this mode has finished, so labels compare like with like.
        common = set.intersection(*(set(other) for (_, m), other in runs.items() if m == mode))
        chosen = [items[i] for i in sorted(common)]
        # The client's wall time; a failed request counts at the time it failed (a
        # deadline at 120 s), so failures raise the percentiles instead of leaving them.
        client = [
            value
            for item in chosen
            if (value := seconds(item, "client") or seconds(item, "total")) is not None
        ]
        plan = [value for item in chosen if (value := seconds(item, "plan")) is not None]
        errors = [item["error"] for item in chosen if item.get("error")]
        rows.append(
            {
                "label": label,
                "mode": mode,
                "items": len(chosen),
                "p50_s": round(statistics.median(client), 2) if client else None,
                "p95_s": round(percentile(client, 0.95), 2) if client else None,
                "mean_s": round(statistics.mean(client), 2) if client else None,
                "plan_stage_p50_s": round(statistics.median(plan), 2) if plan else None,
                "errors": len(errors),
                "deadline_errors": sum("deadline" in str(e) or "timeout" in str(e) for e in errors),
                "correct": sum(bool(item.get("correct")) for item in chosen),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    for row in report(parser.parse_args().paths):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
