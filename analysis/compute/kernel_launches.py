"""How the host feeds the GPU: Holistic Trace Analysis (HTA) 0.5.0's idle-time breakdown, kernel
launch statistics and CUDA stream queue length, for ONE rank, with HTA's definitions.

Every function is a pure function of one rank's events and lanes (``Store.events(rank)``,
``Store.lanes(rank)``; ns on the aligned clock) and sees the events as HTA loads them
(:func:`breakdown.hta_view`: times rounded to whole µs of the raw clock, start up and end down;
with two or more ``ProfilerStep`` numbers, host events from the last step's start on and the GPU
events they launched dropped), so the figures agree with HTA's on the same trace
(``tests/test_hta_analyses.py`` against ``tests/data/hta_reference.json``). Definitions, and where
rankscope deliberately differs, in docs/analysis.md ("HTA's analyses").

* **Idle time** per stream (``get_idle_time_breakdown``): the gap before each kernel / memcpy /
  memset on a stream (its start minus the previous one's end, in start order; the first has
  none) is *host wait* when the CUDA runtime call that launched it started after the previous
  one ended (the CPU had not even asked yet), else *kernel wait* when the gap is shorter than
  :data:`KERNEL_WAIT_NS` (back-to-back launch overhead), else *other* (e.g. waiting on an event
  of another stream).
* **Launch statistics** (``get_cuda_kernel_launch_stats``): for each GPU event launched by
  ``cudaLaunchKernel``/``cudaLaunchKernelExC``/``cudaMemcpyAsync``/``cudaMemsetAsync`` (same
  correlation id), the runtime call's duration, the GPU event's duration and the launch delay
  = GPU start − runtime call end, clipped at 0. Short kernels: GPU duration < runtime duration
  (and runtime duration ≤ :data:`RUNTIME_CUTOFF_NS`); runtime outliers: runtime duration >
  :data:`RUNTIME_CUTOFF_NS`; launch-delay outliers: delay > :data:`LAUNCH_DELAY_CUTOFF_NS`.
* **Queue length** per stream (``get_queue_length_time_series``): +1 when a launch call starts,
  −1 when the GPU event it launched starts; a step function over the change points.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.breakdown import gpu_lanes, hta_view
from rankscope.analysis.store.frames import from_rows, typed
from rankscope.analysis.store.schema import EventKind, text_codes, tid_numbers

#: HTA's ``consecutive_kernel_delay`` default (30) in the trace's unit, µs: a gap shorter than
#: this between two kernels whose launch came in time is launch overhead ("kernel wait").
#: (HTA's docstring says ns; its trace times are whole µs, so the comparison is in µs.)
KERNEL_WAIT_NS = 30_000
#: HTA's ``runtime_cutoff`` default: a CUDA runtime launch call longer than this is an outlier.
RUNTIME_CUTOFF_NS = 50_000
#: HTA's ``launch_delay_cutoff`` default: a launch delay longer than this is an outlier.
LAUNCH_DELAY_CUTOFF_NS = 100_000

#: Runtime calls whose GPU events HTA's launch statistics take (``include_memory_events=True``).
LAUNCH_STAT_CALLS = frozenset(
    {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync"}
)
#: Runtime calls that enqueue work on a stream, for the queue length (HTA's
#: ``get_runtime_launch_events_query``: CUDA and ROCm).
QUEUE_CALLS = LAUNCH_STAT_CALLS | {
    "cuLaunchKernel",
    "hipLaunchKernel",
    "hipExtModuleLaunchKernel",
    "hipMemsetAsync",
    "hipMemcpyAsync",
    "hipMemcpyWithStream",
}
#: GPU event kinds the idle-time breakdown walks (HTA: kernel, memcpy, memset; no sync events).
IDLE_KINDS = (EventKind.KERNEL_COMPUTE, EventKind.KERNEL_COMM, EventKind.MEMCPY, EventKind.MEMSET)

#: Columns of :func:`idle_time` (ns, summed over the stream's gaps).
IDLE_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "stream": "int64",  # CUDA stream number
    "host_wait_ns": "int64",
    "kernel_wait_ns": "int64",
    "other_ns": "int64",
    "idle_ns": "int64",  # the sum of the three: every gap between the stream's GPU events
    "gaps": "int64",  # number of gaps (GPU events on the stream - 1)
    "unlaunched_ns": "int64",  # part of idle_ns before GPU events whose launch is not in the trace
}
#: Columns of :func:`launches` (one row per launched GPU event; ns).
LAUNCH_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "corr": "int64",
    "kernel": "str",  # the GPU event's name
    "cpu_ns": "int64",  # the runtime call's duration
    "gpu_ns": "int64",  # the GPU event's duration
    "delay_ns": "int64",  # GPU start - runtime call end, clipped at 0
}
#: Columns of :func:`launch_summary` (one row per rank; ns summed over its launches).
LAUNCH_SUMMARY_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "launches": "int64",
    "cpu_ns": "int64",
    "gpu_ns": "int64",
    "delay_ns": "int64",  # total launch delay
    "delay_mean_ns": "float64",
    "delay_p50_ns": "float64",
    "delay_max_ns": "int64",
    "short_kernels": "int64",
    "runtime_outliers": "int64",
    "delay_outliers": "int64",
}
#: Columns of :func:`queue_length` (the step function: one row per change, in time order).
QUEUE_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "stream": "int64",
    "ts": "int64",  # ns, aligned (on HTA's µs grid)
    "queue_length": "int64",  # launched but not yet started, from this instant on
}
#: Columns of :func:`queue_summary` (one row per rank and stream).
QUEUE_SUMMARY_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "stream": "int64",
    "changes": "int64",  # HTA's "count": change points
    "mean": "float64",  # HTA's "mean": over the change points, not over time
    "mean_in_time": "float64",  # weighted by how long each value held (first to last change)
    "max": "int64",
}


def _frame(rows: Any, columns: dict[str, str]) -> pd.DataFrame:
    return from_rows(rows, columns)


def lane_streams(lanes: pd.DataFrame) -> np.ndarray:
    """CUDA stream number per lane id (-1: not a GPU stream with a valid number)."""
    out = np.full(len(lanes), -1, np.int64)
    ok = gpu_lanes(lanes)
    if len(ok):
        num = np.asarray([-1 if n is None else n for n in tid_numbers(lanes)], np.int64)
        out[ok] = num[ok]
    return out


def idle_time(
    events: pd.DataFrame,
    lanes: pd.DataFrame,
    *,
    rank: int = 0,
    grid_phase_ns: int = 0,
    drop_last_step: bool = True,
    kernel_wait_ns: int = KERNEL_WAIT_NS,
) -> pd.DataFrame:
    """HTA's idle-time breakdown per stream (``IDLE_COLUMNS``); empty without GPU events."""
    ts, end, kept = hta_view(events, lanes, grid_phase_ns, drop_last_step)
    kinds = events["kind"].to_numpy()
    stream = lane_streams(lanes)[events["lane"].to_numpy()] if len(lanes) else np.full(len(ts), -1)
    gpu = kept & (stream >= 0) & np.isin(kinds, [int(k) for k in IDLE_KINDS])
    corr = events["corr"].to_numpy()
    runtime = kept & (kinds == int(EventKind.RUNTIME)) & (corr >= 0)
    # the launching runtime call's start per GPU event (HTA joins on the correlation)
    r_corr, first = np.unique(corr[runtime], return_index=True)
    r_ts = ts[runtime][first]
    rows = []
    for s in np.unique(stream[gpu]):
        idx = np.flatnonzero(gpu & (stream == s))
        idx = idx[np.argsort(ts[idx], kind="stable")]
        if len(idx) < 2:
            rows.append((rank, s, 0, 0, 0, 0, 0, 0))
            continue
        prev_end = end[idx][:-1]
        gap = ts[idx][1:] - prev_end
        c = corr[idx][1:]
        pos = np.searchsorted(r_corr, c)
        found = (pos < len(r_corr)) & (r_corr[np.minimum(pos, len(r_corr) - 1)] == c) & (c >= 0)
        launch = np.where(
            found, r_ts[np.minimum(pos, max(len(r_ts) - 1, 0))], np.iinfo(np.int64).min
        )
        host = found & (launch > prev_end)
        kern = ~host & (gap < kernel_wait_ns)
        other = ~host & ~kern
        h, k, o = int(gap[host].sum()), int(gap[kern].sum()), int(gap[other].sum())
        rows.append((rank, s, h, k, o, h + k + o, len(gap), int(gap[~found].sum())))
    return _frame(rows, IDLE_COLUMNS)


