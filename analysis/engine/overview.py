"""The rank × time overview: for every rank and every time bin, how its time was spent.

At hundreds of ranks a per-lane timeline cannot be read, and a wide view that draws only the
longest events shows a stretch packed with short kernels as empty. The overview instead
*aggregates*: each rank's time is partitioned, instant by instant, into one :class:`Category`
(compute, waiting for other ranks, exposed transfer, input, other GPU work, idle, or not
profiled), and each bin holds the exact nanoseconds of each category inside it. Any coarser view
(a pixel column of the wide view, several ranks in one pixel row) is a *sum* of bins, so every
pixel is the share of its time per category — busy never looks idle, and nothing is dropped.

The partition is the time breakdown's (``breakdown.py``, ``docs/analysis.md``), built from the
same interval sets (:func:`rankscope.analysis.compute.breakdown.rank_sets`), with the exposed
communication split by the rank's *wait* intervals: from its arrival at a collective until the
last rank arrived (``collectives.collective_waits``' ``wait_ns``, measured as an interval). So,
summed over the bins, a rank's compute equals the breakdown's ``compute_ns``, wait + transfer its
``comm_exposed_ns`` (the verdict table apportions that sum by the wall-time ratio instead, so its
two shares can differ slightly), input + idle its idle time (GPU) or input + idle (CPU), and the
profiled categories sum to the profiled total (``total_ns``).

The bins are a global grid (``Grid``: an origin and a width in ns on the aligned clock) sized so
that ranks × bins stays under :data:`MAX_CELLS`; each rank's bins are computed in its analysis
task (``pipeline.rank_task``) and joined here (:func:`assemble`). The views
(:mod:`rankscope.analysis.views.overview_plot`, the HTML report) aggregate them with :func:`raster`.

Units: ns (int64 on the aligned clock for times; float32 ns per cell, exact below 2**24 ns =
16.7 ms per bin and within 6e-8 relative above).

Why one module of ~510 lines: the partition, the grid it is binned on and the aggregation into
pixels are one contract (every pixel sums whole cells) and change together; the drawing is in
``overview_plot.py``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from rankscope.analysis.engine.driver import Analysis, StoreLike
    from rankscope.analysis.engine.scheduler import ClusterSpec


class Category(enum.IntEnum):
    """What a rank was doing at an instant (the overview's partition; index into the cells)."""

    COMPUTE = 0
    """Compute: a compute kernel runs (GPU) or an operator / annotated range (CPU)."""
    WAIT = 1
    """Exposed communication while waiting for a later rank to arrive at the collective."""
    TRANSFER = 2
    """Exposed communication once every rank had arrived (moving bytes)."""
    INPUT = 3
    """Waiting for the DataLoader (GPU: GPU idle while the host is in ``__next__``)."""
    OTHER = 4
    """Other GPU work alone: memcpy/memset, sync events (GPU ranks only)."""
    IDLE = 5
    """Nothing recorded inside a profiled step (host overhead, Python)."""
    UNPROFILED = 6
    """Outside the rank's profiled steps (before, after, between profiler windows)."""


#: Number of categories (the cells' last axis).
N_CATEGORIES = len(Category)
#: Label of each category in legends and tooltips.
CATEGORY_LABELS: dict[Category, str] = {
    Category.COMPUTE: "compute",
    Category.WAIT: "waiting for other ranks",
    Category.TRANSFER: "transfer (exposed comm)",
    Category.INPUT: "input",
    Category.OTHER: "memory / other GPU",
    Category.IDLE: "idle",
    Category.UNPROFILED: "not profiled",
}
#: Colour of each category (a pixel is the share-weighted mix of these). Wait and transfer use
#: the timeline's colours; idle is white so that a busy pixel is as saturated as it is busy.
CATEGORY_COLORS: dict[Category, str] = {
    Category.COMPUTE: "#54A24B",
    Category.WAIT: "#D62728",
    Category.TRANSFER: "#17BECF",
    Category.INPUT: "#9467BD",
    Category.OTHER: "#9D755D",
    Category.IDLE: "#FFFFFF",
    Category.UNPROFILED: "#D0D0D0",
}
#: Ranks × bins kept in memory at most (7 float32 per cell: 112 MB at this budget).
MAX_CELLS = 4_000_000
#: Bins over the run at most (a few ranks: zooming 16× into a 1,000-px view stays exact).
MAX_BINS = 16_384
#: Bins over the run at least, however many ranks.
MIN_BINS = 512


@dataclasses.dataclass(frozen=True)
class Grid:
    """The overview's global bins: bin ``k`` is ``[origin_ns + k·bin_ns, origin_ns + (k+1)·bin_ns)``."""

    origin_ns: int
    """Start of bin 0, ns on the aligned clock (the earliest profiled step start)."""
    bin_ns: int
    """Width of one bin, ns."""


@dataclasses.dataclass
class RankCells:
    """One rank's bins: ``cells[i]`` is bin ``first_bin + i``; float32 ns per :class:`Category`."""

    rank: int
    first_bin: int
    cells: np.ndarray


@dataclasses.dataclass
class Overview:
    """Every rank's bins on one grid (row ``i`` is rank ``ranks[i]``)."""

    grid: Grid
    """The bins."""
    first_bin: int
    """Global index of column 0 of ``cells``."""
    ranks: np.ndarray
    """Rank of each row (int64), in rank order."""
    hosts: list[str]
    """Host of each row."""
    cells: np.ndarray
    """float32 ``[rank row, bin, Category]``: ns of each category in each bin (sums to bin_ns)."""

    @property
    def n_bins(self) -> int:
        """Bins (columns) held."""
        return int(self.cells.shape[1])

    @property
    def start_ns(self) -> int:
        """Start of the first bin, ns aligned."""
        return self.grid.origin_ns + self.first_bin * self.grid.bin_ns

    @property
    def end_ns(self) -> int:
        """End of the last bin, ns aligned."""
        return self.start_ns + self.n_bins * self.grid.bin_ns

    def totals(self) -> pd.DataFrame:
        """Per rank: ns of each category over the whole run (columns: rank, then each label)."""
        sums = self.cells.astype("float64").sum(axis=1)
        out = pd.DataFrame(sums, columns=[c.name.lower() for c in Category])
        out.insert(0, "rank", self.ranks)
        return out


def grid_for(steps: pd.DataFrame, n_ranks: int) -> Grid | None:
    """The bins for a run: its profiled steps' span cut into at most ``MAX_CELLS / n_ranks`` bins
    (clamped to [MIN_BINS, MAX_BINS]); None without steps.

    The span comes from the store's step table (host ``ProfilerStep`` ranges); a GPU rank's steps
    end later (its kernels lag the host), so ranks may add bins past the end (:func:`assemble`).
    """
    if len(steps) == 0:
        return None
    lo, hi = int(steps["start"].min()), int(steps["end"].max())
    bins = max(MIN_BINS, min(MAX_BINS, MAX_CELLS // max(n_ranks, 1)))
    return Grid(origin_ns=lo, bin_ns=max(1, math.ceil(max(hi - lo, 1) / bins)))


def wait_intervals(coll_rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """A rank's waiting time as an interval set: from its arrival at each collective until the
    last rank arrived, within the collective (``coll_rows``: ``start``, ``end``, ``last_start``)."""
    from rankscope.analysis.compute.breakdown import interval_union

    if len(coll_rows) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    start = coll_rows["start"].to_numpy(np.int64)
    end = np.maximum(coll_rows["end"].to_numpy(np.int64), start)
    waited = np.clip(coll_rows["last_start"].to_numpy(np.int64), start, end)
    keep = waited > start
    return interval_union(start[keep], waited[keep])


def _gpu_partition(c: dict[str, np.ndarray]) -> dict[Category, np.ndarray]:
    k, n, m, x, d, w, s = c["K"], c["N"], c["M"], c["X"], c["D"], c["W"], c["S"]
    busy = k | n | m | x
    return {
        Category.COMPUTE: s & k,
        Category.WAIT: s & n & ~k & w,
        Category.TRANSFER: s & n & ~k & ~w,
        Category.INPUT: s & ~busy & d,
        Category.OTHER: s & ~k & ~n & (m | x),
        Category.IDLE: s & ~busy & ~d,
        Category.UNPROFILED: ~s,
    }


def _cpu_partition(c: dict[str, np.ndarray]) -> dict[Category, np.ndarray]:
    o, a, comm, d, w, s = c["O"], c["A"], c["C"], c["D"], c["W"], c["S"]
    exposed = comm & ~o & ~d
    return {
        Category.COMPUTE: s & ((o & ~d) | (a & ~d & ~comm)),
        Category.WAIT: s & exposed & w,
        Category.TRANSFER: s & exposed & ~w,
        Category.INPUT: s & d,
        Category.OTHER: s & False,
        Category.IDLE: s & ~(o | a | d | comm),
        Category.UNPROFILED: ~s,
    }


def rank_cells(
    events: pd.DataFrame,
    lanes: pd.DataFrame,
    coll_rows: pd.DataFrame,
    grid: Grid,
    rank: int = 0,
    painted: tuple[Any, dict[str, Any]] | None = None,
    steps: pd.DataFrame | None = None,
) -> RankCells:
    """One rank's bins (pure; runs in the rank's analysis task).

    Covers the bins its profiled steps touch (``breakdown.step_windows``); ``painted``: the
    ``(device, sets)`` of :func:`rankscope.analysis.compute.breakdown.rank_sets`, and ``steps``
    the rank's ``step_windows``, when the task has them already (each ~1 ms for a small rank).
    """
    from rankscope.analysis.compute import breakdown as bd

    device, sets = painted if painted is not None else bd.rank_sets(events, lanes)
    if steps is None:
        steps = bd.step_windows(events, lanes, device)
    if (steps["step"] >= 0).any():
        steps = steps[steps["step"] >= 0]
    spans = bd.interval_union(steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64))
    if len(spans[0]) == 0:
        return RankCells(rank, 0, np.zeros((0, N_CATEGORIES), np.float32))
    k0 = (int(spans[0].min()) - grid.origin_ns) // grid.bin_ns
    k1 = -((grid.origin_ns - int(spans[1].max())) // grid.bin_ns)  # ceil division
    k1 = max(k1, k0 + 1)
    edges = grid.origin_ns + np.arange(k0, k1 + 1, dtype=np.int64) * grid.bin_ns
    all_sets = {**sets, "S": spans, "W": wait_intervals(coll_rows)}
    partition = _gpu_partition if device is bd.Device.GPU else _cpu_partition
    got = bd.paint(all_sets, partition, edges[:-1], edges[1:])
    cells = np.zeros((k1 - k0, N_CATEGORIES), np.float32)
    for cat, ns in got.items():
        cells[:, int(cat)] = ns
    return RankCells(rank, int(k0), cells)


def assemble(parts: list[RankCells], grid: Grid, hosts: dict[int, str]) -> Overview:
    """Join the ranks' bins on one column range; bins a rank did not cover are not profiled."""
    parts = sorted(parts, key=lambda p: p.rank)
    used = [p for p in parts if len(p.cells)]
    lo = min((p.first_bin for p in used), default=0)
    hi = max((p.first_bin + len(p.cells) for p in used), default=1)
    cells = np.zeros((len(parts), hi - lo, N_CATEGORIES), np.float32)
    cells[:, :, int(Category.UNPROFILED)] = grid.bin_ns
    for row, p in enumerate(parts):
        if len(p.cells):
            a = p.first_bin - lo
            cells[row, a : a + len(p.cells)] = p.cells
    ranks = np.array([p.rank for p in parts], np.int64)
    return Overview(grid, lo, ranks, [str(hosts.get(int(r), "")) for r in ranks], cells)


def _overview_task(path: str, rank: int, coll_rows: pd.DataFrame, grid: Grid) -> RankCells:
    from rankscope.analysis.store.reader import open_store

    with open_store(path) as store:
        events = store.events(rank)
        lanes = store.lanes(rank)
    return rank_cells(events, lanes, coll_rows, grid, rank)


def overview_of(store: StoreLike, spec: ClusterSpec | None = None) -> Overview | None:
    """The overview of a store without the rest of the analysis (``rankscope view
    --no-analysis``, Jupyter); None when the store has no profiled steps."""
    from rankscope.analysis.engine.scheduler import ANALYSIS_RANK_S, ClusterSpec, choose, run_each
    from rankscope.analysis.store.frames import per_rank
    from rankscope.analysis.store.reader import open_store

    spec = spec or ClusterSpec()
    with open_store(Path(store) if isinstance(store, str | os.PathLike) else store.path) as s:
        path, ranks = str(s.path), s.ranks
        colls = s.collectives()
        grid = grid_for(s.steps(), len(ranks))
        hosts = {r: str(s.rank_meta(r).get("host", "")) for r in ranks}
        n_events = sum(int(s.rank_meta(r).get("events", 0)) for r in ranks)
    if grid is None:
        return None
    colls["last_start"] = colls.groupby("coll")["start"].transform("max")
    coll_rows = per_rank(colls, ranks, ["start", "end", "last_start"])
    calls = [(path, r, coll_rows[r], grid) for r in ranks]
    choice = choose(spec, len(ranks), n_events, ANALYSIS_RANK_S)
    spec = dataclasses.replace(spec, scheduler=choice.scheduler)
    return assemble(list(run_each(_overview_task, calls, spec, len(ranks))), grid, hosts)


# -- ordering ---------------------------------------------------------------------------------


class RankOrder(enum.StrEnum):
    """How the overview's rows are sorted."""

    STRAGGLER = "straggler score"
    """Flagged ranks first (most significant first), then by the wait they caused."""
    LATENESS = "lateness"
    """By mean lateness at the collectives (arrived last most often / by most on top)."""
    HOST = "host"
    """By host, then rank: hosts form bands."""
    RANK = "rank"
    """By rank."""


def rank_order(ov: Overview, analysis: Analysis | None, order: RankOrder) -> np.ndarray:
    """Row indices of ``ov`` in the display order (top row first)."""
    ranks = pd.Series(np.arange(len(ov.ranks)), index=ov.ranks)
    by_rank = np.argsort(ov.ranks, kind="stable")
    if order is RankOrder.RANK or (analysis is None and order is not RankOrder.HOST):
        return by_rank
    if order is RankOrder.HOST:
        return np.lexsort((ov.ranks, np.asarray(ov.hosts, dtype=object).astype(str)))
    assert analysis is not None
    if order is RankOrder.LATENESS:
        w = analysis.waits
        late = (
            w[w["n_ranks"] >= 2].groupby("rank")["lateness_ns"].mean()
            if len(w)
            else pd.Series(dtype=float)
        )
        key = ranks.index.map(late).to_numpy(dtype=float)
        key = np.where(np.isnan(key), -np.inf, key)
        return np.lexsort((ov.ranks, -key))
    flagged = analysis.flagged_ranks()
    s = analysis.stragglers
    caused = s.set_index("rank")["wait_caused_s"] if len(s) else pd.Series(dtype=float)
    first = [int(ranks[r]) for r in flagged if r in ranks.index]
    score = ranks.index.map(caused).to_numpy(dtype=float)
    score = np.where(np.isnan(score), -np.inf, score)
    rest = [int(i) for i in np.lexsort((ov.ranks, -score)) if int(i) not in set(first)]
    return np.array(first + rest, np.int64)


# -- aggregation into pixels --------------------------------------------------------------------


#: A flagged rank's row is at least this many pixels tall (magnified when ranks are many), px.
FLAGGED_PX = 12
#: At most this many flagged rows are magnified.
MAX_MAGNIFIED = 16


@dataclasses.dataclass
class RowLayout:
    """Which display rows (indices into the order) each image row shows: ``lo[k]:hi[k]``.

    Groups are consecutive and cover every display row once; a magnified row (a flagged rank
    among many) is repeated over several image rows so that it stays readable at a glance, and
    the rows around it share the remaining image rows (summed, never dropped). The image's y
    axis is in image rows.
    """

    lo: np.ndarray
    hi: np.ndarray

    @property
    def n_rows(self) -> int:
        """Image rows."""
        return len(self.lo)

    @property
    def ranks_per_row(self) -> int:
        """Most display rows (ranks) summed into one image row."""
        return int((self.hi - self.lo).max()) if len(self.lo) else 0

    def rows_between(self, y0: float, y1: float) -> tuple[int, int]:
        """Display rows ``[a, b)`` that image rows ``y0..y1`` (image-row units) show."""
        import math

        lo, hi = sorted((y0, y1))
        a = min(max(0, math.floor(lo)), self.n_rows - 1)
        b = min(self.n_rows, max(math.ceil(hi), a + 1))
        return int(self.lo[a:b].min()), int(self.hi[a:b].max())

    def centre_of(self, row: int) -> float:
        """Y of the middle of display row ``row``'s image rows."""
        k = np.flatnonzero((self.lo <= row) & (self.hi > row))
        return float(k.min() + k.max() + 1) / 2 if len(k) else 0.0

    def first_image_row(self, row: int) -> int:
        """The first image row showing display row ``row``."""
        return int(np.searchsorted(self.hi, row, side="right"))


def flagged_rows(ov: Overview, order: np.ndarray, flagged: list[int]) -> list[int]:
    """Display rows (positions in ``order``) of the ``flagged`` ranks: the rows to magnify."""
    keep = {int(r) for r in flagged}
    return [i for i, rank in enumerate(ov.ranks[order]) if int(rank) in keep]


def row_layout(n: int, height: int, magnify: list[int] | None = None) -> RowLayout:
    """Image rows for ``n`` display rows in ``height`` px; display rows in ``magnify`` (flagged
    ranks) get at least ``FLAGGED_PX`` px each when rows are many (at most ``MAX_MAGNIFIED``)."""
    mag = sorted({int(i) for i in magnify or [] if 0 <= int(i) < n})[:MAX_MAGNIFIED]
    per_row = height / max(n, 1)
    if not mag or per_row >= FLAGGED_PX or len(mag) * FLAGGED_PX >= height // 2:
        edges = _groups(n, height)
        return RowLayout(edges[:-1], edges[1:])
    times = FLAGGED_PX if n > height else int(np.ceil(FLAGGED_PX / per_row))
    # image rows left for the others, shared by each run between magnified rows by its length
    rest = (height if n > height else n) - len(mag) * (times if n > height else 1)
    normal = n - len(mag)
    lo: list[int] = []
    hi: list[int] = []
    start = 0
    for stop in [*mag, n]:
        m = stop - start
        if m > 0:
            k = max(1, round(m * rest / max(normal, 1)))
            g = start + _groups(m, k)
            lo += g[:-1].tolist()
            hi += g[1:].tolist()
        if stop < n:
            lo += [stop] * times
            hi += [stop + 1] * times
        start = stop + 1
    return RowLayout(np.array(lo, np.int64), np.array(hi, np.int64))


@dataclasses.dataclass
class Raster:
    """An overview aggregated to pixels: ``shares[row, column, Category]`` sums to 1 per pixel."""

    shares: np.ndarray
    """float32 ``[image row, pixel column, Category]``: share of the pixel's time per category."""
    x_edges_ns: np.ndarray
    """int64, columns + 1: each column covers ``[x_edges_ns[j], x_edges_ns[j+1])`` (whole bins)."""
    rows: RowLayout
    """Which display rows each image row sums."""
    bins_per_column: float
    """Bins summed into one column on average (below 1: a bin is wider than a pixel)."""

    @property
    def ranks_per_row(self) -> int:
        """Most display rows (ranks) summed into one image row."""
        return self.rows.ranks_per_row


def _groups(n: int, parts: int) -> np.ndarray:
    """Boundaries cutting ``n`` items into ``min(n, parts)`` near-equal consecutive groups."""
    k = max(1, min(n, parts))
    return np.floor(np.arange(k + 1) * (n / k)).astype(np.int64)


def raster(
    ov: Overview,
    order: np.ndarray,
    *,
    window: tuple[int, int] | None = None,
    width: int = 1000,
    height: int = 500,
    rows: RowLayout | None = None,
) -> Raster:
    """Aggregate ``ov`` to at most ``width`` columns and the image rows of ``rows`` (default:
    :func:`row_layout` of ``height`` px, nothing magnified) — pure, no drawing.

    ``window`` (aligned ns) is widened to whole bins; a column sums whole bins (when fewer bins
    than pixels, one bin per column) and an image row sums its display rows of ``order``. Shares
    are the summed ns over the summed time, so each pixel's shares sum to 1.
    """
    layout = rows if rows is not None else row_layout(len(order), height)
    lo, hi = (ov.start_ns, ov.end_ns) if window is None else window
    b = ov.grid.bin_ns
    i0 = max(0, (int(lo) - ov.start_ns) // b)
    i1 = min(ov.n_bins, -((ov.start_ns - int(hi)) // b))
    i1 = max(i1, min(i0 + 1, ov.n_bins))
    i0 = min(i0, max(i1 - 1, 0))
    cols = _groups(i1 - i0, width)
    block = ov.cells[:, i0:i1]  # a view: the columns are summed before the rows are reordered
    summed = np.add.reduceat(block, cols[:-1], axis=1) if block.shape[1] else block
    summed = summed[order]
    if len(order):
        starts = np.unique(layout.lo)  # the groups partition the display rows
        summed = np.add.reduceat(summed, starts, axis=0)[np.searchsorted(starts, layout.lo)]
    total = summed.sum(axis=2, keepdims=True)
    shares = np.divide(summed, total, out=np.zeros_like(summed), where=total > 0)
    edges = ov.start_ns + (i0 + cols) * b
    return Raster(shares.astype(np.float32), edges, layout, (i1 - i0) / max(len(cols) - 1, 1))


def colors_rgb() -> np.ndarray:
    """The category colours as a float ``[Category, 3]`` array in 0..255."""
    return np.array(
        [[int(CATEGORY_COLORS[c][i : i + 2], 16) for i in (1, 3, 5)] for c in Category], float
    )


def to_rgb(r: Raster) -> np.ndarray:
    """uint8 ``[row, column, 3]``: each pixel the share-weighted mix of the category colours."""
    return np.clip(np.rint(r.shares @ colors_rgb()), 0, 255).astype(np.uint8)
