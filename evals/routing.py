"""Routing analysis over per-item results of several modes (or models).

Per dataset, over the items every compared mode has a result for:
- oracle accuracy: an item counts when any mode got it right (what a perfect router
  choosing one mode per item would score);
- headroom: oracle accuracy less the best single mode's accuracy;
- for each ordered pair (a, b): items a rescues (a right, b wrong) and items a loses
  (a wrong, b right); `rescues[a][b] == loses[b][a]`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RoutingReport:
    dataset: str
    modes: list[str]
    n_items: int  # items every mode has a result for
    accuracy: dict[str, float]
    oracle_accuracy: float
    best_mode: str
    headroom: float
    rescues: dict[str, dict[str, int]] = field(default_factory=dict)
    only_correct: dict[str, int] = field(default_factory=dict)  # items only this mode got
    none_correct: int = 0
    dropped_items: int = 0  # items missing from at least one mode

    def loses(self, a: str, b: str) -> int:
        return self.rescues[b][a]

    def as_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "modes": self.modes,
            "n_items": self.n_items,
            "accuracy": self.accuracy,
            "oracle_accuracy": self.oracle_accuracy,
            "best_mode": self.best_mode,
            "headroom": self.headroom,
            "rescues": self.rescues,
            "only_correct": self.only_correct,
            "none_correct": self.none_correct,
            "dropped_items": self.dropped_items,
        }


def routing_analysis(
    records: list[dict[str, Any]], modes: list[str] | None = None
) -> list[RoutingReport]:
    """One report per dataset that has results of at least two modes."""
    by_dataset: dict[str, dict[str, dict[str, bool]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if modes is None or r["mode"] in modes:
            by_dataset[str(r.get("dataset", ""))][r["mode"]][str(r["id"])] = bool(r["correct"])
    reports = []
    for dataset in sorted(by_dataset):
        per_mode = by_dataset[dataset]
        names = [m for m in (modes or sorted(per_mode)) if m in per_mode]
        if len(names) < 2:
            continue
        all_ids = set().union(*(per_mode[m].keys() for m in names))
        common = sorted(set.intersection(*(set(per_mode[m]) for m in names)))
        if not common:
            continue
        n = len(common)
        right = {m: {i for i in common if per_mode[m][i]} for m in names}
        accuracy = {m: len(right[m]) / n for m in names}
        any_right = set().union(*right.values())
        oracle = len(any_right) / n
        best = max(names, key=lambda m: (accuracy[m], -names.index(m)))
        rescues = {a: {b: len(right[a] - right[b]) for b in names if b != a} for a in names}
        only = {m: len(right[m] - set().union(*(right[o] for o in names if o != m))) for m in names}
        reports.append(
            RoutingReport(
                dataset=dataset,
                modes=names,
                n_items=n,
                accuracy=accuracy,
                oracle_accuracy=oracle,
                best_mode=best,
                headroom=oracle - accuracy[best],
                rescues=rescues,
                only_correct=only,
                none_correct=n - len(any_right),
                dropped_items=len(all_ids) - n,
            )
        )
    return reports


def routing_markdown(reports: list[RoutingReport]) -> str:
    if not reports:
        return "No dataset has results of two or more modes on shared items.\n"
    out = []
    for rep in reports:
        out.append(f"### Routing: {rep.dataset} ({rep.n_items} items in every mode)\n")
        if rep.dropped_items:
            out.append(
                f"{rep.dropped_items} items lacked a result in some mode and are left out.\n"
            )
        out.append("| mode | accuracy | only this mode right |")
        out.append("|---|---|---|")
        for m in rep.modes:
            out.append(f"| {m} | {100 * rep.accuracy[m]:.1f}% | {rep.only_correct[m]} |")
        out.append(
            f"\nOracle accuracy (any mode right): **{100 * rep.oracle_accuracy:.1f}%**; best "
            f"single mode `{rep.best_mode}` {100 * rep.accuracy[rep.best_mode]:.1f}%; headroom "
            f"{100 * rep.headroom:.1f} points; no mode right on {rep.none_correct} items.\n"
        )
        out.append(
            "Rescues: row mode right where column mode is wrong (row loses = column's rescues).\n"
        )
        out.append("| rescues ↓ over → | " + " | ".join(rep.modes) + " |")
        out.append("|---" * (len(rep.modes) + 1) + "|")
        for a in rep.modes:
            cells = ["—" if a == b else str(rep.rescues[a][b]) for b in rep.modes]
            out.append(f"| {a} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) + "\n"
