"""Per collective and rank: arrival, wait (for the last rank), transfer (the rest), lateness.

Input is the store's long collectives table (``Store.collectives()``, one row per (collective,
rank), ns on the aligned clock) and optionally the clock table (``Store.clock()``) for the
uncertainty of each rank's offset. Pure functions: the table is small (one row per collective
and rank), so this runs once, outside the per-rank Dask tasks.

Definitions (``docs/analysis.md``):

* arrival = the rank's start of the collective; last arrival = the latest arrival of all ranks
  present; wait = ``clip(last_arrival - arrival, 0, duration)``; transfer = ``duration - wait``;
  lateness = ``arrival - first arrival``.
* Clock-free cross-check: ``duration - min(duration over ranks)``. A collective finishes at about
  the same time everywhere, so the extra duration of a rank is the time it waited — no clock
  needed. When it differs from the aligned-clock wait by more than the two ranks' clock
  uncertainties plus a slack (transfer times are not exactly equal), ``clock_disagree`` is set.
* Who was last, lateness and blame use the aligned clock, except for a collective that fails the
  check on some rank while the clock uncertainty (largest of its ranks) covers half its arrival
  spread: there the clock cannot settle the order, and the clock-free arrival (median end -
  duration) is used instead (``ordered_by``), so a clock error cannot fake a straggler. ``wait_ns``
  stays on the clock.
* Point-to-point pairs (a send and its recv, ``schema.P2P_OPS``): the same wait / transfer — the
  receiver waits until the sender arrives — but no clock-free check (a send may return before its
  recv ends) and no straggler evidence (``stragglers.find_stragglers`` leaves them out).
* Wait caused (``blame_ns``): every instant a rank waits is charged in equal parts to the ranks
  that have not arrived yet, so the blame of all ranks adds up to the total (arrival-gap) wait;
  the last rank carries most of it. Each waiter's part is scaled by its wall-time / summed wait
  (:func:`wall_factor`), so concurrent collectives (DDP buckets) waiting at the same instants are
  charged once: the wait a rank caused never exceeds the time the others spent waiting.
* Per rank (:func:`wait_totals`): wait and transfer as wall time inside the profiled steps (each
  instant once), so ``wait + transfer`` never exceeds the profiled time; the sums over
  collectives (rank-time) are kept beside them as ``*_sum_ns``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.exact_reductions import group_positions

#: Fixed part of the slack allowed between the aligned-clock wait and the clock-free check, ns.
CHECK_SLACK_NS = 50_000
#: Relative part of the slack: this fraction of the fastest rank's duration (transfer jitter).
CHECK_SLACK_FRACTION = 0.25

#: Columns of :func:`collective_waits` (times int64 ns, aligned clock).
WAIT_COLUMNS: dict[str, str] = {
    "coll": "int64",
    "group": "str",
    "seq": "int64",
    "op": "str",
    "bytes": "int64",
    "rank": "int32",
    "n_ranks": "int32",  # ranks present in this collective
    "arrival": "int64",
    "end": "int64",
    "dur_ns": "int64",
    "last_arrival": "int64",
    "last_rank": "int32",  # -1 when fewer than two ranks are present
    "is_last": "bool",
    "wait_ns": "int64",
    "transfer_ns": "int64",
    "lateness_ns": "int64",
    "blame_ns": "float64",  # wait of the other ranks charged to this rank
    "check_wait_ns": "int64",  # clock-free: duration - min duration across ranks
    "uncertainty_ns": "int64",  # this rank's + the last (by clock) rank's clock uncertainty
    "clock_disagree": "bool",
    "ordered_by": "str",  # "clock" or "duration": what is_last / lateness / blame were based on
}


def collective_waits(collectives: pd.DataFrame, clock: pd.DataFrame | None = None) -> pd.DataFrame:
    """Wait, transfer, lateness and blame per (collective, rank) (``WAIT_COLUMNS``).

    ``collectives`` follows ``schema.COLLECTIVE_COLUMNS``; ``clock`` (``schema.CLOCK_COLUMNS``)
    gives ``uncertainty_ns`` per rank (0 when absent).
    """
    from rankscope.analysis.store.schema import P2P_OPS

    if len(collectives) == 0:
        return pd.DataFrame(
            {c: pd.Series(dtype=d if d != "str" else object) for c, d in WAIT_COLUMNS.items()}
        )
    df = collectives.rename(columns={"start": "arrival"}).copy()
    df["dur_ns"] = (df["end"] - df["arrival"]).clip(lower=0)
    g = df.groupby("coll", sort=False)
    df["n_ranks"] = g["rank"].transform("size").astype("int32")
    df["last_arrival"] = g["arrival"].transform("max")
    df["wait_ns"] = np.minimum(
        (df["last_arrival"] - df["arrival"]).clip(lower=0).to_numpy(), df["dur_ns"].to_numpy()
    )
    df["transfer_ns"] = df["dur_ns"] - df["wait_ns"]
    min_dur = g["dur_ns"].transform("min")
    df["check_wait_ns"] = df["dur_ns"] - min_dur
    unc = (
        clock.set_index("rank")["uncertainty_ns"].astype("int64")
        if clock is not None and len(clock)
        else pd.Series(dtype="int64")
    )
    last_by_clock = df.loc[g["arrival"].idxmax(), ["coll", "rank"]].set_index("coll")["rank"]
    own = df["rank"].map(unc).fillna(0).astype("int64")
    of_last = df["coll"].map(last_by_clock).map(unc).fillna(0).astype("int64")
    df["uncertainty_ns"] = own + of_last
    slack = CHECK_SLACK_NS + CHECK_SLACK_FRACTION * min_dur
    # The check assumes every rank's op ends together; a send may return as soon as its data is
    # handed over (gloo, small NCCL messages), so point-to-point pairs are not checked.
    checked = (df["n_ranks"] >= 2) & ~df["op"].isin(P2P_OPS)
    df["clock_disagree"] = checked & (
        (df["wait_ns"] - df["check_wait_ns"]).abs() > df["uncertainty_ns"] + slack
    )
    # Who was last, how late, and whose fault: on the aligned clock when the collective is
    # consistent with the clock-free check; otherwise from durations alone (a rank that waited
    # less arrived later: arrival ~ median end - duration), so clock errors cannot fake a straggler.
    # ...but only where the clock cannot settle it: its uncertainty covers half the arrival spread
    spread = (g["arrival"].transform("max") - g["arrival"].transform("min")).to_numpy()
    coll_unc = own.groupby(df["coll"]).transform("max").to_numpy()
    disagree_any = df.groupby("coll")["clock_disagree"].transform("any").to_numpy()
    bad = disagree_any & (2 * coll_unc >= spread)
    clock_free = (g["end"].transform("median") - df["dur_ns"]).to_numpy()
    df["order_arrival"] = np.where(bad, clock_free, df["arrival"].to_numpy())
    df["ordered_by"] = np.where(bad, "duration", "clock")
    df = df.sort_values(["coll", "order_arrival", "rank"], kind="stable").reset_index(drop=True)
    g = df.groupby("coll", sort=False)
    pos = g.cumcount().to_numpy()
    n = df["n_ranks"].to_numpy()
    is_last = (pos == n - 1) & (n >= 2)
    df["is_last"] = is_last
    last_rank = pd.Series(np.where(is_last, df["rank"].to_numpy(), -1), index=df.index)
    df["last_rank"] = last_rank.groupby(df["coll"]).transform("max").astype("int32")
    df["lateness_ns"] = df["order_arrival"] - g["order_arrival"].transform("min")
    # blame: the gap before the next arrival, L_k, is waited by k+1 ranks and shared by n-k-1
    # Concurrent collectives (DDP buckets in flight together) wait at the same instants: each
    # waiter's part is scaled by its wall-time / summed wait (``wall_factor``), so the blame of
    # all ranks adds up to wait time that really elapsed, never more than the waiters' time.
    nxt = g["order_arrival"].shift(-1)
    gap = (nxt - df["order_arrival"]).fillna(0).to_numpy(dtype=float)
    factor = df["rank"].map(wall_factor(df)).fillna(1.0).to_numpy(dtype=float)
    waiters = pd.Series(factor).groupby(df["coll"].to_numpy()).cumsum().to_numpy()
    share = np.where(pos < n - 1, gap * waiters / np.maximum(n - pos - 1, 1), 0.0)
    cum = pd.Series(share).groupby(df["coll"]).cumsum().to_numpy()
    df["blame_ns"] = np.where(n >= 2, cum - share, 0.0)
    return df[list(WAIT_COLUMNS)].astype({k: v for k, v in WAIT_COLUMNS.items() if v != "str"})


def wall_factor(waits: pd.DataFrame) -> pd.Series:
    """Per rank: wall time spent waiting / wait summed over its collectives (1 without overlap).

    The wait of each (collective, rank) is ``[arrival, arrival + wait_ns)``; concurrent
    collectives wait at the same instants, which the union counts once. Index: rank; ranks that
    never waited are left out (their factor is 1).
    """
    from rankscope.analysis.compute.breakdown import interval_measure, interval_union

    out: dict[int, float] = {}
    waiting = waits[waits["wait_ns"] > 0]
    for rank, sub in waiting.groupby("rank", sort=False):  # one pass, not a mask per rank
        arrival = sub["arrival"].to_numpy(np.int64)
        wait = sub["wait_ns"].to_numpy(np.int64)
        out[int(rank)] = interval_measure(interval_union(arrival, arrival + wait)) / int(wait.sum())
    return pd.Series(out, dtype="float64")


#: Columns of :func:`wait_totals` (ns).
TOTAL_COLUMNS = [
    "rank",
    "collectives",
    "comm_dur_ns",  # durations summed over the rank's collectives (rank-time)
    "comm_wait_sum_ns",  # waits summed over the rank's collectives
    "comm_transfer_sum_ns",
    "comm_wait_ns",  # wall time with a collective waiting for a later rank (within the spans)
    "comm_transfer_ns",  # wall time with a collective in flight and none waiting (within spans)
    "disagree",
]


def wait_totals(waits: pd.DataFrame, spans: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank: collectives, their summed durations/waits, and wall-time wait and transfer (ns).

    Summed figures are rank-time (two DDP buckets in flight together both count); the wall-time
    ``comm_wait_ns`` / ``comm_transfer_ns`` count each instant once — waiting when any
    collective of the rank is waiting for a later rank, transferring when collectives are in
    flight and none waits — so ``comm_wait_ns + comm_transfer_ns`` is the time the rank had
    communication in flight. ``spans`` (``rank``, ``start``, ``end``: the profiled step windows)
    clip them to the profiled time, so neither ever exceeds the rank's profiled total.
    """
    from rankscope.analysis.compute.breakdown import interval_union, paint

    if len(waits) == 0:
        return pd.DataFrame(columns=TOTAL_COLUMNS).astype("int64")
    out = waits.groupby("rank", sort=True).agg(
        collectives=("coll", "size"),
        comm_dur_ns=("dur_ns", "sum"),
        comm_wait_sum_ns=("wait_ns", "sum"),
        comm_transfer_sum_ns=("transfer_ns", "sum"),
        disagree=("clock_disagree", "sum"),
    )
    # each rank's rows as positions (in row order, ranks ascending: the groupby's), not a pandas
    # selection of the waits and of the spans per rank
    arrival_all = waits["arrival"].to_numpy(np.int64)
    wait_all = waits["wait_ns"].to_numpy(np.int64)
    end_all = waits["end"].to_numpy(np.int64)
    span_at: dict[Any, np.ndarray] = {}
    span_lo = span_hi = None
    if spans is not None and len(spans):
        span_at = group_positions(spans["rank"].to_numpy())
        span_lo, span_hi = spans["start"].to_numpy(np.int64), spans["end"].to_numpy(np.int64)
    none = np.zeros(0, np.intp)
    wall_wait, wall_xfer = [], []
    for rank, at in group_positions(waits["rank"].to_numpy()).items():
        arrival = arrival_all[at]
        waited = arrival + wait_all[at]
        end = np.maximum(end_all[at], arrival)
        sets = {"W": interval_union(arrival, waited), "F": interval_union(arrival, end)}
        if span_lo is not None and span_hi is not None:
            mine = span_at.get(rank, none)
            lo, hi = span_lo[mine], span_hi[mine]
        else:
            lo, hi = np.array([arrival.min()]), np.array([end.max()])
        got = paint(sets, lambda c: {"wait": c["W"], "xfer": c["F"] & ~c["W"]}, lo, hi)
        wall_wait.append(int(got["wait"].sum()) if got else 0)
        wall_xfer.append(int(got["xfer"].sum()) if got else 0)
    out["comm_wait_ns"] = wall_wait
    out["comm_transfer_ns"] = wall_xfer
    return out.reset_index()[TOTAL_COLUMNS].astype("int64")


def collective_summary(waits: pd.DataFrame) -> pd.DataFrame:
    """Per operation (allreduce, alltoall, …): count, bytes, and total duration/wait/transfer (ns).

    Durations are summed over ranks (rank-time), counts are distinct collectives.
    """
    if len(waits) == 0:
        return pd.DataFrame(
            columns=["op", "count", "bytes", "dur_ns", "wait_ns", "transfer_ns", "clock_disagree"]
        )
    # one groupby per level, no Python function per group (the same sums: pandas' own)
    per_coll = waits.groupby("coll").agg(op=("op", "first"), bytes=("bytes", "max"))
    by_op = per_coll["bytes"].clip(lower=0).groupby(per_coll["op"])
    counts = pd.DataFrame({"count": by_op.size(), "bytes": by_op.sum()})
    sums = waits.groupby("op")[["dur_ns", "wait_ns", "transfer_ns", "clock_disagree"]].sum()
    return counts.join(sums).reset_index().sort_values("dur_ns", ascending=False, ignore_index=True)
