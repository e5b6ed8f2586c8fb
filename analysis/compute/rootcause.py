"""Root cause of slow steps in jobs whose collectives do not all span every rank.

In a tensor x pipeline x data parallel job no collective waits for every rank: one rank's delay
reaches the others hop by hop, through its tensor-parallel collectives, the pipeline's
send/recv and the data-parallel gradient reduction. The flat straggler rules
(:mod:`rankscope.analysis.compute.stragglers`: who is last at world-spanning collectives and what share
of all waiting it caused) see that delay spread thin and name nobody. This module judges a
rank against its **peers** — the ranks that run the same program (the same pipeline stage) —
and measures what a fix buys on the what-if replay graph (:mod:`rankscope.analysis.engine.whatif`),
OSDI'25 style: the saving of fixing one worker, one stage, or the imbalance of the data.

**Peers** (:func:`layout`): from the process groups the traces list
(``distributedInfo.pg_config``, kept per rank by the merge): Megatron-Core's
``PIPELINE_MODEL_PARALLEL_GROUP`` / ``DATA_PARALLEL_GROUP`` / ``TENSOR_MODEL_PARALLEL_GROUP``
and torchtitan's ``mesh_pp`` / ``mesh_dp*`` / ``mesh_tp`` give each rank its (dp, pp, tp)
coordinates (its index in each group); peers share ``pp``. Without them, ranks whose profiled
step calls the same ops in the same order are peers (:data:`PeerSource.SIGNATURE`).

**Own work** of a rank in a step: the sum of its WORK edges (ns; its time between its own points
less exposed communication). Its **excess** in a step: own work minus the median of its OTHER
peers' (ns). Three classes (:class:`RootClass`), each with general rules (docs/analysis.md):

* a **slow worker** — one rank, the slowest of its peers in significantly many steps
  (one-sided binomial, chance ``1/peers``), its typical excess (median over steps) at least
  ``MIN_STEP_FRACTION`` of the step and ``SEPARATION_Z`` standard errors above its peers'
  step-to-step noise, and "rank r like its peers" (each own-work edge at most the other peers'
  median at the same point) saves at least ``MIN_STEP_FRACTION`` of the step;
* **stage imbalance** — every rank of one stage does more own work per step than the median
  stage's ranks, the stage is the heaviest in significantly many steps (chance ``1/stages``),
  and "the stage like the other stages" (its own work scaled to the other stages' median)
  saves at least ``MIN_STEP_FRACTION`` of the step;
* **data-dependent imbalance** — "no data imbalance" (every own-work edge of every rank at its
  peers' median over peers and steps at the same position and op) saves at least
  ``MIN_STEP_FRACTION`` of the step beyond what the named slow workers and stages buy, in the
  median step: the slowest peer moves, no one rank is to blame.

Each named slow worker comes with the **path** its delay took (:func:`wait_path`): the ops
where it arrived last and the ranks that waited there, then where those ranks arrived last.

Why one module of ~590 lines: one model (peers, excess, replayed fixes) for jobs the flat rules
do not fit, its three class tests read together; flat jobs (every multi-rank collective spans
all ranks) never reach it (:func:`applies`). The weights it replays are in
:mod:`rankscope.analysis.compute.peer_weights`, the wording in :mod:`rankscope.analysis.conclude.rootcause_findings`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.exact_reductions import (
    group_positions,
    pandas_mean,
    pandas_median,
)
from rankscope.analysis.compute.peer_weights import (
    Replayer,
    index_of,
    like_peers,
    minus_others_median,
    no_imbalance,
    own_per_step,
    scale_stages,
)

if TYPE_CHECKING:
    from rankscope.analysis.compute.whatif_graph import Model


class RootClass(enum.StrEnum):
    """What slows a layered job (the 2025 straggler studies' three classes)."""

    SLOW_WORKER = "slow_worker"
    STAGE_IMBALANCE = "stage_imbalance"
    DATA_IMBALANCE = "data_imbalance"


class PeerSource(enum.StrEnum):
    """Where the peers came from."""

    GROUPS = "process groups"
    SIGNATURE = "op signature"


#: Layout dims and the group descriptions that name them (Megatron-Core, torchtitan DeviceMesh).
DIM_DESCS: dict[str, tuple[str, ...]] = {
    "pp": ("PIPELINE_MODEL_PARALLEL_GROUP", "mesh_pp"),
    "dp": ("DATA_PARALLEL_GROUP", "mesh_dp_shard", "mesh_dp", "mesh_dp_replicate"),
    "tp": ("TENSOR_MODEL_PARALLEL_GROUP", "mesh_tp"),
}
#: Most slow-worker candidates replayed (largest typical excess first): each is one replay.
MAX_CANDIDATES = 8

#: Columns of :func:`layout`.
LAYOUT_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "dp": "int64",  # -1 where the layout does not say
    "pp": "int64",
    "tp": "int64",
    "peers": "int64",  # peer group id (the stage where known)
}

