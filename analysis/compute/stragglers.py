"""Which rank holds the others back, how sure we are, and why it was late.

Two steps, as the Dask driver (:mod:`rankscope.analysis.engine.driver`) runs them (pipeline
parallelism's bottlenecks are :mod:`rankscope.analysis.compute.bottleneck`'s):

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

The arrival windows live in :mod:`rankscope.analysis.compute.arrivals` (step 1) and the per-step samples
with their run-queue correction in :mod:`rankscope.analysis.compute.lateness`; this module holds the
straggler model and its tests. Their names stay importable from here.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.arrivals import PARTS as PARTS
from rankscope.analysis.compute.arrivals import POINT_COLUMNS as POINT_COLUMNS
from rankscope.analysis.compute.arrivals import SYNC_PROBE_NS as SYNC_PROBE_NS
from rankscope.analysis.compute.arrivals import WINDOW_COLUMNS as WINDOW_COLUMNS
from rankscope.analysis.compute.arrivals import arrival_points as arrival_points
from rankscope.analysis.compute.arrivals import arrival_windows as arrival_windows
from rankscope.analysis.compute.exact_reductions import (
    clip_low0,
    columns_of,
    group_positions,
    pandas_max,
    pandas_mean,
    pandas_sum,
)
from rankscope.analysis.compute.finding import Cause as Cause
from rankscope.analysis.compute.lateness import STEP_CPU_COLUMNS as STEP_CPU_COLUMNS
from rankscope.analysis.compute.lateness import UNIT_COLUMNS as UNIT_COLUMNS
from rankscope.analysis.compute.lateness import _behind as _behind
from rankscope.analysis.compute.lateness import _lateness_frame as _lateness_frame
from rankscope.analysis.compute.lateness import _own_extras as _own_extras
from rankscope.analysis.compute.lateness import _Spread as _Spread
from rankscope.analysis.compute.lateness import once_per_sync_interval as once_per_sync_interval
from rankscope.analysis.compute.lateness import runq_excess as runq_excess
from rankscope.analysis.compute.lateness import step_cpu_table as step_cpu_table
from rankscope.analysis.compute.lateness import unit_rows as unit_rows
from rankscope.analysis.compute.statistics import EXACT_BINOMIAL_N as EXACT_BINOMIAL_N
from rankscope.analysis.compute.statistics import binomial_p_value as binomial_p_value

#: Significance level of the binomial test (one-sided, "last more often than chance").
ALPHA = 0.05
#: The wait a straggler caused, per waiting rank, is at least this fraction of the profiled time.
MIN_RUN_FRACTION = 0.03
#: Lateness counts as the rank's own when its own extra work explains at least this much of it.
OWN_FRACTION = 0.5
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
    "contention_s": "float64",  # run-queue delay beyond the median rank's, over its units
    # ... its share of the rank's lateness over those units (0-1): >= OWN_FRACTION is the
    # CPU-contention cause. Own extra work is no counter-evidence: a rank that loses its core
    # inside its own ops shows the stolen time as longer ops too.
    "contention_share": "float64",
    "noise_s": "float64",  # s.d. of the other ranks' lateness from unit to unit
    "cause": "str",
    "is_straggler": "bool",
    "verdict": "str",  # Verdict: NAMED, or the first test the rank failed
    "masked_by": "int32",  # the straggler that hid it (found once that one was set aside); -1
}


def min_wait_share(world: int) -> float:
    """Share of everybody's wait a straggler must have caused in a job of ``world`` ranks.

    Halfway between the fair share ``1/world`` and all of it: ``(1 + 1/world) / 2`` — 0.75 for
    2 ranks, 0.625 for 4, 0.5625 for 8, about one half for large jobs.
    """
    w = max(world, 2)
    return (1 + 1 / w) / 2


def find_stragglers(
    waits: pd.DataFrame,
    windows: pd.DataFrame,
    profiled_ns: pd.Series | None = None,
    clock: pd.DataFrame | None = None,
    step_cpu: pd.DataFrame | None = None,
    step_ns: float | None = None,
) -> pd.DataFrame:
    """Per rank: times last, wait caused, significance, cause; most significant first.

    ``waits``: :func:`rankscope.analysis.compute.collectives.collective_waits`; ``windows``: all ranks'
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
    from rankscope.analysis.compute.collectives import collective_waits
    from rankscope.analysis.store.schema import P2P_OPS

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
    from rankscope.analysis.compute.collectives import collective_waits

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
    """Rows of :func:`~rankscope.analysis.compute.collectives.collective_waits` back as a collectives
    table (arrival -> start), to recompute the waits from other arrivals."""
    return waits.rename(columns={"arrival": "start"})[
        ["coll", "group", "seq", "op", "bytes", "rank", "start", "end"]
    ].assign(event=-1)


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
    # The frames as columns, and each rank's rows as positions (in the frames' order, as pandas'
    # groupby gives them): one pandas selection per rank and column cost ~25 ms a rank here.
    m = columns_of(multi, MULTI_COLUMNS)
    un = columns_of(units, RANK_UNIT_COLUMNS)
    ex = columns_of(extras, EXTRA_COLUMNS) if len(extras) else {}
    by_rank = group_positions(un["rank"])
    for rank, at in group_positions(m["rank"]).items():
        n = len(at)
        k = int(m["is_last"][at].sum())
        chance = float(pandas_mean(1.0 / m["n_ranks"][at]))
        blame = float(pandas_sum(m["blame_ns"][at]))
        ua = by_rank.get(rank)
        n_u = len(ua) if ua is not None else 0
        contention = float(pandas_sum(un["contention"][ua])) if ua is not None else 0.0
        raw_late = float(pandas_sum(clip_low0(un["late_raw"][ua]))) if ua is not None else 0.0
        # the time other processes held its core explains its lateness: that is its cause
        contended = raw_late > 0 and contention >= OWN_FRACTION * raw_late
        last_units: np.ndarray | None
        if ua is not None and n_u:
            chance_u = float(pandas_mean(1.0 / un["n_ranks"][ua]))
            last_units = un["unit"][ua][un["is_last"][ua].astype(bool)]
            k_u = len(last_units)
        else:
            chance_u, k_u, last_units = chance, k, None
            n_u = n
        # its own extra work where it was last (in the steps where it was the latest rank once
        # the others' stolen time is taken off)
        mine = _own_rows(extras, ex, rank, last_units)
        any_mine = len(mine["late_ns"]) > 0
        late = float(pandas_sum(clip_low0(mine["late_ns"]))) if any_mine else 0.0
        own = float(pandas_sum(clip_low0(mine["own_ns"]))) if any_mine else 0.0
        parts = {
            cause: float(pandas_sum(clip_low0(mine[col]))) if any_mine else 0.0
            for cause, col in CAUSE_COLUMNS.items()
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
        typical = float(np.median(un[measure][ua])) if ua is not None and n_u else 0.0
        noise = pooled.without(int(rank))
        standard_error = MEDIAN_SE * noise / math.sqrt(max(n_u, 1))
        others = max(int(pandas_max(m["n_ranks"][at])) - 1, 1)
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
                "mean_lateness_s": float(pandas_mean(m["lateness_ns"][at])) / 1e9,
                "late_s": late / 1e9,
                "own_extra_s": own / 1e9,
                "compute_extra_s": parts[Cause.OWN_COMPUTE] / 1e9,
                "input_extra_s": parts[Cause.INPUT] / 1e9,
                "host_extra_s": parts[Cause.HOST] / 1e9,
                "units": n_u,
                "units_last": k_u,
                "typical_s": typical / 1e9,
                "contention_s": contention / 1e9,
                "contention_share": contention / raw_late if raw_late > 0 else 0.0,
                "noise_s": noise / 1e9,
                "cause": str(cause),
                "is_straggler": verdict == Verdict.NAMED,
                "verdict": str(verdict),
                "masked_by": -1,
            }
        )
    return rows


