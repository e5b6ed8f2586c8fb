"""Measuring boolean combinations of interval sets inside windows (:func:`paint`): how the
breakdown, the overview's bins, the collectives' wait/transfer split and the host feed turn a
rank's interval sets (kernels, communication, waits, steps) into ns per window and category.

Why a module apart from ``breakdown.py``: it is one exact rule on integer ns, shared by every
analysis that measures windows, and tested alone against a count of every covered ns.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _covered(iv: tuple[np.ndarray, np.ndarray], points: np.ndarray) -> np.ndarray:
    """For each point p: is ``[p, next point)`` inside the set (i.e. is p covered)?"""
    starts, ends = iv
    if len(starts) == 0:
        return np.zeros(len(points), bool)
    idx = np.searchsorted(starts, points, side="right") - 1
    ok = idx >= 0
    out = np.zeros(len(points), bool)
    out[ok] = ends[idx[ok]] > points[ok]
    return out


def paint(
    sets: dict[str, tuple[np.ndarray, np.ndarray]],
    categories: Any,
    win_start: np.ndarray,
    win_end: np.ndarray,
) -> dict[str, np.ndarray]:
    """Measure boolean combinations of interval sets inside windows.

    ``categories(cov)`` gets ``{set name: bool array per elementary segment}`` and returns
    ``{category: bool array}``; the result is ``{category: ns inside each window}``. Windows may
    overlap (each is measured independently).

    The segments are cut at the sets' own boundaries (and the windows' outermost edges, so a
    category that holds outside every set, ``~S``, is measured there too); each category's
    covered ns up to any point is then its running sum at the segment holding the point plus
    the part of that segment before it, so a window costs two lookups. Cutting at every
    window's edges instead (the earlier form) sorted ``2 × windows`` more points: an overview
    row has 16,384 bins, which made painting most of a small rank's analysis.
    """
    win_start = np.asarray(win_start, np.int64)
    win_end = np.asarray(win_end, np.int64)
    pieces = [win_start[:0]]
    for s, e in sets.values():
        keep = e > s
        pieces += [s[keep], e[keep]]
    if len(win_start):
        pieces.append(np.array([min(win_start.min(), win_end.min())], np.int64))
        pieces.append(np.array([max(win_start.max(), win_end.max())], np.int64))
    points = np.unique(np.concatenate(pieces).astype(np.int64, copy=False))
    if len(points) == 0:
        return {}
    seg_len = np.diff(points)
    cov = {name: _covered(iv, points[:-1]) for name, iv in sets.items()}
    # the segment holding each window edge (the last segment for an edge at the last point)
    last = max(len(points) - 2, 0)
    i_lo = np.minimum(np.searchsorted(points, win_start, side="right") - 1, last)
    i_hi = np.minimum(np.searchsorted(points, win_end, side="right") - 1, last)
    into_lo, into_hi = win_start - points[i_lo], win_end - points[i_hi]
    out: dict[str, np.ndarray] = {}
    for name, mask in categories(cov).items():
        if len(seg_len) == 0:
            out[name] = np.zeros(len(win_start), np.int64)
            continue
        mask = np.broadcast_to(np.asarray(mask, bool), seg_len.shape)
        cum = np.concatenate([[0], np.cumsum(np.where(mask, seg_len, 0))])
        upto_lo = cum[i_lo] + np.where(mask[i_lo], into_lo, 0)
        upto_hi = cum[i_hi] + np.where(mask[i_hi], into_hi, 0)
        out[name] = np.maximum(upto_hi - upto_lo, 0).astype(np.int64)
    return out