#: Columns of :attr:`RootCause.ranks` (ns unless ``_s``): the slow-worker tests per rank.
RANK_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "dp": "int64",
    "pp": "int64",
    "tp": "int64",
    "peers": "int64",  # number of ranks in its peer group (itself included)
    "steps": "int64",
    "times_slowest": "int64",  # steps where it did the most own work of its peers
    "p_value": "float64",
    "typical_s": "float64",  # median over steps of its own work minus its other peers' median
    "noise_s": "float64",  # pooled s.d. over steps of the other peers' excess
    "compute_extra_s": "float64",  # per step (median), vs the other peers' median
    "input_extra_s": "float64",
    "host_extra_s": "float64",  # host time other than GC pauses
    "gc_extra_s": "float64",  # Python GC pauses (0 without ``Python GC`` events)
    "saving_s": "float64",  # what-if: "rank like its peers" (NaN: not replayed)
    "saving_share": "float64",
    "cause": "str",
    "verdict": "str",
    "is_straggler": "bool",
    "path": "str",
}

#: Columns of :attr:`RootCause.stages` (ns unless ``_s``): the stage-imbalance tests per stage.
STAGE_COLUMNS: dict[str, str] = {
    "stage": "int64",
    "ranks": "int64",
    "steps": "int64",
    "times_heaviest": "int64",
    "p_value": "float64",
    "typical_s": "float64",  # median over steps of its own work minus the other stages' median
    "every_rank_heavier": "bool",  # each of its ranks above the median stage's typical work
    "saving_s": "float64",  # what-if: "the stage like the other stages" (NaN: not replayed)
    "saving_share": "float64",
    "verdict": "str",
    "is_imbalanced": "bool",
}


class Verdict(enum.StrEnum):
    """Why a rank or stage is, or is not, named: NAMED, else the first test it failed."""

    NAMED = "named"
    NO_PEERS = "no peers"
    NOT_SIGNIFICANT = "not slowest more often than chance"
    NOT_EVERY_RANK = "not every rank of the stage"
    IMMATERIAL = "immaterial"
    WITHIN_NOISE = "within the noise"
    FIX_IMMATERIAL = "fixing it buys too little"


@dataclasses.dataclass
class RootCause:
    """What :func:`root_causes` found (DataFrames; figures in ns unless ``_s``)."""

    source: PeerSource
    layout: pd.DataFrame
    ranks: pd.DataFrame
    stages: pd.DataFrame
    imbalance: dict[str, float]
    """Data imbalance: ``saving_share`` (no data imbalance), ``beyond_share`` (beyond the named
    fixes, median step), ``moving`` (distinct slowest ranks over (peer group, step)),
    ``steps``, ``named`` (1.0 / 0.0)."""
    whatif: pd.DataFrame
    """Its scenarios (whatif_scenarios.SCENARIO_COLUMNS)."""

    def straggler_ranks(self) -> list[int]:
        """The slow workers, largest saving first."""
        r = self.ranks
        return [int(x) for x in r.loc[r["is_straggler"], "rank"]] if len(r) else []

    def imbalanced_stages(self) -> list[int]:
        """The stages named for stage imbalance."""
        s = self.stages
        return [int(x) for x in s.loc[s["is_imbalanced"], "stage"]] if len(s) else []

    def data_imbalance(self) -> bool:
        """Whether data-dependent imbalance is named."""
        return bool(self.imbalance.get("named", 0.0))

    def coords(self, rank: int) -> str:
        """'dp 0, pp 1, tp 1' (the dims the layout gives), or ''."""
        row = self.layout[self.layout["rank"] == rank]
        if not len(row):
            return ""
        parts = [f"{d} {int(row[d].iloc[0])}" for d in ("dp", "pp", "tp") if row[d].iloc[0] >= 0]
        return ", ".join(parts)