#: The columns of the straggler tests' waits (``multi``), unit rows and own-work rows that
#: :func:`_rank_rows` reads.
MULTI_COLUMNS = ("rank", "is_last", "n_ranks", "blame_ns", "lateness_ns")
RANK_UNIT_COLUMNS = ("rank", "unit", "is_last", "n_ranks", "contention", "late_raw", "late")
EXTRA_COLUMNS = ("rank", "unit", "is_last", "window_start", "window_end", "late_ns", "own_ns")
#: Own-work column of each measured cause (:func:`_own_extras`), in the order the tie-break of
#: ``max`` over causes sees them.
CAUSE_COLUMNS = {
    Cause.OWN_COMPUTE: "d_compute",
    Cause.INPUT: "d_input",
    Cause.HOST: "d_idle",
    Cause.PROPAGATED: "d_comm",
}
#: The own-work rows' columns that :func:`_rank_rows` sums (:func:`_own_rows`).
OWN_ROW_COLUMNS = ("late_ns", "own_ns", *CAUSE_COLUMNS.values())


def _own_rows(
    extras: pd.DataFrame, ex: dict[str, np.ndarray], rank: Any, last_units: np.ndarray | None
) -> dict[str, np.ndarray]:
    """The rank's own-work rows (:func:`_own_extras`) its lateness is measured on, as columns in
    the order pandas' formulation gave them: per unit where it was last, its largest window there
    (among the collectives where it was last itself, where the unit has any); without units, one
    row per sync interval (:func:`once_per_sync_interval`, pandas: a rare path)."""
    if not ex:
        return {c: np.empty(0) for c in OWN_ROW_COLUMNS}
    if last_units is None:
        mine = extras[(extras["rank"] == rank) & extras["is_last"]]
        mine = once_per_sync_interval(mine)
        return {c: mine[c].to_numpy() for c in OWN_ROW_COLUMNS}
    at = np.flatnonzero((ex["rank"] == rank) & np.isin(ex["unit"], last_units))
    unit, is_last = ex["unit"][at], ex["is_last"][at].astype(bool)
    # the collectives where it was last itself, where the unit has any
    units_with_last = set(unit[is_last].tolist())
    keep = is_last | ~np.fromiter((u in units_with_last for u in unit.tolist()), bool, len(unit))
    at, unit = at[keep], unit[keep]
    # per unit its largest window: stable sort by span, the last row of each unit, in that order
    span = ex["window_end"][at] - ex["window_start"][at]
    order = np.argsort(span, kind="stable")
    seen: set[Any] = set()
    last: list[int] = []
    names = unit.tolist()
    for i in order[::-1].tolist():
        u = names[i]
        if u not in seen:
            seen.add(u)
            last.append(i)
    rows = at[np.array(last[::-1], dtype=np.intp)]
    return {c: extras[c].to_numpy()[rows] for c in OWN_ROW_COLUMNS}
