"""The memory findings, worded once for every renderer: leaks, imbalance, headroom, holders.

:func:`memory_findings` turns the memory analyses' tables (``analysis/compute/memory.py``: peaks, leaks,
imbalance, headroom, holders at the peak) into :class:`~rankscope.analysis.conclude.findings.Finding`
items; the evidence sentences are written here and nowhere else, with their figures from the
same rows as summary.json's ``memory`` (MiB = 2**20 bytes). Split from ``findings.py`` (which
words the timing findings) so that each module holds one family of conclusions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rankscope.analysis.compute.finding import Finding, FindingKind, Severity


def mib(nbytes: float) -> str:
    """Bytes as MiB (2**20) with one decimal: '63.5 MiB'."""
    return f"{nbytes / 2**20:.1f} MiB"


def holder_phrase(rank: int, op: str, scope: str, share: float) -> str:
    """'at rank 3's peak, 61 % of live memory was allocated by aten::bmm (in fwd)'."""
    where = f" (in {scope})" if scope and scope != op else ""
    return (
        f"at rank {rank}'s peak, {share:.0%} of live memory was allocated by {op or 'no op'}{where}"
    )


def leak_evidence(figures: Mapping[str, float]) -> str:
    """The evidence sentence of one memory leak, from its :attr:`Finding.figures`."""
    return (
        f"allocated memory at step start grows {mib(figures['slope_bytes_per_step'])}/step over "
        f"{int(figures['steps'])} steps (standard error {mib(figures['slope_se_bytes'])}, one-sided "
        f"p = {figures['p_value']:.2g}); its peak is {mib(figures['peak_allocated_bytes'])}"
    )


def no_leak_evidence(devices: int) -> str:
    """Why "no leak" is a finding: every device's step-start memory was tested."""
    return (
        f"allocated memory at step start grows significantly and materially on no rank "
        f"({devices} device(s) tested)."
    )


def memory_imbalance_evidence(figures: Mapping[str, float]) -> str:
    """The evidence sentence of a rank whose peak is well above the others'."""
    return (
        f"peak allocated {mib(figures['peak_allocated_bytes'])}, {mib(figures['excess_bytes'])} "
        f"({figures['excess_share']:.0%}) above the median of the other ranks "
        f"({mib(figures['median_others_bytes'])})"
    )


def headroom_evidence(figures: Mapping[str, float]) -> str:
    """The evidence sentence of a GPU close to full."""
    return (
        f"peak reserved {mib(figures['peak_reserved_bytes'])} of {mib(figures['total_bytes'])} "
        f"({figures['headroom_share']:.1%} left)"
    )


def _device_label(row: Mapping[str, Any]) -> str:
    from rankscope.analysis.compute.memory import device_name

    return device_name(int(row["device_type"]), int(row["device_id"]))


def _holder_clause(holders: Any, row: Any, figures: dict[str, float]) -> str:
    """ "; at rank N's peak, X% … was allocated by OP" for a memory finding's evidence (and its
    share in ``figures``), or "" when nothing is known to hold the memory at the peak."""
    top = _top_holder(holders, row)
    if top is None:
        return ""
    figures["top_holder_share"] = round(top[2], 4)
    return f"; {holder_phrase(int(row['rank']), *top)}"


def _top_holder(holders: Any, row: Mapping[str, Any]) -> tuple[str, str, float] | None:
    """(op, scope, share) of the largest seen holder at the peak of ``row``'s device."""
    if holders is None or not len(holders):
        return None
    h = holders[
        (holders["rank"] == row["rank"])
        & (holders["device_type"] == row["device_type"])
        & (holders["device_id"] == row["device_id"])
        & (holders["allocations"] > 0)
    ]
    if not len(h):
        return None
    top = h.sort_values("bytes", ascending=False).iloc[0]
    return str(top["op"]), str(top["scope"]), float(top["share"])


def memory_findings(
    peaks: Any, leaks: Any, imbalance: Any, headroom: Any = None, holders: Any = None
) -> list[Finding]:
    """The memory findings, in reading order: leaks (or "no leak"), imbalanced ranks, GPUs with
    low headroom; or the one "no memory events" note when ``peaks`` is empty. Arguments are the
    frames of :mod:`rankscope.analysis.compute.memory` (``headroom``/``holders`` optional). Pure."""
    from rankscope.analysis.compute.memory import NO_MEMORY_EVENTS

    if peaks is None or not len(peaks):
        return [
            Finding(
                kind=FindingKind.NO_MEMORY_EVENTS,
                severity=Severity.NOTE,
                rank=None,
                headline="No memory events",
                evidence=f"{NO_MEMORY_EVENTS}.",
            )
        ]
    out: list[Finding] = []
    found = leaks[leaks["is_leak"]] if len(leaks) else leaks
    for _, row in found.iterrows():
        rank = int(row["rank"])
        figures: dict[str, float] = {
            "slope_bytes_per_step": round(float(row["slope_bytes_per_step"]), 1),
            "slope_se_bytes": round(float(row["slope_se"]), 1),
            "p_value": float(row["p_value"]),
            "steps": int(row["steps"]),
            "peak_allocated_bytes": int(row["peak_allocated"]),
        }
        evidence = leak_evidence(figures) + _holder_clause(holders, row, figures)
        out.append(
            Finding(
                kind=FindingKind.MEMORY_LEAK,
                severity=Severity.PROBLEM,
                rank=rank,
                headline=f"Memory leak: rank {rank} ({_device_label(row)})",
                evidence=evidence,
                figures=figures,
            )
        )
    if not out:
        tested = int(leaks["p_value"].notna().sum()) if len(leaks) else 0
        out.append(
            Finding(
                kind=FindingKind.NO_MEMORY_LEAK,
                severity=Severity.OK,
                rank=None,
                headline="No memory leak",
                evidence=no_leak_evidence(tested),
                figures={"devices": tested},
            )
        )
    high = imbalance[imbalance["is_imbalanced"]] if len(imbalance) else imbalance
    for _, row in high.sort_values("excess_bytes", ascending=False).iterrows():
        rank = int(row["rank"])
        figures = {
            "peak_allocated_bytes": int(row["peak_allocated"]),
            "median_others_bytes": round(float(row["median_others"]), 1),
            "excess_bytes": round(float(row["excess_bytes"]), 1),
            "excess_share": round(float(row["excess_share"]), 4),
        }
        evidence = memory_imbalance_evidence(figures) + _holder_clause(holders, row, figures)
        out.append(
            Finding(
                kind=FindingKind.MEMORY_IMBALANCE,
                severity=Severity.PROBLEM,
                rank=rank,
                headline=f"Memory imbalance: rank {rank} ({_device_label(row)})",
                evidence=evidence,
                figures=figures,
            )
        )
    low = headroom[headroom["is_low"]] if headroom is not None and len(headroom) else None
    for _, row in low.iterrows() if low is not None else iter(()):
        rank = int(row["rank"])
        figures = {
            "peak_reserved_bytes": int(row["peak_reserved"]),
            "total_bytes": int(row["total_bytes"]),
            "headroom_bytes": int(row["headroom_bytes"]),
            "headroom_share": round(float(row["headroom_share"]), 4),
        }
        out.append(
            Finding(
                kind=FindingKind.LOW_MEMORY_HEADROOM,
                severity=Severity.PROBLEM,
                rank=rank,
                headline=f"Low memory headroom: rank {rank} ({_device_label(row)})",
                evidence=headroom_evidence(figures),
                figures=figures,
            )
        )
    return out


# -- from an Analysis ------------------------------------------------------------------------
