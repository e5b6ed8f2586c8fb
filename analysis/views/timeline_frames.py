"""The timeline's data: its rows, and per window the rectangles to draw as DataFrames.

Pure functions of a :class:`~rankscope.analysis.store.reader.Store` (no HoloViews, no Bokeh): which
(rank, lane) rows there are (:func:`timeline_rows`), which events of a window are drawn one by
one and which are left to the lane coverage (:func:`timeline_frame`), the wait/transfer split of
the collectives (:func:`collective_frame`) and the memory curves (:func:`memory_paths`).
``analysis/views/timeline.py`` turns them into HoloViews elements; ``analysis/views/lane_coverage.py``
aggregates the events left out.

Units: store times are int64 **ns** on the aligned clock; rectangles are in **ms since an
origin** (x) and row units (y, row ``i`` spans ``[i, i + 1]``); the hover columns ``start`` and
``duration`` are text in the unit that fits the window (:mod:`rankscope.analysis.views.time_axis`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from rankscope.analysis.store.schema import EventKind, LaneKind, text_values
from rankscope.analysis.views.time_axis import (
    format_durations,
    format_times,
    unit_for_span,
)

if TYPE_CHECKING:
    from rankscope.analysis.store.reader import Store

#: Default plot width, px; also the pixel count used to decimate.
DEFAULT_WIDTH = 1100
#: At most this many event rectangles per render (the longest are kept).
DEFAULT_MAX_EVENTS = 20_000
#: Vertical padding of a rectangle inside its row (row height is 1).
ROW_PAD = 0.08
#: Longest lane label (characters) before it is shortened.
LABEL_CHARS = 22
#: Event columns the timeline reads.
READ_COLUMNS = ("ts", "dur", "name", "kind", "lane", "step", "coll")
#: Columns of :func:`timeline_frame` (x0/x1 in ms since ``origin_ns``; y0/y1 in row units;
#: start_us/dur_us numbers, start/duration the hover's text).
FRAME_COLUMNS = (
    "x0",
    "y0",
    "x1",
    "y1",
    "name",
    "rank",
    "lane_name",
    "kind_name",
    "start_us",
    "dur_us",
    "start",
    "duration",
    "step",
)
#: Columns of the events :func:`timeline_frame` leaves out (the lane coverage's input; ns).
LEFT_OUT_COLUMNS = ("rank", "lane", "ts", "dur", "kind")
NS_PER_MS = 1_000_000
NS_PER_US = 1_000
#: ``Row.lane`` of a rank's memory lane (not a lane of ``Store.lanes``).
MEMORY_LANE = -1


@dataclass(frozen=True)
class Row:
    """One timeline row: a lane of a rank."""

    rank: int
    """Rank of the row."""
    lane: int
    """Lane id within the rank (``Store.lanes(rank)`` row)."""
    label: str
    """Y-axis label ("r2 python3")."""


@dataclass(frozen=True)
class Extent:
    """What the whole timeline spans, on the aligned clock."""

    start_ns: int
    """Earliest event start, ns (the x-axis origin)."""
    end_ns: int
    """Latest event end, ns."""


def lane_label(rank: int, kind: int, name: str) -> str:
    """Short y label: ``r0 python3`` for a thread (the part in parentheses), ``r0 stream 7``."""
    import re

    text = str(name)
    names = re.findall(r"\(([^()]*)\)", text) if int(kind) == LaneKind.THREAD else []
    if names:
        text = "/".join(dict.fromkeys(names))
    elif text.startswith("thread "):
        text = text[len("thread ") :]
    if len(text) > LABEL_CHARS:
        text = text[: LABEL_CHARS - 1] + "…"
    return f"r{rank} {text}"


def timeline_rows(store: Store, ranks: Sequence[int] | None = None) -> list[Row]:
    """One row per (rank, lane) of ``ranks`` (all ranks when None), rank then lane order.

    Two threads of a rank with the same name (two ``python3`` threads) get their tid appended.
    """
    from collections import Counter

    rows = []
    for rank in ranks if ranks is not None else store.ranks:
        lanes = store.lanes(rank)
        labels = [
            lane_label(int(rank), int(kind), str(name))
            for kind, name in zip(lanes["kind"], lanes["name"], strict=True)
        ]
        seen = Counter(labels)
        for lane, label, tid in zip(lanes["lane"], labels, lanes["tid"], strict=True):
            text = f"{label} [{tid}]" if seen[label] > 1 else label
            rows.append(Row(int(rank), int(lane), text))
        if int(store.rank_meta(rank).get("memory_events", 0) or 0) > 0:
            rows.append(Row(int(rank), MEMORY_LANE, f"r{rank} memory"))
    return rows


def memory_paths(
    store: Store,
    rows: Sequence[Row],
    window: tuple[int, int],
    origin_ns: int,
    width: int = DEFAULT_WIDTH,
) -> tuple[list[Any], list[Any]]:
    """(allocated, reserved) curves of the memory lanes in ``rows`` over ``window``: one
    ``(x ms, y row units)`` array pair per (rank, device), each scaled to the rank's highest
    value to fill its row; the last event before the window starts the curve (the counter
    holds). More than ``2 * width`` points become each pixel's minimum and maximum, in time
    order (every peak stays visible)."""
    allocated: list[Any] = []
    reserved: list[Any] = []
    for i, row in enumerate(rows):
        if row.lane != MEMORY_LANE:
            continue
        mem = store.memory(row.rank)
        if not len(mem):
            continue
        scale = float(max(mem["total_allocated"].max(), mem["total_reserved"].max(), 1))
        for _, d in mem.groupby(["device_type", "device_id"], sort=True):
            ts = d["ts"].to_numpy(np.int64)
            lo = max(int(np.searchsorted(ts, window[0], side="right")) - 1, 0)
            hi = int(np.searchsorted(ts, window[1], side="left"))
            if hi <= lo:
                continue
            sel = d.iloc[lo:hi]
            x = (sel["ts"].to_numpy(np.int64) - origin_ns) / NS_PER_MS
            for col, out in (("total_allocated", allocated), ("total_reserved", reserved)):
                v = sel[col].to_numpy(np.float64)
                idx = _pixel_extremes(x, v, 2 * width)
                y = i + 1 - ROW_PAD - v[idx] / scale * (1 - 2 * ROW_PAD)
                out.append((x[idx], y))
    return allocated, reserved


def _pixel_extremes(x: Any, v: Any, pixels: int) -> Any:
    """Indices of the minimum and maximum of ``v`` in each of ``pixels`` x bins, time order
    (all indices when there are no more points than that)."""
    if len(x) <= pixels:
        return np.arange(len(x))
    span = max(float(x[-1] - x[0]), 1e-12)
    b = np.minimum(((x - x[0]) / span * pixels).astype(np.int64), pixels - 1)
    order = np.lexsort((v, b))  # by bin, then value: first of a bin is its min, last its max
    starts = np.flatnonzero(np.r_[True, b[order][1:] != b[order][:-1]])
    ends = np.r_[starts[1:], len(order)] - 1
    return np.unique(np.r_[order[starts], order[ends], 0, len(x) - 1])


def store_extent(store: Store, ranks: Sequence[int] | None = None) -> Extent:
    """First event start and last event end (ns) over ``ranks``."""
    starts, ends = [], []
    for rank in ranks if ranks is not None else store.ranks:
        ev = store.events(rank, columns=["ts", "dur"])
        if len(ev):
            starts.append(int(ev["ts"].iloc[0]))
            ends.append(int((ev["ts"] + ev["dur"]).max()))
    if not starts:
        return Extent(0, 1)
    return Extent(min(starts), max(max(ends), min(starts) + 1))


def ms_window(origin_ns: int, x0_ms: float, x1_ms: float) -> tuple[int, int]:
    """The aligned-ns window of an x range (ms since ``origin_ns``, either order); the end is
    one ns past the last instant so that the range's own end is inside."""
    lo, hi = sorted((x0_ms, x1_ms))
    return origin_ns + int(lo * NS_PER_MS), origin_ns + int(hi * NS_PER_MS) + 1


