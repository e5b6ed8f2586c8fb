"""The whole run's steps (issue 30): the job's step time at every step, how far apart the ranks
are, the run's KPIs over every step, where the profiler windows were and what the live monitor
noticed — from every rank's step log (``Store.step_log``; schema.STEP_LOG_COLUMNS).

Definitions (ms are milliseconds; a *step* is the step log's count, ``steps`` = 1 for the first
step, i.e. ``ProfilerStep#N`` is step N + 1):

* **a rank's step time** at step s: its end of s minus its end of s − 1 (only when it recorded
  both: a rank's first step and a step after a gap in its log have none).
* **the job's step time** at step s (``step_ms``): the latest end of s over the ranks minus the
  latest end of s − 1. A synchronous job's step ends when its last rank ends it, so this is the
  step as the job sees it; over the run it telescopes to the run's length (the sum over steps is
  the time from the first timed step's start to the last step's end), so no step's time is lost
  or counted twice. The per-rank step times are kept for the spread.
* **spread** at step s (``spread_ms``): latest minus earliest end of s over the ranks (how far
  apart they finished it); ``slowest_rank``: the rank that ended it last.

The series is built one rank at a time (:func:`run_steps` reads each rank's log twice, once for
the job's series and once for the plot's bins) so that memory holds the job's series (~40 bytes
per step) and one rank's log, never every rank's: 1,024 ranks × 100,000 steps would be 2.4 GB.

The plot (:data:`BIN_COLUMNS`) bins the steps into at most :data:`PLOT_BINS` consecutive ranges
of steps: every step is in exactly one bin, with its job step time summed there
(``job_sum_ms``, ``job_steps``) and each rank's summed into that rank's row of
:data:`RANK_BIN_COLUMNS`; a bin's min / median / max across ranks are of the ranks' mean step
time in the bin. Sums and counts equal the input's, whatever the run's length.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.store.frames import empty

#: Most bins of the whole run's step-time plot (a run of 100,000 steps draws 200 points a line).
PLOT_BINS = 200
#: Columns of :attr:`RunSteps.job`: one row per step some rank recorded.
JOB_STEP_COLUMNS: dict[str, str] = {
    "step": "int64",  # the step log's count (1: the first step)
    "end": "int64",  # ns, aligned: when the last rank ended the step
    "step_ms": "float64",  # the job's step time (module docstring), NaN for the first / after a gap
    "spread_ms": "float64",  # latest - earliest end of the step over the ranks, ms
    "slowest_rank": "int32",  # the rank that ended the step last
    "ranks": "int32",  # ranks that recorded the step
    "wait_ms": "float64",  # mean over ranks of the step's collective wait, ms (NaN: unknown)
}
#: Columns of :attr:`RunSteps.rank_bins`: one row per (rank, plot bin) with steps in it.
RANK_BIN_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "bin": "int32",
    "steps": "int64",  # the rank's step times in the bin
    "sum_ms": "float64",  # their sum, ms
}
#: Columns of :attr:`RunSteps.bins`: one row per plot bin.
BIN_COLUMNS: dict[str, str] = {
    "bin": "int32",
    "first_step": "int64",  # the bin's steps: first_step..last_step (inclusive)
    "last_step": "int64",
    "job_steps": "int64",  # job step times in the bin
    "job_sum_ms": "float64",  # their sum, ms
    "job_mean_ms": "float64",  # job_sum_ms / job_steps (NaN without any)
    "min_ms": "float64",  # across ranks: the fastest rank's mean step time in the bin, ms
    "median_ms": "float64",  # the median rank's
    "max_ms": "float64",  # the slowest rank's
    "slowest_rank": "int32",  # the rank with max_ms (-1 without any)
}
#: Columns of :attr:`RunSteps.windows`: one row per profiler window, in step order.
RUN_WINDOW_COLUMNS: dict[str, str] = {
    "window": "int32",  # the window's index (meta.json ``windows[].index``)
    "first_step": "int64",  # its steps, on the step log's count (ProfilerStep#N is N + 1)
    "last_step": "int64",
    "ranks": "int32",  # ranks that recorded it
    "triggered": "bool",  # asked for by the live monitor (meta.json ``trigger``)
    "trigger": "int64",  # its trigger id, -1 for a scheduled window
    "reason": "str",  # why it was triggered ("" for a scheduled window)
}
#: Columns of :attr:`RunSteps.rank_totals`: one row per rank with a step log.
RANK_TOTAL_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "steps": "int64",  # step times the rank has (consecutive pairs of its log)
    "mean_ms": "float64",
    "p50_ms": "float64",
    "p99_ms": "float64",
}


@dataclasses.dataclass
class RunSteps:
    """Every step of the run (module docstring); empty frames for runs without step logs."""

    job: pd.DataFrame
    """One row per step: JOB_STEP_COLUMNS."""
    bins: pd.DataFrame
    """The plot's bins: BIN_COLUMNS."""
    rank_bins: pd.DataFrame
    """Per rank and bin: RANK_BIN_COLUMNS."""
    rank_totals: pd.DataFrame
    """Per rank: RANK_TOTAL_COLUMNS."""
    windows: pd.DataFrame
    """The profiler windows: RUN_WINDOW_COLUMNS."""
    changes: pd.DataFrame
    """What the live monitor noticed (schema.CHANGE_COLUMNS)."""

    @property
    def present(self) -> bool:
        """The run has a step series (some rank kept a step log with two steps or more)."""
        return bool(self.job["step_ms"].notna().any()) if len(self.job) else False


