"""What the served votes did, from per-item results of the sampling modes.

A response of a mode that votes (`n_plans` or `n_prose` above one) records every sample of
the served round in the order drawn (`agreement.votes`: executed plans, then worked
solutions) and how many samples were drawn (`agreement.plans`: fewer than asked when the
first stage agreed or the deadline cut the second). Scoring each vote with the
evaluation's one rule splits a mode's wrong answers in two:

- *the vote missed it*: some sample was right and the vote served another answer, so a
  better selector (a verifier trained to rank the samples, a different tie rule) could
  have served it;
- *no sample right*: no selector over these samples could have; only more or better
  samples can.

It also gives accuracy by the number of samples drawn (a two-stage mode stops at the
first stage when its two samples agree) and by how many of the drawn samples agreed with
the served answer. Together they say, from the per-item results, where a sampling mode
loses its right answers. Items of the same (dataset, mode) that recorded no votes (a
failed request, or a mode with one sample) are counted apart and left out of the rest.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from evals.extract import extract_number, is_correct


@dataclass
class Tally:
    items: int = 0
    right: int = 0

    def add(self, right: bool) -> None:
        self.items += 1
        self.right += right


@dataclass
class SamplingReport:
    dataset: str
    mode: str
    items: int  # items whose response recorded its votes
    right: int  # of those, served right
    any_right: int  # some sample right (what a perfect selector over the samples scores)
    missed: int  # served wrong although some sample was right
    none_right: int  # no sample right
    without_votes: int  # items of the group with no recorded votes, left out above
    mean_drawn: float
    by_drawn: dict[int, Tally] = field(default_factory=dict)  # samples drawn -> items, right
    by_agreement: dict[str, Tally] = field(default_factory=dict)  # agreeing share -> ...

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["by_drawn"] = {str(k): asdict(v) for k, v in sorted(self.by_drawn.items())}
        return out


AGREEMENT_BANDS = ("all", "more than half", "half or less")


def agreement_band(agreeing: int, drawn: int) -> str:
    if agreeing >= drawn:
        return "all"
    return "more than half" if 2 * agreeing > drawn else "half or less"


def _votes(record: dict[str, Any]) -> list[dict[str, Any]]:
    agreement = record.get("agreement") or {}
    return [v for v in agreement.get("votes") or [] if isinstance(v, dict)]


def sampling_analysis(records: list[dict[str, Any]]) -> list[SamplingReport]:
    """One report per (dataset, mode) in which some item recorded more than one vote."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(str(r.get("dataset", "")), str(r["mode"]))].append(r)
    reports = []
    for (dataset, mode), rows in sorted(groups.items()):
        voted = [(r, votes) for r in rows if not r.get("error") and (votes := _votes(r))]
        if not any(len(votes) > 1 for _, votes in voted):
            continue  # one sample per item (a replanned `plan` item records its vote too)
        rep = SamplingReport(
            dataset=dataset,
            mode=mode,
            items=len(voted),
            right=0,
            any_right=0,
            missed=0,
            none_right=0,
            without_votes=len(rows) - len(voted),
            mean_drawn=0.0,
            by_agreement={band: Tally() for band in AGREEMENT_BANDS},
        )
        drawn_total = 0
        for r, votes in voted:
            served_right = bool(r.get("correct"))
            some_right = any(
                is_correct(extract_number(v.get("answer")), r.get("gold")) for v in votes
            )
            agreement = r["agreement"]
            drawn = int(agreement.get("plans") or len(votes))
            drawn_total += drawn
            rep.right += served_right
            rep.any_right += some_right or served_right
            rep.missed += some_right and not served_right
            rep.none_right += not some_right and not served_right
            rep.by_drawn.setdefault(drawn, Tally()).add(served_right)
            band = agreement_band(int(agreement.get("agreeing") or 0), drawn)
            rep.by_agreement[band].add(served_right)
        rep.mean_drawn = drawn_total / len(voted)
        reports.append(rep)
    return reports


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "—"


def sampling_markdown(reports: list[SamplingReport]) -> str:
    if not reports:
        return "No mode recorded its votes.\n"
    out = []
    for rep in reports:
        wrong = rep.items - rep.right
        out.append(f"### Votes: {rep.dataset} / {rep.mode} ({rep.items} items with votes)\n")
        if rep.without_votes:
            out.append(f"{rep.without_votes} items recorded no votes and are left out.\n")
        out.append(
            f"Served right: {rep.right} ({_share(rep.right, rep.items)}). Some sample right: "
            f"**{rep.any_right} ({_share(rep.any_right, rep.items)})**, the most any selector "
            f"over these samples could serve. Of the {wrong} wrong answers, the vote missed a "
            f"right sample in **{rep.missed}** and no sample was right in "
            f"**{rep.none_right}**. Samples drawn: {rep.mean_drawn:.2f} on average.\n"
        )
        out.append("| samples drawn | items | right | accuracy |")
        out.append("|---:|---:|---:|---:|")
        for k, t in sorted(rep.by_drawn.items()):
            out.append(f"| {k} | {t.items} | {t.right} | {_share(t.right, t.items)} |")
        out.append("")
        out.append("| samples agreeing with the served answer | items | right | accuracy |")
        out.append("|---|---:|---:|---:|")
        for band in AGREEMENT_BANDS:
            t = rep.by_agreement[band]
            out.append(f"| {band} | {t.items} | {t.right} | {_share(t.right, t.items)} |")
        out.append("")
    return "\n".join(out) + "\n"