# -- which jobs, which peers -----------------------------------------------------------------


def applies(collectives: pd.DataFrame) -> bool:
    """True when some matched collective (not send/recv) of two or more ranks spans fewer than
    all ranks: a layered job (tensor / data / pipeline groups). Flat jobs — and pure pipelines,
    whose bottleneck analysis is :mod:`rankscope.analysis.compute.bottleneck`'s — keep the flat rules."""
    from rankscope.analysis.store.schema import P2P_OPS

    if not len(collectives):
        return False
    world = collectives["rank"].nunique()
    multi = collectives[~collectives["op"].isin(P2P_OPS)]
    sizes = multi.groupby("coll")["rank"].nunique()
    return bool(((sizes >= 2) & (sizes < world)).any())


def layout(ranks: Sequence[int], process_groups: Mapping[int, Any], model: Model) -> pd.DataFrame:
    """Each rank's coordinates and peer group (LAYOUT_COLUMNS); ``process_groups``: per rank the
    store's ``process_groups`` attribute (``[{"name", "desc", "ranks"}]``, None when absent).
    ``.attrs["source"]``: the :class:`PeerSource`."""
    coords: dict[str, dict[int, int]] = {d: {} for d in DIM_DESCS}
    for r in ranks:
        for g in process_groups.get(r) or []:
            members = list(g.get("ranks") or [])
            for dim, descs in DIM_DESCS.items():
                if str(g.get("desc", "")) in descs and r in members:
                    coords[dim][r] = members.index(r)
    rows = pd.DataFrame({"rank": list(ranks)})
    for dim in DIM_DESCS:
        rows[dim] = [coords[dim].get(int(r), -1) for r in ranks]
    if len(coords["pp"]) == len(ranks):
        rows["peers"] = rows["pp"]
        source = PeerSource.GROUPS
    elif (
        not coords["pp"]
        and len(coords["dp"]) + len(coords["tp"])
        and all(r in coords["dp"] or r in coords["tp"] for r in ranks)
    ):
        rows["peers"] = 0  # no pipeline: every rank runs the same program
        source = PeerSource.GROUPS
    else:
        rows["peers"] = _signature_groups(model, list(ranks))
        source = PeerSource.SIGNATURE
    out = rows.astype(LAYOUT_COLUMNS)
    out.attrs["source"] = str(source)
    return out


def _signature_groups(model: Model, ranks: list[int]) -> list[int]:
    """Peer group per rank from the ops of its first profiled step, in order."""
    from rankscope.analysis.compute.whatif_graph import ARRIVAL

    n = model.nodes
    arr = n[(n["kind"] == ARRIVAL) & (n["step"] >= 0)]
    first = int(arr["step"].min()) if len(arr) else -1
    sigs: dict[tuple[str, ...], int] = {}
    out = []
    for r in ranks:
        ops = tuple(arr.loc[(arr["rank"] == r) & (arr["step"] == first)].sort_values("pos")["op"])
        out.append(sigs.setdefault(ops, len(sigs)))
    return out


# -- the tests -------------------------------------------------------------------------------


