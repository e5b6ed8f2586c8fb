"""Peers' work and the what-if weights of layered jobs (:mod:`rankscope.analysis.compute.rootcause`).

A rank's *own work* is its WORK edges on the replay graph (:mod:`rankscope.analysis.engine.whatif`):
its time between its own points less exposed communication (ns). Its step is cut into
*segments* (:func:`segments`), each the work up to the next collective that is not a
send/recv, keyed by that collective's op and count in the step — the same piece of the program
on every peer and in every step. The scenarios scale segments, never change the graph:
"rank r like its peers" (:func:`like_peers`), "no data imbalance" (:func:`no_imbalance`),
a stage's work scaled (:func:`scale_stages`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from rankscope.analysis.compute.whatif_graph import Model


# -- own work per point, per step ------------------------------------------------------------


def _work(model: Model) -> pd.DataFrame:
    """One row per WORK edge into a point of a profiled step: edge, rank, step, pos, op, w."""
    from rankscope.analysis.compute.whatif_graph import WORK

    e, n = model.edges, model.nodes
    idx = np.flatnonzero((e["kind"] == WORK).to_numpy())
    dst = e["dst"].to_numpy(np.int64)[idx]
    out = n.loc[dst, ["step", "pos", "op"]].reset_index(drop=True)
    out.insert(0, "edge", idx)
    out["rank"] = e["rank"].to_numpy(np.int64)[idx]
    out["w"] = e["w_ns"].to_numpy(np.int64)[idx]
    out["input"] = e["input_ns"].to_numpy(np.int64)[idx]
    return out[out["step"] >= 0].reset_index(drop=True)


def segments(model: Model) -> pd.DataFrame:
    """Per own edge into a point of a profiled step (``edge``): its ``rank``, ``step``,
    ``kind``, ``w`` and ``seg``, the segment of the rank's step it belongs to: the work up to
    the next *anchor* — an arrival at a collective that is not a send/recv, or the step's end —
    keyed by that anchor's op and how many of that op came before it in the step
    (``allreduce#12``). Sends and receives interleave with the other ops in an order that
    varies with timing (a receive posted early or late); the collectives of one program come in
    its order, so one key is the same piece of work on every peer and in every step."""
    from rankscope.analysis.compute.whatif_graph import ARRIVAL, STEP_END
    from rankscope.analysis.store.schema import P2P_OPS

    n, e = model.nodes, model.edges
    own = n[n["kind"].isin([ARRIVAL, STEP_END, "start"]) & (n["step"] >= 0)]
    own = own.sort_values(["rank", "step", "pos"])
    anchor = ((own["kind"] == ARRIVAL) & ~own["op"].isin(P2P_OPS)) | (own["kind"] == STEP_END)
    a = own[anchor]
    occ = a.groupby(["rank", "step", "op"]).cumcount().astype(str)
    key = (a["op"].where(a["kind"] != STEP_END, "<end>") + "#" + occ).reindex(own.index)
    key = key.groupby([own["rank"], own["step"]]).bfill()
    seg_of = key.reindex(range(len(n)))
    idx = np.flatnonzero(model.own_mask())
    dst = e["dst"].to_numpy(np.int64)[idx]
    out = {
        "edge": idx,
        "rank": e["rank"].to_numpy(np.int64)[idx],
        "step": n["step"].to_numpy(np.int64)[dst],
        "kind": e["kind"].to_numpy()[idx],
        "w": e["w_ns"].to_numpy(np.int64)[idx],
        "seg": seg_of.to_numpy()[dst],
    }
    frame = pd.DataFrame(out)
    return frame[(frame["step"] >= 0) & frame["seg"].notna()].reset_index(drop=True)


def _scale_segments(
    model: Model, seg: pd.DataFrame, target: pd.Series, chosen: Any, lower_only: bool
) -> np.ndarray:
    """Weights with the own edges of each chosen (rank, step, seg) scaled so that its WORK edges
    sum to ``target`` (aligned with ``seg``'s rows; NaN: unchanged); ``lower_only``: never
    slower."""
    from rankscope.analysis.compute.whatif_graph import WORK

    total = (
        seg["w"]
        .where(seg["kind"] == WORK, 0)
        .groupby([seg["rank"], seg["step"], seg["seg"]])
        .transform("sum")
    )
    f = (target / total.clip(lower=1)).to_numpy(float)
    f = np.where(np.isfinite(f) & np.asarray(chosen, bool), f, 1.0)
    if lower_only:
        f = np.minimum(f, 1.0)
    w = model.edges["w_ns"].to_numpy(np.int64).copy()
    idx = seg["edge"].to_numpy(np.int64)
    w[idx] = np.round(seg["w"].to_numpy(float) * f).astype(np.int64)
    return w


def _segment_work(seg: pd.DataFrame, lay: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step, seg): the WORK edges' sum ``work`` and the peer group ``g``."""
    from rankscope.analysis.compute.whatif_graph import WORK

    work = seg[seg["kind"] == WORK].groupby(["rank", "step", "seg"], as_index=False)["w"].sum()
    work["g"] = work["rank"].map(lay.set_index("rank")["peers"])
    return work.rename(columns={"w": "work"})


def like_peers(model: Model, lay: pd.DataFrame, ranks: Sequence[int]) -> np.ndarray:
    """Weights with the own work of ``ranks`` at most their OTHER peers' median, segment by
    segment (:func:`segments`) in each step: "rank r like its peers"."""
    seg = segments(model)
    work = _segment_work(seg, lay)
    fixed = work["rank"].isin(list(ranks))
    med = work[~fixed].groupby(["g", "step", "seg"])["work"].median()
    seg["g"] = seg["rank"].map(lay.set_index("rank")["peers"])
    target = med.reindex(index_of(seg[["g", "step", "seg"]])).to_numpy(float)
    return _scale_segments(
        model, seg, pd.Series(target, index=seg.index), seg["rank"].isin(list(ranks)), True
    )


def no_imbalance(model: Model, lay: pd.DataFrame) -> np.ndarray:
    """Weights with every segment of every rank (:func:`segments`) at its peer group's median
    over peers AND steps, where it was heavier: no piece of work above its typical size ("no
    data imbalance"; never slower, as :func:`like_peers`: raising the light pieces too would
    add the noise of a median of few draws to every piece, and a pipeline pays for the heavy
    ones)."""
    seg = segments(model)
    work = _segment_work(seg, lay)
    med = work.groupby(["g", "seg"])["work"].median()
    seg["g"] = seg["rank"].map(lay.set_index("rank")["peers"])
    target = med.reindex(index_of(seg[["g", "seg"]])).to_numpy(float)
    return _scale_segments(model, seg, pd.Series(target, index=seg.index), True, True)


def scale_stages(model: Model, lay: pd.DataFrame, factors: Mapping[tuple[int, int], float]) -> Any:
    """Weights with every own edge of the ranks of stage ``g`` in step ``s`` scaled by
    ``factors[(g, s)]`` (others unchanged)."""
    e, n = model.edges, model.nodes
    w = e["w_ns"].to_numpy(np.int64)
    g = e["rank"].map(lay.set_index("rank")["peers"]).fillna(-1).to_numpy(np.int64)
    step = n["step"].to_numpy(np.int64)[e["dst"].to_numpy(np.int64)]
    f = np.ones(len(e))
    for (stage, s), value in factors.items():
        f[(g == stage) & (step == s)] = value
    # a stage with more layers has more of their collectives too: its ranks' transfers
    # scale with their work
    from rankscope.analysis.compute.whatif_graph import TRANSFER

    scaled = model.own_mask() | ((e["kind"] == TRANSFER).to_numpy() & (w > 0))
    return np.where(scaled, np.round(w * f).astype(np.int64), w)


def index_of(frame: pd.DataFrame) -> Any:
    return pd.MultiIndex.from_frame(frame)


def minus_others_median(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Each value minus the median of the *other* values of its group (NaN values ignored, as
    ``np.nanmedian``); NaN where the group has no other value. ``group``: int ids.

    Why not a loop per group: it ran once per (peer group, step) — hundreds of pandas
    assignments per analysis. Sorted within its group, the others of the value at rank ``r``
    are the sorted values without position ``r``, so their median is read at shifted positions."""
    values = np.asarray(values, dtype=float)
    group = np.asarray(group, dtype=np.int64)
    n = len(values)
    out = np.full(n, np.nan)
    finite = ~np.isnan(values)
    if n == 0:
        return out
    order = np.lexsort((np.where(finite, values, np.inf), ~finite, group))  # NaN last in group
    g_sorted = group[order]
    starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
    start_of = np.repeat(starts, np.diff(np.r_[starts, n]))
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - start_of
    start = np.empty(n, np.int64)
    start[order] = start_of
    count = np.bincount(group[finite], minlength=int(group.max()) + 1)[group]  # finite in group
    others = count - finite  # finite values besides this one
    s_sorted = values[order]
    has = np.flatnonzero(others > 0)
    m, base, r, f = others[has], start[has], rank[has], finite[has]

    def pick(t: np.ndarray) -> np.ndarray:  # the t-th of the others in the sorted group
        return s_sorted[base + t + (f & (t >= r))]

    out[has] = values[has] - (pick((m - 1) // 2) + pick(m // 2)) / 2
    return out


def own_per_step(model: Model, lay: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step): own work ``own``, input stall ``input`` (ns), peer group ``g``, and
    ``excess`` = own minus the median of the other peers' in the step (NaN without peers)."""
    wk = _work(model)
    per = wk.groupby(["rank", "step"], as_index=False).agg(own=("w", "sum"), input=("input", "sum"))
    per["g"] = per["rank"].map(lay.set_index("rank")["peers"]).astype("int64")
    peers = per.groupby(["g", "step"]).ngroup().to_numpy(np.int64)
    per["excess"] = minus_others_median(per["own"].to_numpy(float), peers)
    per["input_excess"] = minus_others_median(per["input"].to_numpy(float), peers)
    return per


# -- replay ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Replayer:
    """The base replay of a model and the saving of alternative weights (ns and share)."""

    model: Model

    def __post_init__(self) -> None:
        from rankscope.analysis.compute import whatif_replay as wi

        self.measured = wi.step_times(self.model)
        self.base = wi.step_times(self.model, wi.replay(self.model))
        self.base_stat = float(self.base["step_ns"].mean())

    def steps(self, weights: np.ndarray) -> pd.DataFrame:
        from rankscope.analysis.compute import whatif_replay as wi

        return wi.step_times(self.model, wi.replay(self.model, weights))

    def saving(self, weights: np.ndarray) -> tuple[float, float]:
        pred = float(self.steps(weights)["step_ns"].mean())
        saving = self.base_stat - pred
        return saving, saving / self.base_stat if self.base_stat > 0 else float("nan")

    def row(self, name: str, rank: int, weights: np.ndarray) -> tuple[Any, ...]:
        saving, share = self.saving(weights)
        err = (self.base["step_ns"] - self.measured["step_ns"]).abs()
        err_pct = float((err / self.measured["step_ns"].clip(lower=1)).max() * 100)
        return (
            name,
            rank,
            float(self.measured["step_ns"].mean()),
            self.base_stat,
            self.base_stat - saving,
            saving,
            share * 100.0,
            err_pct,
        )
