"""Top operators and ``record_function`` ranges, across ranks.

Like ``prof.key_averages().table()``, but one row per name across all ranks, with the spread
between the fastest and the slowest rank — the quick way to see *which* op is slow on *which*
rank. Per-rank statistics (:func:`op_stats`) are a pure function of one rank's events and run in
that rank's Dask task; :func:`across_ranks` combines them. Times are inclusive (an operator's
children count in its time, as in the CPU total column of ``key_averages``), in ns.

Two totals per op and rank: ``total_ns`` sums its calls (rank-time, as ``key_averages`` does), and
``wall_ns`` is the time at least one call was running, inside the profiled steps. They differ when
calls overlap — gloo's ``all_reduce`` of two DDP buckets on two runloop threads, async ranges — and
only ``wall_ns`` is a part of the profiled time (it never exceeds it), so tables rank and show it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankscope.analysis.schema import EventKind

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

#: Event kinds summarised as operators (host ops, kernels, copies, collectives).
OP_KINDS = (
    EventKind.CPU_OP,
    EventKind.KERNEL_COMPUTE,
    EventKind.KERNEL_COMM,
    EventKind.MEMCPY,
    EventKind.MEMSET,
    EventKind.COMM_CPU,
    EventKind.COMM_ENQUEUE,
)
#: Event kinds summarised as user ranges.
ANNOTATION_KINDS = (EventKind.USER_ANNOTATION,)

#: Columns of :func:`op_stats`.
OP_STAT_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "name": "str",
    "kind": "str",  # EventKind name
    "count": "int64",
    "total_ns": "int64",  # summed over calls (rank-time)
    "wall_ns": "int64",  # union of the calls, clipped to the profiled steps
    "max_ns": "int64",
}


def op_stats(
    events: pd.DataFrame,
    rank: int = 0,
    kinds: tuple[EventKind, ...] = OP_KINDS,
    spans: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Count, summed / wall / max duration (ns) per (name, kind) of one rank (``OP_STAT_COLUMNS``).

    ``spans`` (``start``, ``end``): the profiled step windows that ``wall_ns`` is clipped to
    (None: not clipped).
    """
    import numpy as np
    import pandas as pd

    sel = events[np.isin(events["kind"].to_numpy(), [int(k) for k in kinds])]
    if len(sel) == 0:
        return pd.DataFrame(
            {c: pd.Series(dtype=d if d != "str" else object) for c, d in OP_STAT_COLUMNS.items()}
        )
    names = sel["name"].astype(str)
    g = sel.groupby([names, sel["kind"]], sort=False, observed=True)["dur"]
    out = g.agg(count="size", total_ns="sum", max_ns="max").reset_index()
    ts = sel["ts"].to_numpy(np.int64)
    end = ts + sel["dur"].to_numpy(np.int64)
    clip = spans is not None and len(spans) > 0
    lo = hi = np.empty(0, np.int64)
    if spans is not None and clip:
        lo, hi = spans["start"].to_numpy(np.int64), spans["end"].to_numpy(np.int64)
    out["wall_ns"] = _walls(
        g.ngroup().to_numpy(np.int64), ts, end, len(out), lo if clip else None, hi
    )
    out["kind"] = [EventKind(int(k)).name for k in out["kind"]]
    out.insert(0, "rank", rank)
    return out[list(OP_STAT_COLUMNS)].astype(
        {k: v for k, v in OP_STAT_COLUMNS.items() if v != "str"}
    )


def _walls(
    group: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    n_groups: int,
    lo: np.ndarray | None,
    hi: np.ndarray,
) -> np.ndarray:
    """Per group: the union of its calls [ts, end), clipped to the windows [lo, hi) when given (ns).

    Windows are measured one by one and summed (overlapping windows count twice, as in
    :func:`rankscope.analysis.breakdown.paint`). All groups at once when the windows are disjoint
    (profiled steps are), else one :func:`paint` per group.
    """
    import numpy as np
    from rankscope.analysis.breakdown import (
        grouped_unions,
        interval_measure,
        interval_union,
        measure_below,
        paint,
    )

    wall = np.zeros(n_groups, np.int64)
    order = np.argsort(lo, kind="stable") if lo is not None else None
    w_lo = lo[order] if lo is not None and order is not None else None
    w_hi = hi[order] if w_lo is not None and order is not None else None
    disjoint = w_lo is None or (
        w_hi is not None and bool(np.all(w_hi >= w_lo)) and bool(np.all(w_lo[1:] >= w_hi[:-1]))
    )
    unions = grouped_unions(group, ts, end) if disjoint else None
    if unions is not None:
        g, s, e = unions
        if w_lo is None or w_hi is None:
            np.add.at(wall, g, e - s)
        else:
            inside = measure_below(w_lo, w_hi, e) - measure_below(w_lo, w_hi, s)
            np.add.at(wall, g, np.maximum(inside, 0))
        return wall
    for k in range(n_groups):
        idx = np.flatnonzero(group == k)
        iv = interval_union(ts[idx], end[idx])
        if lo is None:
            wall[k] = interval_measure(iv)
        else:
            got = paint({"X": iv}, lambda c: {"x": c["X"]}, lo, hi)
            wall[k] = int(got["x"].sum()) if got else 0
    return wall


def annotation_stats(
    events: pd.DataFrame, rank: int = 0, spans: pd.DataFrame | None = None
) -> pd.DataFrame:
    """:func:`op_stats` for ``record_function`` ranges (user annotations)."""
    return op_stats(events, rank, ANNOTATION_KINDS, spans)


#: Columns of :func:`across_ranks` (times in ns; spread as a fraction of the mean).
ACROSS_COLUMNS = [
    "name",
    "kind",
    "ranks",
    "count_mean",
    "total_mean_ns",  # calls summed, mean over ranks (rank-time)
    "wall_mean_ns",  # time the op ran (its calls' union), mean over ranks
    "wall_min_ns",
    "wall_max_ns",
    "spread",
    "fastest_rank",
    "slowest_rank",
]


def across_ranks(stats: pd.DataFrame, top: int = 20) -> pd.DataFrame:
    """One row per (name, kind) over all ranks, the ``top`` largest mean wall times first.

    ``spread = (max - min) / mean`` of the per-rank wall times: 0 when every rank spends the same.
    """
    import pandas as pd

    if len(stats) == 0:
        return pd.DataFrame(columns=ACROSS_COLUMNS)
    g = stats.groupby(["name", "kind"], sort=False)
    out = g.agg(
        ranks=("rank", "nunique"),
        count_mean=("count", "mean"),
        total_mean_ns=("total_ns", "mean"),
        wall_mean_ns=("wall_ns", "mean"),
        wall_min_ns=("wall_ns", "min"),
        wall_max_ns=("wall_ns", "max"),
    )
    idx_max = stats.loc[g["wall_ns"].idxmax().to_numpy()].set_index(["name", "kind"])["rank"]
    idx_min = stats.loc[g["wall_ns"].idxmin().to_numpy()].set_index(["name", "kind"])["rank"]
    out["slowest_rank"] = idx_max
    out["fastest_rank"] = idx_min
    out["spread"] = (out["wall_max_ns"] - out["wall_min_ns"]) / out["wall_mean_ns"].where(
        out["wall_mean_ns"] > 0
    )
    out = out.fillna({"spread": 0.0}).reset_index()
    out = out.sort_values(["wall_mean_ns", "name"], ascending=[False, True], kind="stable").head(
        top
    )
    return out[ACROSS_COLUMNS].reset_index(drop=True)
