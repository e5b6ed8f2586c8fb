"""How the host feeds the GPU inside the profiled steps, for the advice (docs/advice.md): the time
the whole GPU sat idle waiting for the host (the launch-bound rule's evidence) and the
host-to-device copies from pinned memory that the host waited for (the blocking-copy rule's).

Pure functions of ONE rank's events and lanes (``Store.events(rank)``, ``Store.lanes(rank)``; ns
on the aligned clock), run in the rank task beside HTA's analyses (``kernel_launches.py``).

Why not HTA's idle time: HTA's host wait is per stream, so a rank with a compute stream and a
communication stream counts the same instant once per stream, and the sum can exceed the step;
a stream that is idle while another one computes is no loss either. What a launch-bound rank
loses is the time *no* stream runs anything: here a gap of the union of the rank's GPU events
(kernels, memcpy, memset, sync events on every stream), inside the profiled step windows
(``breakdown.step_windows``, the same windows as the breakdown's, so a part never exceeds its
step). A gap is *host wait* when the runtime call that launched the GPU event ending the gap
(same correlation id) started after the gap began: the GPU had run out of work and the host had
not even asked for the next piece yet — HTA's host-wait test, applied to the whole device.
The part of it while the training loop's thread was inside the DataLoader's ``__next__`` is
counted apart (``input_wait_ns``): that is the input rule's, not launch overhead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute import breakdown as bd
from rankscope.analysis.compute.kernel_names import HostMemory, htod_source
from rankscope.analysis.store.frames import from_rows
from rankscope.analysis.store.schema import EventKind, text_values

#: Runtime calls that block the host until the GPU's work (the stream, the device) is done: a
#: copy followed by one of these on the same thread is a copy the host waited for.
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
    }
)
#: Copy calls that are synchronous by themselves ("cudaMemcpy ... synchronous with respect to
#: the host", CUDA Runtime API, "API synchronization behavior").
SYNC_COPY_CALLS = frozenset({"cudaMemcpy", "hipMemcpy"})

#: Columns of :func:`host_wait` (one row per GPU rank; ns summed over its profiled steps).
HOST_WAIT_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "steps": "int64",  # profiled step windows measured
    "step_ns": "int64",  # their summed length
    "gpu_idle_ns": "int64",  # no GPU event on any stream (the breakdown's idle_ns)
    "host_wait_ns": "int64",  # part of gpu_idle_ns ended by work the host had not asked for yet
    "input_wait_ns": "int64",  # part of host_wait_ns with the loop's thread in the DataLoader
    "host_wait_gaps": "int64",  # number of host-wait gaps (or pieces of one, cut by a window)
}
#: Columns of :func:`blocking_copies` (one row per host-to-device copy the host waited for).
BLOCKING_COPY_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "step": "int32",  # the ProfilerStep of its launch
    "copy": "str",  # the memcpy's name, e.g. "Memcpy HtoD (Pinned -> Device)"
    "call": "str",  # the runtime call that launched it (cudaMemcpyAsync, cudaMemcpy)
    "sync": "str",  # the synchronising call right after it on the same thread ("" for cudaMemcpy)
    "copy_ns": "int64",  # the copy's own duration on the GPU
    "wait_ns": "int64",  # the host blocked: the sync call's duration (cudaMemcpy: its own)
}


def _frame(rows: Any, columns: dict[str, str]) -> pd.DataFrame:
    return from_rows(rows, columns)


def _launch_starts(events: pd.DataFrame, gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(correlation ids, start of the runtime call with that id), sorted by id, of the host's
    launch calls (runtime events off the GPU lanes)."""
    kinds = events["kind"].to_numpy()
    corr = events["corr"].to_numpy()
    call = ~gpu & (kinds == int(EventKind.RUNTIME)) & (corr >= 0)
    ids, first = np.unique(corr[call], return_index=True)
    return ids, events["ts"].to_numpy()[call][first]


