"""How late each rank was, per profiled step, and how much of it was its own extra work: the
samples the straggler tests (:mod:`rankscope.analysis.compute.stragglers`) judge.

* :func:`step_cpu_table` / :func:`runq_excess` — the runtime's per-step run-queue delay
  (``step_cpu`` in meta.json, ns) and each rank's excess over the median rank's: the CPU time
  other processes took from it.
* :func:`unit_rows` — one row per (rank, profiled step): the rank's worst lateness behind the
  median rank in the step, as measured and less that stolen time (ns). Steps, not collectives,
  are the independent samples.
* :func:`_own_extras` / :func:`once_per_sync_interval` — per arrival, its lateness and the own
  extra work (compute, input, host time beyond the median rank's, ns) in its window, counted
  once per sync interval.

Separate from the tests because these tables are measurements — what the ranks did — while
:mod:`rankscope.analysis.compute.stragglers` holds the rules that turn them into a verdict (thresholds,
binomial test, causes); each can be read without the other.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

#: Columns of a step-CPU table (:func:`step_cpu_table`): per rank and recorded step, from the
#: runtime's ``step_cpu`` (ns): wall time, the main thread's CPU time and run-queue delay.
STEP_CPU_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "step": "int64",
    "wall_ns": "int64",
    "cpu_ns": "int64",
    "runq_ns": "int64",
}


def step_cpu_table(metas: dict[int, Any]) -> pd.DataFrame:
    """``STEP_CPU_COLUMNS`` from each rank's meta.json (``{rank: meta}``; the runtime's
    ``step_cpu``: ``{"step": [wall_ns, cpu_ns, runq_ns]}``); malformed entries are left out."""
    rows = []
    for rank, meta in metas.items():
        per_step = meta.get("step_cpu") if isinstance(meta, dict) else None
        if not isinstance(per_step, dict):
            continue
        for step, values in per_step.items():
            try:
                wall, cpu, runq = (int(v) for v in values)
                rows.append((int(rank), int(step), wall, cpu, runq))
            except (TypeError, ValueError):
                continue
    return pd.DataFrame(rows, columns=list(STEP_CPU_COLUMNS)).astype(STEP_CPU_COLUMNS)


def runq_excess(step_cpu: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per (rank, step): the run-queue delay beyond the median rank's in that step (ns), the CPU
    time other processes took from it; None without a record of at least two ranks."""
    if step_cpu is None or len(step_cpu) == 0 or step_cpu["rank"].nunique() < 2:
        return None
    t = step_cpu[["rank", "step", "runq_ns"]].copy()
    t["excess_ns"] = t["runq_ns"] - t.groupby("step")["runq_ns"].transform("median")
    return t[["rank", "step", "excess_ns"]]


#: Columns of :func:`unit_rows` (ns).
UNIT_COLUMNS = (
    "rank",
    "unit",
    "n_ranks",
    "is_last",
    "is_last_raw",
    "late",
    "late_raw",
    "contention",
)


def unit_rows(
    multi: pd.DataFrame, windows: pd.DataFrame, runq: pd.DataFrame | None
) -> pd.DataFrame:
    """One row per (rank, unit): how late the rank was at its worst moment of the unit.

    The units are the independent samples of the straggler tests: the **profiled steps** (every
    step draws its data, its work and the machine's noise anew; collectives outside the steps,
    or of a trace without steps, are units of their own). Within a step lateness carries from one
    collective to the next (a late rank is still late at the second DDP bucket), and a step can
    hold collectives after the one everybody waited for, where nobody is late any more: so a
    rank's figure for the step is its largest lateness there, and the step's last rank the one
    with the largest.

    Lateness (``late_raw``) is the arrival behind the median rank's (behind the other rank with
    two). ``contention`` is the run-queue delay the rank had beyond the median rank's in the
    arrival's step (the runtime's ``step_cpu``), capped at its lateness; ``late`` is the
    lateness of the arrivals less that delay. ``is_last``: at its worst moment the rank arrived,
    as measured, after every OTHER rank's arrival less its stolen time — another rank that only
    lost its core to other processes does not take "last" from it, and its own arrival is never
    moved (the run-queue delay of a step may have come after the arrival, when every rank woke
    at once). ``is_last_raw``: the largest lateness as measured.
    """
    w = _lateness_frame(multi, windows, runq)
    # each rank's worst moment of the unit (its largest lateness as measured)
    w = w.sort_values(["unit", "rank", "late_raw"], kind="stable")
    worst = w.groupby(["unit", "rank"], sort=False).tail(1)
    units = worst[["unit", "rank", "n_ranks", "late_raw", "contention", "last_vs_fair"]].rename(
        columns={"last_vs_fair": "is_last"}
    )
    units = units.merge(
        w.groupby(["unit", "rank"], sort=False)["late"].max().rename("late").reset_index(),
        on=["unit", "rank"],
    )
    several = units.groupby("unit")["rank"].transform("size").to_numpy() >= 2
    units["is_last"] = units["is_last"] & several
    units["is_last_raw"] = (
        units["late_raw"] >= units.groupby("unit")["late_raw"].transform("max")
    ) & several
    return units[list(UNIT_COLUMNS)]