def launches(
    events: pd.DataFrame,
    lanes: pd.DataFrame,
    *,
    rank: int = 0,
    grid_phase_ns: int = 0,
    drop_last_step: bool = True,
) -> pd.DataFrame:
    """HTA's kernel launch statistics, one row per launched GPU event (``LAUNCH_COLUMNS``)."""
    ts, end, kept = hta_view(events, lanes, grid_phase_ns, drop_last_step)
    code, texts = text_codes(events["name"])  # names compared once per distinct text
    names = texts[code]
    corr = events["corr"].to_numpy()
    stream = lane_streams(lanes)[events["lane"].to_numpy()] if len(lanes) else np.full(len(ts), -1)
    call = kept & (stream < 0) & np.isin(texts, list(LAUNCH_STAT_CALLS))[code] & (corr >= 0)
    gpu = kept & (stream >= 0) & np.isin(corr, corr[call])
    # pandas' inner merge of the calls with the GPU events on the correlation id, in numpy: the
    # calls in their order, each with its GPU events in theirs
    c_rows, g_rows = np.flatnonzero(call), np.flatnonzero(gpu)
    by_corr = g_rows[np.argsort(corr[g_rows], kind="stable")]
    lo = np.searchsorted(corr[by_corr], corr[c_rows], side="left")
    hi = np.searchsorted(corr[by_corr], corr[c_rows], side="right")
    n = hi - lo
    c = np.repeat(c_rows, n)
    g = by_corr[np.repeat(lo - np.cumsum(n) + n, n) + np.arange(int(n.sum()))]
    cpu_ns = end[c] - ts[c]
    j = {
        "rank": np.full(len(c), rank),
        "corr": corr[c],
        "kernel": names[g],
        "cpu_ns": cpu_ns,
        "gpu_ns": end[g] - ts[g],
        "delay_ns": np.maximum(ts[g] - ts[c] - cpu_ns, 0),
    }
    return typed(pd.DataFrame(j), LAUNCH_COLUMNS)


