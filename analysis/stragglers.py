"""Which rank holds the others back, how sure we are, and why it was late.

Two steps, matching how the pipeline runs them:

1. :func:`arrival_windows` — per rank (a Dask task over ONE rank's events): for each collective,
   what the rank did between the end of its previous collective and its arrival (compute, input,
   host/idle, exposed communication), in ns.
2. :func:`find_stragglers` — across ranks, on the small tables: how often each rank was last,
   the wait it caused the others (seconds), a one-sided binomial test of "last this often by
   chance" (chance = 1/ranks per collective), and the likely cause.

A balanced run still has a last rank at every collective; a straggler must be both *significant*
(p ≤ ``ALPHA``), *consistent* (last at ``MIN_LAST_FRACTION`` of its collectives or more) and
*material*: it caused a clearly unfair share of all waiting
(:func:`min_wait_share`: halfway between its fair share ``1/ranks`` and all of it), and that wait
is at least ``MIN_RUN_FRACTION`` of the profiled time of the ranks that waited.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

#: Significance level of the binomial test (one-sided, "last more often than chance").
ALPHA = 0.05
#: A straggler is last at no fewer than this fraction of its collectives (a systematic delay is
#: last nearly always; CPU contention on an oversubscribed machine moves "last" around).
MIN_LAST_FRACTION = 0.75
#: ... and the wait it caused, per waiting rank, is at least this fraction of the profiled time.
MIN_RUN_FRACTION = 0.03
#: Lateness counts as the rank's own when its own extra work explains at least this much of it.
OWN_FRACTION = 0.5
#: Cap of the score (-log10 p) so that p == 0 stays finite in JSON.
MAX_SCORE = 300.0


class Cause(enum.StrEnum):
    """Why a rank arrived late."""

    OWN_COMPUTE = "own compute"
    INPUT = "input"
    HOST = "host"
    PROPAGATED = "propagated"
    UNKNOWN = "unknown"


#: Columns of :func:`arrival_windows` (ns).
WINDOW_COLUMNS: dict[str, str] = {
    "coll": "int64",
    "rank": "int32",
    "step": "int64",  # profiled step holding the arrival; -1: outside every profiled step
    "window_start": "int64",  # latest sync point, own previous arrival or start of the steps
    "window_end": "int64",  # the arrival (or the end of the profiled step holding it)
    "arrival": "int64",
    "compute_ns": "int64",
    "input_ns": "int64",
    "idle_ns": "int64",  # host gaps (CPU) / GPU idle waiting for launches (GPU)
    "comm_ns": "int64",  # exposed communication (earlier collectives still running)
}

#: Columns of :func:`find_stragglers`.
STRAGGLER_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "collectives": "int64",
    "times_last": "int64",
    "expected_last": "float64",
    "p_value": "float64",
    "score": "float64",  # -log10(p_value)
    "confidence": "float64",  # 1 - p_value
    "wait_caused_s": "float64",
    "wait_share": "float64",  # of everybody's wait
    "mean_lateness_s": "float64",
    "late_s": "float64",  # lateness vs the median rank where it was last, once per step
    "own_extra_s": "float64",  # extra own work before arriving, summed where it was last
    "compute_extra_s": "float64",
    "input_extra_s": "float64",
    "host_extra_s": "float64",
    "cause": "str",
    "is_straggler": "bool",
}


def arrival_windows(
    coll_rows: pd.DataFrame,
    measure: Any,
    steps: pd.DataFrame,
    rank: int = 0,
) -> pd.DataFrame:
    """What ``rank`` did before arriving at each of its collectives (``WINDOW_COLUMNS``).

    ``coll_rows``: this rank's rows of ``Store.collectives()`` (``coll``, ``start``, ``end``, and
    ``op`` when known);
    ``measure``: the rank's painter (:func:`rankscope.analysis.breakdown.painter`);
    ``steps``: its step windows (:func:`rankscope.analysis.breakdown.step_windows`), used to
    start the window of the first collective at the start of its step.

    A window starts at the latest of: the previous sync point (the end of a collective that
    finished before this arrival: every rank leaves it together), the rank's own previous
    arrival (collectives in flight together, e.g. DDP buckets, get consecutive windows, so no
    instant is counted twice), and the start of the run of consecutive profiled steps holding
    the arrival (time between profiler windows was not recorded). Windows are thus disjoint and
    inside the profiled time: their sum never exceeds the rank's profiled total. ``step`` is the
    profiled step holding the arrival (lateness is judged once per step, :func:`find_stragglers`).
    """
    import numpy as np
    import pandas as pd

    lowest = np.iinfo(np.int64).min
    rows = coll_rows.sort_values(["start", "coll"], kind="stable")
    arrival = rows["start"].to_numpy(np.int64)
    ends = rows["end"].to_numpy(np.int64)
    colls = rows["coll"].to_numpy(np.int64)
    # the previous sync point: the latest end of a collective that finished before this arrival
    sorted_ends = np.sort(ends)
    k = np.searchsorted(sorted_ends, arrival, side="left") - 1
    prev_end = np.where(k >= 0, sorted_ends[np.maximum(k, 0)], lowest)
    # the rank's own previous arrival at a collective (rows are in arrival order); point-to-point
    # ops keep the sync point alone: a batched isend/irecv pair is posted together, and the work
    # before the send is what a pipeline's bottleneck test measures
    from rankscope.analysis.schema import P2P_OPS

    is_p2p = rows["op"].isin(P2P_OPS).to_numpy() if "op" in rows else np.zeros(len(rows), bool)
    prev_arrival = np.full(len(arrival), lowest, np.int64)
    coll_idx = np.flatnonzero(~is_p2p)
    if len(coll_idx) > 1:
        prev_arrival[coll_idx[1:]] = arrival[coll_idx[:-1]]
    step_of = np.full(len(arrival), -1, np.int64)
    real_steps = steps[steps["step"] >= 0] if len(steps) else steps
    block_start = np.full(len(arrival), lowest, np.int64)
    step_end = np.full(len(arrival), np.iinfo(np.int64).max, np.int64)
    if len(real_steps):
        st = real_steps.sort_values("start", kind="stable")
        s_start = st["start"].to_numpy(np.int64)
        s_end = st["end"].to_numpy(np.int64)
        s_num = st["step"].to_numpy(np.int64)
        # a block is a run of consecutive step numbers: the start of its first step
        new_block = np.ones(len(s_num), bool)
        new_block[1:] = s_num[1:] != s_num[:-1] + 1
        first = np.maximum.accumulate(np.where(new_block, np.arange(len(s_num)), 0))
        idx = np.searchsorted(s_start, arrival, side="right") - 1
        inside = idx >= 0
        block_start = np.where(inside, s_start[first[np.maximum(idx, 0)]], lowest)
        # an arrival after the last profiled step of its block is measured up to that step's end
        step_end = np.where(inside, s_end[np.maximum(idx, 0)], arrival)
        step_of = np.where(inside & (arrival <= step_end), s_num[np.maximum(idx, 0)], -1)
    sync_or_own = np.maximum(prev_end, prev_arrival)
    start = np.maximum(sync_or_own, block_start)
    no_start = start == lowest
    stop = np.minimum(arrival, step_end)
    start = np.where(no_start, stop, np.minimum(start, stop))
    out = pd.DataFrame(
        {
            "coll": colls,
            "rank": np.full(len(rows), rank, np.int32),
            "step": step_of,
            "window_start": start,
            "window_end": stop,
            "arrival": arrival,
        }
    )
    values = measure(start, stop) if len(out) else {}
    for col in ("compute_ns", "input_ns", "idle_ns"):
        out[col] = values.get(col, np.zeros(len(out), np.int64))
    out["comm_ns"] = values.get("comm_exposed_ns", np.zeros(len(out), np.int64))
    return out.astype(WINDOW_COLUMNS)


def min_wait_share(world: int) -> float:
    """Share of everybody's wait a straggler must have caused in a job of ``world`` ranks.

    Halfway between the fair share ``1/world`` and all of it: ``(1 + 1/world) / 2`` — 0.75 for
    2 ranks, 0.625 for 4, 0.5625 for 8, about one half for large jobs.
    """
    w = max(world, 2)
    return (1 + 1 / w) / 2


def binomial_p_value(times_last: int, collectives: int, chance: float) -> float:
    """P(X >= times_last) for X ~ Binomial(collectives, chance): last this often by luck."""
    from scipy.stats import binom

    if collectives <= 0 or times_last <= 0:
        return 1.0
    return float(binom.sf(times_last - 1, collectives, chance))


def find_stragglers(
    waits: pd.DataFrame,
    windows: pd.DataFrame,
    profiled_ns: pd.Series | None = None,
) -> pd.DataFrame:
    """Per rank: times last, wait caused, significance, cause; most significant first.

    ``waits``: :func:`rankscope.analysis.collectives.collective_waits`; ``windows``: all ranks'
    :func:`arrival_windows`; ``profiled_ns``: profiled time per rank (index rank), for the
    materiality test (when absent, only significance and wait share count).
    """
    import pandas as pd
    from rankscope.analysis.schema import P2P_OPS

    # Point-to-point pairs are left out: in a pipeline the earlier stage is "last" at every
    # recv of the next one by construction (the bubble), which says nothing about stragglers.
    multi = waits[(waits["n_ranks"] >= 2) & ~waits["op"].isin(P2P_OPS)]
    if len(multi) == 0:
        return pd.DataFrame(
            {c: pd.Series(dtype=d if d != "str" else object) for c, d in STRAGGLER_COLUMNS.items()}
        )
    # blame is split from arrival gaps, so its total (not the duration-capped waits) is the base
    total_wait = float(multi["blame_ns"].sum())
    extras = _own_extras(multi, windows)
    median_profiled = (
        float(profiled_ns.median()) if profiled_ns is not None and len(profiled_ns) else 0.0
    )
    rows: list[dict[str, Any]] = []
    for rank, sub in multi.groupby("rank", sort=True):
        n = len(sub)
        k = int(sub["is_last"].sum())
        chance = float((1.0 / sub["n_ranks"]).mean())
        p = binomial_p_value(k, n, chance)
        blame = float(sub["blame_ns"].sum())
        mine = extras[(extras["rank"] == rank) & extras["is_last"]] if len(extras) else extras
        late = lateness_once_per_step(mine)
        own = float(mine["own_ns"].clip(lower=0).sum()) if len(mine) else 0.0
        parts = {
            Cause.OWN_COMPUTE: float(mine["d_compute"].clip(lower=0).sum()) if len(mine) else 0.0,
            Cause.INPUT: float(mine["d_input"].clip(lower=0).sum()) if len(mine) else 0.0,
            Cause.HOST: float(mine["d_idle"].clip(lower=0).sum()) if len(mine) else 0.0,
            Cause.PROPAGATED: float(mine["d_comm"].clip(lower=0).sum()) if len(mine) else 0.0,
        }
        if k == 0 or late <= 0:
            cause = Cause.UNKNOWN
        elif own < OWN_FRACTION * late:
            cause = Cause.PROPAGATED
        else:
            cause = max(parts, key=lambda c: parts[c])
            if parts[cause] <= 0:
                cause = Cause.UNKNOWN
        others = max(int(sub["n_ranks"].max()) - 1, 1)
        share = blame / total_wait if total_wait > 0 else 0.0
        material = median_profiled <= 0 or blame / others >= MIN_RUN_FRACTION * median_profiled
        rows.append(
            {
                "rank": int(rank),
                "collectives": n,
                "times_last": k,
                "expected_last": chance * n,
                "p_value": p,
                "score": min(max(-math.log10(p), 0.0), MAX_SCORE) if p > 0 else MAX_SCORE,
                "confidence": 1.0 - p,
                "wait_caused_s": blame / 1e9,
                "wait_share": share,
                "mean_lateness_s": float(sub["lateness_ns"].mean()) / 1e9,
                "late_s": late / 1e9,
                "own_extra_s": own / 1e9,
                "compute_extra_s": parts[Cause.OWN_COMPUTE] / 1e9,
                "input_extra_s": parts[Cause.INPUT] / 1e9,
                "host_extra_s": parts[Cause.HOST] / 1e9,
                "cause": str(cause),
                "is_straggler": bool(
                    p <= ALPHA
                    and k >= MIN_LAST_FRACTION * n
                    and share >= min_wait_share(others + 1)
                    and material
                    and k > 0
                ),
            }
        )
    out = pd.DataFrame(rows)
    out = out.sort_values(
        ["is_straggler", "score", "wait_caused_s"], ascending=[False, False, False]
    )
    return out.reset_index(drop=True).astype(
        {k: v for k, v in STRAGGLER_COLUMNS.items() if v != "str"}
    )


def _own_extras(waits: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Per (collective, rank): how much later than the median rank it arrived, counted once, and
    how much of that came from its own extra work in its window (vs the median rank), in ns.

    ``late_ns`` is the arrival's distance behind the median rank's. Lateness is a level, not a
    flow: a rank 20 ms late at the first of two DDP buckets is still 20 ms late at the second, and
    on GPUs its compute stream stays behind across buckets whose NCCL kernels have ended. So
    :func:`find_stragglers` counts it once per profiled step (its largest value in the step),
    and ``own_ns`` compares the rank's disjoint windows: both then count each delay once.
    """
    import numpy as np
    import pandas as pd

    cols_out = ["coll", "rank", "step", "is_last", "late_ns", "own_ns", "d_compute", "d_input"]
    cols_out += ["d_idle", "d_comm"]
    if len(windows) == 0:
        return pd.DataFrame(columns=cols_out)
    w = waits[["coll", "rank", "is_last", "arrival"]].merge(
        windows.drop(columns=["arrival"]), on=["coll", "rank"], how="inner"
    )
    if "step" not in w:
        w["step"] = -1  # windows from elsewhere: each collective stands alone
    if "window_end" not in w:
        w["window_end"] = w["arrival"]
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


