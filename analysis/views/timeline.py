"""The cross-rank timeline: one row per (rank, lane), one rectangle per event (HoloViews/Bokeh).

Used inline in Jupyter (``rankscope.analysis.views.timeline(store)``) and by the Panel app
(``rankscope view``). Rectangles are coloured by :class:`~rankscope.analysis.store.schema.EventKind`;
every collective is redrawn on top split in two: the part spent *waiting* for the last rank
(red) and the *transfer* part (cyan), from :func:`rankscope.analysis.compute.collectives.collective_waits`.
The rank that arrived last at a collective gets a triangle at its arrival, and straggler ranks
(when an :class:`~rankscope.analysis.engine.driver.Analysis` is given) get a shaded row and a label.

Scaling without datashader: the plot is a ``DynamicMap`` driven by the x range. On every zoom it
reads only the events overlapping the visible window (``Store.events(window=...)``) and draws the
ones at least half a pixel long (``window / (2 * width)``), at most ``max_events`` (the longest).
Nothing else is dropped: the events not drawn are aggregated into the **lane coverage**
(:mod:`rankscope.analysis.views.lane_coverage`): per bin of :data:`~rankscope.analysis.views.lane_coverage.BIN_PX`
pixels, a bar as high as the share of the bin the lane was busy with them (their union), stacked
by category (compute, communication, memory, other). A stream busy 97 % of the time is a 97 %
bar in a wide view, and its kernels appear one by one as you zoom in. Collective wait/transfer
parts shorter than half a pixel are left to the coverage too (their kernels' communication).

With memory events (``--profile-memory``) each rank gets one more row, its memory lane: the
allocator's allocated (solid) and reserved (dashed) bytes over time as curves, scaled to the
rank's own highest value (hover the row label for it), aggregated per pixel to its minimum and
maximum so no peak disappears in a wide view.

Units: x values are **ms since an origin** (float64 cannot hold epoch nanoseconds exactly;
Bokeh works in float64), *written* in the unit that fits the visible span (ns … min, h:mm:ss;
:mod:`rankscope.analysis.views.time_axis`), the hover's start times in the same unit and durations in
their own. Store times are int64 ns on the aligned clock. The data (rows, rectangles, coverage)
are pure functions in ``timeline_frames.py`` and ``lane_coverage.py``; this module draws them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rankscope.analysis.store.schema import EventKind
from rankscope.analysis.views.time_axis import time_axis, unit_for_span
from rankscope.analysis.views.timeline_frames import DEFAULT_MAX_EVENTS as DEFAULT_MAX_EVENTS
from rankscope.analysis.views.timeline_frames import DEFAULT_WIDTH as DEFAULT_WIDTH
from rankscope.analysis.views.timeline_frames import FRAME_COLUMNS as FRAME_COLUMNS
from rankscope.analysis.views.timeline_frames import MEMORY_LANE as MEMORY_LANE
from rankscope.analysis.views.timeline_frames import NS_PER_MS as NS_PER_MS
from rankscope.analysis.views.timeline_frames import NS_PER_US as NS_PER_US
from rankscope.analysis.views.timeline_frames import ROW_PAD as ROW_PAD
from rankscope.analysis.views.timeline_frames import Extent as Extent
from rankscope.analysis.views.timeline_frames import Row as Row
from rankscope.analysis.views.timeline_frames import collective_frame as collective_frame
from rankscope.analysis.views.timeline_frames import lane_label as lane_label
from rankscope.analysis.views.timeline_frames import memory_paths as memory_paths
from rankscope.analysis.views.timeline_frames import ms_window as ms_window
from rankscope.analysis.views.timeline_frames import present_kinds as present_kinds
from rankscope.analysis.views.timeline_frames import step_window as step_window
from rankscope.analysis.views.timeline_frames import store_extent as store_extent
from rankscope.analysis.views.timeline_frames import timeline_frame as timeline_frame
from rankscope.analysis.views.timeline_frames import timeline_rows as timeline_rows

if TYPE_CHECKING:
    import holoviews as hv
    import pandas as pd
    from rankscope.analysis.engine.driver import Analysis
    from rankscope.analysis.store.reader import Store
    from rankscope.analysis.views.lane_coverage import LaneCategory

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
#: Height of one (rank, lane) row, px.
ROW_PX = 26
#: X label of the default axis (origin: the first event of the ranks shown).
XLABEL_FIRST_EVENT = "time since the first event (aligned clock)"
#: X label when the origin is the run's first profiled step (the app, next to the overview).
XLABEL_FIRST_STEP = "time since the first profiled step (aligned clock)"
#: Colours of the memory curves.
ALLOCATED_COLOR = "#2E86C1"
RESERVED_COLOR = "#7F8C8D"


def _event_tooltips() -> list[tuple[str, str]]:
    return [
        ("name", "@name"),
        ("rank", "@rank"),
        ("lane", "@lane_name"),
        ("kind", "@kind_name"),
        ("step", "@step"),
        ("start", "@start"),
        ("duration", "@duration"),
    ]


def _coll_tooltips() -> list[tuple[str, str]]:
    return [
        ("collective", "@name #@coll"),
        ("rank", "@rank"),
        ("part", "@part"),
        ("start", "@start"),
        ("duration", "@duration"),
        ("wait", "@wait"),
        ("transfer", "@transfer"),
        ("last to arrive", "rank @last_rank"),
    ]


def _coverage_tooltips() -> list[tuple[str, str]]:
    return [
        ("lane", "@lane_name"),
        ("rank", "@rank"),
        ("bin", "@when"),
        ("busy", "@busy of the bin"),
        ("this colour", "@share"),
        ("events", "@events not drawn one by one"),
    ]


def coverage_label(cat: LaneCategory) -> str:
    """Legend label of a coverage layer ("coverage: compute")."""
    return f"coverage: {cat.name.lower()}"


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
    overlay keeps its shape across zooms, empty layers included), the lane coverage (one layer
    per category of those kinds, :func:`coverage_label`), memory curves, and unless
    ``with_collectives`` is False: collective wait, collective transfer, last-arrival triangles.
    Events shorter than half a pixel (``(end - start) / (2 * width)`` ns) or past ``max_events``
    are not drawn one by one but as coverage per bin of ``BIN_PX`` pixels; the title says how
    many of each.
    """
    import holoviews as hv
    from rankscope.analysis.views.lane_coverage import (
        CATEGORY_COLORS,
        CATEGORY_OF_KIND,
        bin_edges,
        bins_for,
        coverage_rects,
        lane_coverage,
    )

    use_bokeh()
    rows = timeline_rows(store, ranks)
    min_dur = max(0, (window[1] - window[0]) // max(2 * width, 1))  # half a pixel
    frame, left_out = timeline_frame(
        store,
        window,
        origin_ns=origin_ns,
        ranks=ranks,
        kinds=kinds,
        min_dur_ns=min_dur,
        max_events=max_events,
    )
    vdims = ["name", "rank", "lane_name", "kind_name", "start", "duration", "step"]
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
    edges = bin_edges(window, bins_for(window, width))
    unit = unit_for_span(window[1] - window[0])
    row_of = {(r.rank, r.lane): (i, r.label) for i, r in enumerate(rows)}
    bars = coverage_rects(lane_coverage(left_out, edges), row_of, origin_ns, ROW_PAD, unit)
    kinds_in = shown if kinds is not None else [EventKind(int(k)) for k in set(left_out["kind"])]
    cvdims = ["rank", "lane_name", "when", "busy", "share", "events"]
    for cat, bar in bars.items():
        if cat not in {CATEGORY_OF_KIND[k] for k in {*kinds_in, *shown}}:
            continue
        layers.append(
            hv.Rectangles(
                bar[kdims + cvdims] if len(bar) else [],
                kdims=kdims,
                vdims=cvdims,
                label=coverage_label(cat),
            ).opts(
                color=CATEGORY_COLORS[cat],
                line_alpha=0,
                alpha=0.8,
                tools=[_hover(_coverage_tooltips())],
            )
        )
    if waits is None:
        from rankscope.analysis.compute.collectives import collective_waits

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
    status = _status(len(frame), len(left_out), int(edges[1] - edges[0]))
    if not with_collectives:
        return _finish(layers, rows, stragglers, status, width, (x_lo, x_hi), xlabel)
    coll = collective_frame(waits, store, rows, window, origin_ns, min_dur_ns=min_dur)
    cvd = ["name", "rank", "coll", "part", "start", "duration", "wait", "transfer", "last_rank"]
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
    return _finish(layers, rows, stragglers, status, width, (x_lo, x_hi), xlabel)


def _status(drawn: int, left_out: int, bin_ns: int) -> str:
    """The title: how many events are drawn one by one and how many as coverage, per what bin
    ("1,362 of 350,944 events drawn, 349,582 as coverage per 1.2 ms bin")."""
    from rankscope.analysis.views.time_axis import format_short

    if not left_out:
        return f"{drawn:,} events"
    return (
        f"{drawn:,} of {drawn + left_out:,} events drawn, {left_out:,} as coverage per "
        f"{format_short(bin_ns)} bin"
    )


def _finish(
    layers: list[Any],
    rows: Sequence[Row],
    stragglers: Sequence[int],
    title: str,
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
            hooks=[x_only_tools, time_axis],
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
    so ``rankscope.analysis.views.timeline(store)`` renders inline without further setup.
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
    from rankscope.analysis.store.reader import Store

    if not isinstance(store, Store):
        from rankscope.analysis.store.reader import open_store

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
        from rankscope.analysis.compute.collectives import collective_waits

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