def launch_summary(launch_rows: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One rank's launches summed (``LAUNCH_SUMMARY_COLUMNS``), outliers with HTA's cut-offs."""
    d = launch_rows  # its int64 columns as arrays: pandas' sum / mean / median are numpy's here
    cpu, gpu, delay = (d[c].to_numpy(np.int64) for c in ("cpu_ns", "gpu_ns", "delay_ns"))
    row = (
        rank,
        len(d),
        int(cpu.sum()),
        int(gpu.sum()),
        int(delay.sum()),
        float(delay.mean()) if len(d) else float("nan"),
        float(np.median(delay)) if len(d) else float("nan"),
        int(delay.max()) if len(d) else 0,
        int(((cpu <= RUNTIME_CUTOFF_NS) & (gpu < cpu)).sum()),
        int((cpu > RUNTIME_CUTOFF_NS).sum()),
        int((delay > LAUNCH_DELAY_CUTOFF_NS).sum()),
    )
    return _frame([row], LAUNCH_SUMMARY_COLUMNS)


def queue_length(
    events: pd.DataFrame,
    lanes: pd.DataFrame,
    *,
    rank: int = 0,
    grid_phase_ns: int = 0,
    drop_last_step: bool = True,
    launch_first: bool = True,
) -> pd.DataFrame:
    """HTA's queue length of each CUDA stream over time (``QUEUE_COLUMNS``).

    A launch call and a GPU start at the same instant (HTA's whole µs): the launch counts first
    (``launch_first``: it is what enqueues), which gives every value its largest possible
    reading; ``launch_first=False`` the smallest. HTA's unstable sort leaves that order open, so
    its per-change mean and max lie between the two."""
    ts, _end, kept = hta_view(events, lanes, grid_phase_ns, drop_last_step)
    code, texts = text_codes(events["name"])  # names compared once per distinct text
    corr = events["corr"].to_numpy()
    stream = lane_streams(lanes)[events["lane"].to_numpy()] if len(lanes) else np.full(len(ts), -1)
    call = kept & (stream < 0) & np.isin(texts, list(QUEUE_CALLS))[code] & (corr >= 0)
    gpu = kept & (stream >= 0) & (corr >= 0)
    gpu &= np.isin(corr, corr[call])
    call &= np.isin(corr, corr[gpu])
    # in numpy (a pandas merge, concat, sort and grouped cumsum were most of the function):
    # each call on the stream of the first GPU event of its correlation id (every call has
    # one), +1 per call then -1 per GPU start, ordered by stream, time, then the launch first
    # (stable: ties keep that order), the running sum restarted per stream
    g_corr, g_stream = corr[gpu], stream[gpu]
    known, first = np.unique(g_corr, return_index=True)
    c_stream = g_stream[first][np.searchsorted(known, corr[call])]
    n_call = int(call.sum())
    at = np.concatenate([ts[call], ts[gpu]]).astype(np.int64)
    on = np.concatenate([c_stream, g_stream]).astype(np.int64)
    delta = np.concatenate([np.ones(n_call, np.int64), np.full(len(g_corr), -1, np.int64)])
    order = np.lexsort((-delta if launch_first else delta, at, on))
    at, on, delta = at[order], on[order], delta[order]
    running = np.cumsum(delta)
    starts = np.flatnonzero(np.r_[True, on[1:] != on[:-1]]) if len(on) else np.zeros(0, np.int64)
    before = np.repeat(running[starts] - delta[starts], np.diff(np.r_[starts, len(on)]))
    out = {"rank": np.full(len(on), rank), "stream": on, "ts": at, "queue_length": running - before}
    return typed(pd.DataFrame(out), QUEUE_COLUMNS)


def queue_summary(series: pd.DataFrame) -> pd.DataFrame:
    """Per rank and stream: HTA's count, mean and max of the queue length, and its mean in time."""
    rows = []
    for (rank, s), g in series.groupby(["rank", "stream"], sort=True):
        t = g["ts"].to_numpy()
        q = g["queue_length"].to_numpy()
        span = t[-1] - t[0]
        held = np.diff(t)
        in_time = float((q[:-1] * held).sum() / span) if span > 0 else float(q.mean())
        rows.append((rank, s, len(g), float(q.mean()), in_time, int(q.max())))
    return _frame(rows, QUEUE_SUMMARY_COLUMNS)


def differing_ranks(values: pd.Series) -> list[int]:
    """Ranks (the index) whose value lies outside Tukey's fences (Q1 − 1.5·IQR, Q3 + 1.5·IQR)
    of all ranks' values: the textbook rule for a value that does not belong with the rest,
    not a threshold fitted to a trace. Needs four ranks or more (quartiles of fewer say little);
    a spread of zero (all equal) finds none."""
    v = values.dropna()
    if len(v) < 4:
        return []
    q1, q3 = np.percentile(v.to_numpy(float), [25, 75])
    iqr = q3 - q1
    out = v[(v < q1 - 1.5 * iqr) | (v > q3 + 1.5 * iqr)]
    return [int(r) for r in out.index]
