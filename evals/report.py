"""Summaries of result lines: accuracy, plan validity, latency, cache, calibration, plots.

Grouped by (dataset, mode). Accuracy counts every item of the group (an item whose
request failed is wrong). Latency percentiles are over items without an error. The
served confidence is a calibrated probability that the answer is right
(`orchestrator/confidence.py`): its calibration is measured over every pipeline item
that got a response (an item without an answer has confidence 0), against whether the
answer was right; `verified` is measured by its precision (verified answers that are
right) and coverage (verified answers among all the items).
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evals.extract import TOLERANCE
from evals.modes import PLAN_FAILURE_TYPES
from evals.routing import routing_analysis, routing_markdown
from evals.sampling import sampling_analysis, sampling_markdown
from evals.stats import (
    ECE_BINS,
    CalibrationBin,
    calibration_bins,
    ece_of_calibrated,
    expected_calibration_error,
    percentile,
    wilson_interval,
)

STAGES = ("plan", "execute", "verify", "total")
MODE_ORDER = (
    "direct",
    "plan",
    "plan+verify",
    "plan+verify+sc5",
    "plan+verify+mixed5",
    "plan+verify+mixed7",
)


@dataclass
class GroupSummary:
    dataset: str
    mode: str
    models: list[str]
    n: int
    correct: int
    accuracy: float
    ci95: tuple[float, float]
    errors: int
    # share of plan-bearing answers among items where the planner finished (pipeline
    # modes): timeouts and unreachable services are left out, planning failures count
    schema_valid: float | None
    latency_ms: dict[str, dict[str, float]]  # stage -> {"p50", "p95", "n"}
    cache_hit_rate: float | None
    scored: int = 0  # pipeline items answered with a served confidence
    ece: float | None = None
    # what a perfectly calibrated confidence with the same values would measure (mean,
    # 95th percentile): the floor the sample size sets (evals.stats.ece_of_calibrated)
    ece_floor: tuple[float, float] | None = None
    calibration: list[CalibrationBin] = field(default_factory=list)
    verified: int = 0  # items served with the verdict `verified`
    verified_right: int = 0

    @property
    def verified_precision(self) -> float | None:
        return self.verified_right / self.verified if self.verified else None

    @property
    def verified_coverage(self) -> float:
        return self.verified / self.n if self.n else 0.0


def planner_finished(record: dict[str, Any]) -> bool:
    """The planner either returned a plan or gave up on making a valid one.

    A timeout or an unreachable service (error `"503 dependency_unavailable: ..."`) says
    nothing about plan validity, so such items are left out of the schema-valid share.
    """
    error = record.get("error")
    if error is None:
        return True
    head = str(error).split(":", 1)[0].split()
    return len(head) == 2 and head[0].isdigit() and head[1] in PLAN_FAILURE_TYPES


def served_from_prose(record: dict[str, Any]) -> bool:
    """The answer came from the model's own worked solution (a mixed mode's prose vote),
    so the response carries no plan to judge. Lines written since `evals.modes.
    plan_validity` say so with `schema_valid: None`; earlier lines wrote `False` for any
    200 response without a plan, which a served plan never is (its response lists at
    least one step), so such a line with no steps is read the same way."""
    if record.get("error") is not None:
        return False
    if record.get("schema_valid") is None:
        return True
    return record["schema_valid"] is False and not record.get("n_steps")


def _mode_rank(mode: str) -> tuple[int, str]:
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def summarize(records: list[dict[str, Any]]) -> list[GroupSummary]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((str(r.get("dataset", "")), str(r["mode"])), []).append(r)
    out = []
    for (dataset, mode), rows in sorted(
        groups.items(), key=lambda kv: (kv[0][0], _mode_rank(kv[0][1]))
    ):
        n = len(rows)
        correct = sum(bool(r["correct"]) for r in rows)
        ok = [r for r in rows if r.get("error") is None]
        latency: dict[str, dict[str, float]] = {}
        for stage in STAGES:
            values = [
                float(v) for r in ok if (v := (r.get("latency_ms") or {}).get(stage)) is not None
            ]
            if values:
                latency[stage] = {
                    "p50": percentile(values, 50),
                    "p95": percentile(values, 95),
                    "n": len(values),
                }
        pipeline = [r for r in rows if r.get("mode") != "direct"]
        planned = [r for r in pipeline if planner_finished(r) and not served_from_prose(r)]
        scored = [r for r in pipeline if r.get("error") is None and r.get("confidence") is not None]
        verified = [r for r in pipeline if r.get("verdict") == "verified"]
        summary = GroupSummary(
            dataset=dataset,
            mode=mode,
            models=sorted({str(r.get("model")) for r in rows}),
            n=n,
            correct=correct,
            accuracy=correct / n,
            ci95=wilson_interval(correct, n),
            errors=n - len(ok),
            schema_valid=(
                sum(bool(r["schema_valid"]) for r in planned) / len(planned) if planned else None
            ),
            latency_ms=latency,
            cache_hit_rate=(
                sum(bool(r.get("cached")) for r in pipeline) / len(pipeline) if pipeline else None
            ),
            scored=len(scored),
            verified=len(verified),
            verified_right=sum(bool(r["correct"]) for r in verified),
        )
        if scored:
            conf = [float(r["confidence"]) for r in scored]
            right = [bool(r["correct"]) for r in scored]
            summary.ece = expected_calibration_error(conf, right, ECE_BINS)
            summary.ece_floor = ece_of_calibrated(conf, ECE_BINS)
            summary.calibration = calibration_bins(conf, right, ECE_BINS)
        out.append(summary)
    return out


# --------------------------------------------------------------------------- markdown


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _lat(s: GroupSummary, stage: str) -> str:
    v = s.latency_ms.get(stage)
    return "—" if v is None else f"{v['p50']:.0f} / {v['p95']:.0f}"


def summary_table(summaries: list[GroupSummary]) -> str:
    lines = [
        "| dataset | mode | n | accuracy [95% CI] | errors | schema-valid plans | "
        "plan ms P50/P95 | execute ms P50/P95 | verify ms P50/P95 | total ms P50/P95 | "
        "cache hits | ECE of the confidence (15 bins) | `verified`: right / served "
        "(precision, coverage) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lo, hi = s.ci95
        verified = (
            "—"
            if s.mode == "direct"
            else f"{s.verified_right} / {s.verified} ({_pct(s.verified_precision)}, "
            f"{_pct(s.verified_coverage)})"
        )
        lines.append(
            f"| {s.dataset} | {s.mode} | {s.n} | {100 * s.accuracy:.1f}% "
            f"[{100 * lo:.1f}, {100 * hi:.1f}] | {s.errors} | {_pct(s.schema_valid)} | "
            f"{_lat(s, 'plan')} | {_lat(s, 'execute')} | {_lat(s, 'verify')} | "
            f"{_lat(s, 'total')} | {_pct(s.cache_hit_rate)} | "
            f"{'—' if s.ece is None else f'{s.ece:.3f} (n={s.scored})'} | {verified} |"
        )
    return "\n".join(lines) + "\n"


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} CPUs visible"


def render_markdown(
    summaries: list[GroupSummary],
    records: list[dict[str, Any]],
    inputs: list[Path],
    plots: dict[str, str],
) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    models = sorted({m for s in summaries for m in s.models})
    parts = [
        "# Evaluation report\n",
        f"Generated {now} by `reason eval report` on {machine_description()}.\n",
        "Inputs: " + ", ".join(f"`{p}`" for p in inputs) + "\n",
        "Models: " + ", ".join(f"`{m}`" for m in models) + "\n",
        "Scoring: the last number in the answer text (commas removed) against the gold "
        f"answer, correct when within {TOLERANCE:g} (relative above 1); the same rule for "
        "every mode. Failed requests count as wrong. Accuracy intervals are Wilson 95%.\n",
        "## Results\n",
        summary_table(summaries),
    ]
    if plots.get("accuracy_latency"):
        parts.append(f"![accuracy against latency]({plots['accuracy_latency']})\n")
    calibrated = [s for s in summaries if s.calibration]
    if calibrated:
        parts.append("## Calibration of the served confidence\n")
        parts.append(
            "The response's `confidence` (a calibrated probability that the answer is "
            "right; 0 for no answer) against whether the answer was right, over every "
            f"pipeline item that got a response, {ECE_BINS} equal-width bins; ECE weights "
            "each bin's gap by its share of the items.\n"
        )
        for s in calibrated:
            cells = [
                f"{b.lo:.2f}–{b.hi:.2f}: n={b.count}, conf {b.mean_confidence:.2f}, acc {b.accuracy:.2f}"
                for b in s.calibration
                if b.count and b.mean_confidence is not None and b.accuracy is not None
            ]
            floor = (
                f"; perfectly calibrated, the same confidences would measure "
                f"{s.ece_floor[0]:.3f} on average, {s.ece_floor[1]:.3f} at the 95th percentile"
                if s.ece_floor
                else ""
            )
            parts.append(f"- {s.dataset} / {s.mode} (ECE {s.ece:.3f}{floor}): " + "; ".join(cells))
        parts.append("")
        if plots.get("reliability"):
            parts.append(f"![reliability diagram]({plots['reliability']})\n")
    sampling = sampling_analysis(records)
    if sampling:
        parts.append("## Votes of the sampling modes\n")
        parts.append(sampling_markdown(sampling))
    parts.append("## Routing\n")
    parts.append(routing_markdown(routing_analysis(records)))
    return "\n".join(parts)


def write_report(
    inputs: list[Path], out_dir: Path, records: list[dict[str, Any]]
) -> dict[str, Path]:
    """Write report.md, summary.json and the PNG plots into out_dir; return their paths."""
    from evals.plots import plot_accuracy_latency, plot_reliability

    if not records:
        raise ValueError("no result lines in " + ", ".join(map(str, inputs)))
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = summarize(records)
    written: dict[str, Path] = {}
    acc_png = out_dir / "accuracy_latency.png"
    if plot_accuracy_latency(summaries, acc_png):
        written["accuracy_latency"] = acc_png
    rel_png = out_dir / "reliability.png"
    if plot_reliability(summaries, rel_png):
        written["reliability"] = rel_png
    md = render_markdown(summaries, records, inputs, {k: p.name for k, p in written.items()})
    md_path = out_dir / "report.md"
    md_path.write_text(md, encoding="utf-8")
    written["markdown"] = md_path
    json_path = out_dir / "summary.json"
    json_path.write_text(
        json.dumps(
            {
                "generated": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": machine_description(),
                "inputs": [str(p) for p in inputs],
                "groups": [asdict(s) for s in summaries],
                "routing": [r.as_dict() for r in routing_analysis(records)],
                "sampling": [r.as_dict() for r in sampling_analysis(records)],
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    written["json"] = json_path
    return written