def lateness_once_per_step(mine: pd.DataFrame) -> float:
    """Lateness (ns) over the collectives in ``mine`` (one rank's rows of :func:`_own_extras`),
    counted once per profiled step: the largest ``late_ns`` of each step, summed; rows outside
    every profiled step (``step`` -1) count one by one."""
    if len(mine) == 0:
        return 0.0
    late = mine["late_ns"].clip(lower=0)
    inside = mine["step"] >= 0
    per_step = late[inside].groupby(mine.loc[inside, "step"]).max().sum()
    return float(per_step + late[~inside].sum())


# -- pipelines: point-to-point pairs -----------------------------------------------------------

#: Receiver waits shorter than this (ns) are not traced back (scheduling noise, not a stage).
MIN_P2P_WAIT_NS = 50_000
#: A pipeline bottleneck is the root of at least this many receivers' waits.
MIN_ROOT_PAIRS = 3
#: ... and of at least this share of all the waiting in recvs.
MIN_ROOT_SHARE = 0.5

#: Columns of :func:`p2p_roots`: one row per (send, recv) pair (ns).
ROOT_COLUMNS: dict[str, str] = {
    "coll": "int64",
    "sender": "int32",
    "receiver": "int32",
    "wait_ns": "int64",  # the receiver's wait for the sender
    "extra_ns": "int64",  # the sender's own work before sending, beyond the typical stage's
    "root": "int32",  # rank whose own extra work the wait traces back to; -1 none
    "caused_ns": "int64",  # part of the wait charged to the root: min(wait, the root's extra)
    "via": "int32",  # pairs followed upstream to reach the root (0: the sender itself)
}

