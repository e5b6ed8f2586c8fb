"""The findings of a layered job (:mod:`rankscope.analysis.compute.rootcause`), worded once for every
renderer, and the path a slow worker's delay took through the job's groups.

A slow worker is a ``straggler`` finding (its coordinates, its own extra work over its peers,
the path of its delay); a stage imbalance and a data-dependent imbalance have kinds of their
own (``stage_imbalance``, ``data_imbalance``); without any of them one ``no_straggler`` says
which rank came closest and which test it failed. Each is followed by its what-if finding
(:func:`rankscope.analysis.findings.findings.findings` links them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.compute.finding import Finding
    from rankscope.analysis.compute.rootcause import RootCause

#: Cause of a data-dependent imbalance (the findings' ``cause``).
DATA_CAUSE = "data-dependent work (e.g. sequence length)"
#: Cause of a stage imbalance.
STAGE_CAUSE = "more work on the stage"


# -- findings --------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def _signed_ms(seconds: float) -> str:
    """``+1.2`` / ``-0.3`` ms, and ``0.0`` (never ``+-0.0``) for what rounds to nothing."""
    text = f"{seconds * 1e3:+.1f}"
    return "0.0" if text in ("+0.0", "-0.0") else text


def _gc_part(row: Mapping[str, Any]) -> str:
    """ ", GC pauses +X" where the trace showed the rank's garbage collections (else nothing)."""
    paused = float(row.get("gc_extra_s", 0.0) or 0.0)
    return f", GC pauses {_signed_ms(paused)}" if paused != 0.0 else ""


def straggler_evidence(rc: RootCause, row: Mapping[str, Any]) -> str:
    """The evidence sentence of one slow worker (a row of ``RootCause.ranks``), in ms."""
    rank = int(row["rank"])
    where = rc.coords(rank)
    text = (
        f"rank {rank}{f' ({where})' if where else ''} did the most own work of the "
        f"{int(row['peers'])} ranks of its stage (its peers) in {int(row['times_slowest'])} of "
        f"{int(row['steps'])} steps (p = {float(row['p_value']):.2g}): "
        f"{_signed_ms(row['typical_s'])} ms per step over their median (compute "
        f"{_signed_ms(row['compute_extra_s'])}, input {_signed_ms(row['input_extra_s'])}, host "
        f"{_signed_ms(row['host_extra_s'])}{_gc_part(row)} ms; step-to-step noise "
        f"{_ms(row['noise_s'])} ms s.d.)"
    )
    path = str(row.get("path", ""))
    return text + (f"; its delay: {path}" if path else "")


#: Why the closest rank is not named (RootCause.ranks ``verdict``).
_NOT_NAMED: dict[str, str] = {
    "not slowest more often than chance": "it was not the slowest of its peers more often "
    "than chance",
    "immaterial": "its typical excess, {typical_ms} ms per step, is too small to matter",
    "within the noise": "its typical excess, {typical_ms} ms per step, is within its peers' "
    "step-to-step noise ({noise_ms} ms s.d.)",
    "fixing it buys too little": "making it like its peers would save too little of the step",
    "no peers": "no other rank runs its program",
}


def no_straggler_evidence(rc: RootCause) -> str:
    """Why no slow worker is named in a layered job."""
    text = (
        "no rank did significantly more own work than its peers (the ranks of its stage) with a "
        "material what-if"
    )
    r = rc.ranks
    if not len(r):
        return text + "."
    closest = r.sort_values("p_value").iloc[0]
    why = _NOT_NAMED.get(str(closest["verdict"]))
    if why is None or int(closest["times_slowest"]) == 0:
        return text + "."
    return (
        f"{text}; rank {int(closest['rank'])} was the slowest of its peers in "
        f"{int(closest['times_slowest'])} of {int(closest['steps'])} steps "
        f"(p = {float(closest['p_value']):.2g}) but is not named: "
        + why.format(typical_ms=_ms(closest["typical_s"]), noise_ms=_ms(closest["noise_s"]))
        + "."
    )


