"""Rank numbers as compact text (``0–2, 5``): one rule for every message that lists ranks.

Here, in the umbrella package, because the merge (``orchestrator/ingest``) and the analysis'
sentences (``analysis/conclude``) both list ranks, and those floors may not import each other.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Between the first and the last rank of a run of consecutive ranks (an en dash, as in "0–7").
RANGE_DASH = "\u2013"


def rank_ranges(ranks: Iterable[int]) -> str:
    """Sorted, de-duplicated ranks with consecutive ones as ranges: [5, 0, 1, 2] -> '0–2, 5'."""
    ordered = sorted(set(ranks))
    if not ordered:
        return ""
    parts: list[str] = []
    start = prev = ordered[0]
    for r in [*ordered[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}{RANGE_DASH}{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


def rank_list(ranks: Iterable[int]) -> str:
    """``rank 3`` / ``ranks 0, 2–7``: :func:`rank_ranges` with its noun."""
    ordered = sorted(set(ranks))
    return ("rank " if len(ordered) == 1 else "ranks ") + rank_ranges(ordered)
