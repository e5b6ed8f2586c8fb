"""Where each rank stood at each collective, and what it did before arriving: the arrival
windows the straggler tests (:mod:`rankscope.analysis.compute.stragglers`) read.

Two stages, as the Dask driver (:mod:`rankscope.analysis.engine.driver`) runs them:
:func:`arrival_points` per rank (a Dask task over ONE rank's events: prefix sums of compute,
input, host/idle and exposed communication at each arrival and collective end, ns), then
:func:`arrival_windows` across ranks (the window of each arrival since the previous sync point
that every rank waited for).

Separate from the straggler tests because it is a different stage of the pipeline with its own
inputs: it measures one rank's events against the breakdown painter, and knows nothing of
significance, blame or causes; the tests run afterwards on the small tables it produces.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.exact_reductions import group_positions
from rankscope.analysis.store.frames import typed

#: A collective's end is a sync point when no rank computed through most of its last phase
#: (from the last arrival to the end, and at least this long, ns): they all waited for it.
SYNC_PROBE_NS = 1_000

#: What the windows measure, in the painter's words (GPU idle during input is input).
PARTS = ("compute_ns", "input_ns", "idle_ns", "comm_ns")

#: Columns of :func:`arrival_points` (ns): one row per (collective, rank), from ONE rank's events.
POINT_COLUMNS: dict[str, str] = {
    "coll": "int64",
    "rank": "int32",
    "step": "int64",  # profiled step holding the arrival; -1: outside every profiled step
    "arrival": "int64",
    "stop": "int64",  # the arrival, or the end of the profiled step holding it
    "block_start": "int64",  # start of the run of consecutive profiled steps holding the arrival
    "end": "int64",  # the collective's end on this rank
    "end_block_start": "int64",  # same for the end (INT64_MIN: the end is outside the steps)
    "busy_before_end": "bool",  # mostly computing from the last arrival to the end: no wait
    # prefix sums from the block start to ``stop`` (at_) and to ``end`` (end_), per part
    **{f"at_{p}": "int64" for p in PARTS},
    **{f"end_{p}": "int64" for p in PARTS},
}

#: Columns of :func:`arrival_windows` (ns).
WINDOW_COLUMNS: dict[str, str] = {
    "coll": "int64",
    "rank": "int32",
    "step": "int64",  # profiled step holding the arrival; -1: outside every profiled step
    "window_start": "int64",  # the previous sync point (or the start of the profiled steps)
    "window_end": "int64",  # the arrival (or the end of the profiled step holding it)
    "arrival": "int64",
    "compute_ns": "int64",
    "input_ns": "int64",
    "idle_ns": "int64",  # host gaps (CPU) / GPU idle waiting for launches (GPU)
    "comm_ns": "int64",  # exposed communication (earlier collectives still running)
}


def arrival_points(
    coll_rows: pd.DataFrame,
    measure: Any,
    steps: pd.DataFrame,
    rank: int = 0,
) -> pd.DataFrame:
    """Where ``rank`` stood at each of its collectives (``POINT_COLUMNS``); runs per rank.

    ``coll_rows``: this rank's rows of ``Store.collectives()`` (``coll``, ``start``, ``end``, and
    ``last_start``: the collective's last arrival over all ranks);
    ``measure``: the rank's painter (:func:`rankscope.analysis.compute.breakdown.painter`);
    ``steps``: its step windows (:func:`rankscope.analysis.compute.breakdown.step_windows`).

    For its arrival and for the collective's end: how much compute, input, idle and exposed
    communication the rank had done since the start of its run of consecutive profiled steps
    (prefix sums, so that :func:`arrival_windows` can cut any window between them once the sync
    points are known across ranks), and whether it kept computing while the collective finished
    (mostly busy from the last arrival to the end): then it did not wait for it. A gloo op's
    recorded end can trail the moment the main thread resumed by a little, so "mostly", not
    "at all".
    """
    lowest = np.iinfo(np.int64).min
    rows = coll_rows.sort_values(["start", "coll"], kind="stable")
    arrival = rows["start"].to_numpy(np.int64)
    ends = np.maximum(rows["end"].to_numpy(np.int64), arrival)
    real_steps = steps[steps["step"] >= 0] if len(steps) else steps
    n = len(arrival)
    # the columns as arrays, one frame at the end (a frame column set per figure cost more
    # than the measuring on a small rank)
    out: dict[str, Any] = {
        "coll": rows["coll"].to_numpy(np.int64),
        "rank": np.full(n, rank, np.int32),
        "arrival": arrival,
        "end": ends,
    }
    st = real_steps.sort_values("start", kind="stable")
    s_start = st["start"].to_numpy(np.int64)
    s_end = st["end"].to_numpy(np.int64)
    s_num = st["step"].to_numpy(np.int64)
    # a block is a run of consecutive step numbers: the start of its first step
    new_block = np.ones(len(s_num), bool)
    new_block[1:] = s_num[1:] != s_num[:-1] + 1
    first = np.maximum.accumulate(np.where(new_block, np.arange(len(s_num)), 0))

    def locate(t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(step, block start, point clipped to its step, inside) of each time ``t``."""
        if len(s_start) == 0:
            return (np.full(len(t), -1), np.full(len(t), lowest), t, np.zeros(len(t), bool))
        after = np.searchsorted(s_start, t, side="right")
        idx, inside = np.maximum(after - 1, 0), after > 0
        clipped = np.where(inside, np.minimum(t, s_end[idx]), t)
        step = np.where(inside & (t <= s_end[idx]), s_num[idx], -1)
        return step, np.where(inside, s_start[first[idx]], lowest), clipped, inside

    step, block, stop, inside = locate(arrival)
    _, end_block, end_stop, end_inside = locate(ends)
    out["step"] = step
    out["stop"] = stop
    out["block_start"] = block
    out["end_block_start"] = np.where(end_inside & (ends <= end_stop), end_block, lowest)
    zeros = np.zeros(n, np.int64)
    at = measure(np.where(inside, block, stop), stop) if n else {}
    at_end = measure(np.where(end_inside, end_block, end_stop), end_stop) if n else {}
    # computing while the collective finished: through its last phase (from the last rank's
    # arrival to its end on this rank, at least SYNC_PROBE_NS), mostly busy
    last = rows["last_start"].to_numpy(np.int64) if "last_start" in rows else ends
    since = np.minimum(np.clip(last, arrival, ends), ends - SYNC_PROBE_NS)
    probe = measure(since, ends) if n else {}
    out["busy_before_end"] = 2 * probe.get("compute_ns", zeros) >= ends - since
    for prefix, values in (("at_", at), ("end_", at_end)):
        idle = values.get("idle_ns", zeros)
        if "idle_input_ns" in values:
            # GPU ranks: the device idling while the host waits for the DataLoader is input,
            # not host time (counted once, under input)
            idle = idle - values["idle_input_ns"]
        out[f"{prefix}compute_ns"] = values.get("compute_ns", zeros)
        out[f"{prefix}input_ns"] = values.get("input_ns", zeros)
        out[f"{prefix}idle_ns"] = idle
        out[f"{prefix}comm_ns"] = values.get("comm_exposed_ns", zeros)
    return typed(pd.DataFrame(out), POINT_COLUMNS)