def stage_evidence(row: Mapping[str, Any]) -> str:
    """The evidence sentence of a stage imbalance (a row of ``RootCause.stages``)."""
    return (
        f"every rank of stage {int(row['stage'])} ({int(row['ranks'])} ranks) does more own work "
        f"than the median stage: +{_ms(row['typical_s'])} ms per step over the other stages' "
        f"median; the heaviest stage in {int(row['times_heaviest'])} of {int(row['steps'])} "
        f"steps (p = {float(row['p_value']):.2g}); its ranks are as slow as each other, so fixing "
        "any one of them buys nothing: balance the stages"
    )


def data_evidence(fig: Mapping[str, float]) -> str:
    """The evidence sentence of a data-dependent imbalance (``RootCause.imbalance``)."""
    return (
        f"the rank doing the most own work among its peers moves ({int(fig['moving'])} different "
        f"ranks over {int(fig['steps'])} steps and the stages), so no one rank is a straggler; "
        f"every piece of work at its typical size would save {fig['saving_share']:.1%} of the "
        f"step ({fig['beyond_share']:.1%} beyond the named fixes, median step)"
    )


def rootcause_findings(rc: RootCause) -> list[Finding]:
    """The slow workers (or one ``no_straggler``), then the stage and data imbalances."""
    from rankscope.analysis.compute.finding import Finding, FindingKind, Severity

    out: list[Finding] = []
    r = rc.ranks
    for _, row in (r[r["is_straggler"]] if len(r) else r).iterrows():
        rank = int(row["rank"])
        figures = {
            k: round(float(row[k]), 6)
            for k in (
                "typical_s",
                "noise_s",
                "compute_extra_s",
                "input_extra_s",
                "host_extra_s",
                "gc_extra_s",
            )
        }
        figures.update(
            {
                "times_slowest": int(row["times_slowest"]),
                "steps": int(row["steps"]),
                "peers": int(row["peers"]),
                "p_value": float(row["p_value"]),
                "saving_s": round(float(row["saving_s"]), 6),
                "saving_share": round(float(row["saving_share"]), 4),
                **{d: int(row[d]) for d in ("dp", "pp", "tp")},
            }
        )
        out.append(
            Finding(
                kind=FindingKind.STRAGGLER,
                severity=Severity.PROBLEM,
                rank=rank,
                headline=f"Straggler: rank {rank}",
                evidence=straggler_evidence(rc, row),
                cause=str(row["cause"]),
                figures=figures,
            )
        )
    if not out:
        out.append(
            Finding(
                kind=FindingKind.NO_STRAGGLER,
                severity=Severity.OK,
                rank=None,
                headline="No straggler",
                evidence=no_straggler_evidence(rc),
                figures={"ranks": len(r)},
            )
        )
    s = rc.stages
    for _, row in (s[s["is_imbalanced"]] if len(s) else s).iterrows():
        out.append(
            Finding(
                kind=FindingKind.STAGE_IMBALANCE,
                severity=Severity.PROBLEM,
                rank=None,
                headline=f"Stage imbalance: stage {int(row['stage'])}",
                evidence=stage_evidence(row),
                cause=STAGE_CAUSE,
                figures={
                    "stage": int(row["stage"]),
                    "ranks": int(row["ranks"]),
                    "times_heaviest": int(row["times_heaviest"]),
                    "steps": int(row["steps"]),
                    "p_value": float(row["p_value"]),
                    "typical_s": round(float(row["typical_s"]), 6),
                    "saving_s": round(float(row["saving_s"]), 6),
                    "saving_share": round(float(row["saving_share"]), 4),
                },
            )
        )
    if rc.data_imbalance():
        out.append(
            Finding(
                kind=FindingKind.DATA_IMBALANCE,
                severity=Severity.PROBLEM,
                rank=None,
                headline="Data-dependent imbalance",
                evidence=data_evidence(rc.imbalance),
                cause=DATA_CAUSE,
                figures={k: v for k, v in rc.imbalance.items() if k != "named"},
            )
        )
    return out


def layout_frame(rc: RootCause) -> pd.DataFrame:
    """The layout with each rank's verdict: rank, dp, pp, tp, peers, verdict."""
    out = rc.layout.copy()
    verdict = rc.ranks.set_index("rank")["verdict"] if len(rc.ranks) else None
    out["verdict"] = out["rank"].map(verdict) if verdict is not None else ""
    return out
