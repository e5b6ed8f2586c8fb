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

The op table of ``key_averages()`` (:func:`op_table`: self and total CPU time, device time through
correlation ids, input shapes) lives here too. Why one module of ~560 lines: both are the per-op
statistics of one rank and their cross-rank combination, read and rendered together.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from rankscope.analysis.compute import op_nesting
from rankscope.analysis.compute.launch_match import launch_rows
from rankscope.analysis.store.frames import empty, typed
from rankscope.analysis.store.schema import EventKind, text_codes

#: Each event kind's name by its stored code (a dict lookup per row: constructing the enum per
#: row was ~1 ms of a rank's op table, 720 rows).
KIND_NAMES = {int(k): k.name for k in EventKind}
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
    sel = events[np.isin(events["kind"].to_numpy(), [int(k) for k in kinds])]
    if len(sel) == 0:
        return empty(_objects(OP_STAT_COLUMNS))
    code, text = text_codes(sel["name"])
    kind = sel["kind"].to_numpy()
    dur = sel["dur"].to_numpy()
    # pandas' groupby(sort=False) on (name, kind) in numpy: groups numbered in the order of
    # their first row, count / sum / max per group (a pandas groupby, its frame and its
    # reset_index cost more than the rest of the function on a small rank)
    group, first = _first_seen_groups(code, kind.astype(np.int64))
    n = len(first)
    by_group, starts = _group_runs(group, n)
    ts = sel["ts"].to_numpy(np.int64)
    end = ts + dur.astype(np.int64)
    clip = spans is not None and len(spans) > 0
    lo = hi = np.empty(0, np.int64)
    if spans is not None and clip:
        lo, hi = spans["start"].to_numpy(np.int64), spans["end"].to_numpy(np.int64)
    out = pd.DataFrame(
        {
            "rank": np.full(n, rank, np.int64),
            "name": text[code[first]],
            "kind": [KIND_NAMES[k] for k in kind[first].tolist()],
            "count": np.bincount(group, minlength=n).astype(np.int64),
            "total_ns": np.add.reduceat(dur[by_group], starts),
            "wall_ns": _walls(group, ts, end, n, lo if clip else None, hi),
            "max_ns": np.maximum.reduceat(dur[by_group], starts),
        }
    )
    return typed(out, _kept(OP_STAT_COLUMNS))


