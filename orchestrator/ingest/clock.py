"""Clock alignment: put every rank's timestamps on the reference rank's clock.

Three stages (DESIGN, "Clock alignment"), all pure functions on numpy / pandas:

1. **Runtime samples** (``meta.json`` ``clock.samples``, NTP-style t1..t4, ns): per clock domain,
   keep the lowest-RTT round of each phase, fit ``offset(t) = offset + drift·(t - t_ref)``
   (Theil-Sen slope over every pair of phases, weighted by the time between them; robust to a
   bad phase). The true offset lies within ±RTT_min/2 of a round's estimate: that is the hard
   bound.
2. **Collectives**: matched synchronizing collectives (allreduce & co.) end nearly together on all
   ranks. With runtime samples, GPU collectives refine them (per rank, the median over
   collectives of ``(consensus end) - (rank's end)``, :func:`collective_offsets`) only when its
   standard error (residual scatter / sqrt(n)) is below the runtime bound, clipped into it.
   Without samples (foreign traces) whole clocks are fitted — one unknown per clock domain, else
   per host, a rank that breaks causality with its host mates alone — over the graph that
   collectives spanning several clocks and paired sends/receives make: end agreement along the
   best-bounded path from the reference, a drift where the data show one, clipped into the
   causality interval; sends/receives alone give the interval's middle
   (``orchestrator/ingest/clock_graph.py``). A rank without runtime facts on the reference's host keeps
   0 (``same-host``) while causality allows it (docs/format.md, "/clock"); without either, the
   raw clock.
3. **Causality**: no rank can finish a synchronizing collective before its last participant
   started it. Violations are counted before and after; the remaining ones are repaired with
   small per-rank shifts satisfying every constraint ``a_q - a_r <= end_r - start_q``
   (difference constraints, solved by Bellman-Ford — the controlled-logical-clock idea applied
   to whole ranks, which keeps each rank's own intervals intact). A measured clock moves only
   inside its measurement's bound (the reference's domain not at all): violations that no clock
   inside the bounds removes are not clock errors, and they stay counted.

The transform of rank r (all ns, int64 except the drift term)::

    aligned = raw + offset_ns + round(drift_ppb * (raw - t_ref_ns) / 1e9)

``offset_ns`` includes the repair shift; ``raw`` is recovered by inverting it (docs/format.md).

Why one module of ~570 lines: one analysis (clock alignment in three stages and the causality
repair); the graph fit of whole clocks is its own module (``clock_graph.py``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from rankscope.analysis.store.schema import ClockMethod
from rankscope.orchestrator.ingest.clock_graph import constraints as _constraints
from rankscope.orchestrator.ingest.clock_graph import intervals_from
from rankscope.orchestrator.ingest.clock_graph import shortest_from as shortest_from
from rankscope.orchestrator.ingest.column_tables import (
    Columns,
    from_rows,
    group_max,
    median,
    rows_of,
)

if TYPE_CHECKING:
    import pandas as pd

#: The clock table's columns (schema.CLOCK_COLUMNS) and the dtypes :func:`align_columns` gives.
CLOCK_TABLE = {
    "rank": np.int64, "host": object, "offset_ns": np.int64, "drift_ppb": np.float64,
    "t_ref_ns": np.int64, "uncertainty_ns": np.int64, "method": object,
    "violations_before": np.int64, "violations_after": np.int64,
}  # fmt: skip
#: Phases closer than this (s) are not used to estimate drift (the slope would be noise).
MIN_DRIFT_SPAN_S = 0.05
#: Iterations of the consensus/offset alternation of the collective fit.
CONSENSUS_ITERATIONS = 5


@dataclass(frozen=True)
class RuntimeFit:
    """Offset of a clock domain relative to the reference, from runtime ping-pong samples."""

    offset_ns: float
    """reference clock minus this clock at ``t_ref_ns`` (ns)"""
    drift_ppb: float
    """change of the offset per second of elapsed time (ns/s = parts per billion)"""
    t_ref_ns: int
    """time on this domain's raw clock (ns) at which ``offset_ns`` holds"""
    bound_ns: float
    """the true offset is within ± this (ns): worst phase's lowest half-RTT + fit residual"""
    rounds: int
    """rounds available (one per phase, the lowest-RTT one, enters the fit)"""

    def offset_at(self, t_ns: Any) -> Any:
        """Offset (ns, float) at raw time(s) ``t_ns``."""
        return self.offset_ns + self.drift_ppb * (t_ns - self.t_ref_ns) / 1e9


