"""PNG plots of a report (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evals.report import GroupSummary


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


MARKERS = "osD^v<>PX*"


def minor_log_label(value: float, _pos: object = None) -> str:
    """A log axis's minor tick label: plain numbers on the 2s and 5s between decades."""
    text = f"{value:g}"
    return text if text.lstrip("0.")[:1] in ("2", "5") else ""


def plot_accuracy_latency(summaries: list[GroupSummary], path: Path) -> bool:
    """Accuracy (with its 95% interval) against median total latency, one point per mode."""
    points = [s for s in summaries if "total" in s.latency_ms]
    if not points:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    datasets = sorted({s.dataset for s in points})
    modes = sorted({s.mode for s in points})
    colours = plt.get_cmap("tab10")
    for s in points:
        x = s.latency_ms["total"]["p50"] / 1000
        y = 100 * s.accuracy
        lo, hi = (100 * v for v in s.ci95)
        ax.errorbar(
            x,
            y,
            yerr=[[y - lo], [hi - y]],
            fmt=MARKERS[datasets.index(s.dataset) % len(MARKERS)],
            color=colours(modes.index(s.mode) % 10),
            capsize=3,
            label=f"{s.dataset} · {s.mode} (n={s.n})",
        )
    xs = [s.latency_ms["total"]["p50"] / 1000 for s in points]
    if min(xs) > 0 and max(xs) / min(xs) > 10:  # log scale only across decades
        from matplotlib.ticker import FuncFormatter, ScalarFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(FuncFormatter(minor_log_label))
        scale = " (log scale)"
    else:
        ax.set_xlim(0, max(xs) * 1.15)
        scale = ""
    ax.set_xlabel(f"median latency per item, s{scale}")
    ax.set_ylabel("accuracy, % (95% Wilson interval)")
    ax.set_ylim(0, 100)
    ax.set_title("Accuracy against latency per mode")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def plot_reliability(summaries: list[GroupSummary], path: Path) -> bool:
    """Reliability diagram: per bin, the served confidence's mean against accuracy."""
    scored = [s for s in summaries if s.calibration]
    if not scored:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5.5), dpi=120)
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
    colours = plt.get_cmap("tab10")
    for k, s in enumerate(scored):
        bins = [
            b
            for b in s.calibration
            if b.count and b.mean_confidence is not None and b.accuracy is not None
        ]
        xs = [b.mean_confidence for b in bins]
        ys = [b.accuracy for b in bins]
        sizes = [20 + 200 * b.count / s.scored for b in bins]
        ax.plot(xs, ys, color=colours(k % 10), linewidth=1)
        ax.scatter(
            xs,
            ys,
            s=sizes,
            color=colours(k % 10),
            label=f"{s.dataset} · {s.mode} (n={s.scored}, ECE {s.ece:.3f})",
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("served confidence (bin mean)")
    ax.set_ylabel("share of answers that were right")
    ax.set_title("Reliability of the served confidence (15 bins; area ∝ items)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
