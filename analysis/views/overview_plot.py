"""Drawing the rank × time overview (HoloViews/Bokeh): one RGB image, re-aggregated on zoom.

Each pixel is the share-weighted mix of the category colours of the time it covers
(:func:`rankscope.analysis.engine.overview.raster`: whole bins per column, consecutive ranks per row),
so a stretch packed with short kernels is as green as it is busy, a rank that waits is red where
it waits, and the arrival wave of a collective shows as the red stretches ending together across
ranks — while the late rank's row has none. Rows are sorted by straggler score, lateness, host
or rank (:class:`~rankscope.analysis.engine.overview.RankOrder`); flagged ranks are labelled on the y axis
(``⚑ r5``) and host boundaries are its ticks. Zooming re-aggregates only the visible bins (no
store reads: the bins are in memory), and stays exact down to one bin per pixel; below that a
bin spans several pixels (the title gives the resolution).

The Panel app (``analysis/views/app.py``) adds box selection (ranks × a time span → their per-lane
timeline) and a click read-out (:func:`pixel_text`). Units: x is **ms since the first profiled
step** (``Overview.grid.origin_ns``), the timeline's axis in the app, written in the unit that
fits the visible span (:mod:`rankscope.analysis.views.time_axis`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import numpy as np
from rankscope.analysis.engine.overview import (
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    Category,
    Overview,
    RankOrder,
    Raster,
    RowLayout,
    flagged_rows,
    rank_order,
    raster,
    row_layout,
    to_rgb,
)
from rankscope.analysis.views.timeline import NS_PER_MS, ms_window

if TYPE_CHECKING:
    import holoviews as hv
    from rankscope.analysis.engine.driver import Analysis

#: Default width of the image (the plot's frame), px: the pixel columns aggregated to (a wider
#: raster than its frame would be resampled by the browser, which may drop columns).
DEFAULT_WIDTH = 1000
#: Image height at most, px: more ranks than this share pixel rows (summed, never dropped).
MAX_IMAGE_PX = 512
#: Image height per rank for few ranks, px.
RANK_PX = 14
#: Image height at least, px.
MIN_IMAGE_PX = 120
#: Up to this many ranks every row is labelled on the y axis.
LABEL_ALL_RANKS = 40
#: Host labels at least this many pixels apart on the y axis.
HOST_LABEL_PX = 14
#: Prefix of a flagged rank's y label.
FLAG = "⚑ "


def image_px(n_ranks: int) -> int:
    """Height of the image for ``n_ranks`` rows, px."""
    return max(MIN_IMAGE_PX, min(MAX_IMAGE_PX, RANK_PX * n_ranks))


def layout_for(ov: Overview, order: np.ndarray, flagged: list[int]) -> RowLayout:
    """The image rows of ``order``: flagged ranks magnified when ranks are many."""
    return row_layout(len(order), image_px(len(order)), flagged_rows(ov, order, flagged))


def _yticks(ov: Overview, order: np.ndarray, flagged: list[int], layout: RowLayout) -> list[Any]:
    """Y ticks (image-row units): every rank when few; else flagged ranks, and host boundaries
    (a tick each, labelled at most every ``HOST_LABEL_PX`` px) when the order keeps hosts
    together."""
    ranks = ov.ranks[order]
    n = len(order)
    if n <= LABEL_ALL_RANKS:
        return [
            (layout.centre_of(i), (FLAG if int(r) in flagged else "") + f"r{int(r)}")
            for i, r in enumerate(ranks)
        ]
    ticks: dict[float, str] = {}
    hosts = [ov.hosts[i] for i in order]
    starts = [i for i in range(n) if i == 0 or hosts[i] != hosts[i - 1]]
    if len(starts) < n / 2:  # hosts are bands in this order
        px_per_row = image_px(n) / max(layout.n_rows, 1)
        last_label = -float(HOST_LABEL_PX)
        for i in starts:
            y = float(layout.first_image_row(i))
            label = ""
            if y * px_per_row - last_label >= HOST_LABEL_PX:
                label, last_label = hosts[i], y * px_per_row
            ticks[y] = label
    for i, r in enumerate(ranks):
        if int(r) in flagged:
            ticks[layout.centre_of(i)] = f"{FLAG}r{int(r)}"
    return sorted(ticks.items())


#: Milliseconds without interaction before BokehJS reports a zoom to the server (its default,
#: 500, was most of the 1 s a wheel zoom took to show in the browser; the re-aggregation itself
#: takes 0.06-0.35 s, docs/performance.md).
REPORT_ZOOM_AFTER_MS = 60


def report_zoom_soon(plot: Any, element: Any) -> None:
    """Bokeh hook: report a zoom or pan to the server ``REPORT_ZOOM_AFTER_MS`` after it ends."""
    plot.state.lod_timeout = REPORT_ZOOM_AFTER_MS


def quiet_fixed_sizing() -> None:
    """Silence Bokeh's W-1005 (FIXED_SIZING_MODE): the plot is sized by its frame
    (``frame_width``/``frame_height``, so the image is exactly one raster pixel per screen pixel)
    and Bokeh computes the outer size itself; the check assumes an outer size is given."""
    from bokeh.core.validation import silence
    from bokeh.core.validation.warnings import FIXED_SIZING_MODE

    silence(FIXED_SIZING_MODE, True)


@functools.cache
def _legend() -> list[Any]:
    """One legend entry per category (points at NaN: no mark on the plot); built once, reused by
    every render."""
    import holoviews as hv

    return [
        hv.Points([(float("nan"), float("nan"))], label=CATEGORY_LABELS[c]).opts(
            backend="bokeh",
            color=CATEGORY_COLORS[c],
            marker="square",
            size=10,
            line_color="#999999",
        )
        for c in Category
    ]


def _title(ov: Overview, r: Raster, n: int) -> str:
    from rankscope.analysis.views.time_axis import format_short

    res = (
        f"1 px = {format_short(r.bins_per_column * ov.grid.bin_ns)}"
        if r.bins_per_column >= 1
        else (f"1 bin = {format_short(ov.grid.bin_ns)} (finest)")
    )
    rows = f" × ≤ {r.ranks_per_row} ranks" if r.ranks_per_row > 1 else ""
    return f"{n:,} ranks · each pixel: share of its time · {res}{rows}"


def overview_image(
    ov: Overview,
    order: np.ndarray,
    *,
    window: tuple[int, int] | None = None,
    flagged: list[int] | None = None,
    width: int = DEFAULT_WIDTH,
    origin_ns: int | None = None,
    layout: RowLayout | None = None,
) -> hv.Overlay:
    """One static view: the aggregated image of ``window`` (aligned ns; None: all) with its
    legend, y labels and title. ``layout``: the image rows (:func:`layout_for`) when already
    built (the zoomable plot builds them once)."""
    import holoviews as hv
    from rankscope.analysis.views.time_axis import time_axis
    from rankscope.analysis.views.timeline import XLABEL_FIRST_STEP, use_bokeh, x_only_tools

    use_bokeh()
    quiet_fixed_sizing()
    origin = ov.grid.origin_ns if origin_ns is None else origin_ns
    n = len(order)
    height = image_px(n)
    layout = layout if layout is not None else layout_for(ov, order, flagged or [])
    r = raster(ov, order, window=window, width=width, rows=layout)
    x0 = (int(r.x_edges_ns[0]) - origin) / NS_PER_MS
    x1 = (int(r.x_edges_ns[-1]) - origin) / NS_PER_MS
    rows = layout.n_rows
    # HoloViews puts array row 0 at the top of the bounds; the y axis is inverted (row 0 on top)
    img = hv.RGB(to_rgb(r)[::-1], bounds=(x0, 0, x1, rows), kdims=["time", "row"])
    img = img.opts(
        backend="bokeh",
        tools=["box_select", "tap"],
        active_tools=["box_select", "wheel_zoom", "tap"],
    )
    return hv.Overlay([img, *_legend()]).opts(
        backend="bokeh",
        **dict(
            frame_width=width,
            frame_height=height,
            xlabel=XLABEL_FIRST_STEP,
            ylabel="",
            yticks=_yticks(ov, order, flagged or [], layout),
            ylim=(0, rows),
            xlim=(x0, x1),
            invert_yaxis=True,
            # wheel, pan and box zoom act on time (every rank stays shown), reported soon
            hooks=[x_only_tools, time_axis, report_zoom_soon],
            title=_title(ov, r, n),
            legend_position="bottom",
            legend_cols=4,
            legend_opts={"label_text_font_size": "9pt", "glyph_width": 12},
            toolbar="above",
            show_grid=False,
            fontsize={"yticks": "8pt", "xticks": "9pt", "title": "10pt"},
        ),
    )


@dataclasses.dataclass
class OverviewPlot:
    """The zoomable overview and what a selection on it means."""

    overview: Overview
    order: np.ndarray
    """Row indices of ``overview`` from top to bottom."""
    origin_ns: int
    """Aligned ns of x = 0 ms."""
    dmap: hv.DynamicMap
    """The plot: re-aggregated on every zoom (a ``RangeXY`` stream)."""
    bounds: Any
    """``hv.streams.BoundsXY`` of the box selection (x in ms, y in image rows)."""
    tap: Any
    """``hv.streams.Tap`` of a click (x in ms, y in image rows)."""
    layout: RowLayout
    """The image rows (flagged ranks magnified when ranks are many)."""
    view: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The window (aligned ns, or None: all) and width of the last render."""

    def ranks_between(self, y0: float, y1: float) -> list[int]:
        """Ranks of the rows a selection from ``y0`` to ``y1`` (image rows) touches, top first."""
        a, b = self.layout.rows_between(y0, y1)
        return [int(self.overview.ranks[i]) for i in self.order[a:b]]

    def window_between(self, x0: float, x1: float) -> tuple[int, int]:
        """The aligned-ns window of a selection from ``x0`` to ``x1`` ms."""
        return ms_window(self.origin_ns, x0, x1)


