"""The what-if scenarios: their names and stable keys, the columns of their table, and the weightings that make a job's
slow parts normal on the replay graph (:mod:`rankscope.analysis.compute.whatif_graph`) — a rank like
the median rank, communication overlapped, no input stall, a user's :class:`Scenario` such as
:func:`scale_events`. Each returns new edge weights (``w_ns``, ns); none changes the graph.

Separate from the replay (:mod:`rankscope.analysis.engine.whatif`, which runs every scenario and
tabulates what it saves) because these are the changes a reader asks "what if" about: each is a
short function of the model, read on its own, and new scenarios are added here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.whatif_graph import EARLY, TRANSFER, WORK, Model

#: Columns of the what-if table (:func:`rankscope.analysis.compute.whatif_replay.scenarios`; ns, statistic
#: over profiled steps: ``whatif_replay.STEP_STATISTIC``).
SCENARIO_COLUMNS: dict[str, str] = {
    "scenario": "str",
    "rank": "int32",  # the rank the scenario fixes, -1 for job-wide ones
    "measured_step_ns": "float64",  # measured step time
    "replayed_step_ns": "float64",  # replay of the unmodified job (== measured when exact)
    "predicted_step_ns": "float64",  # replay with the scenario's weights
    "saving_ns": "float64",  # replayed - predicted
    "saving_pct": "float64",  # saving / replayed * 100
    "replay_error_pct": "float64",  # largest |error| of the unmodified replay over the steps
}

#: Scenario names (``SCENARIO_COLUMNS`` ``scenario``).
STRAGGLER_LIKE_MEDIAN = "straggler like the median rank"
BOTTLENECK_LIKE_MEDIAN = "bottleneck like the median rank"
ALL_LIKE_MEDIAN = "all ranks like the median rank"
COMM_OVERLAPPED = "communication fully overlapped"
NO_INPUT_STALL = "no input stall"
#: Layered jobs (:mod:`rankscope.analysis.compute.rootcause`): a slow worker like the other ranks of
#: its stage; the imbalanced stage's own work scaled to the other stages'; every stage's to the
#: mean stage's (total conserved); every own-work edge at its peers' median (no data imbalance).
PEER_LIKE = "straggler like its peers"
STAGE_LIKE_OTHERS = "imbalanced stage like the other stages"
STAGES_BALANCED = "stages balanced"
NO_DATA_IMBALANCE = "no data imbalance"
#: The transfers crossing a slow host pair (:mod:`rankscope.analysis.compute.links`) at the median of
#: the same transfers elsewhere.
SLOW_LINKS_LIKE_OTHERS = "slow links like the other links"
#: A stable key per built-in scenario (summary.json ``what_if.scenarios[].kind``): readers select
#: on these, never on the names, whose wording may improve; user scenarios have ``custom``.
SCENARIO_KEYS: dict[str, str] = {
    STRAGGLER_LIKE_MEDIAN: "straggler_like_median",
    BOTTLENECK_LIKE_MEDIAN: "bottleneck_like_median",
    ALL_LIKE_MEDIAN: "all_like_median",
    COMM_OVERLAPPED: "communication_overlapped",
    NO_INPUT_STALL: "no_input_stall",
    PEER_LIKE: "straggler_like_peers",
    STAGE_LIKE_OTHERS: "stage_like_others",
    STAGES_BALANCED: "stages_balanced",
    NO_DATA_IMBALANCE: "no_data_imbalance",
    SLOW_LINKS_LIKE_OTHERS: "slow_links_like_others",
}
#: The scenarios that fix one named rank (``rank`` >= 0).
RANK_SCENARIOS = (STRAGGLER_LIKE_MEDIAN, BOTTLENECK_LIKE_MEDIAN, PEER_LIKE)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A named change of the replay's weights: ``weights(model) -> new w_ns per edge``."""

    name: str
    weights: Callable[[Model], np.ndarray]
    rank: int = -1