def root_causes(
    model: Model,
    lay: pd.DataFrame,
    breakdown: pd.DataFrame | None = None,
    collectives: pd.DataFrame | None = None,
    process_groups: Mapping[int, Any] | None = None,
    gc: pd.DataFrame | None = None,
) -> RootCause:
    """The three classes' tests on a layered job (module docstring; docs/analysis.md).

    ``lay``: :func:`layout`; ``breakdown``: per rank and step (breakdown.BREAKDOWN_COLUMNS) for
    the compute part of a rank's excess (without it: all own work counts as compute);
    ``collectives``: ``Store.collectives()`` for the wait path; ``process_groups``: as for
    :func:`layout`, to name the groups on the path; ``gc``: garbage collections per rank and
    step (``gc_pauses.gc_per_step``) for the GC part of a rank's excess (without: none)."""
    from rankscope.analysis.compute import whatif_scenarios as wi

    rp = Replayer(model)
    per = own_per_step(model, lay)
    per = _with_gc(_with_compute(per, breakdown), gc)
    ranks = _rank_tests(per, lay, rp)
    named = [int(r) for r in ranks.loc[ranks["is_straggler"], "rank"]]
    stages, stage_fix = _stage_tests(per, lay, rp, named)
    rows = [rp.row(wi.PEER_LIKE, r, like_peers(model, lay, [r])) for r in named]
    for g in stages.loc[stages["is_imbalanced"], "stage"] if len(stages) else []:
        rows.append(rp.row(wi.STAGE_LIKE_OTHERS, -1, scale_stages(model, lay, stage_fix[int(g)])))
    balanced = _balanced(per, lay, named)
    if balanced:
        rows.append(rp.row(wi.STAGES_BALANCED, -1, scale_stages(model, lay, balanced)))
    even = no_imbalance(model, lay)
    rows.append(rp.row(wi.NO_DATA_IMBALANCE, -1, even))
    fixes = _named_fixes(model, lay, named, stages, stage_fix)
    imbalance = _imbalance_test(per, rp, even, fixes)
    if collectives is not None and named:
        from rankscope.analysis.compute.wait_paths import group_roles, wait_path

        roles = group_roles(process_groups or {})
        n_steps = max(int(per["step"].nunique()), 1)
        paths = {r: wait_path(collectives, r, roles, n_steps) for r in named}
        ranks["path"] = [paths.get(int(r), "") for r in ranks["rank"]]
    table = pd.DataFrame(rows, columns=list(wi.SCENARIO_COLUMNS)).astype(wi.SCENARIO_COLUMNS)
    source = PeerSource(lay.attrs.get("source", PeerSource.GROUPS))
    return RootCause(source, lay, ranks, stages, imbalance, table)


def _with_compute(per: pd.DataFrame, breakdown: pd.DataFrame | None) -> pd.DataFrame:
    """``per`` with ``compute_excess``: the rank's compute (breakdown) minus its other peers'
    median in the step (ns; the whole excess where the breakdown lacks the step)."""
    per = per.copy()
    if breakdown is None or not len(breakdown):
        per["compute_excess"] = per["excess"] - per["input_excess"]
        return per
    comp = breakdown[breakdown["step"] >= 0].set_index(["rank", "step"])["compute_ns"]
    per["compute"] = comp.reindex(index_of(per[["rank", "step"]])).to_numpy(float)
    peers = per.groupby(["g", "step"]).ngroup().to_numpy(np.int64)
    per["compute_excess"] = minus_others_median(per["compute"].to_numpy(float), peers)
    miss = per["compute_excess"].isna()
    per.loc[miss, "compute_excess"] = per.loc[miss, "excess"] - per.loc[miss, "input_excess"]
    return per


def _with_gc(per: pd.DataFrame, gc: pd.DataFrame | None) -> pd.DataFrame:
    """``per`` with ``gc_excess``: the rank's GC pauses in the step minus its other peers'
    median (ns; 0 where the trace has no ``Python GC`` events)."""
    per = per.copy()
    per["gc_excess"] = 0.0
    if gc is None or not len(gc):
        return per
    paused = gc.set_index(["rank", "step"])["gc_ns"]
    per["gc"] = paused.reindex(index_of(per[["rank", "step"]])).fillna(0).to_numpy(float)
    peers = per.groupby(["g", "step"]).ngroup().to_numpy(np.int64)
    per["gc_excess"] = np.nan_to_num(minus_others_median(per["gc"].to_numpy(float), peers))
    return per


