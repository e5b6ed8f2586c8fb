"""The cross-rank timeline: one row per (rank, lane), one rectangle per event (HoloViews/Bokeh).

Used inline in Jupyter (``rankscope.analysis.timeline(store)``) and by the Panel app
(``rankscope view``). Rectangles are coloured by :class:`~rankscope.analysis.schema.EventKind`;
every collective is redrawn on top split in two: the part spent *waiting* for the last rank
(red) and the *transfer* part (cyan), from :func:`rankscope.analysis.collectives.collective_waits`.
The rank that arrived last at a collective gets a triangle at its arrival, and straggler ranks
(when an :class:`~rankscope.analysis.pipeline.Analysis` is given) get a shaded row and a label.

Scaling without datashader: the plot is a ``DynamicMap`` driven by the x range. On every zoom it
reads only the events overlapping the visible window (``Store.events(window=...)``) and drops the
ones shorter than half a pixel (``window / (2 * width)``), keeping at most ``max_events`` (the longest),
so a wide view of a long run draws a few thousand rectangles and a zoomed view shows everything.

With memory events (``--profile-memory``) each rank gets one more row, its memory lane: the
allocator's allocated (solid) and reserved (dashed) bytes over time as curves, scaled to the
rank's own highest value (hover the row label for it), aggregated per pixel to its minimum and
maximum so no peak disappears in a wide view.

Units: the x axis is **milliseconds since the run's first event** (float64 cannot hold epoch
nanoseconds exactly; Bokeh works in float64); hover shows start and duration in **µs**. Store
times are int64 ns on the aligned clock.

Why one module of ~660 lines: the per-pixel data reduction and the HoloViews elements built from
it change together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rankscope.analysis.schema import EventKind, LaneKind

if TYPE_CHECKING:
    import holoviews as hv
    import pandas as pd
    from rankscope.analysis.pipeline import Analysis
    from rankscope.analysis.store import Store

#: Colour of each event kind (Tableau-like, readable on white).
KIND_COLORS: dict[EventKind, str] = {
    EventKind.CPU_OP: "#4C78A8",
    EventKind.USER_ANNOTATION: "#B279A2",
    EventKind.PROFILER_STEP: "#D9D4CF",
    EventKind.KERNEL_COMPUTE: "#54A24B",
    EventKind.KERNEL_COMM: "#F58518",
    EventKind.MEMCPY: "#72B7B2",
    EventKind.MEMSET: "#9D755D",
    EventKind.SYNC: "#FF9DA6",
    EventKind.RUNTIME: "#EECA3B",
    EventKind.COMM_CPU: "#F58518",
    EventKind.COMM_ENQUEUE: "#FFBF79",
    EventKind.PYTHON: "#D6A5C9",
    EventKind.OTHER: "#BBBBBB",
}
#: Colour of the wait part of a collective (waiting for the last rank to arrive).
WAIT_COLOR = "#D62728"
#: Colour of the transfer part of a collective (all ranks present, data moving).
TRANSFER_COLOR = "#17BECF"
#: Marker colour of the last rank to arrive at a collective.
LAST_COLOR = "#7F0000"
#: Background of a straggler rank's rows.
STRAGGLER_SHADE = "#FBE3E3"
#: Default plot width, px; also the pixel count used to decimate.
DEFAULT_WIDTH = 1100
#: Height of one (rank, lane) row, px.
ROW_PX = 26
#: At most this many event rectangles per render (the longest are kept).
DEFAULT_MAX_EVENTS = 20_000
#: Vertical padding of a rectangle inside its row (row height is 1).
ROW_PAD = 0.08
#: Longest lane label (characters) before it is shortened.
LABEL_CHARS = 22
#: Event columns the timeline reads.
READ_COLUMNS = ("ts", "dur", "name", "kind", "lane", "step", "coll")
#: Columns of :func:`timeline_frame` (x0/x1 in ms since ``origin_ns``; y0/y1 in row units).
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
    "step",
)
NS_PER_MS = 1_000_000
NS_PER_US = 1_000
#: X label of the default axis (origin: the first event of the ranks shown).
XLABEL_FIRST_EVENT = "time since the first event (ms, aligned clock)"
#: X label when the origin is the run's first profiled step (the app, next to the overview).
XLABEL_FIRST_STEP = "time since the first profiled step (ms, aligned clock)"
#: ``Row.lane`` of a rank's memory lane (not a lane of ``Store.lanes``).
MEMORY_LANE = -1
#: Colours of the memory curves.
ALLOCATED_COLOR = "#2E86C1"
RESERVED_COLOR = "#7F8C8D"


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
    import numpy as np

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
    import numpy as np

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
) -> tuple[pd.DataFrame, int]:
    """Rectangles of the events overlapping ``window`` (ns), and how many were left out.

    Events shorter than ``min_dur_ns`` are left out (sub-pixel at the current zoom), then all but
    the ``max_events`` longest. Rows are ordered longest first so short events draw on top of the
    ranges that contain them. Columns: :data:`FRAME_COLUMNS` plus ``kind`` (int) and ``coll``.
    """
    import numpy as np
    import pandas as pd

    rows = timeline_rows(store, ranks)
    row_of = {(r.rank, r.lane): i for i, r in enumerate(rows)}
    label_of = {(r.rank, r.lane): r.label.split(" ", 1)[1] for r in rows}
    wanted = None if kinds is None else np.array([int(k) for k in kinds], dtype=np.int8)
    parts = []
    hidden = 0
    for rank in sorted({r.rank for r in rows}):
        ev = store.events(rank, columns=list(READ_COLUMNS), window=window)
        if wanted is not None:
            ev = ev[np.isin(ev["kind"].to_numpy(), wanted)]
        keep = ev["dur"].to_numpy() >= min_dur_ns
        hidden += int((~keep).sum())
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
                    "name": ev["name"].astype(str).to_numpy(),
                    "rank": rank,
                    "lane_name": [label_of[(rank, int(lane))] for lane in ev["lane"]],
                    "kind_name": [EventKind(int(k)).name.lower() for k in ev["kind"]],
                    "start_us": (ev["ts"].to_numpy() - origin_ns) / NS_PER_US,
                    "dur_us": ev["dur"].to_numpy() / NS_PER_US,
                    "step": ev["step"].to_numpy(),
                    "kind": ev["kind"].to_numpy(),
                    "coll": ev["coll"].to_numpy(),
                }
            )
        )
    if not parts:
        return pd.DataFrame({c: [] for c in (*FRAME_COLUMNS, "kind", "coll")}), hidden
    frame = pd.concat(parts, ignore_index=True)
    frame["_dur"] = frame["x1"] - frame["x0"]
    frame = frame.sort_values("_dur", ascending=False, kind="stable")
    if len(frame) > max_events:
        hidden += len(frame) - max_events
        frame = frame.iloc[:max_events]
    return frame.drop(columns="_dur").reset_index(drop=True), hidden


def collective_frame(
    waits: pd.DataFrame,
    store: Store,
    rows: Sequence[Row],
    window: tuple[int, int],
    origin_ns: int,
) -> pd.DataFrame:
    """Wait and transfer rectangles of the collectives overlapping ``window`` on ``rows``.

    One row per (collective, rank, part) with ``part`` "wait" or "transfer"; each sits on the lane
    of the rank's collective event. Times from ``waits`` (collectives.WAIT_COLUMNS, ns).
    """
    import numpy as np
    import pandas as pd

    row_of = {(r.rank, r.lane): i for i, r in enumerate(rows)}
    ranks = sorted({r.rank for r in rows})
    w = waits[
        waits["rank"].isin(ranks) & (waits["arrival"] < window[1]) & (waits["end"] > window[0])
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
                        "last_rank": g["last_rank"].to_numpy(),
                        "is_last": g["is_last"].to_numpy(),
                    }
                )
            )
    cols = [
        *("x0", "y0", "x1", "y1", "name", "rank", "coll", "part", "start_us", "dur_us"),
        *("wait_us", "transfer_us", "last_rank", "is_last"),
    ]
    if not out:
        return pd.DataFrame({c: [] for c in cols})
    return pd.concat(out, ignore_index=True)[cols]


def _event_tooltips() -> list[tuple[str, str]]:
    return [
        ("name", "@name"),
        ("rank", "@rank"),
        ("lane", "@lane_name"),
        ("kind", "@kind_name"),
        ("step", "@step"),
        ("start (µs)", "@start_us{0,0.000}"),
        ("duration (µs)", "@dur_us{0,0.000}"),
    ]


def _coll_tooltips() -> list[tuple[str, str]]:
    return [
        ("collective", "@name #@coll"),
        ("rank", "@rank"),
        ("part", "@part"),
        ("start (µs)", "@start_us{0,0.000}"),
        ("duration (µs)", "@dur_us{0,0.000}"),
        ("wait (µs)", "@wait_us{0,0.000}"),
        ("transfer (µs)", "@transfer_us{0,0.000}"),
        ("last to arrive", "rank @last_rank"),
    ]


def timeline_overlay(
    store: Store,
    window: tuple[int, int],
    *,
    origin_ns: int,
    ranks: Sequence[int] | None = None,
    kinds: Sequence[EventKind] | None = None,
    waits: pd.DataFrame | None = None,
    stragglers: Sequence[int] = (),
    width: int = DEFAULT_WIDTH,
    max_events: int = DEFAULT_MAX_EVENTS,
    with_collectives: bool = True,
    xlabel: str = XLABEL_FIRST_EVENT,
) -> hv.Overlay:
    """The timeline of ``window`` (ns) as a static HoloViews Overlay.

    Layers, bottom to top: straggler row shading (when ``stragglers``), one ``Rectangles`` per
    kind of ``kinds`` (default: the kinds in the window; the DynamicMap passes a fixed list so the
    overlay keeps its shape across zooms, empty layers included), and unless
    ``with_collectives`` is False: collective wait, collective transfer, last-arrival triangles.
    Events shorter than half a pixel (``(end - start) / (2 * width)`` ns) are left out; the
    title says how many.
    """
    import holoviews as hv

    use_bokeh()
    rows = timeline_rows(store, ranks)
    min_dur = max(0, (window[1] - window[0]) // max(2 * width, 1))  # half a pixel
    frame, hidden = timeline_frame(
        store,
        window,
        origin_ns=origin_ns,
        ranks=ranks,
        kinds=kinds,
        min_dur_ns=min_dur,
        max_events=max_events,
    )
    vdims = ["name", "rank", "lane_name", "kind_name", "start_us", "dur_us", "step"]
    kdims = ["x0", "y0", "x1", "y1"]
    x_lo, x_hi = (window[0] - origin_ns) / NS_PER_MS, (window[1] - origin_ns) / NS_PER_MS
    layers: list[Any] = []
    shade = [(x_lo, i, x_hi, i + 1) for i, r in enumerate(rows) if r.rank in set(stragglers)]
    if stragglers:
        layers.append(
            hv.Rectangles(shade, kdims=kdims, label="straggler rank").opts(
                color=STRAGGLER_SHADE, line_alpha=0, tools=[]
            )
        )
    shown = kinds if kinds is not None else [EventKind(int(k)) for k in set(frame["kind"])]
    for kind in EventKind:
        if kind not in shown:
            continue
        part = frame[frame["kind"] == int(kind)][kdims + vdims] if len(frame) else frame
        layers.append(
            hv.Rectangles(
                part[kdims + vdims] if len(part) else [],
                kdims=kdims,
                vdims=vdims,
                label=kind.name.lower().replace("_", " "),
            ).opts(
                color=KIND_COLORS[kind],
                line_color="white",
                line_width=0.4,
                alpha=0.55 if kind == EventKind.PROFILER_STEP else 0.95,
                tools=[_hover(_event_tooltips())],
            )
        )
    if waits is None:
        from rankscope.analysis.collectives import collective_waits

        waits = collective_waits(store.collectives(), store.clock())
    if any(r.lane == MEMORY_LANE for r in rows):
        allocated, reserved = memory_paths(store, rows, window, origin_ns, width)
        for paths, color, dash, label in (
            (reserved, RESERVED_COLOR, "dashed", "memory reserved"),
            (allocated, ALLOCATED_COLOR, "solid", "memory allocated"),
        ):
            layers.append(
                hv.Path(paths, label=label).opts(
                    color=color, line_width=1.5, line_dash=dash, tools=[]
                )
            )
    coll = collective_frame(waits, store, rows, window, origin_ns)
    if not with_collectives:
        return _finish(layers, rows, stragglers, frame, hidden, width, (x_lo, x_hi), xlabel)
    cvd = ["name", "rank", "coll", "part", "start_us", "dur_us", "wait_us", "transfer_us"]
    cvd.append("last_rank")
    for part, color, label in (
        ("wait", WAIT_COLOR, "collective: wait"),
        ("transfer", TRANSFER_COLOR, "collective: transfer"),
    ):
        sel = coll[coll["part"] == part] if len(coll) else coll
        layers.append(
            hv.Rectangles(
                sel[kdims + cvd] if len(sel) else [], kdims=kdims, vdims=cvd, label=label
            ).opts(
                color=color, line_color="white", line_width=0.4, tools=[_hover(_coll_tooltips())]
            )
        )
    last = coll[(coll["part"] == "wait") & coll["is_last"].astype(bool)] if len(coll) else coll
    layers.append(
        hv.Scatter(
            (last["x0"].to_numpy(), last["y0"].to_numpy() + 0.12) if len(last) else ([], []),
            label="last to arrive",
        ).opts(color=LAST_COLOR, marker="inverted_triangle", size=9, tools=[])
    )
    return _finish(layers, rows, stragglers, frame, hidden, width, (x_lo, x_hi), xlabel)


def _finish(
    layers: list[Any],
    rows: Sequence[Row],
    stragglers: Sequence[int],
    frame: pd.DataFrame,
    hidden: int,
    width: int,
    xlim: tuple[float, float],
    xlabel: str = XLABEL_FIRST_EVENT,
) -> hv.Overlay:
    """The overlay of ``layers`` with the axes, labels and legend of the timeline."""
    import holoviews as hv

    straggling = set(stragglers)
    ticks = [
        (i + 0.5, r.label + ("  ⚑ straggler" if r.rank in straggling else ""))
        for i, r in enumerate(rows)
    ]
    title = f"{len(frame):,} events"
    if hidden:
        title = f"{len(frame):,} of {len(frame) + hidden:,} events drawn (zoom in for the rest)"
    overlay = hv.Overlay(layers).opts(
        backend="bokeh",
        **dict(
            width=width,
            height=max(160, ROW_PX * len(rows) + 110),
            xlabel=xlabel,
            ylabel="",
            yticks=ticks,
            ylim=(0, len(rows)),
            invert_yaxis=True,
            hooks=[x_only_tools],
            xlim=xlim,
            title=title,
            legend_position="bottom",
            legend_cols=4,  # wider would spill past the plot into the findings column
            legend_opts={"label_text_font_size": "9pt", "glyph_width": 14},
            toolbar="above",
            show_grid=False,
            fontsize={"yticks": "8.5pt", "xticks": "9pt", "title": "10pt"},
        ),
    )
    return overlay


def use_bokeh() -> None:
    """Load HoloViews' Bokeh backend (the one the options here are written for).

    Makes it the current backend when the current one is not loaded (plain Python without
    ``hv.extension``, where HoloViews would default to matplotlib), so ``hv.render(obj)`` works;
    in a Jupyter kernel where no extension was loaded yet, loads it (``hv.extension("bokeh")``)
    so ``rankscope.analysis.timeline(store)`` renders inline without further setup.
    """
    import holoviews as hv
    import holoviews.plotting.bokeh  # registers the backend

    if hv.Store.current_backend not in hv.Store.renderers:
        hv.Store.set_current_backend("bokeh")
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if type(shell).__name__ == "ZMQInteractiveShell" and not getattr(hv.extension, "_loaded", True):
        hv.extension("bokeh")  # in Jupyter: load BokehJS once so the timeline renders inline


def x_only_tools(plot: Any, element: Any) -> None:
    """Bokeh hook: pan, wheel and box zoom act on time only (rows stay put), wheel zoom active."""
    from bokeh.models import BoxZoomTool, PanTool, WheelZoomTool

    fig = plot.state
    for tool in fig.tools:
        if isinstance(tool, PanTool | WheelZoomTool | BoxZoomTool):
            tool.dimensions = "width"
    wheel = [t for t in fig.tools if isinstance(t, WheelZoomTool)]
    if wheel:
        fig.toolbar.active_scroll = wheel[0]


def _hover(tooltips: list[tuple[str, str]]) -> Any:
    from bokeh.models import HoverTool

    return HoverTool(tooltips=tooltips)


def timeline(
    store: Store | str | Path,
    *,
    ranks: Sequence[int] | None = None,
    kinds: Sequence[EventKind] | None = None,
    window: tuple[int, int] | None = None,
    steps: tuple[int, int] | None = None,
    analysis: Analysis | None = None,
    width: int = DEFAULT_WIDTH,
    max_events: int = DEFAULT_MAX_EVENTS,
    origin_ns: int | None = None,
) -> hv.DynamicMap:
    """The cross-rank timeline of ``store`` (a Store, a ``trace.h5`` or a run directory).

    A ``DynamicMap`` on a ``RangeX`` stream: each zoom re-reads only the visible events.
    ``window=(start_ns, end_ns)`` (aligned clock) or ``steps=(first, last)`` sets the initial
    view (default: the whole run); ``ranks``/``kinds`` filter; ``analysis`` (from
    :func:`rankscope.analysis.analyze`) supplies the collective waits and marks its stragglers
    (without it the waits are computed from the store and no rank is marked as straggler).
    ``origin_ns``: the aligned ns of x = 0 (default: the first event of ``ranks``; the app passes
    the run's first profiled step, the overview's origin). Renders inline in Jupyter (loads HoloViews' Bokeh extension when none is loaded).
    """
    import holoviews as hv

    use_bokeh()
    if not hasattr(store, "events"):
        from rankscope.analysis.store import open_store

        store = open_store(cast("str | Path", store))
    store = cast("Store", store)
    extent = store_extent(store, ranks)
    if steps is not None:
        window = step_window(store, steps[0], steps[1])
    start, end = window if window is not None else (extent.start_ns, extent.end_ns)
    if end <= start:
        raise ValueError(f"empty window: end {end} ns <= start {start} ns")
    if analysis is not None:
        waits = analysis.waits
        strag = analysis.flagged_ranks()
    else:
        from rankscope.analysis.collectives import collective_waits

        waits = collective_waits(store.collectives(), store.clock())
        strag = []
    origin = extent.start_ns if origin_ns is None else origin_ns
    xlabel = XLABEL_FIRST_EVENT if origin_ns is None else XLABEL_FIRST_STEP
    the_store = store
    if kinds is None:  # the kinds present: a fixed set of layers for every zoom
        kinds = present_kinds(store, ranks)
    with_colls = len(waits) > 0

    def render(x_range: tuple[float, float] | None) -> hv.Overlay:
        if x_range is None or x_range[1] <= x_range[0]:
            win = (start, end)
        else:
            win = ms_window(origin, *x_range)
        return timeline_overlay(
            the_store,
            win,
            origin_ns=origin,
            ranks=ranks,
            kinds=kinds,
            waits=waits,
            stragglers=strag,
            width=width,
            max_events=max_events,
            with_collectives=with_colls,
            xlabel=xlabel,
        )

    return hv.DynamicMap(render, streams=[hv.streams.RangeX()])
