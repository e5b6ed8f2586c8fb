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

A balanced run still has a last rank in every step; a straggler must be *significant* — the
last rank of a profiled step more often than chance (one-sided binomial over the **steps**, the
independent samples: the collectives of one step share its lateness, :func:`unit_rows`) —
*dominant* — it caused a clearly unfair share of all waiting (:func:`min_wait_share`: halfway
between its fair share ``1/ranks`` and all of it) — *material* — its typical lateness is at least
``MIN_STEP_FRACTION`` of the step and the wait it caused at least ``MIN_RUN_FRACTION`` of the
profiled time of the ranks that waited — *separated* — that lateness stands ``SEPARATION_Z``
standard errors clear of how every rank's arrival moves from step to step — and *explained*: its
own extra work (compute, input, host time beyond the median rank's) explains its lateness, or the
CPU time other processes took from it does. A rank whose lateness came from before its window
(``propagated``: it left the previous sync point late — in a flat job, the collective's own
completion order or a late wake-up) is shown with that cause but never named: the delay did not
start in its work, so fixing it buys nothing (issue 23: 7 of 60 balanced real runs named such a
rank, consistently last by 4–10 ms). Where the runtime recorded each step's run-queue
delay (``step_cpu``), the time other processes took from a rank's core is taken off the OTHER
ranks' arrivals when a rank is judged, and a rank whose lateness it explains is named only with
the cause "CPU taken by other processes" (:class:`Cause`). A second, smaller straggler hidden
behind the first is found by setting the first aside (``masked_by``, :func:`find_stragglers`).

Why one module of ~830 lines: one analysis (arrival windows, the per-step samples with their
run-queue correction, and the straggler tests on them).
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

#: Significance level of the binomial test (one-sided, "last more often than chance").
ALPHA = 0.05
#: The wait a straggler caused, per waiting rank, is at least this fraction of the profiled time.
MIN_RUN_FRACTION = 0.03
#: Lateness counts as the rank's own when its own extra work explains at least this much of it.
OWN_FRACTION = 0.5
#: A collective's end is a sync point when no rank computed through most of its last phase
#: (from the last arrival to the end, and at least this long, ns): they all waited for it.
SYNC_PROBE_NS = 1_000
#: Cap of the score (-log10 p) so that p == 0 stays finite in JSON.
MAX_SCORE = 300.0
#: A straggler's typical lateness per profiled step (the median over its steps of its worst
#: lateness in the step, ns, after the run-queue correction; :func:`unit_rows`) is at least this
#: fraction of the median step: less would not move the step by more than compare's smallest
#: change (``CompareConfig.min_change``, 3 %), so a fix could not be seen. (Without step times:
#: the median window before an arrival.)
MIN_STEP_FRACTION = 0.03
#: ... and at least this many standard errors above the median rank: the standard error of a
#: median of ``n`` steps (``1.2533 * sigma / sqrt(n)``), with ``sigma`` how much the OTHER
#: ranks' lateness varies from one step to the next (pooled within-rank standard
#: deviation). A 3-standard-error separation from what chance and contention move every rank's
#: arrival by anyway.
SEPARATION_Z = 3.0
#: Standard error of a sample median in units of sigma / sqrt(n) (normal data: sqrt(pi / 2)).
MEDIAN_SE = 1.2533


class Cause(enum.StrEnum):
    """Why a rank arrived late."""

    OWN_COMPUTE = "own compute"
    INPUT = "input"
    HOST = "host"
    GC = "GC pauses"
    """Python garbage collections (torch's ``Python GC`` events, analysis/gc_pauses.py): the
    part of a rank's extra host time they account for; without them in the trace it is HOST."""
    PROPAGATED = "propagated"
    CPU_CONTENTION = "CPU taken by other processes"
    """A system cause: the rank's main thread was runnable but waited for a core (its run-queue
    delay, recorded per step by the runtime) — other processes on the node took its CPU. Named
    only when significant after correcting for the choice among the ranks (p <= ALPHA / ranks):
    the scheduler starves some rank in every step of a busy node, and three steps of one rank
    (p = 1/64 for 4 ranks) are within what that lottery draws (4/64)."""
    UNKNOWN = "unknown"


#: Causes that are the rank's own measured extra work (compute, input, host time).
OWN_CAUSES = frozenset({Cause.OWN_COMPUTE, Cause.INPUT, Cause.HOST, Cause.GC})
#: Causes that were measured (own work, or CPU time the node's other processes took).
MEASURED_CAUSES = OWN_CAUSES | {Cause.CPU_CONTENTION}


class Verdict(enum.StrEnum):
    """Why a rank is, or is not, named (``STRAGGLER_COLUMNS`` ``verdict``): NAMED, else the
    first test it failed, in the order the rules are written in docs/analysis.md. A "no
    straggler" finding says this of the rank that came closest, so that a rank last in every
    step but not named (e.g. its lateness came from before the sync point) is explained, not
    silently dropped."""

    NAMED = "named"
    NEVER_LAST = "never last"
    NOT_SIGNIFICANT = "not last more often than chance"
    SMALL_SHARE = "too small a share of the waiting"
    PROPAGATED = "propagated"
    CAUSE_UNKNOWN = "cause not measured"
    IMMATERIAL = "immaterial"
    WITHIN_NOISE = "within the noise"


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
    "units": "int64",  # profiled steps it took part in (the independent samples; unit_rows)
    "units_last": "int64",  # ... where it was the latest rank
    "typical_s": "float64",  # median over its units of its worst lateness behind the median rank
    "contention_s": "float64",  # run-queue delay beyond the median rank's, where it was last
    "noise_s": "float64",  # s.d. of the other ranks' lateness from unit to unit
    "cause": "str",
    "is_straggler": "bool",
    "verdict": "str",  # Verdict: NAMED, or the first test the rank failed
    "masked_by": "int32",  # the straggler that hid it (found once that one was set aside); -1
}