def arrival_windows(points: pd.DataFrame) -> pd.DataFrame:
    """What each rank did before arriving at each collective (``WINDOW_COLUMNS``), cross-rank.

    ``points``: every rank's :func:`arrival_points`. A window runs from the rank's previous
    **sync point** to its arrival. A sync point is the end of a collective that *every* rank of it
    waited for — none kept computing while it finished (:func:`arrival_points`) — so all resumed from it
    together and their windows start alike. The end of a DDP bucket whose all-reduce ran under
    backward compute (a GPU compute stream running through an NCCL kernel's end, a CPU main thread
    busy when a gloo bucket finishes) is no sync point: a late rank's backlog runs on across it.
    An end at exactly the arrival counts (``<=``: integer-µs traces often start a kernel where
    the previous one ended). Windows stay inside the run of consecutive profiled steps holding
    the arrival (time between profiler windows was not recorded); collectives between two sync
    points share a start, and :func:`~rankscope.analysis.compute.stragglers.find_stragglers` counts each such
    group once.
    """
    if len(points) == 0:
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in WINDOW_COLUMNS.items()})
    lowest = np.iinfo(np.int64).min
    p = points.copy()
    positive = p["end"] > p["arrival"]
    nobody_busy = ~p.groupby("coll")["busy_before_end"].transform("any")
    p["is_sync"] = positive & nobody_busy & (p["end_block_start"] > lowest)
    # Every rank's rows sorted by (arrival, coll), ranks in order, and its sync points by end
    # (ties in that order): stable sorts of the whole table give each rank's own sorts; the
    # rest is numpy on each rank's rows (a pandas frame and two sorts per rank cost ~2 ms a
    # rank, 0.5 s at 256 ranks).
    p = p.sort_values(["rank", "arrival", "coll"], kind="stable")
    sync = p[p["is_sync"]].sort_values(["rank", "end"], kind="stable")
    col = {c: p[c].to_numpy(np.int64) for c in ("arrival", "stop", "block_start")}
    at_part = {part: p[f"at_{part}"].to_numpy(np.int64) for part in PARTS}
    s_all = {c: sync[c].to_numpy(np.int64) for c in ("end", "end_block_start")}
    s_part = {part: sync[f"end_{part}"].to_numpy(np.int64) for part in PARTS}
    syncs = group_positions(sync["rank"].to_numpy())
    none = np.zeros(0, np.intp)
    start = np.empty(len(p), np.int64)
    parts = {part: np.empty(len(p), np.int64) for part in PARTS}
    for rank, at in group_positions(p["rank"].to_numpy()).items():
        s_at = syncs.get(rank, none)
        # a sentinel first row, so that "no sync point yet" indexes something
        s_end = np.concatenate([[lowest], s_all["end"][s_at]])
        s_block = np.concatenate([[lowest], s_all["end_block_start"][s_at]])
        kk = np.searchsorted(s_end, col["arrival"][at], side="right") - 1
        block = col["block_start"][at]
        stop = col["stop"][at]
        # the sync point counts when it lies in the arrival's block (else: the block's start)
        same_block = (kk > 0) & (s_block[kk] == block) & (block > lowest)
        first = np.where(same_block, s_end[kk], np.where(block > lowest, block, stop))
        start[at] = np.minimum(first, stop)
        for part in PARTS:
            ends = np.concatenate([[0], s_part[part][s_at]])
            base = np.where(same_block, ends[kk], 0)
            parts[part][at] = np.where(block > lowest, np.maximum(at_part[part][at] - base, 0), 0)
    out = pd.DataFrame(
        {
            "coll": p["coll"].to_numpy(np.int64),
            "rank": p["rank"].to_numpy(np.int32),
            "step": p["step"].to_numpy(np.int64),
            "window_start": start,
            "window_end": col["stop"],
            "arrival": col["arrival"],
            **parts,
        }
    )
    return out.astype(WINDOW_COLUMNS)