def fit_samples(samples: pd.DataFrame) -> RuntimeFit | None:
    """Fit offset + drift from samples (columns phase, t1, t2, t3, t4; int ns). None if empty."""
    from rankscope.launchers.clocksync import offset_ns, rtt_ns

    if samples is None or samples.empty:
        return None
    s = samples.copy()
    for c in ("t1", "t2", "t3", "t4"):
        s[c] = s[c].astype(np.int64)
    # The per-round formulas are the runtime's (launchers/clocksync.py: the NTP offset and RTT
    # of one round, tested there), applied to each round. The fit keeps whole ns: the exact half
    # that offset_ns returns is floored, as the fit always did. Floor of the exact half equals
    # the integer halving (t2 - t1 + t3 - t4) // 2 while that sum stays below 2**53 ns (~104
    # days); the stamps themselves (~1.8e18 ns) only ever enter as differences, in int.
    rounds = s[["t1", "t2", "t3", "t4"]].to_dict("records")
    s["rtt"] = np.array([rtt_ns(r) for r in rounds], dtype=np.int64)
    s["offset"] = np.floor(np.array([offset_ns(r) for r in rounds], dtype=np.float64))
    s = s[s["rtt"] >= 0]
    if s.empty:
        return None
    s["mid"] = s["t1"] + (s["t4"] - s["t1"]) // 2
    if "phase" not in s:
        s["phase"] = "all"
    # One point per phase: its lowest-RTT round (the true offset is within ±rtt/2 of it).
    # Drift is fitted between phases; the bound is the worst phase's half-RTT plus the fit's
    # largest residual, so it holds for every phase.
    best = s.sort_values("rtt", kind="stable").groupby("phase", sort=False).head(1)
    t_ref = int(best["mid"].min())
    x = (best["mid"].to_numpy(np.float64) - t_ref) / 1e9  # s
    y = best["offset"].to_numpy(np.float64)
    half_rtt = best["rtt"].to_numpy(np.float64) / 2
    drift = 0.0
    if len(best) >= 2 and np.ptp(x) > MIN_DRIFT_SPAN_S:
        # Every pair of phases at least MIN_DRIFT_SPAN_S apart, in either order (the phases are
        # in RTT order here, not in time order), each slope weighted by its pair's time apart:
        # a phase's error (up to its half-RTT) over that time is the slope's error, so a pair
        # of windows 0.4 s apart must not outvote the pairs that span the run.
        i, j = np.triu_indices(len(x), 1)
        dx = x[j] - x[i]
        ok = np.abs(dx) > MIN_DRIFT_SPAN_S
        if ok.any():
            slopes = (y[j] - y[i])[ok] / dx[ok]  # ns per s
            drift = weighted_median(slopes, np.abs(dx[ok]))
    if abs(drift) * float(np.ptp(x)) <= 2 * float(np.max(half_rtt)):
        # The offset change over the run is within the measurement error: not significant.
        drift = 0.0
    intercept = median(y - drift * x)
    residual = float(np.max(np.abs(y - (intercept + drift * x))))
    bound = float(np.max(half_rtt)) + residual
    return RuntimeFit(
        offset_ns=intercept, drift_ppb=drift, t_ref_ns=t_ref, bound_ns=bound, rounds=len(s)
    )


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The value at which the cumulative weight (values in ascending order) reaches half the
    total; the mean of the two neighbours when it lands exactly on a boundary (as the plain
    median does for an even count of equal weights)."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    half = cum[-1] / 2
    k = int(np.searchsorted(cum, half))
    if k + 1 < len(v) and np.isclose(cum[k], half, rtol=1e-12, atol=0.0):
        return float((v[k] + v[k + 1]) / 2)
    return float(v[k])