#: Columns of :func:`pipeline_stages` (seconds where ``_s``).
PIPELINE_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "sends": "int64",
    "root_pairs": "int64",  # receivers' waits that trace back to this rank
    "wait_traced_s": "float64",  # those waits, in full
    "wait_share": "float64",  # wait_traced_s / all the waiting in recvs
    "wait_caused_s": "float64",  # the part of them its own extra work explains
    "compute_extra_s": "float64",  # summed over its sends where it is the root
    "input_extra_s": "float64",
    "host_extra_s": "float64",
    "cause": "str",
    "is_bottleneck": "bool",
}


def _typical_stage(sends: pd.DataFrame, col: str) -> float:
    """The typical stage's ``col`` over send windows: median over ranks of each rank's median.

    Per rank first, so that one slow stage — however many sends it has — cannot move it.
    """
    return float(sends.groupby("rank")[col].median().median())


def p2p_roots(waits: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Trace each receiver's wait back to the pipeline stage whose own extra work caused it.

    A receiver waits because its sender sent late. The sender's *own* work before sending (its
    arrival window: compute + input + host time since its previous sync point) is compared with
    the typical stage's — the median over ranks of each rank's median send window, so one slow
    stage cannot move the reference. When that extra explains at least ``OWN_FRACTION`` of the
    wait, the sender is the root. Otherwise the sender was late because it was itself waiting:
    if its previous sync point is a recv in which it waited, the root of that pair is the root
    of this one (followed pair by pair, in time order), else the wait is the pipeline's schedule
    and has no root (-1) — the bubble of a balanced pipeline traces back to nobody.
    """
    import numpy as np
    import pandas as pd
    from rankscope.analysis.schema import P2P_OPS

    empty = pd.DataFrame({c: pd.Series(dtype=d) for c, d in ROOT_COLUMNS.items()})
    pairs = waits[waits["op"].isin(P2P_OPS) & (waits["n_ranks"] == 2)]
    send = pairs[pairs["op"] == "send"].set_index("coll")
    recv = pairs[pairs["op"] == "recv"].set_index("coll")
    both = send.index.intersection(recv.index)
    if len(both) == 0:
        return empty
    send, recv = send.loc[both], recv.loc[both]
    own = send[["rank", "arrival"]].reset_index()
    parts = ["compute_ns", "input_ns", "idle_ns"]
    if len(windows):
        own = own.merge(windows[["coll", "rank", *parts]], on=["coll", "rank"], how="left")
    for p in parts:
        own[p] = own[p].fillna(0) if p in own else 0
    own["own_ns"] = own[parts].sum(axis=1)
    own["extra_ns"] = own["own_ns"] - _typical_stage(own, "own_ns")
    own = own.set_index("coll")
    table = pd.DataFrame(
        {
            "coll": both.to_numpy(np.int64),
            "sender": send["rank"].to_numpy(np.int32),
            "receiver": recv["rank"].to_numpy(np.int32),
            "wait_ns": recv["wait_ns"].to_numpy(np.int64),
            "extra_ns": own.loc[both, "extra_ns"].to_numpy(np.float64).round().astype(np.int64),
            "arrival": send["arrival"].to_numpy(np.int64),
        }
    ).sort_values("arrival", kind="stable")
    # each rank's sync points (ends of all its collectives and pairs), to find what a sender
    # last waited in before it sent
    ends = {
        int(r): (g["end"].to_numpy(np.int64), g["coll"].to_numpy(np.int64))
        for r, g in waits.sort_values("end", kind="stable").groupby("rank")
    }
    waited_in = {
        (int(c), int(r)): int(w)
        for c, r, w in recv.reset_index()[["coll", "rank", "wait_ns"]].itertuples(index=False)
    }
    resolved: dict[int, tuple[int, int, int]] = {}  # coll -> (root, caused, via)
    out = []
    for coll, s, _d, wait, extra, arrival in table.itertuples(index=False):
        root, caused, via = -1, 0, 0
        if wait >= MIN_P2P_WAIT_NS:
            if extra >= OWN_FRACTION * wait:
                root, caused = int(s), int(min(wait, extra))
            else:
                mine = ends.get(int(s))
                if mine is not None:
                    k = int(np.searchsorted(mine[0], arrival, "right")) - 1
                    if k >= 0:
                        prev = int(mine[1][k])
                        if waited_in.get((prev, int(s)), 0) >= MIN_P2P_WAIT_NS and prev in resolved:
                            up_root, up_caused, up_via = resolved[prev]
                            if up_root >= 0:
                                root, caused, via = up_root, min(int(wait), up_caused), up_via + 1
        resolved[int(coll)] = (root, caused, via)
        out.append((root, caused, via))
    table["root"], table["caused_ns"], table["via"] = (
        [o[0] for o in out],
        [o[1] for o in out],
        [o[2] for o in out],
    )
    return table[list(ROOT_COLUMNS)].astype(ROOT_COLUMNS).sort_values("coll").reset_index(drop=True)


def pipeline_stages(
    waits: pd.DataFrame,
    windows: pd.DataFrame,
    profiled_ns: pd.Series | None = None,
) -> pd.DataFrame:
    """Per rank that sends point to point: the receivers' waits it is the root of, and why.

    A rank is the pipeline's **bottleneck** when it is the root (:func:`p2p_roots`) of at least
    ``MIN_ROOT_PAIRS`` waits that add up to at least ``MIN_ROOT_SHARE`` of all the waiting in
    recvs, and the part of them its own extra work explains is at least ``MIN_RUN_FRACTION`` of
    the median rank's profiled time. The cause is the largest
    part of its own extra work (compute, input, host) over the sends where it is the root.
    Empty without matched pairs. Stragglers by collectives are :func:`find_stragglers`.
    """
    import pandas as pd

    empty = pd.DataFrame(
        {c: pd.Series(dtype=d if d != "str" else object) for c, d in PIPELINE_COLUMNS.items()}
    )
    roots = p2p_roots(waits, windows)
    if roots.empty:
        return empty
    total = float(roots["wait_ns"].sum())
    median_profiled = (
        float(profiled_ns.median()) if profiled_ns is not None and len(profiled_ns) else 0.0
    )
    parts = {Cause.OWN_COMPUTE: "compute_ns", Cause.INPUT: "input_ns", Cause.HOST: "idle_ns"}
    # the sender's window of every pair, and the typical stage's value of each part
    sent = roots[["coll", "sender"]].rename(columns={"sender": "rank"})
    sends = sent.merge(windows, on=["coll", "rank"], how="inner") if len(windows) else sent
    typical = {c: _typical_stage(sends, col) if col in sends else 0.0 for c, col in parts.items()}
    sends = sends.set_index("coll")
    rows = []
    for rank, sub in roots.groupby("sender"):
        mine = roots[roots["root"] == rank]
        caused = float(mine["caused_ns"].sum())
        traced = float(mine["wait_ns"].sum())
        direct = sends.reindex(mine.loc[mine["via"] == 0, "coll"])
        extras = {
            c: float((direct[col].fillna(0) - typical[c]).clip(lower=0).sum())
            if col in direct
            else 0.0
            for c, col in parts.items()
        }
        cause = max(extras, key=lambda c: extras[c]) if caused > 0 else Cause.UNKNOWN
        if caused > 0 and extras[cause] <= 0:
            cause = Cause.UNKNOWN
        share = traced / total if total > 0 else 0.0
        material = median_profiled <= 0 or caused >= MIN_RUN_FRACTION * median_profiled
        rows.append(
            {
                "rank": int(rank),
                "sends": len(sub),
                "root_pairs": len(mine),
                "wait_traced_s": traced / 1e9,
                "wait_share": share,
                "wait_caused_s": caused / 1e9,
                "compute_extra_s": extras[Cause.OWN_COMPUTE] / 1e9,
                "input_extra_s": extras[Cause.INPUT] / 1e9,
                "host_extra_s": extras[Cause.HOST] / 1e9,
                "cause": str(cause),
                "is_bottleneck": bool(
                    len(mine) >= MIN_ROOT_PAIRS and share >= MIN_ROOT_SHARE and material
                ),
            }
        )
    out = pd.DataFrame(rows).sort_values(
        ["is_bottleneck", "wait_caused_s"], ascending=[False, False]
    )
    return out.reset_index(drop=True).astype(
        {k: v for k, v in PIPELINE_COLUMNS.items() if v != "str"}
    )