def _first_seen_groups(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group of each row, first row of each group) of the rows' key tuples (non-negative
    integer arrays of one length), groups numbered in the order of their first row: pandas'
    ``groupby(keys, sort=False).ngroup()``."""
    key = np.asarray(keys[0], np.int64)
    if len(key):
        # one integer per tuple: directly (key * range + more) while the ranges' product stays
        # far below 2**63 (codes into a string table, kinds); else renumbered densely first
        span = int(key.max()) + 1
        for more in keys[1:]:
            width = int(more.max()) + 1
            if span * width >= 2**62:
                key = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)
                span = int(key.max()) + 1
            key = key * width + np.asarray(more, np.int64)
            span *= width
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    renumber = np.empty(len(first), np.int64)
    renumber[order] = np.arange(len(first))
    return renumber[inverse.reshape(-1)], first[order]


def _group_runs(group: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows in group order, each group's first position in that order) of ``n`` groups
    numbered 0..n-1, every one holding a row: what ``np.add.reduceat(values[rows], starts)``
    needs to sum each group."""
    by_group = np.argsort(group, kind="stable")
    return by_group, np.searchsorted(group[by_group], np.arange(n))


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
    :func:`rankscope.analysis.compute.breakdown.paint`). All groups at once when the windows are disjoint
    (profiled steps are), else one :func:`paint` per group.
    """
    from rankscope.analysis.compute.breakdown import (
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


# -- the op table of key_averages() --------------------------------------------------------------

#: Host event kinds that nest on a thread (torch's CPU ``FunctionEvent``s): the op tree's nodes.
HOST_TREE_KINDS = (
    EventKind.CPU_OP,
    EventKind.USER_ANNOTATION,
    EventKind.PROFILER_STEP,
    EventKind.RUNTIME,
    EventKind.COMM_CPU,
    EventKind.COMM_ENQUEUE,
)
#: Device event kinds whose time counts as device time of the op that launched them.
DEVICE_TIME_KINDS = (
    EventKind.KERNEL_COMPUTE,
    EventKind.KERNEL_COMM,
    EventKind.MEMCPY,
    EventKind.MEMSET,
)
#: Names ``key_averages()`` leaves out before it nests events (torch's ``_filter_name``): they are
#: not in the table, and their time stays in their parent's self time, as in torch.
TORCH_FILTERED_NAMES = frozenset(
    {
        "[memory]",
        "[OutOfMemory]",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    }
)

#: Columns of :func:`op_table` (one row per rank and op, or op and input shapes), times in ns.
OP_TABLE_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "name": "str",
    "kind": "str",  # EventKind name
    "shapes": "str",  # str(Input Dims) with group_by_shape (torch's form), else ""
    "count": "int64",
    "self_cpu_ns": "int64",  # duration minus the direct children's on its thread, summed
    "cpu_total_ns": "int64",  # duration (inclusive), summed; 0 for device events
    "self_device_ns": "int64",  # kernels/copies launched while it was the innermost op
    "device_total_ns": "int64",  # kernels/copies launched anywhere inside it
}

#: ``key_averages().table(sort_by=...)`` keys → :data:`OP_TABLE_COLUMNS` columns.
SORT_KEYS: dict[str, str] = {
    "count": "count",
    "self_cpu_time_total": "self_cpu_ns",
    "cpu_time_total": "cpu_total_ns",
    "self_cuda_time_total": "self_device_ns",
    "self_device_time_total": "self_device_ns",
    "cuda_time_total": "device_total_ns",
    "device_time_total": "device_total_ns",
    **{c: c for c in ("self_cpu_ns", "cpu_total_ns", "self_device_ns", "device_total_ns")},
}


def sort_column(sort_by: str) -> str:
    """The :data:`OP_TABLE_COLUMNS` column of a ``key_averages`` sort key (or a column name)."""
    try:
        return SORT_KEYS[sort_by]
    except KeyError:
        raise ValueError(f"unknown sort key {sort_by!r}; known: {sorted(SORT_KEYS)}") from None


def op_tree(
    events: pd.DataFrame, lanes: pd.DataFrame | None = None, *, merge_redispatch: bool = True
) -> pd.DataFrame:
    """Each host event's parent and its self and device times, the way torch nests them.

    Host events (:data:`HOST_TREE_KINDS` on thread lanes, without :data:`TORCH_FILTERED_NAMES`)
    are nested per lane as ``torch.autograd.profiler_util.EventList._populate_cpu_children`` does:
    sorted by (start, -end), a child starts before and ends no later than its parent ends (a
    partial overlap nests nowhere). ``self_cpu_ns`` = duration − the direct children's durations.
    A device event (:data:`DEVICE_TIME_KINDS`) belongs to the runtime call with its correlation id
    and counts in ``self_device_ns`` of the innermost non-runtime event around that call (torch
    links a kernel to the innermost RecordFunction open at its launch), and in
    ``device_total_ns`` of it and of every event around it.

    ``merge_redispatch``: an event that is the only child of one of the same name is dropped and
    its children move up (torch's ``_remove_dup_nodes``; a redispatch such as ``aten::div`` of a
    scalar calling ``aten::div`` of a tensor counts once, as in ``key_averages``); its device
    events count as its parent's own.

    Returns one row per host event: ``row`` (position in ``events``), ``parent`` (position, -1
    none), ``self_cpu_ns``, ``self_device_ns``, ``device_total_ns``; in nesting order (a parent
    before its children).
    """
    kind = events["kind"].to_numpy().astype(np.int64)
    # texts compared once per distinct text, through the codes (np.isin of the rows' strings
    # sorted every row's Python string: most of the op tree on a rank of 50k events)
    code, texts = text_codes(events["name"])
    host = np.isin(kind, [int(k) for k in HOST_TREE_KINDS])
    host &= ~np.isin(texts, list(TORCH_FILTERED_NAMES))[code]
    if "cat" in events.columns:
        cat_code, cat_texts = text_codes(events["cat"])
        host &= (cat_texts != "gpu_user_annotation")[cat_code]
    lane = events["lane"].to_numpy().astype(np.int64)
    if lanes is not None and len(lanes):
        from rankscope.analysis.store.schema import LaneKind

        is_gpu_lane = np.zeros(int(max(lane.max(initial=0), lanes["lane"].max()) + 1), bool)
        gl = lanes["lane"].to_numpy(np.int64)[lanes["kind"].to_numpy() == int(LaneKind.GPU_STREAM)]
        is_gpu_lane[gl] = True
        host &= ~is_gpu_lane[lane]
    rows = np.flatnonzero(host)
    ts = events["ts"].to_numpy(np.int64)
    dur = events["dur"].to_numpy(np.int64)
    end = ts + dur
    order = rows[np.lexsort((-end[rows], ts[rows], lane[rows]))]
    parent = op_nesting.nest(order, lane, ts, end, len(events))
    if merge_redispatch:
        # equal names as equal integers (a text's one id, whichever codes spell it)
        same_text = np.unique(texts, return_inverse=True)[1].reshape(-1)
        order, parent = op_nesting.merge_redispatch(order, parent, same_text[code])
    self_cpu = dur.copy()
    has = order[parent[order] >= 0]
    np.subtract.at(self_cpu, parent[has], dur[has])
    # device time: kernel -> its runtime call (corr) -> innermost non-runtime op around it
    self_dev = np.zeros(len(events), np.int64)
    dev_rows = np.flatnonzero(np.isin(kind, [int(k) for k in DEVICE_TIME_KINDS]))
    launch = launches(events, dev_rows, runtime=rows[kind[rows] == int(EventKind.RUNTIME)])
    ok = launch >= 0
    owner = parent[np.maximum(launch, 0)]
    runtime = int(EventKind.RUNTIME)
    for _ in range(8):  # a runtime call inside a runtime call (driver under runtime) is rare
        up = ok & (owner >= 0) & (kind[np.maximum(owner, 0)] == runtime)
        if not up.any():
            break
        owner[up] = parent[owner[up]]
    ok &= owner >= 0
    np.add.at(self_dev, owner[ok], dur[dev_rows[ok]])
    total_dev = op_nesting.subtree_sums(order, parent, self_dev) if ok.any() else self_dev.copy()
    return pd.DataFrame(
        {
            "row": order,
            "parent": parent[order],
            "self_cpu_ns": self_cpu[order],
            "self_device_ns": self_dev[order],
            "device_total_ns": total_dev[order],
        }
    )


def launches(
    events: pd.DataFrame, idx: np.ndarray, runtime: np.ndarray | None = None
) -> np.ndarray:
    """Row of the runtime call (same correlation id) that launched each device event ``idx``;
    -1 where it has no correlation id or its launch is not in ``events``. ``runtime``: the rows
    to look in (default: every RUNTIME event with a correlation id)."""
    return launch_rows(events["corr"].to_numpy(np.int64), events["kind"].to_numpy(), idx, runtime)


def op_table(
    events: pd.DataFrame,
    rank: int = 0,
    *,
    lanes: pd.DataFrame | None = None,
    group_by_shape: bool = False,
    sort_by: str = "cpu_time_total",
) -> pd.DataFrame:
    """One rank's ``key_averages()``: per op (and input shapes), calls, self and total CPU time
    and device time (ns; ``OP_TABLE_COLUMNS``), sorted by ``sort_by`` (a ``key_averages`` key such
    as ``"self_cuda_time_total"``, or a column), largest first.

    Rows: the host events of :func:`op_tree` and the device events (kernels, copies, memsets:
    their duration is their self and total device time, their CPU time 0, as in torch).
    ``group_by_shape``: group by (name, input shapes) like ``key_averages(group_by_input_shape=
    True)``; needs the ``shapes`` column (``Store.events(rank, columns=[..., "shapes"])``, a trace
    recorded with ``record_shapes``), else every shape is ``""``.
    """
    col = sort_column(sort_by)
    tree = op_tree(events, lanes)
    kind = events["kind"].to_numpy().astype(np.int64)
    dur = events["dur"].to_numpy(np.int64)
    dev = np.flatnonzero(np.isin(kind, [int(k) for k in DEVICE_TIME_KINDS]))
    rows = np.concatenate([tree["row"].to_numpy(np.int64), dev])
    zeros = np.zeros(len(dev), np.int64)
    name_code, name_text = text_codes(events["name"])
    if group_by_shape and "shapes" in events.columns:
        shape_code, shape_text = text_codes(events["shapes"], missing="")
        shapes = shape_code[rows]
    else:
        shapes = np.zeros(len(rows), np.int64)
        shape_text = np.asarray([""], dtype=object)
    if not len(rows):
        return _empty(OP_TABLE_COLUMNS)
    tree_rows = tree["row"].to_numpy(np.int64)
    sums = {
        "self_cpu_ns": np.concatenate([tree["self_cpu_ns"].to_numpy(np.int64), zeros]),
        "cpu_total_ns": np.concatenate([dur[tree_rows], zeros]),
        "self_device_ns": np.concatenate([tree["self_device_ns"].to_numpy(np.int64), dur[dev]]),
        "device_total_ns": np.concatenate([tree["device_total_ns"].to_numpy(np.int64), dur[dev]]),
    }
    # grouped on integer codes (hashing each row's strings was most of the table's time), in
    # numpy: pandas' groupby(sort=False).sum() on (name, kind, shapes), groups in first-row order
    group, first = _first_seen_groups(name_code[rows], kind[rows], shapes)
    by_group, starts = _group_runs(group, len(first))
    numbers = {
        "count": np.bincount(group, minlength=len(first)).astype(np.int64),
        **{c: np.add.reduceat(v[by_group], starts) for c, v in sums.items()},
    }
    names = name_text[name_code[rows][first]]
    # pandas' sort_values([col, "name"], ascending=[False, True], kind="stable"), in numpy:
    # by the column's rank descending, then the name's ascending, then first-seen order
    name_rank = np.unique(names, return_inverse=True)[1].reshape(-1)
    col_rank = np.unique(numbers[col], return_inverse=True)[1].reshape(-1)
    order = np.lexsort((name_rank, -col_rank))
    kinds = kind[rows][first][order].tolist()
    # one frame, built as the unsorted one was (text columns inferred alike), already in order
    return pd.DataFrame(
        {
            "rank": np.full(len(first), rank, np.int32),
            "name": names[order],
            "kind": [KIND_NAMES[k] for k in kinds],
            "shapes": shape_text[shapes[first]][order],
            **{c: v[order] for c, v in numbers.items()},
        }
    )


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return empty(_objects(columns))


def _objects(columns: dict[str, str]) -> dict[str, str]:
    """``columns`` with its text columns as ``object`` (how these frames hold text)."""
    return {k: ("object" if v == "str" else v) for k, v in columns.items()}


def _kept(columns: dict[str, str]) -> dict[str, str | None]:
    """``columns`` with its text columns kept as they are (object), not made ``str``."""
    return {k: (None if v == "str" else v) for k, v in columns.items()}


def _dtypes(columns: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in columns.items() if v != "str"}


#: Columns of :func:`op_table_across_ranks` (times in ns, means over the ranks that ran the op;
#: ``spread`` = (max − min) / mean of the sort column over those ranks).
OP_TABLE_ACROSS_COLUMNS = [
    "name",
    "kind",
    "shapes",
    "ranks",
    "count_mean",
    "self_cpu_mean_ns",
    "cpu_total_mean_ns",
    "self_device_mean_ns",
    "device_total_mean_ns",
    "sort_min_ns",
    "sort_max_ns",
    "spread",
    "fastest_rank",
    "slowest_rank",
]


def op_sort_of(table: pd.DataFrame) -> str:
    """``key_averages``' sort for an op table: self device time when kernels were recorded (GPU
    runs), else self CPU time."""
    has_device = len(table) and "self_device_ns" in table and table["self_device_ns"].sum() > 0
    return "self_cuda_time_total" if has_device else "self_cpu_time_total"


def op_table_across_ranks(
    tables: pd.DataFrame, sort_by: str = "cpu_time_total", top: int | None = 20
) -> pd.DataFrame:
    """:func:`op_table` rows of all ranks (concatenated) to one row per (name, kind, shapes): the
    mean per rank, and the spread, fastest and slowest rank of the ``sort_by`` time; the largest
    mean of ``sort_by`` first (``top`` rows; None: all)."""
    col = sort_column(sort_by)
    if not len(tables):
        return pd.DataFrame(columns=OP_TABLE_ACROSS_COLUMNS)
    keys = ["name", "kind", "shapes"]
    tables = tables.reset_index(drop=True)
    g = tables.groupby(keys, sort=False)
    out = g.agg(
        ranks=("rank", "nunique"),
        count_mean=("count", "mean"),
        self_cpu_mean_ns=("self_cpu_ns", "mean"),
        cpu_total_mean_ns=("cpu_total_ns", "mean"),
        self_device_mean_ns=("self_device_ns", "mean"),
        device_total_mean_ns=("device_total_ns", "mean"),
        sort_min_ns=(col, "min"),
        sort_max_ns=(col, "max"),
        sort_mean=(col, "mean"),
    )
    out["slowest_rank"] = tables.loc[g[col].idxmax().to_numpy()].set_index(keys)["rank"]
    out["fastest_rank"] = tables.loc[g[col].idxmin().to_numpy()].set_index(keys)["rank"]
    out["spread"] = (out["sort_max_ns"] - out["sort_min_ns"]) / out["sort_mean"].where(
        out["sort_mean"] > 0
    )
    out = out.fillna({"spread": 0.0}).reset_index()
    out = out.sort_values(["sort_mean", "name"], ascending=[False, True], kind="stable")
    if top is not None:
        out = out.head(top)
    return out[OP_TABLE_ACROSS_COLUMNS].reset_index(drop=True)


def format_op_table(
    table: pd.DataFrame, sort_by: str = "cpu_time_total", row_limit: int = 20
) -> str:
    """One rank's :func:`op_table` as text, like ``key_averages().table(sort_by=...)`` (ms)."""
    col = sort_column(sort_by)
    rows = table.sort_values([col, "name"], ascending=[False, True], kind="stable").head(row_limit)
    shapes = bool((rows["shapes"] != "").any()) if len(rows) else False
    width = max([len("Name"), *(min(len(str(n)), 55) for n in rows["name"])])
    head = (
        f"{'Name':<{width}}  {'Self CPU':>10}  {'CPU total':>10}  {'Self dev':>10}  "
        f"{'Dev total':>10}  {'# Calls':>7}" + ("  Input Shapes" if shapes else "")
    )
    lines = [head, "-" * len(head)]
    for r in rows.itertuples(index=False):
        name = str(r.name)
        name = name if len(name) <= 55 else name[:52] + "..."
        lines.append(
            f"{name:<{width}}  {r.self_cpu_ns / 1e6:>8.3f}ms  {r.cpu_total_ns / 1e6:>8.3f}ms  "
            f"{r.self_device_ns / 1e6:>8.3f}ms  {r.device_total_ns / 1e6:>8.3f}ms  {r.count:>7}"
            + (f"  {r.shapes}" if shapes else "")
        )
    return "\n".join(lines)