def _frame(data: Any, columns: Mapping[str, str]) -> pd.DataFrame:
    """``data`` (columns, dict rows or tuple rows in ``columns``' order) typed by ``columns``
    (text as object). No rows (most runs: no step logs): built directly, the same frame."""
    kinds = {k: ("object" if v == "str" else v) for k, v in columns.items()}
    if isinstance(data, list) and not data:
        return empty(kinds)
    frame = pd.DataFrame(data, columns=list(columns))
    return frame.astype(kinds)


def no_steps() -> RunSteps:
    """The :class:`RunSteps` of a run without step logs."""
    from rankscope.analysis.store.schema import CHANGE_COLUMNS

    return RunSteps(
        job=_frame([], JOB_STEP_COLUMNS),
        bins=_frame([], BIN_COLUMNS),
        rank_bins=_frame([], RANK_BIN_COLUMNS),
        rank_totals=_frame([], RANK_TOTAL_COLUMNS),
        windows=_frame([], RUN_WINDOW_COLUMNS),
        changes=_frame([], CHANGE_COLUMNS),
    )


def rank_step_times(log: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(steps, ms) of one rank's log: the step time of every step whose previous step the rank
    also recorded (a step after a gap in the log has none)."""
    steps = log["steps"].to_numpy(np.int64)
    end = log["end"].to_numpy(np.int64)
    if len(steps) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    follows = np.diff(steps) == 1
    return steps[1:][follows], (np.diff(end)[follows] / 1e6).astype(np.float64)


def bin_of(steps: np.ndarray, first: int, last: int, bins: int) -> np.ndarray:
    """The plot bin of each step of ``first..last`` cut into ``bins`` consecutive ranges."""
    span = last - first + 1
    return ((np.asarray(steps, np.int64) - first) * bins // span).astype(np.int64)


def run_steps(
    ranks: Sequence[int],
    read: Callable[[int], pd.DataFrame],
    windows: Mapping[int, Any] | None = None,
    changes: pd.DataFrame | None = None,
    plot_bins: int = PLOT_BINS,
) -> RunSteps:
    """The whole run's steps from each rank's log (``read(rank)``: schema.STEP_LOG_COLUMNS),
    its profiler windows (``windows``: rank -> meta.json ``windows`` list) and the live
    monitor's changes (module docstring for the definitions)."""
    out = no_steps()
    if changes is not None:
        out.changes = changes.reset_index(drop=True)
    out.windows = run_windows(windows or {})
    # Pass 1: the job's series, indexed by step (grown as ranks with longer logs come).
    size = 0
    latest = np.zeros(0, np.int64)
    earliest = np.zeros(0, np.int64)
    slowest = np.zeros(0, np.int32)
    count = np.zeros(0, np.int32)
    wait_sum = np.zeros(0, np.float64)
    wait_n = np.zeros(0, np.int32)
    totals = []
    timed: list[int] = []
    for rank in ranks:
        log = read(rank)
        if not len(log):
            continue
        steps = log["steps"].to_numpy(np.int64)
        end = log["end"].to_numpy(np.int64)
        top = int(steps.max()) + 1
        if top > size:
            grow = top - size
            latest = np.concatenate([latest, np.full(grow, np.iinfo(np.int64).min)])
            earliest = np.concatenate([earliest, np.full(grow, np.iinfo(np.int64).max)])
            slowest = np.concatenate([slowest, np.full(grow, -1, np.int32)])
            count = np.concatenate([count, np.zeros(grow, np.int32)])
            wait_sum = np.concatenate([wait_sum, np.zeros(grow)])
            wait_n = np.concatenate([wait_n, np.zeros(grow, np.int32)])
            size = top
        later = end > latest[steps]  # steps are unique within a rank's log
        latest[steps[later]] = end[later]
        slowest[steps[later]] = rank
        earliest[steps] = np.minimum(earliest[steps], end)
        count[steps] += 1
        wait = log["wait"].to_numpy(np.int64)
        known = wait >= 0
        wait_sum[steps[known]] += wait[known] / 1e6
        wait_n[steps[known]] += 1
        s, ms = rank_step_times(log)
        if len(ms):
            timed.append(int(rank))
            p50, p99 = np.percentile(ms, [50, 99])
            totals.append((int(rank), len(ms), float(ms.mean()), float(p50), float(p99)))
    out.rank_totals = _frame(totals, RANK_TOTAL_COLUMNS)
    have = np.flatnonzero(count > 0)
    if not len(have):
        return out
    prev_ok = np.zeros(len(have), bool)
    prev_ok[1:] = np.diff(have) == 1
    step_ms = np.full(len(have), np.nan)
    ends = latest[have]
    step_ms[1:] = np.where(prev_ok[1:], np.diff(ends) / 1e6, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        wait_ms = np.where(wait_n[have] > 0, wait_sum[have] / np.maximum(wait_n[have], 1), np.nan)
    out.job = _frame(
        {
            "step": have,
            "end": ends,
            "step_ms": step_ms,
            "spread_ms": (ends - earliest[have]) / 1e6,
            "slowest_rank": slowest[have],
            "ranks": count[have],
            "wait_ms": wait_ms,
        },
        JOB_STEP_COLUMNS,
    )
    # Pass 2: the plot's bins over the steps that have a time (the job's or a rank's).
    first, last = int(have[0]), int(have[-1])
    n_bins = max(1, min(plot_bins, last - first + 1))
    rank_rows = []
    for rank in timed:
        s, ms = rank_step_times(read(rank))
        b = bin_of(s, first, last, n_bins)
        n = np.bincount(b, minlength=n_bins)
        total = np.bincount(b, weights=ms, minlength=n_bins)
        used = np.flatnonzero(n)
        rank_rows.append(
            pd.DataFrame(
                {"rank": np.int32(rank), "bin": used, "steps": n[used], "sum_ms": total[used]}
            )
        )
    out.rank_bins = (
        pd.concat(rank_rows, ignore_index=True) if rank_rows else _frame([], RANK_BIN_COLUMNS)
    ).astype(RANK_BIN_COLUMNS)
    out.bins = _bins(out.job, out.rank_bins, first, last, n_bins)
    return out


def _bins(
    job: pd.DataFrame, rank_bins: pd.DataFrame, first: int, last: int, n_bins: int
) -> pd.DataFrame:
    """BIN_COLUMNS from the job's series and the per-rank sums."""
    edges = first + (np.arange(n_bins + 1) * (last - first + 1) + n_bins - 1) // n_bins
    timed = job[job["step_ms"].notna()]
    jb = bin_of(timed["step"].to_numpy(np.int64), first, last, n_bins)
    job_n = np.bincount(jb, minlength=n_bins)
    job_sum = np.bincount(jb, weights=timed["step_ms"].to_numpy(np.float64), minlength=n_bins)
    lo = np.full(n_bins, np.nan)
    mid = np.full(n_bins, np.nan)
    hi = np.full(n_bins, np.nan)
    worst = np.full(n_bins, -1, np.int32)
    if len(rank_bins):
        rb = rank_bins.assign(mean=rank_bins["sum_ms"] / rank_bins["steps"])
        for b, g in rb.groupby("bin", sort=True):
            means = g["mean"].to_numpy(np.float64)
            lo[int(b)], mid[int(b)], hi[int(b)] = means.min(), np.median(means), means.max()
            worst[int(b)] = int(g["rank"].to_numpy()[int(np.argmax(means))])
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(job_n > 0, job_sum / np.maximum(job_n, 1), np.nan)
    return _frame(
        {
            "bin": np.arange(n_bins),
            "first_step": edges[:-1],
            "last_step": edges[1:] - 1,
            "job_steps": job_n,
            "job_sum_ms": job_sum,
            "job_mean_ms": mean,
            "min_ms": lo,
            "median_ms": mid,
            "max_ms": hi,
            "slowest_rank": worst,
        },
        BIN_COLUMNS,
    )


def run_windows(windows: Mapping[int, Any]) -> pd.DataFrame:
    """RUN_WINDOW_COLUMNS from each rank's meta.json ``windows`` records (rank -> list; a
    record's ``first_step`` / ``last_step`` are profiler step numbers, shifted by one onto the
    step log's count; ``trigger`` {id, reason} marks a triggered window)."""
    spans: dict[int, dict[str, Any]] = {}
    for records in windows.values():
        for w in records if isinstance(records, list) else []:
            if not isinstance(w, dict) or "index" not in w or "last_step" not in w:
                continue
            try:
                i = int(w["index"])
                last = int(w["last_step"]) + 1
                given = w.get("first_step")
                first = int(given) + 1 if given is not None else last
            except (TypeError, ValueError):
                continue  # a record this reader does not understand: not a window to mark
            row = spans.setdefault(
                i,
                {"window": i, "first_step": first, "last_step": last, "ranks": 0,
                 "triggered": False, "trigger": -1, "reason": ""},
            )  # fmt: skip
            row["first_step"] = min(row["first_step"], first)
            row["last_step"] = max(row["last_step"], last)
            row["ranks"] += 1
            trig = w.get("trigger")
            if isinstance(trig, dict):
                row["triggered"] = True
                row["trigger"] = int(trig.get("id", -1))
                row["reason"] = str(trig.get("reason") or "")
    rows = sorted(spans.values(), key=lambda r: (r["first_step"], r["window"]))
    return _frame(rows, RUN_WINDOW_COLUMNS)


@dataclasses.dataclass(frozen=True)
class RunKpis:
    """The whole run's step time, every step a sample (summary.json ``run_steps``)."""

    steps: int
    """Job step times behind the figures (steps with a previous step on some rank)."""
    ranks: int
    """Ranks whose step log entered."""
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    """The job's step time over those steps, ms per step."""
    timed_s: float
    """The steps' summed job step time, s (the run's length from its first timed step)."""
    steps_per_s: float
    """Steps per second over the timed steps (steps / timed_s)."""
    samples_per_s: float | None
    """The job's samples (or tokens) per second: samples per step per rank × ranks × steps_per_s;
    None when the samples per step are unknown."""
    spread_p50_ms: float
    """Median over the steps of how far apart the ranks finished a step, ms."""


def run_kpis(rs: RunSteps, samples_per_step: float | None = None) -> RunKpis | None:
    """The run's KPIs over every step (None without a step series). ``samples_per_step``: one
    rank's samples per step (the run's constant, when known)."""
    if not rs.present:
        return None
    ms = rs.job["step_ms"].dropna().to_numpy(np.float64)
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    timed_s = float(ms.sum()) / 1e3
    per_s = len(ms) / timed_s if timed_s > 0 else math.nan
    ranks = len(rs.rank_totals)
    return RunKpis(
        steps=len(ms),
        ranks=ranks,
        p50_ms=float(p50),
        p90_ms=float(p90),
        p99_ms=float(p99),
        mean_ms=float(ms.mean()),
        timed_s=timed_s,
        steps_per_s=per_s,
        samples_per_s=samples_per_step * ranks * per_s if samples_per_step else None,
        spread_p50_ms=float(rs.job["spread_ms"].median()),
    )


def job_samples(rs: RunSteps) -> pd.DataFrame:
    """The job's step time per step in s (columns step, value): the samples ``rankscope
    compare`` tests for the whole run (every step one sample)."""
    timed = rs.job[rs.job["step_ms"].notna()]
    return pd.DataFrame(
        {
            "step": timed["step"].to_numpy(np.int64),
            "value": timed["step_ms"].to_numpy(np.float64) / 1e3,
        }
    )