def present_kinds(store: Store, ranks: Sequence[int] | None = None) -> list[EventKind]:
    """The event kinds ``ranks`` (all when None) have, in ``EventKind`` order."""
    present: set[int] = set()
    for rank in ranks if ranks is not None else store.ranks:
        present.update(int(k) for k in set(store.events(rank, columns=["kind"])["kind"]))
    return [k for k in EventKind if int(k) in present]


def step_window(store: Store, first: int, last: int | None = None) -> tuple[int, int]:
    """``(start_ns, end_ns)`` covering ProfilerSteps ``first``..``last`` on every rank.

    Raises ``KeyError`` naming the steps the store has when none of them is present.
    """
    last = first if last is None else last
    steps = store.steps()
    sel = steps[(steps["step"] >= first) & (steps["step"] <= last)]
    if len(sel) == 0:
        have = sorted({int(s) for s in steps["step"]})
        raise KeyError(f"steps {first}..{last} are not in the store (steps: {have})")
    return int(sel["start"].min()), int(sel["end"].max())


def timeline_frame(
    store: Store,
    window: tuple[int, int],
    *,
    origin_ns: int,
    ranks: Sequence[int] | None = None,
    kinds: Sequence[EventKind] | None = None,
    min_dur_ns: int = 0,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The events overlapping ``window`` (ns): the rectangles drawn one by one, and the rest.

    Events shorter than ``min_dur_ns`` are left out (sub-pixel at the current zoom), then all but
    the ``max_events`` longest. Drawn rows are ordered longest first so short events draw on top
    of the ranges that contain them; columns: :data:`FRAME_COLUMNS` plus ``kind`` (int) and
    ``coll``. The events left out (:data:`LEFT_OUT_COLUMNS`, ns) are for the lane coverage
    (:func:`rankscope.analysis.views.lane_coverage.lane_coverage`): drawn + left out = every event of
    ``ranks`` and ``kinds`` in the window, none twice.
    """
    rows = timeline_rows(store, ranks)
    row_of = {(r.rank, r.lane): i for i, r in enumerate(rows)}
    label_of = {(r.rank, r.lane): r.label.split(" ", 1)[1] for r in rows}
    wanted = None if kinds is None else np.array([int(k) for k in kinds], dtype=np.int8)
    parts = []
    out: list[pd.DataFrame] = []
    for rank in sorted({r.rank for r in rows}):
        ev = store.events(rank, columns=list(READ_COLUMNS), window=window)
        if wanted is not None:
            ev = ev[np.isin(ev["kind"].to_numpy(), wanted)]
        keep = ev["dur"].to_numpy() >= min_dur_ns
        if not keep.all():
            out.append(_left_out(ev[~keep], rank))
        ev = ev[keep]
        if len(ev) == 0:
            continue
        y = np.array([row_of[(rank, int(lane))] for lane in ev["lane"]], dtype=np.float64)
        parts.append(
            pd.DataFrame(
                {
                    "x0": (ev["ts"].to_numpy() - origin_ns) / NS_PER_MS,
                    "y0": y + ROW_PAD,
                    "x1": (ev["ts"].to_numpy() + ev["dur"].to_numpy() - origin_ns) / NS_PER_MS,
                    "y1": y + 1 - ROW_PAD,
                    "name": text_values(ev["name"]),
                    "rank": rank,
                    "lane_name": [label_of[(rank, int(lane))] for lane in ev["lane"]],
                    "kind_name": [EventKind(int(k)).name.lower() for k in ev["kind"]],
                    "start_us": (ev["ts"].to_numpy() - origin_ns) / NS_PER_US,
                    "dur_us": ev["dur"].to_numpy() / NS_PER_US,
                    "step": ev["step"].to_numpy(),
                    "kind": ev["kind"].to_numpy(),
                    "coll": ev["coll"].to_numpy(),
                    "lane": ev["lane"].to_numpy(),
                    "ts": ev["ts"].to_numpy(),
                    "dur": ev["dur"].to_numpy(),
                }
            )
        )
    if not parts:
        frame = pd.DataFrame({c: [] for c in (*FRAME_COLUMNS, "kind", "coll")})
        return frame, _concat_left_out(out)
    frame = pd.concat(parts, ignore_index=True)
    frame = frame.sort_values("dur", ascending=False, kind="stable")
    if len(frame) > max_events:
        over = frame.iloc[max_events:]
        out.append(over[list(LEFT_OUT_COLUMNS)])
        frame = frame.iloc[:max_events]
    unit = unit_for_span(window[1] - window[0])
    frame["start"] = format_times(frame["ts"].to_numpy() - origin_ns, unit)
    frame["duration"] = format_durations(frame["dur"].to_numpy())
    frame = frame[[*FRAME_COLUMNS, "kind", "coll"]]
    return frame.reset_index(drop=True), _concat_left_out(out)


def _left_out(ev: pd.DataFrame, rank: int) -> pd.DataFrame:
    """``ev`` (store events of ``rank``) as :data:`LEFT_OUT_COLUMNS`."""
    return pd.DataFrame(
        {
            "rank": rank,
            "lane": ev["lane"].to_numpy(),
            "ts": ev["ts"].to_numpy(),
            "dur": ev["dur"].to_numpy(),
            "kind": ev["kind"].to_numpy(),
        }
    )


def _concat_left_out(parts: list[pd.DataFrame]) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame({c: pd.Series([], dtype="int64") for c in LEFT_OUT_COLUMNS})
    return pd.concat(parts, ignore_index=True)


def collective_frame(
    waits: pd.DataFrame,
    store: Store,
    rows: Sequence[Row],
    window: tuple[int, int],
    origin_ns: int,
    *,
    min_dur_ns: int = 0,
) -> pd.DataFrame:
    """Wait and transfer rectangles of the collectives overlapping ``window`` on ``rows``.

    One row per (collective, rank, part) with ``part`` "wait" or "transfer"; each sits on the lane
    of the rank's collective event. Times from ``waits`` (collectives.WAIT_COLUMNS, ns); a
    collective shorter than ``min_dur_ns`` from arrival to end on every rank is left out (its
    kernels are in the lane coverage); one longer on some rank is kept on all, so the last rank's
    marker stays beside the others' waits. Hover text: ``start`` in the unit that fits the window, ``duration``,
    ``wait``, ``transfer`` each in its own.
    """
    row_of = {(r.rank, r.lane): i for i, r in enumerate(rows)}
    ranks = sorted({r.rank for r in rows})
    unit = unit_for_span(window[1] - window[0])
    longest = (waits["end"] - waits["arrival"]).groupby(waits["coll"]).transform("max")
    w = waits[
        waits["rank"].isin(ranks)
        & (waits["arrival"] < window[1])
        & (waits["end"] > window[0])
        & (longest >= min_dur_ns)
    ]
    colls = store.collectives()
    event_of = colls.set_index(["coll", "rank"])["event"]
    out = []
    for rank, group in w.groupby("rank", sort=True):
        lanes = store.events(int(rank), columns=["lane"])["lane"].to_numpy()
        events = event_of.reindex(list(zip(group["coll"], group["rank"], strict=True))).to_numpy()
        ok = (events >= 0) & (events < len(lanes))
        g = group[ok]
        lane = lanes[events[ok].astype(np.int64)]
        y = np.array([row_of.get((int(rank), int(ln)), -1) for ln in lane], dtype=np.float64)
        g, y = g[y >= 0], y[y >= 0]
        if len(g) == 0:
            continue
        split = g["arrival"].to_numpy() + g["wait_ns"].to_numpy()
        for part, a, b in (
            ("wait", g["arrival"].to_numpy(), split),
            ("transfer", split, g["end"].to_numpy()),
        ):
            out.append(
                pd.DataFrame(
                    {
                        "x0": (a - origin_ns) / NS_PER_MS,
                        "y0": y + ROW_PAD,
                        "x1": (b - origin_ns) / NS_PER_MS,
                        "y1": y + 1 - ROW_PAD,
                        "name": g["op"].astype(str).to_numpy(),
                        "rank": int(rank),
                        "coll": g["coll"].to_numpy(),
                        "part": part,
                        "start_us": (g["arrival"].to_numpy() - origin_ns) / NS_PER_US,
                        "dur_us": g["dur_ns"].to_numpy() / NS_PER_US,
                        "wait_us": g["wait_ns"].to_numpy() / NS_PER_US,
                        "transfer_us": g["transfer_ns"].to_numpy() / NS_PER_US,
                        "start": format_times(g["arrival"].to_numpy() - origin_ns, unit),
                        "duration": format_durations(g["dur_ns"].to_numpy()),
                        "wait": format_durations(g["wait_ns"].to_numpy()),
                        "transfer": format_durations(g["transfer_ns"].to_numpy()),
                        "last_rank": g["last_rank"].to_numpy(),
                        "is_last": g["is_last"].to_numpy(),
                    }
                )
            )
    cols = [
        *("x0", "y0", "x1", "y1", "name", "rank", "coll", "part", "start_us", "dur_us"),
        *("wait_us", "transfer_us", "start", "duration", "wait", "transfer"),
        *("last_rank", "is_last"),
    ]
    if not out:
        return pd.DataFrame({c: [] for c in cols})
    return pd.concat(out, ignore_index=True)[cols]