def apply_transform(ts: np.ndarray, offset_ns: int, drift_ppb: float, t_ref_ns: int) -> np.ndarray:
    """Raw int64 ns → aligned int64 ns (module docstring)."""
    out = ts + np.int64(offset_ns)
    if drift_ppb:
        out = out + np.rint(drift_ppb * (ts - np.int64(t_ref_ns)).astype(np.float64) / 1e9).astype(
            np.int64
        )
    return out


def collective_offsets(
    ends: pd.DataFrame, ref_rank: int, anchors: frozenset[int] = frozenset()
) -> tuple[dict[int, float], dict[int, float], dict[int, int]]:
    """Per-rank offsets (ns) that make matched collective ends agree, the reference at 0.

    ``ends``: columns coll, rank, end (ns, possibly already runtime-corrected). Alternates a
    consensus end per collective (median over ranks) and a per-rank offset (median over
    collectives of consensus - end). Returns (offset, spread, count) per rank, spread being
    1.4826·MAD of that rank's residuals (ns). Ranks without shared collectives are absent.

    ``anchors``: ranks whose clocks are already known to equal the reference's (same host): their
    offsets stay 0 and, where a collective has any, the consensus is the median of their ends
    alone, so an unsettled rank is not fitted against a consensus that includes itself.
    """
    if ends.empty:
        return {}, {}, {}
    e = ends[["coll", "rank", "end"]].copy()
    multi = e.groupby("coll")["rank"].transform("nunique") >= 2
    e = e[multi]
    if e.empty:
        return {}, {}, {}
    base = int(e["end"].min())
    e["x"] = (e["end"] - base).astype(np.float64)
    ranks = sorted(e["rank"].unique().tolist())
    off = dict.fromkeys(ranks, 0.0)
    is_anchor = e["rank"].isin(anchors | {ref_rank}) if anchors else None

    def consensus_of(e: pd.DataFrame) -> pd.Series:
        everyone = e.groupby("coll")["adj"].median()
        if is_anchor is None:
            return everyone
        settled = e[is_anchor].groupby("coll")["adj"].median()
        return settled.reindex(everyone.index).fillna(everyone)

    for _ in range(CONSENSUS_ITERATIONS):
        e["adj"] = e["x"] + e["rank"].map(off)
        consensus = consensus_of(e)
        resid = consensus.loc[e["coll"]].to_numpy() - e["x"].to_numpy()
        e["resid"] = resid
        off = e.groupby("rank")["resid"].median().to_dict()
        if anchors:
            # The consensus is on the settled clocks already: no re-anchoring shift.
            off.update({r: 0.0 for r in anchors | {ref_rank} if r in off})
        elif ref_rank in off:
            shift = off[ref_rank]
            off = {r: v - shift for r, v in off.items()}
    e["adj"] = e["x"] + e["rank"].map(off)
    consensus = consensus_of(e)
    e["r"] = e["adj"] - consensus.loc[e["coll"]].to_numpy()
    # Spread: a rank's own residual scatter, but never less than the pooled scatter of all
    # ranks (with a handful of collectives one rank's MAD can be misleadingly small).
    pooled = float(1.4826 * np.median(np.abs(e["r"] - e["r"].median())))
    spread = e.groupby("rank")["r"].apply(
        lambda r: float(1.4826 * np.median(np.abs(r - r.median())))
    )
    count = e.groupby("rank")["coll"].nunique()
    return (
        {int(r): float(v) for r, v in off.items()},
        {int(r): max(float(v), pooled) for r, v in spread.items()},
        {int(r): int(v) for r, v in count.items()},
    )


def count_violations(colls: Columns | pd.DataFrame) -> dict[int, int]:
    """Per rank (each rank of ``colls``, ascending): synchronizing collectives it ended before
    their last participant started."""
    coll = np.asarray(colls["coll"])
    if not len(coll):
        return {}
    start = np.asarray(colls["start"]).astype(np.int64)
    ids, inverse = np.unique(coll, return_inverse=True)
    last_start = group_max(inverse, start, len(ids))
    bad = np.asarray(colls["end"]).astype(np.int64) < last_start[inverse]
    ranks, at = np.unique(np.asarray(colls["rank"]), return_inverse=True)
    counts = np.bincount(at, weights=bad, minlength=len(ranks))
    return {int(r): int(v) for r, v in zip(ranks.tolist(), counts.tolist(), strict=True)}


