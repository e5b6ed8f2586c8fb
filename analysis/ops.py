"""Top operators and ``record_function`` ranges, across ranks.

Like ``prof.key_averages().table()``, but one row per name across all ranks, with the spread
between the fastest and the slowest rank — the quick way to see *which* op is slow on *which*
rank. Per-rank statistics (:func:`op_stats`) are a pure function of one rank's events and run in
that rank's Dask task; :func:`across_ranks` combines them. Times are inclusive (an operator's
children count in its time, as in the CPU total column of ``key_averages``), in ns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankscope.analysis.schema import EventKind

if TYPE_CHECKING:
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
    "total_ns": "int64",
    "max_ns": "int64",
}


def op_stats(
    events: pd.DataFrame, rank: int = 0, kinds: tuple[EventKind, ...] = OP_KINDS
) -> pd.DataFrame:
    """Count, total and max duration (ns) per (name, kind) of one rank (``OP_STAT_COLUMNS``)."""
    import numpy as np
    import pandas as pd

    sel = events[np.isin(events["kind"].to_numpy(), [int(k) for k in kinds])]
    if len(sel) == 0:
        return pd.DataFrame(
            {c: pd.Series(dtype=d if d != "str" else object) for c, d in OP_STAT_COLUMNS.items()}
        )
    g = sel.groupby([sel["name"].astype(str), sel["kind"]], sort=False, observed=True)["dur"]
    out = g.agg(count="size", total_ns="sum", max_ns="max").reset_index()
    out["kind"] = [EventKind(int(k)).name for k in out["kind"]]
    out.insert(0, "rank", rank)
    return out[list(OP_STAT_COLUMNS)].astype(
        {k: v for k, v in OP_STAT_COLUMNS.items() if v != "str"}
    )


def annotation_stats(events: pd.DataFrame, rank: int = 0) -> pd.DataFrame:
    """:func:`op_stats` for ``record_function`` ranges (user annotations)."""
    return op_stats(events, rank, ANNOTATION_KINDS)


#: Columns of :func:`across_ranks` (times in ns; spread as a fraction of the mean).
ACROSS_COLUMNS = [
    "name",
    "kind",
    "ranks",
    "count_mean",
    "total_mean_ns",
    "total_min_ns",
    "total_max_ns",
    "spread",
    "fastest_rank",
    "slowest_rank",
]


def across_ranks(stats: pd.DataFrame, top: int = 20) -> pd.DataFrame:
    """One row per (name, kind) over all ranks, the ``top`` largest mean totals first.

    ``spread = (max - min) / mean`` of the per-rank totals: 0 when every rank spends the same.
    """
    import pandas as pd

    if len(stats) == 0:
        return pd.DataFrame(columns=ACROSS_COLUMNS)
    g = stats.groupby(["name", "kind"], sort=False)
    out = g.agg(
        ranks=("rank", "nunique"),
        count_mean=("count", "mean"),
        total_mean_ns=("total_ns", "mean"),
        total_min_ns=("total_ns", "min"),
        total_max_ns=("total_ns", "max"),
    )
    idx_max = stats.loc[g["total_ns"].idxmax().to_numpy()].set_index(["name", "kind"])["rank"]
    idx_min = stats.loc[g["total_ns"].idxmin().to_numpy()].set_index(["name", "kind"])["rank"]
    out["slowest_rank"] = idx_max
    out["fastest_rank"] = idx_min
    out["spread"] = (out["total_max_ns"] - out["total_min_ns"]) / out["total_mean_ns"].where(
        out["total_mean_ns"] > 0
    )
    out = out.fillna({"spread": 0.0}).reset_index()
    out = out.sort_values(["total_mean_ns", "name"], ascending=[False, True], kind="stable").head(
        top
    )
    return out[ACROSS_COLUMNS].reset_index(drop=True)