def overview_plot(
    source: Any,
    *,
    analysis: Analysis | None = None,
    order: RankOrder | str = RankOrder.STRAGGLER,
    width: int = DEFAULT_WIDTH,
    origin_ns: int | None = None,
) -> OverviewPlot:
    """The rank × time overview of ``source``: an :class:`~rankscope.analysis.engine.driver.Analysis`
    (its overview, stragglers flagged), an :class:`Overview`, or a store / ``trace.h5`` / run
    directory (computed, nobody flagged). ``.dmap`` renders inline in Jupyter."""
    import holoviews as hv
    from rankscope.analysis.engine.overview import overview_of
    from rankscope.analysis.views.timeline import use_bokeh

    use_bokeh()
    from rankscope.analysis.engine.driver import Analysis

    if isinstance(source, Analysis):
        analysis = analysis or source
        ov = source.overview
    elif isinstance(source, Overview):
        ov = source
    else:
        ov = overview_of(source)
    if ov is None:
        raise ValueError("the store has no profiled steps: nothing to draw an overview of")
    the_order = rank_order(ov, analysis, RankOrder(order))
    flagged = analysis.flagged_ranks() if analysis is not None else []
    origin = ov.grid.origin_ns if origin_ns is None else origin_ns

    view: dict[str, Any] = {"window": None, "width": width}
    layout = layout_for(ov, the_order, flagged)

    def render(x_range: tuple[float, float] | None, y_range: Any = None) -> hv.Overlay:
        window = None
        if x_range is not None and x_range[1] > x_range[0]:
            window = ms_window(origin, *x_range)
        view["window"] = window
        return overview_image(
            ov,
            the_order,
            window=window,
            flagged=flagged,
            width=width,
            origin_ns=origin,
            layout=layout,
        )

    dmap = hv.DynamicMap(render, streams=[hv.streams.RangeXY()])
    bounds = hv.streams.BoundsXY(source=dmap)
    tap = hv.streams.Tap(source=dmap)
    return OverviewPlot(ov, the_order, origin, dmap, bounds, tap, layout, view)