def _rank_tests(per: pd.DataFrame, lay: pd.DataFrame, rp: Replayer) -> pd.DataFrame:
    """The slow-worker tests (RANK_COLUMNS), largest saving first, then largest excess."""
    from rankscope.analysis.compute.stragglers import (
        ALPHA,
        MEDIAN_SE,
        MIN_STEP_FRACTION,
        SEPARATION_Z,
        Cause,
        binomial_p_value,
    )

    step_ns = rp.base_stat
    size = lay.groupby("peers")["rank"].size()
    slowest = per.loc[per.groupby(["g", "step"])["own"].idxmax(), ["rank", "step"]]
    times = slowest.groupby("rank").size()
    # each rank's layout and the excess variance of every rank, once (a filter of the whole
    # table per rank made this quadratic in the ranks: 0.4 s at 256 ranks); a rank's peers'
    # variances are then picked from these, in rank order as a groupby of the peers gives them
    # (``g`` is the rank's peer group, one per rank: ``own_per_step`` maps it from the layout)
    coords: dict[Any, dict[str, int]] = {}
    for rank, dp, pp, tp in lay[["rank", "dp", "pp", "tp"]].itertuples(index=False):
        coords.setdefault(rank, {"dp": int(dp), "pp": int(pp), "tp": int(tp)})
    variance = per.groupby("rank")["excess"].var(ddof=1)
    var_of = dict(zip(variance.index.tolist(), variance.to_numpy(float).tolist(), strict=True))
    ranks_in: dict[Any, list[Any]] = {}
    for rank, g in per.groupby("rank")["g"].first().items():
        ranks_in.setdefault(g, []).append(rank)
    # each rank's rows as positions, in the table's order, reduced as pandas reduces
    # (exact_reductions: a pandas filter and five pandas reductions per rank cost ~1.5 ms a
    # rank, 0.4 s at 256 ranks)
    g_of = per["g"].to_numpy()
    excess = per["excess"].to_numpy(float)
    medians_of = {
        c: per[c].to_numpy(float) for c in ("compute_excess", "input_excess", "gc_excess")
    }
    rows = []
    for r, mine in group_positions(per["rank"].to_numpy()).items():
        g = g_of[mine[0]]
        k = int(size.get(int(g), 1))
        ex = excess[mine]
        ex = ex[~np.isnan(ex)]
        n = len(ex)
        var = np.array([var_of[q] for q in ranks_in[g] if q != r], float)
        var = var[~np.isnan(var)]  # dropped first: pandas sums the values left, in order
        noise = float(math.sqrt(pandas_mean(var))) if len(var) else 0.0
        t = int(times.get(r, 0))
        p = binomial_p_value(t, n, 1.0 / k) if k >= 2 and n else 1.0
        typical = float(np.median(ex)) if n else 0.0
        comp, inp, paused = (
            pandas_median(medians_of[c][mine]) if n else 0.0
            for c in ("compute_excess", "input_excess", "gc_excess")
        )
        host = typical - comp - inp - paused
        parts = {Cause.OWN_COMPUTE: comp, Cause.INPUT: inp, Cause.HOST: host, Cause.GC: paused}
        cause = max(parts, key=lambda c: parts[c]) if typical > 0 else Cause.UNKNOWN
        if k < 2 or not n:
            verdict = Verdict.NO_PEERS
        elif p > ALPHA:
            verdict = Verdict.NOT_SIGNIFICANT
        elif typical < MIN_STEP_FRACTION * step_ns:
            verdict = Verdict.IMMATERIAL
        elif typical <= SEPARATION_Z * MEDIAN_SE * noise / math.sqrt(n):
            verdict = Verdict.WITHIN_NOISE
        else:
            verdict = Verdict.NAMED  # provisional: the replay decides (below)
        rows.append(
            {
                "rank": int(r),
                **coords[r],
                "peers": k,
                "steps": n,
                "times_slowest": t,
                "p_value": p,
                "typical_s": typical / 1e9,
                "noise_s": noise / 1e9,
                "compute_extra_s": comp / 1e9,
                "input_extra_s": inp / 1e9,
                "host_extra_s": host / 1e9,
                "gc_extra_s": paused / 1e9,
                "saving_s": np.nan,
                "saving_share": np.nan,
                "cause": str(cause),
                "verdict": str(verdict),
                "is_straggler": False,
                "path": "",
            }
        )
    out = pd.DataFrame(rows, columns=list(RANK_COLUMNS))
    cand = out[out["verdict"] == Verdict.NAMED].sort_values("typical_s", ascending=False)
    for i in cand.index[:MAX_CANDIDATES]:
        saving, share = rp.saving(like_peers(rp.model, lay, [int(out.at[i, "rank"])]))
        out.at[i, "saving_s"], out.at[i, "saving_share"] = saving / 1e9, share
        ok = share >= MIN_STEP_FRACTION
        out.at[i, "is_straggler"] = ok
        out.at[i, "verdict"] = str(Verdict.NAMED if ok else Verdict.FIX_IMMATERIAL)
    for i in cand.index[MAX_CANDIDATES:]:
        out.at[i, "verdict"] = str(Verdict.FIX_IMMATERIAL)
    out = out.sort_values(
        ["is_straggler", "saving_s", "typical_s"], ascending=False, na_position="last"
    )
    return out.reset_index(drop=True).astype(RANK_COLUMNS)