def repair_shifts(
    colls: Columns | pd.DataFrame,
    ranks: list[int],
    ref_rank: int,
    limits: dict[int, tuple[float, float]] | None = None,
) -> dict[int, int]:
    """Small per-rank shifts (ns) removing causality violations, the reference fixed.

    Constraint per collective c and ranks r != q: ``(end_cr + a_r) >= (start_cq + a_q)``, i.e.
    ``a_q - a_r <= end_cr - start_cq``. ``limits``: per rank, the range ``(lo, hi)`` its shift
    must stay in relative to the reference — what a measurement vouches for (a runtime fit's
    bound): two more difference constraints ``a_r - a_ref <= hi`` and ``a_ref - a_r <= -lo``.
    Without them the repair moves a well-measured rank as far as the others' constraints need
    (in one CI run a rank whose fit was good to tens of µs was moved 0.79 ms; docs/format.md).

    Two solutions of the same constraints, each anchored on the reference: the largest with all
    shifts <= 0 (Bellman-Ford from all-zero, ranks only move earlier) and the smallest with all
    shifts >= 0 (ranks only move later); the one that moves the ranks less in total (then fewer
    ranks) is returned.
    With contradictory constraints (a negative cycle, e.g. stamps that no clock inside the
    limits explains) the earlier-only shifts after n rounds are returned; the caller checks
    them against the limits and the violation count.
    """
    if not len(colls["coll"]) or len(ranks) < 2:
        return dict.fromkeys(ranks, 0)
    idx = {r: i for i, r in enumerate(ranks)}
    w, inf = _constraints(colls, ranks)
    if limits and ref_rank in idx:
        i0 = idx[ref_rank]
        for r, (lo, hi) in limits.items():
            if r in idx and r != ref_rank:
                i = idx[r]
                w[i0, i] = min(int(w[i0, i]), int(np.floor(hi)))
                w[i, i0] = min(int(w[i, i0]), int(np.floor(-lo)))
    earlier, earlier_settled = _largest_nonpositive(w, inf)
    # The smallest solution >= 0 is minus the largest <= 0 of the reversed constraints
    # (a_q - a_r <= w[r, q] is (-a_r) - (-a_q) <= w[r, q]).
    later, later_settled = _largest_nonpositive(w.T, inf)
    solutions = []
    for is_later, a, settled in ((False, earlier, earlier_settled), (True, -later, later_settled)):
        a = a - a[idx[ref_rank]] if ref_rank in idx else a
        solutions.append((not settled, int(np.abs(a).sum()), int(np.count_nonzero(a)), is_later, a))
    a = min(solutions, key=lambda s: s[:4])[4]
    return {r: int(a[idx[r]]) for r in ranks}


def _largest_nonpositive(w: np.ndarray, inf: int) -> tuple[np.ndarray, bool]:
    """The componentwise largest ``a <= 0`` with ``a_q - a_r <= w[r, q]`` (``inf``: no
    constraint), by Bellman-Ford from all-zero, and whether it settled within n + 1 rounds
    (False: a negative cycle, the shifts after those rounds)."""
    n = len(w)
    found = w < inf
    a = np.zeros(n, dtype=np.int64)
    for _ in range(n + 1):
        new = np.minimum(a, np.where(found, a[:, None] + w, inf).min(axis=0))
        if np.array_equal(new, a):
            return a, True
        a = new
    return a, False


def feasible_offsets(
    colls: Columns | pd.DataFrame, ranks: list[int], ref_rank: int
) -> dict[int, tuple[float, float]]:
    """Per rank, the interval [lo, hi] (ns) of offsets (relative to the reference) that causality
    allows: with the true clocks no rank ends a collective before its last participant started it.

    Shortest paths through the constraints of ``_constraints`` (they chain through third ranks;
    :func:`shortest_from`, from and to the reference): ``a_r - a_ref <= d[ref, r]`` and ``a_ref - a_r <= d[r, ref]``. A hard bound,
    whatever the other ranks' estimates. Ranks with no constraint path to the reference, and all
    ranks when the constraints contradict each other (a negative cycle), are absent.
    """
    if not len(colls["coll"]) or ref_rank not in ranks or len(ranks) < 2:
        return {}
    w, inf = _constraints(colls, ranks)
    return {ranks[i]: b for i, b in intervals_from(w, inf, ranks.index(ref_rank)).items()}