def pixel_text(plot: OverviewPlot, x_ms: float, y: float) -> str:
    """What the overview shows at a click: the rank(s) of that pixel row and the share of each
    category in the pixel's time span (the same aggregation as the image on screen; the span in
    the unit that fits its width)."""
    import math

    from rankscope.analysis.views.time_axis import format_range

    ov, order, layout = plot.overview, plot.order, plot.layout
    k = min(max(math.floor(y), 0), layout.n_rows - 1)
    r = raster(
        ov,
        order,
        window=plot.view.get("window"),
        width=plot.view.get("width", DEFAULT_WIDTH),
        rows=layout,
    )
    t = plot.origin_ns + int(x_ms * NS_PER_MS)
    col = int(np.clip(np.searchsorted(r.x_edges_ns, t, side="right") - 1, 0, len(r.x_edges_ns) - 2))
    a, b = int(layout.lo[k]), int(layout.hi[k])
    ranks = [int(ov.ranks[i]) for i in order[a:b]]
    lo = int(r.x_edges_ns[col]) - plot.origin_ns
    hi = int(r.x_edges_ns[col + 1]) - plot.origin_ns
    who = (
        f"rank {ranks[0]} ({ov.hosts[order[a]]})"
        if len(ranks) == 1
        else ("ranks " + ", ".join(map(str, ranks)) + " (summed)")
    )
    shares = r.shares[k, col]
    parts = [
        f"{CATEGORY_LABELS[c]} {100 * float(shares[int(c)]):.0f} %"
        for c in Category
        if shares[int(c)] >= 0.005
    ]
    return f"**{who}**, {format_range(lo, hi)}: " + ", ".join(parts)