def _stage_work(per: pd.DataFrame, named: Sequence[int]) -> pd.DataFrame:
    """Per step (rows) and stage (columns): the median own work of the stage's ranks, the named
    slow workers left out (ns)."""
    kept = per[~per["rank"].isin(list(named))]
    return kept.groupby(["step", "g"])["own"].median().unstack("g")


def _stage_tests(
    per: pd.DataFrame, lay: pd.DataFrame, rp: Replayer, named: Sequence[int]
) -> tuple[pd.DataFrame, dict[int, dict[tuple[int, int], float]]]:
    """The stage-imbalance tests (STAGE_COLUMNS) and each tested stage's fix (factors for
    :func:`scale_stages`: the stage's own work scaled to the other stages' median, per step)."""
    from rankscope.analysis.compute.stragglers import (
        ALPHA,
        MEDIAN_SE,
        MIN_STEP_FRACTION,
        SEPARATION_Z,
        binomial_p_value,
    )

    empty = pd.DataFrame({c: pd.Series(dtype=d) for c, d in STAGE_COLUMNS.items()})
    if lay.attrs.get("source") != PeerSource.GROUPS or lay["peers"].nunique() < 2:
        return empty, {}
    w = _stage_work(per, named)
    n_stages = w.shape[1]
    heaviest = w.idxmax(axis=1).value_counts()
    rank_typical = per.groupby(["g", "rank"])["own"].median()
    median_stage = float(w.median(axis=0).median())
    rows, fixes = [], {}
    for g in w.columns:
        others = w.drop(columns=g)
        ex = (w[g] - others.median(axis=1)).dropna()
        n = len(ex)
        typical = float(ex.median()) if n else 0.0
        noise_parts = [
            (others[h] - w.drop(columns=h).median(axis=1)).var(ddof=1) for h in others.columns
        ]
        noise_var = [v for v in noise_parts if np.isfinite(v)]
        noise = math.sqrt(float(np.mean(noise_var))) if noise_var else 0.0
        t = int(heaviest.get(g, 0))
        p = binomial_p_value(t, n, 1.0 / n_stages) if n else 1.0
        every = bool((rank_typical.loc[g] > median_stage).all())
        fixes[int(g)] = {
            (int(g), int(s)): min(1.0, float(others.loc[s].median()) / float(w.at[s, g]))
            for s in w.index
            if w.at[s, g] > 0 and np.isfinite(others.loc[s].median())
        }
        saving, share = np.nan, np.nan
        if p > ALPHA:
            verdict = Verdict.NOT_SIGNIFICANT
        elif not every:
            verdict = Verdict.NOT_EVERY_RANK
        elif typical < MIN_STEP_FRACTION * rp.base_stat:
            verdict = Verdict.IMMATERIAL
        elif typical <= SEPARATION_Z * MEDIAN_SE * noise / math.sqrt(n):
            verdict = Verdict.WITHIN_NOISE
        else:
            saving, share = rp.saving(scale_stages(rp.model, lay, fixes[int(g)]))
            ok = share >= MIN_STEP_FRACTION
            verdict = Verdict.NAMED if ok else Verdict.FIX_IMMATERIAL
        rows.append(
            {
                "stage": int(g),
                "ranks": int((lay["peers"] == g).sum()),
                "steps": n,
                "times_heaviest": t,
                "p_value": p,
                "typical_s": typical / 1e9,
                "every_rank_heavier": every,
                "saving_s": saving / 1e9 if np.isfinite(saving) else np.nan,
                "saving_share": share,
                "verdict": str(verdict),
                "is_imbalanced": verdict == Verdict.NAMED,
            }
        )
    out = pd.DataFrame(rows, columns=list(STAGE_COLUMNS))
    out = out.sort_values(["is_imbalanced", "typical_s"], ascending=False).reset_index(drop=True)
    return out.astype(STAGE_COLUMNS), fixes


