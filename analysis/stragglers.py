"""Which rank holds the others back, how sure we are, and why it was late.

Two steps, as the Dask driver (:mod:`rankscope.analysis.pipeline`) runs them (pipeline
parallelism's bottlenecks are :mod:`rankscope.analysis.bottleneck`'s):

1. :func:`arrival_points` — per rank (a Dask task over ONE rank's events): for each collective,
   how much compute, input, host/idle and exposed communication the rank had done by its arrival
   and by the collective's end (prefix sums, ns), and whether it was computing just before the
   end; then :func:`arrival_windows`, across ranks: the window of each arrival since the previous
   sync point that every rank waited for.
2. :func:`find_stragglers` — across ranks, on the small tables: how often each rank was last,
   the wait it caused the others (seconds), a one-sided binomial test of "last this often by
   chance" (chance = 1/ranks per collective), and the likely cause.

A balanced run still has a last rank at every collective; a straggler must be *significant*
(p ≤ ``ALPHA``), *dominant* — it caused a clearly unfair share of all waiting
(:func:`min_wait_share`: halfway between its fair share ``1/ranks`` and all of it) — and
*material*: that wait is at least ``MIN_RUN_FRACTION`` of the profiled time of the ranks that
waited — and *explained*: its own extra work (compute, input, host time beyond the median rank's)
explains its lateness. How often it was last is then evidence, not a threshold: a rank slow in
70 % of the steps, or slow in every step of a job whose steps also hold collectives nobody is
late for, is last at far fewer than all collectives yet causes nearly all the waiting. Only a
rank whose lateness its own work does not explain (``propagated``) must also be *consistent*,
last at ``MIN_LAST_FRACTION`` of its collectives: on an oversubscribed CPU, contention moves
"last" around, and such a rank's lateness is measured to come from elsewhere. A second, smaller
straggler hidden behind the first is found by setting the first aside (``masked_by``,
:func:`find_stragglers`).

Why one module of ~530 lines: one analysis (arrival windows and the straggler tests).
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

#: Significance level of the binomial test (one-sided, "last more often than chance").
ALPHA = 0.05
#: A rank whose lateness its own extra work does not explain (cause propagated / unknown) must
#: be last at this fraction of its collectives or more: without a measured cause, only a
#: systematic pattern tells a straggler from CPU contention moving "last" around.
MIN_LAST_FRACTION = 0.75
#: The wait a straggler caused, per waiting rank, is at least this fraction of the profiled time.
MIN_RUN_FRACTION = 0.03
#: Lateness counts as the rank's own when its own extra work explains at least this much of it.
OWN_FRACTION = 0.5
#: A collective's end is a sync point when no rank computed through most of its last phase
#: (from the last arrival to the end, and at least this long, ns): they all waited for it.
SYNC_PROBE_NS = 1_000
#: Cap of the score (-log10 p) so that p == 0 stays finite in JSON.
MAX_SCORE = 300.0


class Cause(enum.StrEnum):
    """Why a rank arrived late."""

    OWN_COMPUTE = "own compute"
    INPUT = "input"
    HOST = "host"
    PROPAGATED = "propagated"
    UNKNOWN = "unknown"


#: Causes that are the rank's own measured extra work (compute, input, host time).
OWN_CAUSES = frozenset({Cause.OWN_COMPUTE, Cause.INPUT, Cause.HOST})


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
    "late_s": "float64",  # lateness vs the median rank where it was last, once per sync interval
    "own_extra_s": "float64",  # extra own work before arriving, summed where it was last
    "compute_extra_s": "float64",
    "input_extra_s": "float64",
    "host_extra_s": "float64",
    "cause": "str",
    "is_straggler": "bool",
    "masked_by": "int32",  # the straggler that hid it (found once that one was set aside); -1
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
    ``measure``: the rank's painter (:func:`rankscope.analysis.breakdown.painter`);
    ``steps``: its step windows (:func:`rankscope.analysis.breakdown.step_windows`).

    For its arrival and for the collective's end: how much compute, input, idle and exposed
    communication the rank had done since the start of its run of consecutive profiled steps
    (prefix sums, so that :func:`arrival_windows` can cut any window between them once the sync
    points are known across ranks), and whether it kept computing while the collective finished
    (mostly busy from the last arrival to the end): then it did not wait for it. A gloo op's
    recorded end can trail the moment the main thread resumed by a little, so "mostly", not
    "at all".
    """
    import numpy as np
    import pandas as pd

    lowest = np.iinfo(np.int64).min
    rows = coll_rows.sort_values(["start", "coll"], kind="stable")
    arrival = rows["start"].to_numpy(np.int64)
    ends = np.maximum(rows["end"].to_numpy(np.int64), arrival)
    real_steps = steps[steps["step"] >= 0] if len(steps) else steps
    n = len(arrival)
    out = pd.DataFrame(
        {
            "coll": rows["coll"].to_numpy(np.int64),
            "rank": np.full(n, rank, np.int32),
            "arrival": arrival,
            "end": ends,
        }
    )
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
    return out[list(POINT_COLUMNS)].astype(POINT_COLUMNS)


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
    points share a start, and :func:`find_stragglers` counts each such group once.
    """
    import numpy as np
    import pandas as pd

    if len(points) == 0:
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in WINDOW_COLUMNS.items()})
    lowest = np.iinfo(np.int64).min
    p = points.copy()
    positive = p["end"] > p["arrival"]
    nobody_busy = ~p.groupby("coll")["busy_before_end"].transform("any")
    p["is_sync"] = positive & nobody_busy & (p["end_block_start"] > lowest)
    frames = []
    for _, r in p.groupby("rank", sort=True):
        r = r.sort_values(["arrival", "coll"], kind="stable")
        sync = r[r["is_sync"]].sort_values("end", kind="stable")
        # a sentinel first row, so that "no sync point yet" indexes something
        s_end = np.concatenate([[lowest], sync["end"].to_numpy(np.int64)])
        s_block = np.concatenate([[lowest], sync["end_block_start"].to_numpy(np.int64)])
        kk = np.searchsorted(s_end, r["arrival"].to_numpy(np.int64), side="right") - 1
        block = r["block_start"].to_numpy(np.int64)
        # the sync point counts when it lies in the arrival's block (else: the block's start)
        same_block = (kk > 0) & (s_block[kk] == block) & (block > lowest)
        start = np.where(same_block, s_end[kk], np.where(block > lowest, block, r["stop"]))
        stop = r["stop"].to_numpy(np.int64)
        start = np.minimum(start, stop)
        w = pd.DataFrame(
            {
                "coll": r["coll"].to_numpy(np.int64),
                "rank": r["rank"].to_numpy(np.int32),
                "step": r["step"].to_numpy(np.int64),
                "window_start": start,
                "window_end": stop,
                "arrival": r["arrival"].to_numpy(np.int64),
            }
        )
        for part in PARTS:
            at = r[f"at_{part}"].to_numpy(np.int64)
            ends = np.concatenate([[0], sync[f"end_{part}"].to_numpy(np.int64)])
            base = np.where(same_block, ends[kk], 0)
            w[part] = np.where(block > lowest, np.maximum(at - base, 0), 0)
        frames.append(w)
    return pd.concat(frames, ignore_index=True).astype(WINDOW_COLUMNS)


def min_wait_share(world: int) -> float:
    """Share of everybody's wait a straggler must have caused in a job of ``world`` ranks.

    Halfway between the fair share ``1/world`` and all of it: ``(1 + 1/world) / 2`` — 0.75 for
    2 ranks, 0.625 for 4, 0.5625 for 8, about one half for large jobs.
    """
    w = max(world, 2)
    return (1 + 1 / w) / 2


#: Up to this many trials the first term of the tail is computed from the exact binomial
#: coefficient (``math.comb`` stays below the float range up to ~1020); beyond, in log space.
EXACT_BINOMIAL_N = 1000


def binomial_p_value(times_last: int, collectives: int, chance: float) -> float:
    """P(X >= times_last) for X ~ Binomial(collectives, chance): last this often by luck.

    Computed with :mod:`math` (no scipy import: 0.8 s of a command's start-up for one tail).
    The first probability mass term is exact up to :data:`EXACT_BINOMIAL_N` trials, in log space
    (``lgamma``) beyond, and the tail is summed outward from ``times_last`` only while terms
    still matter: above the mean the tail is summed directly (full relative precision for the tiny p-values that name stragglers); at or
    below it, ``1 - P(X < times_last)`` (the p-value is then at least about one half). Terms fall
    off geometrically away from the mean, so a sum takes O(sqrt(n)) terms, not O(n).
    """
    n, k, p = collectives, times_last, chance
    if n <= 0 or k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    upper = k > n * p
    i = k if upper else k - 1
    if n <= EXACT_BINOMIAL_N:
        term = math.comb(n, i) * p**i * (1.0 - p) ** (n - i)
    else:
        log_pmf = (
            math.lgamma(n + 1)
            - math.lgamma(i + 1)
            - math.lgamma(n - i + 1)
            + i * math.log(p)
            + (n - i) * math.log1p(-p)
        )
        term = math.exp(log_pmf)
    total = term
    odds = p / (1.0 - p)
    step = 1 if upper else -1
    while 0 <= i + step <= n:
        if step > 0:
            term *= (n - i) / (i + 1) * odds
        else:
            term *= i / (n - i + 1) / odds
        i += step
        total += term
        if term <= total * 1e-17:
            break
    tail = total if upper else 1.0 - total
    return min(1.0, max(0.0, tail))


def find_stragglers(
    waits: pd.DataFrame,
    windows: pd.DataFrame,
    profiled_ns: pd.Series | None = None,
    clock: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per rank: times last, wait caused, significance, cause; most significant first.

    ``waits``: :func:`rankscope.analysis.collectives.collective_waits`; ``windows``: all ranks'
    :func:`arrival_windows`; ``profiled_ns``: profiled time per rank (index rank), for the
    materiality test (when absent, only significance and wait share count); ``clock``: the
    store's clock table, used when the waits are recomputed without a straggler.

    **Masked stragglers.** A second, smaller straggler is rarely last — the big one is — so it
    looks innocent. Once stragglers are named, the waits are recomputed as if they had arrived
    with the others (their rows removed), and the same tests run on what remains: a rank named
    then is reported with ``masked_by`` (the rank that hid it), provided its significance holds
    after correcting for the choice among the ranks left. Repeated until nobody new.
    """
    import pandas as pd
    from rankscope.analysis.collectives import collective_waits
    from rankscope.analysis.schema import P2P_OPS

    # Point-to-point pairs are left out: in a pipeline the earlier stage is "last" at every
    # recv of the next one by construction (the bubble), which says nothing about stragglers.
    multi = waits[(waits["n_ranks"] >= 2) & ~waits["op"].isin(P2P_OPS)]
    if len(multi) == 0:
        return pd.DataFrame(
            {c: pd.Series(dtype=d if d != "str" else object) for c, d in STRAGGLER_COLUMNS.items()}
        )
    candidates = int(multi["rank"].nunique())
    base = _rank_rows(multi, windows, profiled_ns)
    named = [r for r in base if r["is_straggler"]]
    removed = {int(r["rank"]) for r in named}
    masker = int(named[0]["rank"]) if named else -1
    current = multi
    while named and len(removed) < candidates - 1:
        # the rows without the named ranks: who would the others wait for once they are fixed?
        kept = current[~current["rank"].isin(removed)]
        table = kept.rename(columns={"arrival": "start"})[
            ["coll", "group", "seq", "op", "bytes", "rank", "start", "end"]
        ].assign(event=-1)
        current = collective_waits(table, clock)
        current = current[current["n_ranks"] >= 2]
        if len(current) == 0:
            break
        rows = _rank_rows(current, windows, profiled_ns)
        # This round only runs because a straggler was found, and among the few ranks left one
        # easily dominates the little waiting that remains: its significance is corrected for
        # picking one of them (Bonferroni over the ranks left), so noise is not named.
        left = max(candidates - len(removed), 1)
        named = [
            r
            for r in rows
            if r["is_straggler"] and int(r["rank"]) not in removed and r["p_value"] <= ALPHA / left
        ]
        by_rank = {int(r["rank"]): i for i, r in enumerate(base)}
        for r in named:
            r["masked_by"] = masker
            base[by_rank[int(r["rank"])]] = r
            removed.add(int(r["rank"]))
        if named:
            masker = int(named[0]["rank"])
    out = pd.DataFrame(base)
    out["unmasked"] = out["masked_by"] < 0
    out = out.sort_values(
        ["is_straggler", "unmasked", "score", "wait_caused_s"],
        ascending=[False, False, False, False],
    ).drop(columns="unmasked")
    return out.reset_index(drop=True).astype(
        {k: v for k, v in STRAGGLER_COLUMNS.items() if v != "str"}
    )


def _rank_rows(
    multi: pd.DataFrame,
    windows: pd.DataFrame,
    profiled_ns: pd.Series | None,
) -> list[dict[str, Any]]:
    """The straggler tests on one set of waits: one dict (``STRAGGLER_COLUMNS``) per rank."""
    # blame is split from arrival gaps, so its total (not the duration-capped waits) is the base
    total_wait = float(multi["blame_ns"].sum())
    extras = _own_extras(multi, windows)
    median_profiled = (
        float(profiled_ns.median()) if profiled_ns is not None and len(profiled_ns) else 0.0
    )
    # No per-rank correction of ALPHA here: the dominance test (an unfair share, at least half of
    # all waiting) already picks at most one candidate per round (masked rounds: find_stragglers)
    rows: list[dict[str, Any]] = []
    for rank, sub in multi.groupby("rank", sort=True):
        n = len(sub)
        k = int(sub["is_last"].sum())
        chance = float((1.0 / sub["n_ranks"]).mean())
        p = binomial_p_value(k, n, chance)
        blame = float(sub["blame_ns"].sum())
        mine = extras[(extras["rank"] == rank) & extras["is_last"]] if len(extras) else extras
        mine = once_per_sync_interval(mine)
        late = float(mine["late_ns"].clip(lower=0).sum()) if len(mine) else 0.0
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
                    and share >= min_wait_share(others + 1)
                    and material
                    and k > 0
                    and (cause in OWN_CAUSES or k >= MIN_LAST_FRACTION * n)
                ),
                "masked_by": -1,
            }
        )
    return rows


def _own_extras(waits: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Per (collective, rank): how much later than the median rank it arrived, counted once, and
    how much of that came from its own extra work in its window (vs the median rank), in ns.

    ``late_ns`` is the arrival's distance behind the median rank's. Lateness is a level, not a
    flow: a rank 20 ms late at the first of two DDP buckets is still 20 ms late at the second, and
    on GPUs its compute stream stays behind across buckets whose NCCL kernels have ended. So
    :func:`find_stragglers` counts lateness and own work once per sync interval
    (:func:`once_per_sync_interval`): both then count each delay once.
    """
    import numpy as np
    import pandas as pd

    cols_out = ["coll", "rank", "window_start", "window_end", "is_last", "late_ns", "own_ns"]
    cols_out += ["d_compute", "d_input", "d_idle", "d_comm"]
    if len(windows) == 0:
        return pd.DataFrame(columns=cols_out)
    w = waits[["coll", "rank", "is_last", "arrival"]].merge(
        windows.drop(columns=["arrival"]), on=["coll", "rank"], how="inner"
    )
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
