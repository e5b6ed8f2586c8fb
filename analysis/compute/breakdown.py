"""Where a rank's time went: compute, communication (overlapped vs exposed), memory, input, idle.

Every function here is a pure function of ONE rank's events (``Store.events(rank)``, schema
``EVENT_COLUMNS``, ns on the aligned clock) and lanes (``Store.lanes(rank)``), so the pipeline can
run it as one Dask task per rank.

Two timelines are painted, one per device kind (definitions in ``docs/analysis.md``):

* **GPU** ranks (any kernel on a GPU stream): the union of GPU events. Each instant of the window
  is exactly one of compute (a compute kernel runs), comm exposed (only communication runs),
  memory (only memcpy/memset), other (only e.g. sync events) or idle. Comm overlapped is the time
  a communication kernel runs *together with* a compute kernel. Kernel kinds follow Holistic Trace
  Analysis (HTA) 0.5.0 exactly, so the quantities HTA also reports agree with it
  (:func:`hta_temporal_breakdown`).
* **CPU** ranks (gloo): the main thread (the one running ``ProfilerStep#N``). Each instant is
  input (inside a DataLoader ``__next__`` range), comm exposed (a collective is in flight — gloo
  on a ``pt_gloo_runloop`` thread or the c10d enqueue call — and the main thread runs no operator:
  this is the DDP reducer's wait, which is only a hole in the main thread), compute (an operator
  or a ``record_function`` range covers it), or idle (nothing recorded: Python/host time).

Why one module of ~570 lines: one analysis (the time breakdown) with the interval arithmetic it
is built on.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.painting import paint as paint
from rankscope.analysis.compute.rank_views import rank_view
from rankscope.analysis.store.schema import EventKind, LaneKind, tid_numbers

#: Communication kernels, as HTA 0.5.0 classifies them (``re.match``: anchored at the start).
COMM_KERNEL_RE = r"^nccl.*Kernel"
#: Memory kernels, as HTA 0.5.0 classifies them.
MEMORY_KERNEL_RE = r"(^Memcpy)|(^Memset)|(^dma)"
#: GPU events that are NOT compute for HTA 0.5.0 (``re.match``; note the grouping: "Memset" only
#: at the start, "Memcpy" and "Sync" anywhere).
NOT_COMPUTE_RE = r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)"
#: The DataLoader's per-batch range that PyTorch records (``enumerate(DataLoader)#…__next__``).
DATALOADER_RE = r"^enumerate\(DataLoader\)#.*__next__"

#: Kinds that are GPU events when they sit on a GPU stream lane (HTA: ``stream != -1``).
GPU_EVENT_KINDS = (
    EventKind.KERNEL_COMPUTE,
    EventKind.KERNEL_COMM,
    EventKind.MEMCPY,
    EventKind.MEMSET,
    EventKind.SYNC,
)
#: Kinds that are host "work" (an operator runs) on the main thread.
HOST_OP_KINDS = (
    EventKind.CPU_OP,
    EventKind.RUNTIME,
    EventKind.PYTHON,
    EventKind.SYNC,
    EventKind.OTHER,
)

#: Step number of the row that covers the whole profiled span of a rank.
WHOLE_RUN_STEP = -1

#: HTA rounds fractional-µs timestamps: start up (ceil), end down (floor), in µs.
HTA_GRID_NS = 1000


class Device(enum.StrEnum):
    """Which timeline a rank's breakdown was painted on."""

    GPU = "gpu"
    CPU = "cpu"


#: Columns of :func:`rank_breakdown` (all times int64 ns).
BREAKDOWN_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "step": "int32",  # ProfilerStep number; WHOLE_RUN_STEP: the sum of the steps (or the span)
    "device": "str",  # Device
    "start": "int64",  # window start, ns aligned
    "end": "int64",  # window end, ns aligned
    "total_ns": "int64",  # end - start (whole-run row: the sum of the step windows)
    "compute_ns": "int64",
    "comm_ns": "int64",  # comm_overlapped_ns + comm_exposed_ns
    "comm_overlapped_ns": "int64",  # communication running while compute runs
    "comm_exposed_ns": "int64",  # communication alone (nothing hides it)
    "memory_ns": "int64",  # GPU: memcpy/memset alone; CPU: 0
    "input_ns": "int64",  # DataLoader __next__ (CPU: part of the partition; GPU: host side)
    "other_ns": "int64",  # GPU: other GPU events alone (sync); CPU: 0
    "idle_ns": "int64",  # nothing recorded
}