def _balanced(
    per: pd.DataFrame, lay: pd.DataFrame, named: Sequence[int]
) -> dict[tuple[int, int], float]:
    """Factors for "stages balanced": each stage's own work scaled to the mean stage's in each
    step (the total conserved); empty when the layout gives no stages."""
    if lay.attrs.get("source") != PeerSource.GROUPS or lay["peers"].nunique() < 2:
        return {}
    w = _stage_work(per, named)
    mean = w.mean(axis=1)
    return {
        (int(g), int(s)): float(mean.at[s]) / float(w.at[s, g])
        for g in w.columns
        for s in w.index
        if w.at[s, g] > 0
    }


def _named_fixes(
    model: Model,
    lay: pd.DataFrame,
    named: Sequence[int],
    stages: pd.DataFrame,
    stage_fix: Mapping[int, Mapping[tuple[int, int], float]],
) -> np.ndarray | None:
    """Weights with every named slow worker and stage fixed together; None when none is named."""
    imbalanced = (
        [int(g) for g in stages.loc[stages["is_imbalanced"], "stage"]] if len(stages) else []
    )
    if not named and not imbalanced:
        return None
    w = like_peers(model, lay, named) if named else model.edges["w_ns"].to_numpy(np.int64)
    factors: dict[tuple[int, int], float] = {}
    for g in imbalanced:
        factors.update(stage_fix[g])
    if factors:
        scaled = scale_stages(model, lay, factors)
        base = model.edges["w_ns"].to_numpy(np.int64)
        w = np.maximum(w - (base - scaled), 0)
    return w


def _imbalance_test(
    per: pd.DataFrame, rp: Replayer, even: np.ndarray, fixes: np.ndarray | None
) -> dict[str, float]:
    """Data imbalance (module docstring): the saving of "no data imbalance" beyond the named
    fixes, per step, its median as a share of the step; named when that and the mean saving
    are at least ``MIN_STEP_FRACTION``."""
    from rankscope.analysis.compute.stragglers import MIN_STEP_FRACTION

    base = rp.base.set_index("step")["step_ns"].astype(float)
    flat = rp.steps(even).set_index("step")["step_ns"].astype(float)
    fixed = (
        rp.steps(fixes).set_index("step")["step_ns"].astype(float) if fixes is not None else base
    )
    beyond = ((fixed - flat) / base.clip(lower=1)).dropna()
    saving_share = float((base - flat).mean() / base.mean()) if len(base) else 0.0
    beyond_share = float(beyond.median()) if len(beyond) else 0.0
    slowest = per.loc[per.groupby(["g", "step"])["own"].idxmax(), "rank"]
    named = saving_share >= MIN_STEP_FRACTION and beyond_share >= MIN_STEP_FRACTION
    return {
        "saving_share": round(saving_share, 4),
        "beyond_share": round(beyond_share, 4),
        "moving": float(slowest.nunique()),
        "steps": float(len(base)),
        "named": 1.0 if named else 0.0,
    }