def typical_work(model: Model, exclude: Iterable[int] = ()) -> np.ndarray:
    """Per edge: the median over ranks of the WORK edge into the same point (same step, position
    in the step and op) — the median rank's own work there; -1 where not an own edge.

    ``exclude``: ranks left out of the median (the ones being fixed: a straggler's target is the
    typical *other* rank — with 2 ranks, a median that includes the straggler is halfway to it
    and would predict half the saving); all ranks count where no other rank has that point.
    """
    e, n = model.edges, model.nodes
    work = e[e["kind"] == WORK]
    key_cols = ["step", "pos", "op"]
    keyed = n.loc[work["dst"].to_numpy(), key_cols].reset_index(drop=True)
    keyed["w"] = work["w_ns"].to_numpy()
    med = keyed.groupby(key_cols, sort=False)["w"].median()
    left_out = set(exclude)
    if left_out:
        others = ~work["rank"].isin(left_out).to_numpy()
        med_others = keyed[others].groupby(key_cols, sort=False)["w"].median()
        med = med_others.combine_first(med)
    out = np.full(len(e), -1.0)
    own = model.own_mask()
    dst_keys = n.loc[e["dst"].to_numpy()[own], key_cols]
    out[own] = med.reindex(pd_index(dst_keys)).to_numpy(float)
    return out


def pd_index(frame: pd.DataFrame) -> Any:
    return pd.MultiIndex.from_frame(frame)


def like_median(model: Model, ranks: Iterable[int] | None = None) -> np.ndarray:
    """Weights with the own work of ``ranks`` (None: every rank) brought down to the median
    rank's at each point (the median of the other ranks when ``ranks`` are named): each WORK edge becomes ``min(w, median)`` — its excess removed, never
    made slower — and the RESUME edges into the same point lose the same excess (the own work
    after the end they start from is what remained of the WORK edge's: the rank's own time
    before that end is unchanged, so the excess is taken from what comes after it)."""
    ranks = None if ranks is None else list(ranks)
    e = model.edges
    w = e["w_ns"].to_numpy(np.int64)
    typical = typical_work(model, () if ranks is None else ranks)
    kind = e["kind"].to_numpy()
    chosen = model.own_mask()
    if ranks is not None:
        chosen &= e["rank"].isin(list(ranks)).to_numpy()
    dst = e["dst"].to_numpy(np.int64)
    excess = np.zeros(len(model.nodes), np.int64)
    is_work = chosen & (kind == WORK) & (typical >= 0)
    excess[dst[is_work]] = np.maximum(w[is_work] - np.round(typical[is_work]).astype(np.int64), 0)
    return np.where(chosen, np.maximum(w - excess[dst], 0), w)


def overlapped(model: Model) -> np.ndarray:
    """Weights with every transfer (and early end) 0: communication hidden under compute; the
    barrier (waiting for the last rank) stays."""
    kind = model.edges["kind"].to_numpy()
    w = model.edges["w_ns"].to_numpy(np.int64).copy()
    comm = (kind == TRANSFER) | (kind == EARLY)
    w[comm] = np.minimum(w[comm], 0)
    return w


def without_input(model: Model) -> np.ndarray:
    """Weights with the input stall taken out of every own edge."""
    e = model.edges
    w = e["w_ns"].to_numpy(np.int64)
    own = model.own_mask()
    return np.where(own, np.maximum(w - e["input_ns"].to_numpy(np.int64), 0), w)


def scale_events(
    model: Model, events: pd.DataFrame, rank: int, mask: np.ndarray, factor: float, name: str = ""
) -> Scenario:
    """A user scenario: the events of ``rank`` selected by ``mask`` (e.g. one op's kernels) take
    ``factor`` times as long. Each own edge of the rank loses ``(1 − factor) ×`` the time those
    events cover inside its span (the union; assumed to be on the rank's path between the two
    points, as kernels on one stream or ops on the main thread are)."""
    from rankscope.analysis.compute.breakdown import interval_union, measure_below

    ts = events["ts"].to_numpy(np.int64)[mask]
    starts, ends = interval_union(ts, ts + events["dur"].to_numpy(np.int64)[mask])
    t = model.nodes["time_ns"].to_numpy(np.int64)

    def weights(m: Model) -> np.ndarray:
        e = m.edges
        w = e["w_ns"].to_numpy(np.int64)
        sel = m.own_mask() & (e["rank"].to_numpy() == rank)
        src, dst = e["src"].to_numpy(np.int64)[sel], e["dst"].to_numpy(np.int64)[sel]
        covered = measure_below(starts, ends, t[dst]) - measure_below(starts, ends, t[src])
        out = w.copy()
        out[sel] = np.maximum(w[sel] - np.round((1.0 - factor) * covered).astype(np.int64), 0)
        return out

    return Scenario(name or f"rank {rank}: selected events x{factor:g}", weights, rank)


def _fix(rank: int) -> Callable[[Model], np.ndarray]:
    return lambda m: like_median(m, [rank])