#: Columns of :func:`hta_temporal_breakdown` (ns; HTA prints the same in µs).
HTA_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "idle_ns": "int64",
    "compute_ns": "int64",
    "non_compute_ns": "int64",
    "kernel_time_ns": "int64",
    "comm_union_ns": "int64",
    "overlap_pct": "float64",
}


# -- interval sets ---------------------------------------------------------------------------
# An interval set is a pair of int64 arrays (starts, ends), sorted and disjoint.


def interval_union(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals ``[ts, end)`` into a sorted disjoint set.

    Same grouping rule as HTA (a new group starts when ``ts`` is strictly after every earlier
    end), so touching intervals merge and a negative-length interval (HTA's rounding can make
    ``end < ts``) stays a group of its own.
    """
    if len(ts) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(ts, kind="stable")
    s = np.asarray(ts, np.int64)[order]
    e = np.asarray(end, np.int64)[order]
    prev_max = np.maximum.accumulate(e)
    new_group = np.empty(len(s), bool)
    new_group[0] = True
    new_group[1:] = s[1:] > prev_max[:-1]
    group = np.cumsum(new_group) - 1
    starts = s[new_group]
    ends = np.full(len(starts), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(ends, group, e)
    return starts, ends


def grouped_unions(
    group: np.ndarray, ts: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`interval_union` of every group at once: (group, starts, ends) of the merged sets.

    One sort and a few array passes instead of a Python loop over groups (an op table has
    hundreds of groups per rank). The running maximum of the ends restarts at each group by
    lifting group ``g``'s values by ``g × K`` (``K`` wider than all times), so it needs
    ``groups × K`` below 2**62; None when it is not (the caller loops over groups instead).
    """
    n = len(ts)
    if n == 0:
        z = np.empty(0, np.int64)
        return z, z, z
    group = np.asarray(group, np.int64)
    ts = np.asarray(ts, np.int64)
    end = np.asarray(end, np.int64)
    base = min(int(ts.min()), int(end.min()))
    width = max(int(ts.max()), int(end.max())) - base + 1
    if (int(group.max()) + 1) * width >= 2**62:
        return None
    order = np.lexsort((ts, group))
    g, s, e = group[order], ts[order], end[order]
    lift = g * width
    running = np.maximum.accumulate(e - base + lift) - lift + base
    new = np.empty(n, bool)
    new[0] = True
    new[1:] = (g[1:] != g[:-1]) | (s[1:] > running[:-1])
    first = np.flatnonzero(new)
    return g[first], s[first], np.maximum.reduceat(e, first)


def measure_below(starts: np.ndarray, ends: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For each ``x``: length (ns) of the sorted disjoint set ``[starts, ends)`` before ``x``."""
    if len(starts) == 0:
        return np.zeros(len(x), np.int64)
    cum = np.concatenate([[0], np.cumsum(ends - starts)])
    idx = np.searchsorted(starts, x, side="right") - 1
    inside = np.minimum(x, ends[np.maximum(idx, 0)]) - starts[np.maximum(idx, 0)]
    return np.where(idx >= 0, cum[np.maximum(idx, 0)] + inside, 0).astype(np.int64)


def interval_measure(iv: tuple[np.ndarray, np.ndarray]) -> int:
    """Total length of an interval set (ns), as HTA sums it (``sum(end) - sum(start)``)."""
    return int(iv[1].sum() - iv[0].sum())


# -- classification ------------------------------------------------------------------------


def name_matches(names: pd.Series, pattern: str) -> np.ndarray:
    """``re.match(pattern, name)`` for every row, computed once per distinct name."""
    rx = re.compile(pattern)
    if isinstance(names.dtype, pd.CategoricalDtype):
        cats = names.cat.categories
        codes = names.cat.codes.to_numpy()
        used = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(cats)))
        table = np.zeros(len(cats), bool)
        # the categories as an array once: indexing the Index per name cost half the call
        table[used] = [rx.match(str(t)) is not None for t in np.asarray(cats, object)[used]]
        return np.where(codes >= 0, table[np.maximum(codes, 0)], False)
    return np.fromiter((rx.match(str(n)) is not None for n in names), bool, len(names))


@rank_view(1)
def gpu_lanes(lanes: pd.DataFrame) -> np.ndarray:
    """Lane ids that are GPU streams with a valid (non-negative) stream number."""
    if len(lanes) == 0:
        return np.empty(0, np.int32)
    is_gpu = lanes["kind"].to_numpy() == int(LaneKind.GPU_STREAM)
    stream_ok = np.fromiter((n is None or n >= 0 for n in tid_numbers(lanes)), bool, len(lanes))
    return lanes["lane"].to_numpy()[is_gpu & stream_ok].astype(np.int32)


@rank_view(2)
def gpu_event_mask(events: pd.DataFrame, lanes: pd.DataFrame) -> np.ndarray:
    """GPU events in HTA's sense: kernels, memcpy/memset, sync events on a GPU stream."""
    kinds = events["kind"].to_numpy()
    return np.isin(events["lane"].to_numpy(), gpu_lanes(lanes)) & np.isin(
        kinds, [int(k) for k in GPU_EVENT_KINDS]
    )


def comm_kernel_mask(events: pd.DataFrame) -> np.ndarray:
    """Communication kernels: kind ``KERNEL_COMM`` (the merge's vocabulary of communication
    kernels, NCCL's and other libraries', docs/communication-kernels.md) or HTA's name rule
    (:data:`COMM_KERNEL_RE`, for events classified before the vocabulary grew). On NCCL-only
    traces this is HTA's set exactly; other libraries' kernels are communication here where HTA
    calls them compute."""
    kinds = events["kind"].to_numpy()
    return (kinds == int(EventKind.KERNEL_COMM)) | name_matches(events["name"], COMM_KERNEL_RE)


def is_gpu_rank(events: pd.DataFrame, lanes: pd.DataFrame) -> bool:
    """A rank is painted on its GPU timeline when it has any kernel on a GPU stream."""
    mask = gpu_event_mask(events, lanes)
    kinds = events["kind"].to_numpy()[mask]
    return bool(np.isin(kinds, [int(EventKind.KERNEL_COMPUTE), int(EventKind.KERNEL_COMM)]).any())


def main_lane(events: pd.DataFrame, lanes: pd.DataFrame) -> int:
    """The host thread that runs the training loop: the one holding ``ProfilerStep#N``.

    Fallback: the thread with the most operators; -1 when the rank has no host events.
    """
    kinds = events["kind"].to_numpy()
    lane = events["lane"].to_numpy()
    steps = lane[kinds == int(EventKind.PROFILER_STEP)]
    if len(steps):
        vals, counts = np.unique(steps, return_counts=True)
        return int(vals[np.argmax(counts)])
    host = lane[kinds == int(EventKind.CPU_OP)]
    if len(host) == 0:
        return -1
    vals, counts = np.unique(host, return_counts=True)
    return int(vals[np.argmax(counts)])


def _set(events: pd.DataFrame, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ts = events["ts"].to_numpy()[mask]
    return interval_union(ts, ts + events["dur"].to_numpy()[mask])


# -- the two painters ------------------------------------------------------------------------


def _gpu_sets(
    events: pd.DataFrame, lanes: pd.DataFrame
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    gpu = gpu_event_mask(events, lanes)
    comm = gpu & comm_kernel_mask(events)
    memory = gpu & ~comm & name_matches(events["name"], MEMORY_KERNEL_RE)
    compute = gpu & ~comm & ~memory & ~name_matches(events["name"], NOT_COMPUTE_RE)
    other = gpu & ~comm & ~memory & ~compute
    host = events["lane"].to_numpy() == main_lane(events, lanes)
    loader = host & name_matches(events["name"], DATALOADER_RE)
    return {
        "K": _set(events, compute),
        "N": _set(events, comm),
        "M": _set(events, memory),
        "X": _set(events, other),
        "D": _set(events, loader),
    }


def _gpu_categories(c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    k, n, m, x, d = c["K"], c["N"], c["M"], c["X"], c["D"]
    return {
        "compute_ns": k,
        "comm_ns": n,
        "comm_overlapped_ns": n & k,
        "comm_exposed_ns": n & ~k,
        "memory_ns": m & ~k & ~n,
        "other_ns": x & ~k & ~n & ~m,
        "input_ns": d,
        "idle_ns": ~(k | n | m | x),
        # GPU idle while the host is in the DataLoader: waiting for input, not host overhead
        # (not a breakdown column; the straggler windows take it out of idle)
        "idle_input_ns": ~(k | n | m | x) & d,
    }


def _cpu_sets(
    events: pd.DataFrame, lanes: pd.DataFrame
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    kinds = events["kind"].to_numpy()
    main = events["lane"].to_numpy() == main_lane(events, lanes)
    loader = main & name_matches(events["name"], DATALOADER_RE)
    ops = main & ~loader & np.isin(kinds, [int(k) for k in HOST_OP_KINDS])
    ranges = main & ~loader & (kinds == int(EventKind.USER_ANNOTATION))
    comm = (kinds == int(EventKind.COMM_CPU)) | (main & (kinds == int(EventKind.COMM_ENQUEUE)))
    return {
        "O": _set(events, ops),
        "A": _set(events, ranges),
        "C": _set(events, comm),
        "D": _set(events, loader),
    }


def _cpu_categories(c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    o, a, comm, d = c["O"], c["A"], c["C"], c["D"]
    exposed = comm & ~o & ~d
    overlapped = comm & o & ~d
    return {
        "compute_ns": (o & ~d) | (a & ~d & ~comm),
        "comm_ns": exposed | overlapped,
        "comm_overlapped_ns": overlapped,
        "comm_exposed_ns": exposed,
        "input_ns": d,
        "idle_ns": ~(o | a | d | comm),
    }


def rank_sets(
    events: pd.DataFrame, lanes: pd.DataFrame
) -> tuple[Device, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The device of a rank and the interval sets its categories are painted from.

    GPU: ``K`` compute kernels, ``N`` communication kernels, ``M`` memcpy/memset, ``X`` other GPU
    events, ``D`` DataLoader ranges on the main thread. CPU: ``O`` operators, ``A``
    ``record_function`` ranges, ``C`` collectives in flight, ``D`` DataLoader ranges (all on the
    main thread but ``C``). The overview (``overview.py``) paints its own partition from them.
    """
    if is_gpu_rank(events, lanes):
        return Device.GPU, _gpu_sets(events, lanes)
    return Device.CPU, _cpu_sets(events, lanes)


def painter(events: pd.DataFrame, lanes: pd.DataFrame) -> tuple[Device, Any]:
    """The device of a rank and a function ``(win_start, win_end) -> {category: ns array}``.

    The interval sets are built once; the function measures any number of windows (steps,
    the whole run, the time before each collective) against them.
    """
    device, sets = rank_sets(events, lanes)
    return device, measurer(device, sets)


def measurer(device: Device, sets: dict[str, tuple[np.ndarray, np.ndarray]]) -> Any:
    """The measuring function of :func:`painter` for sets already built (:func:`rank_sets`)."""
    cats = _gpu_categories if device is Device.GPU else _cpu_categories

    def measure(win_start: np.ndarray, win_end: np.ndarray) -> dict[str, np.ndarray]:
        return paint(sets, cats, win_start, win_end)

    return measure


def step_windows(events: pd.DataFrame, lanes: pd.DataFrame, device: Device) -> pd.DataFrame:
    """Windows (step, start, end) per ProfilerStep; without steps, one ``WHOLE_RUN_STEP`` window.

    CPU: the ``ProfilerStep#N`` ranges on the main thread (without steps: the span of the
    main-thread events). GPU: a step's window runs from its first GPU event (events carry their
    launch's step) to the next step's first GPU event, or to its own last GPU event when the next
    step was not recorded (end of a profiler window); without steps: first GPU start to last end.
    """
    ts = events["ts"].to_numpy()
    end = ts + events["dur"].to_numpy()
    kinds = events["kind"].to_numpy()
    rows: list[tuple[int, int, int]] = []
    if device is Device.GPU:
        mask = gpu_event_mask(events, lanes)
        if mask.any():
            steps = events["step"].to_numpy()[mask]
            g_ts, g_end = ts[mask], end[mask]
            lo, hi = int(g_ts.min()), int(g_end.max())
            valid = np.unique(steps[steps >= 0])
            firsts = [int(g_ts[steps == s].min()) for s in valid]
            lasts = [int(g_end[steps == s].max()) for s in valid]
            order = np.argsort(firsts)
            for i, j in enumerate(order):
                # a step runs until the next step's first GPU event; the last step of a profiler
                # window (no next step recorded) ends with its own last GPU event
                follows = i + 1 < len(order) and valid[order[i + 1]] == valid[j] + 1
                nxt = firsts[order[i + 1]] if follows else lasts[j]
                rows.append((int(valid[j]), firsts[j], max(nxt, firsts[j])))
            if not rows:
                rows.append((WHOLE_RUN_STEP, lo, hi))
    else:
        lane = main_lane(events, lanes)
        on_main = events["lane"].to_numpy() == lane
        is_step = on_main & (kinds == int(EventKind.PROFILER_STEP))
        if is_step.any():
            for s, a, b in zip(
                events["step"].to_numpy()[is_step], ts[is_step], end[is_step], strict=True
            ):
                rows.append((int(s), int(a), int(b)))
        elif on_main.any():
            rows.append((WHOLE_RUN_STEP, int(ts[on_main].min()), int(end[on_main].max())))
    return pd.DataFrame(rows, columns=["step", "start", "end"]).astype("int64")


def rank_breakdown(events: pd.DataFrame, lanes: pd.DataFrame, rank: int = 0) -> pd.DataFrame:
    """Breakdown of one rank per step and over its whole profiled span (``BREAKDOWN_COLUMNS``).

    Per row the categories partition the window: GPU ``compute + comm_exposed + memory + other
    + idle == total``; CPU ``compute + comm_exposed + input + idle == total``.
    """
    device, measure = painter(events, lanes)
    return measure_windows(measure, device, step_windows(events, lanes, device), rank)


def measure_windows(measure: Any, device: Device, windows: pd.DataFrame, rank: int) -> pd.DataFrame:
    """Breakdown rows (``BREAKDOWN_COLUMNS``) for ``windows`` (step, start, end) of one rank, as
    numpy columns and one frame (a frame per column set cost more than measuring a small rank)."""
    n = len(windows)
    step = windows["step"].to_numpy(np.int32)
    start = windows["start"].to_numpy(np.int64)
    end = windows["end"].to_numpy(np.int64)
    values = measure(start, end) if n else {}
    cols: dict[str, Any] = {
        "rank": np.full(n, rank, np.int32),
        "step": step,
        "device": str(device),
        "start": start,
        "end": end,
        "total_ns": end - start,
    }
    for col, dtype in BREAKDOWN_COLUMNS.items():
        if col not in cols:
            cols[col] = values.get(col, np.zeros(n, np.int64)).astype(dtype)
    cols = {c: cols[c] for c in BREAKDOWN_COLUMNS}
    stepped = np.flatnonzero(step >= 0)
    if not len(stepped):
        return pd.DataFrame(cols)
    # the steps in step order, then the whole-run row: it sums the steps (time between
    # profiler windows was not recorded), spans them, and is the first step's otherwise
    rows = stepped[np.argsort(step[stepped], kind="stable")]
    out: dict[str, Any] = {}
    for col, v in cols.items():
        if col == "device":
            out[col] = np.full(len(rows) + 1, str(device), dtype=object)
            continue
        picked = v[rows]
        last = {"step": WHOLE_RUN_STEP, "start": picked.min(), "end": picked.max()}.get(col)
        if last is None:
            last = picked.sum() if col.endswith("_ns") else picked[0]
        out[col] = np.append(picked, np.asarray(last, picked.dtype))
    return pd.DataFrame(out)


# -- HTA 0.5.0 temporal breakdown and comm/compute overlap -----------------------------------


def _hta_round(ts: np.ndarray, end: np.ndarray, phase_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """HTA's rounding: start up and end down to whole µs of the rank's raw clock."""
    g = HTA_GRID_NS
    rs = -((-(ts - phase_ns)) // g) * g + phase_ns
    re_ = ((end - phase_ns) // g) * g + phase_ns
    return rs, re_


@rank_view(2)
def hta_view(
    events: pd.DataFrame, lanes: pd.DataFrame, grid_phase_ns: int, drop_last_step: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The events as HTA 0.5.0 loads them: ``(ts, end, kept)``, ns on the aligned clock.

    ``ts``/``end``: rounded to whole µs of the raw trace clock, start up and end down
    (``grid_phase_ns``: where that µs grid falls on the aligned clock). ``kept``: HTA's
    ``_filter_irrelevant_gpu_kernels`` when the trace holds two or more ``ProfilerStep`` numbers
    (``drop_last_step``): host events that start before the last ``ProfilerStep`` starts, and the
    GPU events one of them launched (same correlation id); every event otherwise."""
    ts = events["ts"].to_numpy().astype(np.int64)
    end = ts + events["dur"].to_numpy().astype(np.int64)
    ts, end = _hta_round(ts, end, int(grid_phase_ns) % HTA_GRID_NS)
    kept = np.ones(len(ts), bool)
    if drop_last_step:
        kinds = events["kind"].to_numpy()
        is_step = kinds == int(EventKind.PROFILER_STEP)
        if is_step.any():
            last_start = ts[is_step].max()
            gpu = gpu_event_mask(events, lanes)
            corr = events["corr"].to_numpy()
            host = ~gpu & (ts < last_start)
            launched = np.unique(corr[host & (corr >= 0)])
            kept = host | (gpu & np.isin(corr, launched))
    return ts, end, kept


def hta_temporal_breakdown(
    events: pd.DataFrame,
    lanes: pd.DataFrame,
    *,
    rank: int = 0,
    grid_phase_ns: int = 0,
    drop_last_step: bool = True,
) -> pd.DataFrame:
    """HTA 0.5.0's temporal breakdown and comm/compute overlap for one rank (``HTA_COLUMNS``).

    What HTA does, reproduced here:

    * timestamps are rounded to whole µs of the raw trace clock, start up and end down
      (``grid_phase_ns`` = where the µs grid falls on the aligned clock: the rank's clock offset
      modulo 1000 ns);
    * when the traces hold two or more distinct ``ProfilerStep`` numbers (``drop_last_step``),
      GPU events are kept only if launched (same correlation id) by a host event that starts
      before the rank's last ``ProfilerStep`` starts;
    * ``kernel_time`` = last GPU end - first GPU start; ``idle`` = kernel_time - |union of GPU
      events|; ``compute`` = |union of compute kernels|; ``non_compute`` = the rest;
      ``overlap_pct`` = |comm ∩ compute| / |comm| * 100 (comm = ``^nccl.*Kernel``; here also
      the other libraries' communication kernels, :func:`comm_kernel_mask`, which HTA counts as
      compute).
    """
    ts, end, kept = hta_view(events, lanes, grid_phase_ns, drop_last_step)
    gpu = gpu_event_mask(events, lanes) & kept
    names = events["name"]
    comm = gpu & comm_kernel_mask(events)
    memory = gpu & ~comm & name_matches(names, MEMORY_KERNEL_RE)
    compute = gpu & ~comm & ~memory & ~name_matches(names, NOT_COMPUTE_RE)
    row: dict[str, Any] = {"rank": rank}
    all_iv = interval_union(ts[gpu], end[gpu])
    if len(all_iv[0]) == 0:
        row.update(idle_ns=0, compute_ns=0, non_compute_ns=0, kernel_time_ns=0, comm_union_ns=0)
        row["overlap_pct"] = float("nan")
        return pd.DataFrame([row]).astype(HTA_COLUMNS)
    kernel_time = int(all_iv[1][-1] - all_iv[0][0])
    idle = kernel_time - interval_measure(all_iv)
    comp_iv = interval_union(ts[compute], end[compute])
    comm_iv = interval_union(ts[comm], end[comm])
    compute_ns = interval_measure(comp_iv)
    comm_ns = interval_measure(comm_iv)
    both = paint(
        {"K": comp_iv, "N": comm_iv},
        lambda c: {"both": c["K"] & c["N"]},
        np.array([min(all_iv[0][0], all_iv[1].min())]),
        np.array([all_iv[1].max()]),
    )
    overlap = int(both["both"][0]) if both else 0
    row.update(
        idle_ns=idle,
        compute_ns=compute_ns,
        non_compute_ns=kernel_time - compute_ns - idle,
        kernel_time_ns=kernel_time,
        comm_union_ns=comm_ns,
        overlap_pct=100.0 * overlap / comm_ns if comm_ns > 0 else float("nan"),
    )
    return pd.DataFrame([row]).astype(HTA_COLUMNS)