#: Columns of a step-CPU table (:func:`step_cpu_table`): per rank and recorded step, from the
#: runtime's ``step_cpu`` (ns): wall time, the main thread's CPU time and run-queue delay.
STEP_CPU_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "step": "int64",
    "wall_ns": "int64",
    "cpu_ns": "int64",
    "runq_ns": "int64",
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
    step_cpu: pd.DataFrame | None = None,
    step_ns: float | None = None,
) -> pd.DataFrame:
    """Per rank: times last, wait caused, significance, cause; most significant first.

    ``waits``: :func:`rankscope.analysis.collectives.collective_waits`; ``windows``: all ranks'
    :func:`arrival_windows`; ``profiled_ns``: profiled time per rank (index rank), for the
    materiality test (when absent, only significance and wait share count); ``clock``: the
    store's clock table, used when the waits are recomputed without a straggler; ``step_cpu``:
    :func:`step_cpu_table` (the runtime's per-step run-queue delay; None: not recorded);
    ``step_ns``: the median profiled step (ns), the yardstick of materiality.

    **Samples.** A rank late at one collective is late at the next one of the same step (its
    backlog carries; two DDP buckets of one step), so collectives are not independent samples:
    the tests count **profiled steps** (:func:`unit_rows`), each once, at the rank's worst moment
    in it. **Contention.** Where the runtime recorded each step's run-queue delay, a
    late rank's lateness is first reduced by the run-queue delay it had beyond the median rank's
    in that step (never below the median arrival): the time another process held its core is not
    its own slowness. A rank whose lateness that delay explains is named only as its own finding,
    with the cause ``CPU taken by other processes``, and only when that is as material and
    consistent as any straggler.

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
    runq = runq_excess(step_cpu)
    candidates = int(multi["rank"].nunique())
    base = _rank_rows(multi, windows, profiled_ns, runq, step_ns, clock)
    named = [r for r in base if r["is_straggler"]]
    removed = {int(r["rank"]) for r in named}
    masker = int(named[0]["rank"]) if named else -1
    current = multi
    while named and len(removed) < candidates - 1:
        # the rows without the named ranks: who would the others wait for once they are fixed?
        kept = current[~current["rank"].isin(removed)]
        current = collective_waits(_as_collectives(kept), clock)
        current = current[current["n_ranks"] >= 2]
        if len(current) == 0:
            break
        rows = _rank_rows(current, windows, profiled_ns, runq, step_ns, clock, masked=True)
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


def _fair_blame(
    multi: pd.DataFrame,
    windows: pd.DataFrame,
    runq: pd.DataFrame | None,
    clock: pd.DataFrame | None,
) -> tuple[pd.Series | None, float]:
    """The wait each rank caused (ns, index rank) had every arrival come earlier by the rank's
    stolen time (:func:`unit_rows`' ``contention``), and its total; (None, 0) without run-queue
    records or when nobody lost time. A rank's share of the waiting is judged on these, unless
    the stolen time is its own cause."""
    from rankscope.analysis.collectives import collective_waits

    if runq is None or len(multi) == 0:
        return None, 0.0
    stolen = _lateness_frame(multi, windows, runq)["contention"].to_numpy(float)
    if not (stolen > 0).any():
        return None, 0.0
    table = _as_collectives(multi)
    table["start"] = table["start"].to_numpy("int64") - stolen.astype("int64")
    fair = collective_waits(table, clock)
    blame = fair.groupby("rank")["blame_ns"].sum()
    return blame, float(blame.sum())


def _as_collectives(waits: pd.DataFrame) -> pd.DataFrame:
    """Rows of :func:`~rankscope.analysis.collectives.collective_waits` back as a collectives
    table (arrival -> start), to recompute the waits from other arrivals."""
    return waits.rename(columns={"arrival": "start"})[
        ["coll", "group", "seq", "op", "bytes", "rank", "start", "end"]
    ].assign(event=-1)


def step_cpu_table(metas: dict[int, Any]) -> pd.DataFrame:
    """``STEP_CPU_COLUMNS`` from each rank's meta.json (``{rank: meta}``; the runtime's
    ``step_cpu``: ``{"step": [wall_ns, cpu_ns, runq_ns]}``); malformed entries are left out."""
    import pandas as pd

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
    import numpy as np

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
    import numpy as np

    v = w.assign(_v=values).groupby("coll")["_v"]
    n = v.transform("size").to_numpy()
    med = v.transform("median").to_numpy(float)
    other = (v.transform("sum").to_numpy(float) - values) / np.maximum(n - 1, 1)
    return values - np.where(n > 2, med, other)


def _rank_rows(
    multi: pd.DataFrame,
    windows: pd.DataFrame,
    profiled_ns: pd.Series | None,
    runq: pd.DataFrame | None = None,
    step_ns: float | None = None,
    clock: pd.DataFrame | None = None,
    masked: bool = False,
) -> list[dict[str, Any]]:
    """The straggler tests on one set of waits: one dict (``STRAGGLER_COLUMNS``) per rank.

    ``masked``: the second look, with the named stragglers set aside. Its lateness is then a lower
    bound (the big straggler's delay gated the collectives, and part of the small one's is hidden
    for good), so the materiality of the step is not judged on it: only the wait it caused."""
    import numpy as np

    # blame is split from arrival gaps, so its total (not the duration-capped waits) is the base
    total_wait = float(multi["blame_ns"].sum())
    fair_blame, fair_total = _fair_blame(multi, windows, runq, clock)
    extras = _own_extras(multi, windows)
    units = unit_rows(multi, windows, runq)
    pooled = _Spread(units, "late")
    median_profiled = (
        float(profiled_ns.median()) if profiled_ns is not None and len(profiled_ns) else 0.0
    )
    if step_ns is None or not step_ns > 0:
        spans = windows["window_end"] - windows["window_start"] if len(windows) else None
        step_ns = float(spans.median()) if spans is not None and len(spans) else 0.0
    # No per-rank correction of ALPHA here: the dominance test (an unfair share, at least half of
    # all waiting) already picks at most one candidate per round (masked rounds: find_stragglers)
    rows: list[dict[str, Any]] = []
    by_rank = dict(tuple(units.groupby("rank", sort=False)))
    for rank, sub in multi.groupby("rank", sort=True):
        n = len(sub)
        k = int(sub["is_last"].sum())
        chance = float((1.0 / sub["n_ranks"]).mean())
        blame = float(sub["blame_ns"].sum())
        u = by_rank.get(rank)
        n_u = len(u) if u is not None else 0
        contention = float(u["contention"].sum()) if u is not None else 0.0
        raw_late = float(u["late_raw"].clip(lower=0).sum()) if u is not None else 0.0
        # the time other processes held its core explains its lateness: that is its cause
        contended = raw_late > 0 and contention >= OWN_FRACTION * raw_late
        if u is not None and n_u:
            chance_u = float((1.0 / u["n_ranks"]).mean())
            last_units = u.loc[u["is_last"], "unit"]
            k_u = len(last_units)
        else:
            chance_u, k_u, last_units = chance, k, None
            n_u = n
        # its own extra work where it was last (in the steps where it was the latest rank once
        # the others' stolen time is taken off)
        if len(extras) == 0:
            mine = extras
        elif last_units is None:
            mine = extras[(extras["rank"] == rank) & extras["is_last"]]
        else:
            # per step: its largest window there, its lateness and own work (two DDP buckets of
            # one step overlap, and the second one's window can start at the first one's end on
            # this rank alone: it would measure a sliver of own work against the whole delay)
            at_last = extras[(extras["rank"] == rank) & extras["unit"].isin(last_units)]
            # the collectives where it was last itself, where the step has any (else the step's
            # own: it was last only once the others' stolen time was taken off)
            has_last = at_last.groupby("unit")["is_last"].transform("any")
            at_last = at_last[at_last["is_last"] | ~has_last]
            span = at_last["window_end"] - at_last["window_start"]
            mine = at_last.assign(_span=span).sort_values("_span", kind="stable")
            mine = mine.groupby("unit").tail(1).drop(columns="_span")
        if last_units is None:
            mine = once_per_sync_interval(mine)
        late = float(mine["late_ns"].clip(lower=0).sum()) if len(mine) else 0.0
        own = float(mine["own_ns"].clip(lower=0).sum()) if len(mine) else 0.0
        parts = {
            Cause.OWN_COMPUTE: float(mine["d_compute"].clip(lower=0).sum()) if len(mine) else 0.0,
            Cause.INPUT: float(mine["d_input"].clip(lower=0).sum()) if len(mine) else 0.0,
            Cause.HOST: float(mine["d_idle"].clip(lower=0).sum()) if len(mine) else 0.0,
            Cause.PROPAGATED: float(mine["d_comm"].clip(lower=0).sum()) if len(mine) else 0.0,
        }
        p = binomial_p_value(k_u, n_u, chance_u)
        if k_u == 0 or late <= 0:
            cause = Cause.UNKNOWN
        elif contended:
            cause = Cause.CPU_CONTENTION
        elif own < OWN_FRACTION * late:
            cause = Cause.PROPAGATED
        else:
            cause = max(parts, key=lambda c: parts[c])
            if parts[cause] <= 0:
                cause = Cause.UNKNOWN
        # how late it typically was, per step, behind the median rank had nobody lost CPU time
        # (as measured when that is its cause), against how much the other ranks' lateness moves
        # from step to step (the standard error of a median of its steps)
        measure = "late_raw" if contended else "late"
        typical = float(np.median(u[measure])) if u is not None and n_u else 0.0
        noise = pooled.without(int(rank))
        standard_error = MEDIAN_SE * noise / math.sqrt(max(n_u, 1))
        others = max(int(sub["n_ranks"].max()) - 1, 1)
        caused, total = blame, total_wait
        if fair_blame is not None and not contended:
            # the wait it caused had no rank lost its core to other processes
            caused, total = float(fair_blame.get(rank, 0.0)), fair_total
        share = caused / total if total > 0 else 0.0
        material = median_profiled <= 0 or caused / others >= MIN_RUN_FRACTION * median_profiled
        material_step = typical > 0 and (masked or typical >= MIN_STEP_FRACTION * step_ns)
        separated = typical >= SEPARATION_Z * standard_error
        # the first of the tests (in this order) that the rank fails: why it is not named
        verdict = next(
            (
                v
                for v, failed in (
                    (Verdict.NEVER_LAST, k_u == 0),
                    (Verdict.NOT_SIGNIFICANT, p > (ALPHA / (others + 1) if contended else ALPHA)),
                    (Verdict.SMALL_SHARE, share < min_wait_share(others + 1)),
                    (Verdict.PROPAGATED, cause == Cause.PROPAGATED),
                    (Verdict.CAUSE_UNKNOWN, cause not in MEASURED_CAUSES),
                    (Verdict.IMMATERIAL, not (material and material_step)),
                    (Verdict.WITHIN_NOISE, not separated),
                )
                if failed
            ),
            Verdict.NAMED,
        )
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
                "units": n_u,
                "units_last": k_u,
                "typical_s": typical / 1e9,
                "contention_s": contention / 1e9,
                "noise_s": noise / 1e9,
                "cause": str(cause),
                "is_straggler": verdict == Verdict.NAMED,
                "verdict": str(verdict),
                "masked_by": -1,
            }
        )
    return rows


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
    :func:`find_stragglers` counts lateness and own work once per sync interval
    (:func:`once_per_sync_interval`): both then count each delay once.
    """
    import numpy as np
    import pandas as pd

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