def _lateness_frame(
    multi: pd.DataFrame, windows: pd.DataFrame, runq: pd.DataFrame | None
) -> pd.DataFrame:
    """``multi``'s rows (same order) with ``unit``, ``late_raw``, ``contention`` and ``late``
    (:func:`unit_rows`)."""
    w = multi[["coll", "rank", "arrival", "n_ranks"]].reset_index(drop=True)
    if len(windows) and "step" in windows.columns:
        w = w.merge(windows[["coll", "rank", "step"]], on=["coll", "rank"], how="left")
        w["step"] = w["step"].fillna(-1).astype(np.int64)
    else:
        w["step"] = np.int64(-1)
    step = w["step"].to_numpy(np.int64)
    w["unit"] = np.where(step >= 0, step, -1 - w["coll"].to_numpy(np.int64))
    excess = np.zeros(len(w))
    if runq is not None and len(runq):
        w = w.merge(runq, on=["rank", "step"], how="left")
        excess = w["excess_ns"].fillna(0).to_numpy(float)
    arrival = w["arrival"].to_numpy(float)
    late_raw = _behind(w, arrival)
    w["late_raw"] = late_raw
    w["contention"] = np.clip(excess, 0.0, np.maximum(late_raw, 0.0))
    corrected = arrival - w["contention"].to_numpy(float)
    w["late"] = _behind(w, corrected)
    # the latest OTHER rank at the collective, each less its stolen time
    g = w.assign(_c=corrected).groupby("coll")["_c"]
    top = g.transform("max").to_numpy(float)
    is_top = corrected >= top
    second = (
        w.assign(_c=np.where(is_top, -np.inf, corrected)).groupby("coll")["_c"].transform("max")
    ).to_numpy(float)
    tops = w.assign(_t=is_top).groupby("coll")["_t"].transform("sum").to_numpy()
    others_max = np.where(is_top & (tops == 1), second, top)
    w["last_vs_fair"] = (arrival >= others_max) & (w["n_ranks"].to_numpy() >= 2)
    return w


def _behind(w: pd.DataFrame, values: np.ndarray) -> np.ndarray:
    """``values`` behind the median rank's at each collective (with two ranks, the other's)."""
    v = w.assign(_v=values).groupby("coll")["_v"]
    n = v.transform("size").to_numpy()
    med = v.transform("median").to_numpy(float)
    other = (v.transform("sum").to_numpy(float) - values) / np.maximum(n - 1, 1)
    return values - np.where(n > 2, med, other)


class _Spread:
    """How much a column of :func:`unit_rows` moves from one step to the next within a rank: the
    pooled within-rank standard deviation, over every rank but one."""

    def __init__(self, units: pd.DataFrame, column: str) -> None:
        g = units.groupby("rank")[column]
        dev = units[column] - g.transform("mean")
        self.ss = (dev * dev).groupby(units["rank"]).sum()
        self.df = g.size() - 1
        self.total_ss, self.total_df = float(self.ss.sum()), int(self.df.sum())

    def without(self, rank: int) -> float:
        """The pooled standard deviation of the ranks other than ``rank`` (0: no degrees of
        freedom, e.g. one step)."""
        ss = self.total_ss - float(self.ss.get(rank, 0.0))
        df = self.total_df - int(self.df.get(rank, 0))
        return math.sqrt(ss / df) if df > 0 else 0.0


def _own_extras(waits: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Per (collective, rank): how much later than the median rank it arrived, counted once, and
    how much of that came from its own extra work in its window (vs the median rank), in ns.

    ``late_ns`` is the arrival's distance behind the median rank's. Lateness is a level, not a
    flow: a rank 20 ms late at the first of two DDP buckets is still 20 ms late at the second, and
    on GPUs its compute stream stays behind across buckets whose NCCL kernels have ended. So
    :func:`~rankscope.analysis.compute.stragglers.find_stragglers` counts lateness and own work once per
    sync interval
    (:func:`once_per_sync_interval`): both then count each delay once.
    """
    cols_out = [
        "coll",
        "rank",
        "unit",
        "window_start",
        "window_end",
        "is_last",
        "late_ns",
        "own_ns",
    ]
    cols_out += ["d_compute", "d_input", "d_idle", "d_comm"]
    if len(windows) == 0:
        return pd.DataFrame(columns=cols_out)
    w = waits[["coll", "rank", "is_last", "arrival"]].merge(
        windows.drop(columns=["arrival"]), on=["coll", "rank"], how="inner"
    )
    if "window_end" not in w:
        w["window_end"] = w["arrival"]
    step = w["step"].to_numpy(np.int64) if "step" in w else np.full(len(w), -1, np.int64)
    w["unit"] = np.where(step >= 0, step, -1 - w["coll"].to_numpy(np.int64))
    w["span"] = w["window_end"] - w["window_start"]
    cols = {
        "arrival": "late_ns",
        "span": "own_ns",
        "compute_ns": "d_compute",
        "input_ns": "d_input",
        "idle_ns": "d_idle",
        "comm_ns": "d_comm",
    }
    for src, dst in cols.items():
        vals = w[src].to_numpy(dtype=float)
        g = w.groupby("coll")[src]
        n = g.transform("size").to_numpy()
        # median of the OTHER ranks: leave-one-out via sorting is costly; the median of all
        # ranks is a close, robust stand-in when there are more than two ranks
        med = g.transform("median").to_numpy(dtype=float)
        other = (g.transform("sum").to_numpy(dtype=float) - vals) / np.maximum(n - 1, 1)
        ref = np.where(n > 2, med, other)
        w[dst] = vals - ref
    return w[cols_out]


def once_per_sync_interval(mine: pd.DataFrame) -> pd.DataFrame:
    """One row per sync interval of one rank's rows of :func:`_own_extras`.

    Collectives between two sync points share their window's start: their windows are nested,
    and the rank's lateness carries from one to the next (still 20 ms late at the second DDP
    bucket is the same 20 ms). Each interval keeps its largest window where the rank was last —
    the most of its own work that was measured before an arrival — so summed over intervals
    lateness and own work count each delay once and stay within the rank's profiled time.
    """
    if len(mine) == 0 or "window_start" not in mine:
        return mine
    order = mine.sort_values(["window_start", "window_end"], kind="stable")
    return order.groupby("window_start", sort=False).tail(1)
