"""Lane coverage: what the per-lane timeline cannot draw event by event, aggregated per bin.

A wide view of a long run cannot draw each of its hundreds of thousands of kernels; the
timeline draws the longest ones (``timeline_frames.timeline_frame``) and hands the rest here.
Each lane's time is cut into bins (a couple of pixels each) and every bin gets the nanoseconds
during which at least one of those events ran — the **union** of their intervals, so nested or
overlapping events count once — split by :class:`LaneCategory`: at an instant covered by events
of several categories, the first of :data:`PRIORITY` takes it (a gloo call inside a
``record_function`` range is communication; a ``cudaLaunchKernel`` inside an aten op is
compute). The categories of a bin therefore sum to its busy time, and its busy time is the true
busy time of the lane's left-out events in it. A stream busy 97 % of the time shows as a bar
97 % high, never as an empty lane.

Every event given is counted in exactly one bin (``events``: the bin its start, clipped to the
bins, falls in), so what the timeline draws plus the ``events`` of the coverage is every event
of the window.

:func:`lane_coverage` is a pure function from events to a DataFrame; :func:`coverage_rects`
turns it into stacked rectangles (one per bin and category) for the renderer in
``analysis/views/timeline.py``. Units: ns (int64, aligned clock) in and in the coverage; rectangles
in ms since an origin (x) and row units (y).
"""

from __future__ import annotations

import enum
import itertools
from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.store.schema import EventKind
from rankscope.analysis.views.time_axis import TimeUnit, format_range


class LaneCategory(enum.IntEnum):
    """What a lane's events were doing, as the coverage colours it."""

    COMPUTE = 0
    """Compute kernels; CPU operators, annotated ranges, Python functions."""
    COMMUNICATION = 1
    """Communication kernels, gloo/NCCL calls and their enqueueing."""
    MEMORY = 2
    """memcpy / memset."""
    OTHER = 3
    """Runtime calls, syncs, ProfilerStep ranges, anything else."""


#: Category of each event kind.
CATEGORY_OF_KIND: dict[EventKind, LaneCategory] = {
    EventKind.CPU_OP: LaneCategory.COMPUTE,
    EventKind.USER_ANNOTATION: LaneCategory.COMPUTE,
    EventKind.PYTHON: LaneCategory.COMPUTE,
    EventKind.KERNEL_COMPUTE: LaneCategory.COMPUTE,
    EventKind.KERNEL_COMM: LaneCategory.COMMUNICATION,
    EventKind.COMM_CPU: LaneCategory.COMMUNICATION,
    EventKind.COMM_ENQUEUE: LaneCategory.COMMUNICATION,
    EventKind.MEMCPY: LaneCategory.MEMORY,
    EventKind.MEMSET: LaneCategory.MEMORY,
    EventKind.PROFILER_STEP: LaneCategory.OTHER,
    EventKind.RUNTIME: LaneCategory.OTHER,
    EventKind.SYNC: LaneCategory.OTHER,
    EventKind.OTHER: LaneCategory.OTHER,
}
#: Which category takes an instant covered by several (first wins).
PRIORITY: tuple[LaneCategory, ...] = (
    LaneCategory.COMMUNICATION,
    LaneCategory.MEMORY,
    LaneCategory.COMPUTE,
    LaneCategory.OTHER,
)
#: Colour of each category's bars (the timeline's kernel colours; grey for other).
CATEGORY_COLORS: dict[LaneCategory, str] = {
    LaneCategory.COMPUTE: "#54A24B",
    LaneCategory.COMMUNICATION: "#F58518",
    LaneCategory.MEMORY: "#72B7B2",
    LaneCategory.OTHER: "#A0A0A0",
}
#: The ns column of each category in the coverage.
CATEGORY_COLUMNS: dict[LaneCategory, str] = {c: f"{c.name.lower()}_ns" for c in LaneCategory}
#: Columns of :func:`lane_coverage`.
COVERAGE_COLUMNS = (
    "rank",
    "lane",
    "bin",
    "start_ns",
    "end_ns",
    "events",
    "busy_ns",
    *CATEGORY_COLUMNS.values(),
)
#: Width of a coverage bin in the timeline, px.
BIN_PX = 2
#: Bins per view at most (a plot wider than 8,192 px gets wider bins).
MAX_BINS = 4096


