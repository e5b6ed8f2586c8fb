"""Memory across ranks: torch.profiler's ``[memory]`` events as a table, and pure analyses of it.

``rankscope run --profile-memory`` makes every rank's profiler record one instant event per
allocation and per free; the merge keeps them as a per-rank table of
:data:`~rankscope.analysis.store.memory_table.MEMORY_COLUMNS` (``memory_events.py``: the table and
the extraction rule the decoder shares). The analyses are pure functions from such a frame to
frames: :func:`peaks`, :func:`step_peaks`, :func:`imbalance`, :func:`holders_at_peak`,
:func:`headroom` (``memory_peaks.py``), :func:`leaks` (``memory_leaks.py``, with its own t
tail), :func:`memory_series` (here). :func:`rankscope.analysis.conclude.memory_findings.memory_findings`
words their conclusions.

This module is the way in: it puts the analyses together for the pipeline — one rank's share
(:func:`rank_memory`) and the cross-rank rest (:func:`memory_analysis`, into a
:class:`MemoryAnalysis`) — and every name of the pieces above can still be imported from here.

What the counters mean (measured on torch 2.x; it decides how the analyses read them):

* **CUDA**: ``Total Allocated`` / ``Total Reserved`` are the caching allocator's device-wide
  statistics, true whether or not the profiler saw the allocations: comparable across steps and
  windows.
* **CPU**: the CPU allocator counts only blocks it saw allocated while memory profiling was on;
  blocks from before, and frees that happen between profiler windows, are never subtracted. The
  counter therefore restarts near 0 in the first window, drifts between windows, and the first
  step of each window differs from the rest (it replaces blocks from before the window by
  counted ones). ``Total Reserved`` is 0. :func:`leaks` compares CPU steps only within a window
  and leaves out each window's first step.
* Traces are exported per profiler window: a block allocated before its window shows only its
  free, or nothing. Such frees are not an error; :func:`holders_at_peak` counts only the
  allocations it saw in the peak's window and reports the rest as unattributed.

Units: bytes (int64) and ns (int64); ``MiB`` in words means 2**20 bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.memory_leaks import LEAK_ALPHA as LEAK_ALPHA
from rankscope.analysis.compute.memory_leaks import LEAK_MATERIAL_STEPS as LEAK_MATERIAL_STEPS
from rankscope.analysis.compute.memory_leaks import LEAK_TEST_COLUMNS as LEAK_TEST_COLUMNS
from rankscope.analysis.compute.memory_leaks import judge_leaks as judge_leaks
from rankscope.analysis.compute.memory_leaks import leak_tests as leak_tests
from rankscope.analysis.compute.memory_leaks import leaks as leaks
from rankscope.analysis.compute.memory_leaks import slope_test as slope_test
from rankscope.analysis.compute.memory_peaks import HEADROOM_LOW_SHARE as HEADROOM_LOW_SHARE
from rankscope.analysis.compute.memory_peaks import IMBALANCE_MIN_BYTES as IMBALANCE_MIN_BYTES
from rankscope.analysis.compute.memory_peaks import IMBALANCE_MIN_SHARE as IMBALANCE_MIN_SHARE
from rankscope.analysis.compute.memory_peaks import IMBALANCE_Z as IMBALANCE_Z
from rankscope.analysis.compute.memory_peaks import headroom as headroom
from rankscope.analysis.compute.memory_peaks import holders_at_peak as holders_at_peak
from rankscope.analysis.compute.memory_peaks import imbalance as imbalance
from rankscope.analysis.compute.memory_peaks import peaks as peaks
from rankscope.analysis.compute.memory_peaks import step_peaks as step_peaks
from rankscope.analysis.compute.statistics import t_sf as t_sf
from rankscope.analysis.store.memory_table import ALLOCATION_OPS as ALLOCATION_OPS
from rankscope.analysis.store.memory_table import ARG_KEYS as ARG_KEYS
from rankscope.analysis.store.memory_table import DEVICE_KEY as DEVICE_KEY
from rankscope.analysis.store.memory_table import MEMORY_COLUMNS as MEMORY_COLUMNS
from rankscope.analysis.store.memory_table import DeviceType as DeviceType
from rankscope.analysis.store.memory_table import assign_steps as assign_steps
from rankscope.analysis.store.memory_table import attribute as attribute
from rankscope.analysis.store.memory_table import bad_memory_field as bad_memory_field
from rankscope.analysis.store.memory_table import device_name as device_name
from rankscope.analysis.store.memory_table import device_total_memory as device_total_memory
from rankscope.analysis.store.memory_table import empty_memory as empty_memory
from rankscope.analysis.store.memory_table import memory_field_limits as memory_field_limits
from rankscope.analysis.store.memory_table import memory_rows as memory_rows
from rankscope.analysis.store.memory_table import skip_reason as skip_reason

#: The message of a store without memory events (renderers show it instead of zeros).
NO_MEMORY_EVENTS = "no memory events (run with --profile-memory)"


# -- over time, for the figures -----------------------------------------------------------------

#: Bins per (rank, device) of :func:`memory_series` (the HTML figure is ~700 px wide).
SERIES_BINS = 400
#: Columns of :func:`memory_series`.
SERIES_COLUMNS = [*DEVICE_KEY, "t_start", "t_end", "events", "allocated_min", "allocated_max"]
SERIES_COLUMNS += ["allocated_last", "reserved_max"]


def memory_series(mem: pd.DataFrame, bins: int = SERIES_BINS) -> pd.DataFrame:
    """Allocated and reserved memory over time per (rank, device), aggregated into at most
    ``bins`` equal time bins over the device's own span: each bin keeps the minimum, maximum and
    last ``Total Allocated`` of its events and the maximum ``Total Reserved`` (so the peak is
    never lost to the aggregation; bins without events are left out: the counter holds).

    Columns: rank, device_type, device_id, t_start, t_end (ns, the bin), events, allocated_min,
    allocated_max, allocated_last, reserved_max.
    """
    if not len(mem):
        return pd.DataFrame({c: pd.Series([], dtype="int64") for c in SERIES_COLUMNS})
    frames = []
    m = mem.sort_values([*DEVICE_KEY, "ts"], kind="stable", ignore_index=True)
    for key, d in m.groupby(DEVICE_KEY, sort=True):
        ts = d["ts"].to_numpy(np.int64)
        t0, t1 = int(ts[0]), int(ts[-1])
        width = max((t1 - t0) // bins + 1, 1)
        b = (ts - t0) // width
        g = d.assign(bin=b).groupby("bin", sort=True)
        out = pd.DataFrame(
            {
                "t_start": t0 + g.size().index.to_numpy(np.int64) * width,
                "events": g.size().to_numpy(np.int64),
                "allocated_min": g["total_allocated"].min().to_numpy(np.int64),
                "allocated_max": g["total_allocated"].max().to_numpy(np.int64),
                "allocated_last": g["total_allocated"].last().to_numpy(np.int64),
                "reserved_max": g["total_reserved"].max().to_numpy(np.int64),
            }
        )
        out["t_end"] = out["t_start"] + width
        for col, value in zip(DEVICE_KEY, key, strict=True):
            out[col] = value
        frames.append(out)
    res = pd.concat(frames, ignore_index=True)
    return res.astype({"rank": "int32", "device_type": "int8", "device_id": "int16"})[
        SERIES_COLUMNS
    ]


# -- one rank's share and the cross-rank rest (analysis.pipeline) -------------------------------


def _empty(columns: Iterable[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=object) for c in columns})


@dataclasses.dataclass
class MemoryAnalysis:
    """The memory results of one store (``Analysis.memory``); every frame empty without events."""

    peaks: pd.DataFrame
    """:func:`peaks` of every rank and device."""
    step_peaks: pd.DataFrame
    """:func:`step_peaks`."""
    leaks: pd.DataFrame
    """:func:`leaks`, the level split over the devices of ALL ranks."""
    imbalance: pd.DataFrame
    """:func:`imbalance` of the peaks."""
    holders: pd.DataFrame
    """:func:`holders_at_peak`."""
    headroom: pd.DataFrame
    """:func:`headroom` against each GPU's total memory (the trace's ``deviceProperties``)."""
    series: pd.DataFrame
    """:func:`memory_series`, for the figures."""
    requested: bool = False
    """The run was recorded with ``--profile-memory`` (run.json's profiler settings)."""

    @property
    def has_events(self) -> bool:
        """The store holds memory events."""
        return bool(len(self.peaks))

    @classmethod
    def empty(cls, requested: bool = False) -> MemoryAnalysis:
        """No memory events."""
        return cls(
            peaks=peaks(empty_memory()),
            step_peaks=step_peaks(empty_memory()),
            leaks=leaks(empty_memory()),
            imbalance=_empty([*DEVICE_KEY, "peak_allocated", "is_imbalanced"]),
            holders=holders_at_peak(empty_memory()),
            headroom=_empty([*DEVICE_KEY, "peak_reserved", "total_bytes", "is_low"]),
            series=memory_series(empty_memory()),
            requested=requested,
        )


def rank_memory(store: Any, rank: int) -> dict[str, Any] | None:
    """The per-rank memory work of ``pipeline.rank_task``: reads the rank's memory table from
    the open ``store`` once and returns its peaks, step peaks, leak regressions, holders at the
    peak, series and GPU totals (small frames); None when the rank has no memory events."""
    mem = store.memory(rank)
    if not len(mem):
        return None
    pk = peaks(mem)
    return {
        "peaks": pk,
        "step_peaks": step_peaks(mem),
        "leak_tests": leak_tests(mem),
        "holders": holders_at_peak(mem, pk),
        "series": memory_series(mem),
        "totals": {(int(rank), d): b for d, b in store.device_memory(rank).items()},
    }


def memory_analysis(
    per_rank: Iterable[dict[str, Any] | None], *, requested: bool
) -> MemoryAnalysis:
    """The cross-rank memory steps on :func:`rank_memory`'s results (any order): leaks judged
    over all series, imbalance of the peaks, headroom."""
    results = [r for r in per_rank if r is not None]
    if not results:
        return MemoryAnalysis.empty(requested)

    def cat(key: str) -> pd.DataFrame:
        frames = [r[key] for r in results if len(r[key])]
        if not frames:
            return results[0][key]
        return pd.concat(frames, ignore_index=True).sort_values(DEVICE_KEY, kind="stable")

    pk = cat("peaks").reset_index(drop=True)
    totals: dict[tuple[int, int], int] = {}
    for r in results:
        totals.update(r["totals"])
    return MemoryAnalysis(
        peaks=pk,
        step_peaks=cat("step_peaks").reset_index(drop=True),
        leaks=judge_leaks(cat("leak_tests")),
        imbalance=imbalance(pk),
        holders=cat("holders").reset_index(drop=True),
        headroom=headroom(pk, totals),
        series=cat("series").reset_index(drop=True),
        requested=requested,
    )


def requested_in(meta: Mapping[str, Any]) -> bool:
    """Whether a store's root attributes say the run profiled memory (run.json's
    ``profiler.profile_memory``; False for traces merged without a run directory)."""
    run = meta.get("run")
    profiler = run.get("profiler") if isinstance(run, Mapping) else None
    return bool(isinstance(profiler, Mapping) and profiler.get("profile_memory"))