@dataclass(frozen=True)
class ClockInput:
    """What is known about one rank's clock before alignment."""

    rank: int
    host: str
    domain: str
    """clock domain (ranks with equal domains share one clock); '' when unknown"""
    fit: RuntimeFit | None
    """runtime fit of the rank's domain (None: no samples, or the reference domain)"""


def align(
    colls: pd.DataFrame, inputs: list[ClockInput], ref_rank: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`align_columns` on a DataFrame (the aligned rows keep ``colls``' index)."""
    import pandas as pd

    clock, aligned = align_columns(
        {c: colls[c].to_numpy() for c in colls.columns}, inputs, ref_rank, colls.index.to_numpy()
    )
    return pd.DataFrame(clock), pd.DataFrame(aligned, index=colls.index)


def align_columns(
    colls: Columns, inputs: list[ClockInput], ref_rank: int, labels: np.ndarray | None = None
) -> tuple[Columns, Columns]:
    """Align all ranks; returns (clock table per schema.CLOCK_COLUMNS, aligned collectives).

    ``colls``: long-form matched collectives (raw ns per rank; columns coll, rank, op, start,
    end, gpu: ``matching.match``). The collectives come back with start/end on the aligned
    clock. ``labels``: each row's label in the DataFrames the fits get (default: its position).

    In numpy throughout, but for the refinement of sampled clocks by GPU collectives
    (:func:`collective_offsets`, pandas, imported where it runs: ``rankscope run``'s own runs,
    whose analysis imports pandas anyway): a merge of other tools' traces imports no pandas.
    """
    from rankscope.analysis.store.schema import P2P_OPS
    from rankscope.orchestrator.ingest import clock_graph as cg
    from rankscope.orchestrator.ingest.matching import SYNCHRONIZING_OPS, shared_rows

    by_rank = {i.rank: i for i in inputs}
    ref_domain = by_rank[ref_rank].domain if ref_rank in by_rank else ""
    ref_host = by_rank[ref_rank].host if ref_rank in by_rank else ""
    ranks = sorted(by_rank)
    # Stage 1: runtime fit (the reference's domain is the reference).
    offset: dict[int, float] = {}
    drift: dict[int, float] = {}
    t_ref: dict[int, int] = {}
    bound: dict[int, float] = {}
    method: dict[int, ClockMethod] = {}
    for r in ranks:
        ci = by_rank[r]
        offset[r], drift[r], t_ref[r] = 0.0, 0.0, 0
        if r == ref_rank or (ref_domain and ci.domain == ref_domain):
            method[r], bound[r] = ClockMethod.REFERENCE, 0.0
        elif ci.fit is not None:
            offset[r], drift[r], t_ref[r] = ci.fit.offset_ns, ci.fit.drift_ppb, ci.fit.t_ref_ns
            method[r], bound[r] = ClockMethod.RUNTIME, ci.fit.bound_ns
        elif not ci.domain and ref_host and ci.host == ref_host:
            # No runtime clock facts, same host as the reference: one CLOCK_REALTIME, unless
            # something like libfaketime shifted this process (stage 2 checks causality).
            method[r], bound[r] = ClockMethod.SAME_HOST, 0.0
        else:
            method[r], bound[r] = ClockMethod.RAW, -1.0
    if labels is None:
        labels = np.arange(len(colls["rank"]))

    def transform(rows: Columns, extra: dict[int, float]) -> Columns:
        """``apply_transform`` of each row's rank, on whole columns (one ``.loc`` per rank was
        5.9 s of a 1,024-rank merge)."""
        out = dict(rows)
        if not len(rows["rank"]):
            return out
        here, rank = np.unique(np.asarray(rows["rank"]).astype(np.int64), return_inverse=True)
        here_ = here.tolist()
        o_ns = np.array(
            [round(offset.get(r, 0.0) + extra.get(r, 0.0)) for r in here_], dtype=np.int64
        )[rank]
        dr = np.array([float(drift.get(r, 0.0)) for r in here_], dtype=np.float64)[rank]
        t0 = np.array([int(t_ref.get(r, 0)) for r in here_], dtype=np.int64)[rank]
        drifting = dr != 0
        for col in ("start", "end"):
            ts = np.asarray(rows[col]).astype(np.int64)
            new = ts + o_ns
            if drifting.any():
                new[drifting] += np.rint(
                    dr[drifting] * (ts[drifting] - t0[drifting]).astype(np.float64) / 1e9
                ).astype(np.int64)
            out[col] = new
        return out

    def frame(rows: Columns, mask: np.ndarray) -> pd.DataFrame:
        """The rows of ``mask`` as the pandas fit of sampled clocks takes them (labels kept)."""
        import pandas as pd

        return pd.DataFrame(rows, index=labels[mask])

    sync_rows = shared_rows(colls, SYNCHRONIZING_OPS, 2)
    p2p_rows = shared_rows(colls, P2P_OPS, 2, exactly=True)
    sync = rows_of(colls, sync_rows)
    p2p = rows_of(colls, p2p_rows)
    raw_violations = count_violations(sync)
    # Stage 2: collectives refine (inside the runtime bound) or estimate alone.
    spread: dict[int, float] = {}
    feasible: dict[int, tuple[float, float]] = {}
    if sync_rows.any() or p2p_rows.any():
        saved = (dict(offset), dict(method), dict(drift), dict(t_ref))
        pre = transform(sync, {})
        before_fit = sum(count_violations(pre).values())
        # Same-host ranks for which 0 is feasible (causality, relative to the runtime-corrected
        # clocks) keep the reference's clock.
        feasible = feasible_offsets(pre, ranks, ref_rank) if sync_rows.any() else {}
        anchors = frozenset(
            r
            for r, (lo, hi) in feasible.items()
            if method[r] == ClockMethod.SAME_HOST and lo <= 0.0 <= hi
        )
        sampled = any(method[r] == ClockMethod.RUNTIME for r in ranks)
        goff: dict[int, float] = {}
        gspread: dict[int, float] = {}
        gcount: dict[int, int] = {}
        if sampled and "gpu" in pre and np.asarray(pre["gpu"]).astype(bool).any():
            on_gpu = np.asarray(pre["gpu"]).astype(bool)
            gpu = frame(rows_of(pre, on_gpu), np.flatnonzero(sync_rows)[on_gpu])
            goff, gspread, gcount = collective_offsets(gpu, ref_rank)
        for r in ranks:
            # Refine a runtime fit only with GPU collectives (NCCL kernels end within µs of each
            # other), and only when they are more precise than the runtime bound (standard error
            # spread/sqrt(n) below it). Host-side gloo ops are never used here: their end stamps
            # wait for a thread to be scheduled, scattering by up to ms with a per-rank bias
            # that no scatter statistic reveals (measured on one clock:
            # cpu_gloo_4rank_straggler). The refined value stays inside the runtime bound.
            if method[r] != ClockMethod.RUNTIME or r not in goff or ref_rank not in goff:
                continue
            stderr = gspread.get(r, np.inf) / np.sqrt(max(gcount.get(r, 1), 1))
            if stderr < bound[r]:
                offset[r] += float(np.clip(goff[r], -bound[r], bound[r]))
                method[r] = ClockMethod.RUNTIME_COLLECTIVES
                spread[r] = gspread[r]
        # Ranks without runtime facts: whole clocks (domain, else host) over the graph that
        # collectives and sends/receives make (orchestrator/ingest/clock_graph.py).
        unknown = {
            r: by_rank[r].domain or ("" if method[r] == ClockMethod.SAME_HOST else by_rank[r].host)
            for r in ranks
            if method[r] in (ClockMethod.RAW, ClockMethod.SAME_HOST) and r not in anchors
        }
        if unknown:
            groups = cg.clock_groups(unknown, set(ranks) - set(unknown))
            groups = cg.split_inconsistent(pre, groups)
            root_bound = max((bound[r] for r in ranks if groups[r] == cg.ROOT), default=0.0)
            fits = cg.fit_groups(pre, transform(p2p, {}), groups, max(root_bound, 0.0))
            for r in unknown:
                if (f := fits.get(groups[r])) is not None:
                    offset[r] += f.offset_ns
                    drift[r], t_ref[r] = f.drift_ppb, f.t_ref_ns
                    method[r], spread[r] = ClockMethod.COLLECTIVES, f.uncertainty_ns
        if sum(count_violations(transform(sync, {})).values()) > before_fit:
            # The matched events do not behave like synchronizing collectives (e.g. point-to-
            # point traffic of a few ranks out of a larger job): their fit would make things
            # worse than the clocks we had, so it is not used.
            offset, method, drift, t_ref = saved
            spread = {}
    for r in ranks:
        if method[r] == ClockMethod.SAME_HOST and r not in feasible:
            # No collective to check the shared clock against: offset 0 all the same, but
            # nothing vouches for it.
            method[r] = ClockMethod.RAW
    # Stage 3: causality check and repair (kept only when it removes violations).
    aligned_sync = transform(sync, {})
    before = count_violations(aligned_sync)
    shifts: dict[int, int] = {}
    after = before
    if any(before.values()):
        # A measured clock moves only inside what its measurement allows: the reference's
        # domain not at all, a runtime fit within its bound around the fitted offset (a
        # refined one included). Same-host and collective-only clocks are estimates: free.
        limits: dict[int, tuple[float, float]] = {}
        for r in ranks:
            fit = by_rank[r].fit
            if method[r] == ClockMethod.REFERENCE:
                limits[r] = (0.0, 0.0)
            elif method[r] in (ClockMethod.RUNTIME, ClockMethod.RUNTIME_COLLECTIVES) and fit:
                moved = offset[r] - fit.offset_ns
                limits[r] = (-bound[r] - moved, bound[r] - moved)
        shifts = repair_shifts(aligned_sync, ranks, ref_rank, limits)
        for r, a in shifts.items():
            offset[r] += a
        after = count_violations(transform(sync, {}))
        outside = any(not lo - 1 <= shifts.get(r, 0) <= hi + 1 for r, (lo, hi) in limits.items())
        if outside or sum(after.values()) >= sum(before.values()):
            for r, a in shifts.items():
                offset[r] -= a
            shifts, after = {}, before
    rows: list[tuple[Any, ...]] = []
    for r in ranks:
        if method[r] in (ClockMethod.REFERENCE, ClockMethod.SAME_HOST):
            unc = 0.0
        elif method[r] == ClockMethod.RUNTIME:
            unc = bound[r]
        elif method[r] == ClockMethod.RUNTIME_COLLECTIVES:
            unc = min(bound[r], max(spread.get(r, bound[r]), 1.0))
        elif method[r] == ClockMethod.COLLECTIVES:
            unc = spread.get(r, -1.0)
        else:
            unc = -1.0
        rows.append(
            (
                r,
                by_rank[r].host,
                round(offset[r]),
                float(drift[r]),
                int(t_ref[r]),
                round(unc + abs(shifts.get(r, 0))) if unc >= 0 else -1,
                str(method[r]),
                int(raw_violations.get(r, 0)),
                int(after.get(r, 0)),
            )
        )
    return from_rows(rows, CLOCK_TABLE), transform(colls, {})


def summary_line(clock: Columns) -> str:
    """One line: method counts, largest |offset|, violations before → after."""
    if not len(clock["rank"]):
        return "clock: no ranks"
    methods = collections.Counter(str(m) for m in np.asarray(clock["method"]).tolist())
    m = ", ".join(f"{k} {v}" for k, v in sorted(methods.items()))
    offsets = np.asarray(clock["offset_ns"])
    big = int(np.argmax(np.abs(offsets)))  # the first of the largest
    unc = np.asarray(clock["uncertainty_ns"])
    unc = unc[unc >= 0]
    return (
        f"clock: {m}; largest offset {offsets[big] / 1e6:+.3f} ms (rank "
        f"{int(np.asarray(clock['rank'])[big])}); uncertainty ≤ "
        f"{(unc.max() if len(unc) else 0) / 1e3:.1f} µs; causality violations "
        f"{int(np.sum(clock['violations_before']))} → {int(np.sum(clock['violations_after']))}"
    )