def bins_for(window: tuple[int, int], width_px: int) -> int:
    """Bins for a view of ``window`` (ns) ``width_px`` wide: one per :data:`BIN_PX` pixels, at
    most :data:`MAX_BINS`, and none shorter than 1 ns."""
    span = max(int(window[1]) - int(window[0]), 1)
    return max(1, min(int(width_px) // BIN_PX, MAX_BINS, span))


def bin_edges(window: tuple[int, int], n_bins: int) -> np.ndarray:
    """Edges (int64 ns) of ``n_bins`` equal bins from ``window[0]``, as wide as needed (whole ns)
    to cover ``window``; the last edge may lie up to one bin width minus 1 ns past its end."""
    span = max(int(window[1]) - int(window[0]), 1)
    n = max(int(n_bins), 1)
    width = -(-span // n)  # ceil
    return int(window[0]) + width * np.arange(n + 1, dtype=np.int64)


def covered_ns(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """ns of each bin (``edges``, int64 ns) inside the union of the intervals ``[starts, ends)``.

    Intervals may overlap and come in any order; time outside the bins is not counted.
    """
    s, e = _union(np.asarray(starts, np.int64), np.asarray(ends, np.int64))
    return np.diff(_integral(s, e, np.asarray(edges, np.int64)))


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the same instants as ``[starts, ends)``."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    new = np.r_[True, s[1:] > e[:-1]]  # a gap before this interval: it starts a new run
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(s)] - 1
    return s[first], e[last]


def _integral(s: np.ndarray, e: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Covered ns before each of ``at`` for disjoint sorted intervals ``[s, e)``."""
    if len(s) == 0:
        return np.zeros(len(at), dtype=np.int64)
    cum = np.r_[0, np.cumsum(e - s)]
    k = np.searchsorted(s, at, side="right")  # intervals starting at or before each point
    inside = np.where(k > 0, np.maximum(e[np.maximum(k - 1, 0)] - at, 0), 0)
    return cum[k] - inside


def partition(
    starts: np.ndarray, ends: np.ndarray, cats: np.ndarray
) -> dict[LaneCategory, tuple[np.ndarray, np.ndarray]]:
    """The union of ``[starts, ends)`` cut into disjoint sorted intervals per category: each
    instant goes to the first category of :data:`PRIORITY` among the intervals covering it."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    cats = np.asarray(cats, np.int64)
    n = len(starts)
    out: dict[LaneCategory, tuple[np.ndarray, np.ndarray]] = {}
    present = sorted({int(c) for c in cats})
    if len(present) <= 1:  # one category: its union (the common case: a GPU stream)
        for c in present:
            out[LaneCategory(c)] = _union(starts, ends)
        return out
    t = np.r_[starts, ends]
    order = np.argsort(t, kind="stable")
    delta = np.zeros((2 * n, len(LaneCategory)), dtype=np.int32)
    delta[np.arange(n), cats] = 1
    delta[n + np.arange(n), cats] = -1
    t, active = t[order], np.cumsum(delta[order], axis=0) > 0  # state after each boundary
    prio = [int(c) for c in PRIORITY]
    ranked = active[:, prio]
    top = np.where(ranked.any(axis=1), np.argmax(ranked, axis=1), -1)
    seg_s, seg_e = t[:-1], t[1:]
    for i, c in enumerate(PRIORITY):
        sel = (top[:-1] == i) & (seg_e > seg_s)
        if sel.any():
            out[c] = _union(seg_s[sel], seg_e[sel])
    return out


def lane_coverage(events: pd.DataFrame, edges: np.ndarray) -> pd.DataFrame:
    """Per (rank, lane, bin): how many of ``events`` start in the bin and the ns the bin is
    covered by them, in all and per :class:`LaneCategory`.

    ``events``: columns ``rank``, ``lane``, ``ts``, ``dur`` (ns) and ``kind``
    (:class:`~rankscope.analysis.store.schema.EventKind`). ``edges``: the bins' edges, int64 ns,
    increasing. An event starting before the first bin counts in the first, one starting at or
    past the last edge in the last. Columns: :data:`COVERAGE_COLUMNS` (``busy_ns`` = the sum of
    the category columns = the union of the lane's intervals in the bin); only bins with events
    or busy time, sorted by rank, lane, bin.
    """
    edges = np.asarray(edges, np.int64)
    n_bins = len(edges) - 1
    if len(events) == 0 or n_bins < 1:
        return pd.DataFrame({c: pd.Series([], dtype="int64") for c in COVERAGE_COLUMNS})
    kind_cat = np.full(max(int(k) for k in EventKind) + 1, int(LaneCategory.OTHER), np.int64)
    for kind, cat in CATEGORY_OF_KIND.items():
        kind_cat[int(kind)] = int(cat)
    ev = events.sort_values(["rank", "lane"], kind="stable")
    keys = ev[["rank", "lane"]].to_numpy(np.int64)
    ts = ev["ts"].to_numpy(np.int64)
    end = ts + ev["dur"].to_numpy(np.int64)
    cats = kind_cat[np.clip(ev["kind"].to_numpy(np.int64), 0, len(kind_cat) - 1)]
    cut = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1), True])
    parts = []
    for a, b in itertools.pairwise(cut):
        first = np.clip(np.searchsorted(edges, ts[a:b], side="right") - 1, 0, n_bins - 1)
        cols: dict[str, Any] = {"events": np.bincount(first, minlength=n_bins)}
        busy = np.zeros(n_bins, np.int64)
        for c in LaneCategory:
            cols[CATEGORY_COLUMNS[c]] = np.zeros(n_bins, np.int64)
        for c, (s, e) in partition(ts[a:b], end[a:b], cats[a:b]).items():
            ns = np.diff(_integral(s, e, edges))
            cols[CATEGORY_COLUMNS[c]] = ns
            busy += ns
        keep = (cols["events"] > 0) | (busy > 0)
        idx = np.flatnonzero(keep)
        parts.append(
            pd.DataFrame(
                {
                    "rank": keys[a, 0],
                    "lane": keys[a, 1],
                    "bin": idx,
                    "start_ns": edges[idx],
                    "end_ns": edges[idx + 1],
                    "events": cols["events"][idx],
                    "busy_ns": busy[idx],
                    **{CATEGORY_COLUMNS[c]: cols[CATEGORY_COLUMNS[c]][idx] for c in LaneCategory},
                }
            )
        )
    return pd.concat(parts, ignore_index=True)[list(COVERAGE_COLUMNS)]


def coverage_rects(
    cov: pd.DataFrame,
    rows: dict[tuple[int, int], tuple[int, str]],
    origin_ns: int,
    pad: float,
    unit: TimeUnit,
) -> dict[LaneCategory, pd.DataFrame]:
    """Stacked bars of a coverage (:func:`lane_coverage`) per category: in each bin of a lane's
    row (``row_of[(rank, lane)]``; rows without one are skipped) one rectangle per category,
    bottom-aligned (the y axis is inverted: row ``i``'s bottom is ``i + 1 - pad``), each as high
    as its share of the bin, so the stack is as high as the bin is busy.

    ``rows``: (rank, lane) → (row index, lane label); lanes without a row are skipped.
    Columns: x0, y0, x1, y1 (ms since ``origin_ns``, row units), ``rank``, and the hover's text:
    ``lane_name``, ``when`` (the bin, in ``unit``), ``busy`` ("97 %" of the bin, all
    categories), ``share`` (this category's), ``events`` (events of the coverage starting in it).
    """
    keys = list(zip(cov["rank"].tolist(), cov["lane"].tolist(), strict=True))
    found = [rows.get(k, (-1, "")) for k in keys]
    row = np.array([f[0] for f in found], dtype=np.float64)
    labels = np.array([f[1] for f in found], dtype=object)
    cov, labels, row = cov[row >= 0], labels[row >= 0], row[row >= 0]
    width = (cov["end_ns"] - cov["start_ns"]).to_numpy(np.float64)
    height = 1.0 - 2 * pad
    bottom = row + 1 - pad
    below = np.zeros(len(cov))
    x0 = (cov["start_ns"].to_numpy(np.int64) - origin_ns) / 1e6
    x1 = (cov["end_ns"].to_numpy(np.int64) - origin_ns) / 1e6
    busy = cov["busy_ns"].to_numpy(np.float64) / np.maximum(width, 1)
    # one label per distinct bin (bins are shared by every lane)
    starts, first, inverse = np.unique(
        cov["start_ns"].to_numpy(np.int64), return_index=True, return_inverse=True
    )
    ends = cov["end_ns"].to_numpy(np.int64)[first]
    when = np.array(
        [
            format_range(a - origin_ns, b - origin_ns, unit)
            for a, b in zip(starts, ends, strict=True)
        ],
        dtype=object,
    )
    out = {}
    for c in PRIORITY:  # stacked bottom-up: communication, memory, compute, other
        share = cov[CATEGORY_COLUMNS[c]].to_numpy(np.float64) / np.maximum(width, 1)
        sel = share > 0
        out[c] = pd.DataFrame(
            {
                "x0": x0[sel],
                "y0": (bottom - (below + share) * height)[sel],
                "x1": x1[sel],
                "y1": (bottom - below * height)[sel],
                "rank": cov["rank"].to_numpy()[sel],
                "lane_name": labels[sel],
                "when": when[inverse[sel]],
                "busy": [f"{100 * b:.0f} %" for b in busy[sel]],
                "share": [f"{100 * v:.0f} %" for v in share[sel]],
                "events": cov["events"].to_numpy()[sel],
            }
        )
        below = below + share
    return out