def host_wait(
    events: pd.DataFrame,
    lanes: pd.DataFrame,
    *,
    rank: int = 0,
    windows: pd.DataFrame | None = None,
    sets: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> pd.DataFrame:
    """The whole GPU's idle time inside the profiled steps and its host-wait part
    (``HOST_WAIT_COLUMNS``, one row); empty on a rank without GPU events.

    ``windows``: the step windows (``breakdown.step_windows``; computed when None; the profiled
    ones, step >= 0, when there are any). ``sets``: the rank's GPU interval sets
    (``breakdown.rank_sets``), passed to save building them twice."""
    gpu = bd.gpu_event_mask(events, lanes)
    if not gpu.any():
        return _frame([], HOST_WAIT_COLUMNS)
    if sets is None:
        sets = bd.rank_sets(events, lanes)[1]
    if windows is None:
        windows = bd.step_windows(events, lanes, bd.Device.GPU)
    if (windows["step"] >= 0).any():
        windows = windows[windows["step"] >= 0]
    ts = events["ts"].to_numpy()[gpu]
    end = ts + events["dur"].to_numpy()[gpu]
    corr = events["corr"].to_numpy()[gpu]
    order = np.argsort(ts, kind="stable")
    ts, end, corr = ts[order], end[order], corr[order]
    # the union's gaps: event j opens a new busy group when it starts after every earlier end
    reach = np.maximum.accumulate(end)
    opens = np.flatnonzero(ts[1:] > reach[:-1]) + 1
    gap_start, gap_end = reach[opens - 1], ts[opens]
    ids, starts = _launch_starts(events, gpu)
    host = np.zeros(len(opens), bool)
    if len(ids):
        pos = np.minimum(np.searchsorted(ids, corr[opens]), len(ids) - 1)
        found = (corr[opens] >= 0) & (ids[pos] == corr[opens])
        host = found & (starts[pos] > gap_start)
    waits = (gap_start[host], gap_end[host])
    measured = bd.paint(
        {"H": waits, "D": sets.get("D", (np.empty(0, np.int64),) * 2), "G": _busy(sets)},
        lambda c: {"idle": ~c["G"], "host": c["H"], "input": c["H"] & c["D"]},
        windows["start"].to_numpy(),
        windows["end"].to_numpy(),
    )
    lo, hi = windows["start"].to_numpy(), windows["end"].to_numpy()
    cut = (waits[0][:, None] < hi[None, :]) & (waits[1][:, None] > lo[None, :])
    row = (
        rank,
        len(windows),
        int((hi - lo).sum()),
        int(measured["idle"].sum()) if measured else 0,
        int(measured["host"].sum()) if measured else 0,
        int(measured["input"].sum()) if measured else 0,
        int(cut.sum()),
    )
    return _frame([row], HOST_WAIT_COLUMNS)


def _busy(sets: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The union of the GPU sets (compute, communication, memory, other): the GPU is busy."""
    parts = [sets[k] for k in ("K", "N", "M", "X") if k in sets]
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return bd.interval_union(
        np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    )


def blocking_copies(
    events: pd.DataFrame,
    lanes: pd.DataFrame,
    *,
    rank: int = 0,
    source: HostMemory = HostMemory.PINNED,
) -> pd.DataFrame:
    """Host-to-device copies from ``source`` memory inside the profiled steps that the host
    waited for (``BLOCKING_COPY_COLUMNS``): launched by a synchronous copy call
    (:data:`SYNC_COPY_CALLS`), or by ``cudaMemcpyAsync`` whose next runtime call on the same
    thread is a synchronising one (:data:`SYNC_CALLS`) — what PyTorch's ``tensor.to(device)``
    does without ``non_blocking=True``: it copies asynchronously, then synchronises the stream.
    A later synchronisation after other launches is not the copy's."""
    gpu = bd.gpu_event_mask(events, lanes)
    kinds = events["kind"].to_numpy()
    names = text_values(events["name"])
    corr = events["corr"].to_numpy()
    copies = gpu & (kinds == int(EventKind.MEMCPY)) & (events["step"].to_numpy() >= 0)
    copies &= corr >= 0
    if copies.any():
        copies[copies] = [htod_source(str(n)) is source for n in names[copies]]
    if not copies.any():
        return _frame([], BLOCKING_COPY_COLUMNS)
    runtime = np.flatnonzero(~gpu & (kinds == int(EventKind.RUNTIME)))
    lane = events["lane"].to_numpy()[runtime]
    ts = events["ts"].to_numpy()[runtime]
    dur = events["dur"].to_numpy()[runtime]
    order = np.lexsort((ts, lane))  # by thread, then time
    runtime, lane, ts, dur = runtime[order], lane[order], ts[order], dur[order]
    by_corr = {int(c): i for i, c in enumerate(corr[runtime]) if c >= 0}
    rows = []
    for j in np.flatnonzero(copies):
        i = by_corr.get(int(corr[j]))
        if i is None:
            continue
        call = str(names[runtime[i]])
        if call in SYNC_COPY_CALLS:
            sync, wait = "", int(dur[i])
        else:
            # the next runtime call on the same thread that starts after this one ended (the
            # driver calls a runtime call makes inside it start before its end)
            k = i + 1
            while k < len(runtime) and lane[k] == lane[i] and ts[k] < ts[i] + dur[i]:
                k += 1
            if k >= len(runtime) or lane[k] != lane[i] or str(names[runtime[k]]) not in SYNC_CALLS:
                continue
            sync, wait = str(names[runtime[k]]), int(dur[k])
        rows.append(
            (
                rank,
                int(events["step"].iat[j]),
                str(names[j]),
                call,
                sync,
                int(events["dur"].iat[j]),
                wait,
            )
        )
    return _frame(rows, BLOCKING_COPY_COLUMNS)
