"""The tables of a comparison of two runs, BASE vs NEW, one function each: KPIs (with the rank
test and its verdict), ops, collectives, stragglers and what-if savings.

Each returns a DataFrame following its ``*_COLUMNS`` contract (``compare_model.py``);
:func:`rankscope.analysis.conclude.compare.compare` assembles them into a
:class:`~rankscope.analysis.conclude.compare_model.Comparison`. Times are seconds per step. Separate from
the statistics (``statistics.py``: math on arrays) and from the entry point and its findings
(``compare.py``): this is the part that knows the analysis' frames (``Analysis.op_stats``,
``waits``, ``breakdown``, ``stragglers``, ``whatif``) and the KPI samples. Only the command's
work imports it, never its parser: numpy and pandas are imported at the top.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.statistics import hodges_lehmann, holm, mann_whitney
from rankscope.analysis.conclude.compare_model import (
    COLLECTIVE_CHANGE_COLUMNS,
    KPI_CHANGE_COLUMNS,
    MIN_SAMPLES,
    OP_CHANGE_COLUMNS,
    OP_KINDS,
    STRAGGLER_CHANGE_COLUMNS,
    WHATIF_CHANGE_COLUMNS,
    Change,
    CompareConfig,
    Family,
    OpChange,
    StragglerChange,
)
from rankscope.analysis.conclude.kpis import (
    HIGHER_IS_BETTER,
    JOB_RANK,
    TIME_CATEGORIES,
    UNITS,
    Kpi,
)

if TYPE_CHECKING:
    from rankscope.analysis.conclude.kpis import Kpis
    from rankscope.analysis.engine.driver import Analysis


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame(
        {c: pd.Series(dtype=d if d != "str" else object) for c, d in columns.items()}
    )


def _frame(rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    if not rows:
        return _empty(columns)
    return pd.DataFrame(rows, columns=list(columns)).astype(
        {k: v for k, v in columns.items() if v != "str"}
    )


def _pctl(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def compare_kpis(base: Kpis, new: Kpis, config: CompareConfig | None = None) -> pd.DataFrame:
    """KPI_CHANGE_COLUMNS for every (KPI, rank) both runs have (per rank only when the world
    sizes match): the test, the shift and the verdict (see :mod:`rankscope.analysis.conclude.compare`'s
    docstring)."""
    config = config or CompareConfig()
    ranks = [JOB_RANK]
    if base.world_size == new.world_size:
        ranks += sorted(set(base.ranks) & set(new.ranks))

    def series(k: Kpis) -> dict[tuple[str, int], np.ndarray]:
        s = k.samples.sort_values(["kpi", "rank", "step"], kind="mergesort")
        return {
            (str(kpi), int(rank)): g["value"].to_numpy(np.float64)
            for (kpi, rank), g in s.groupby(["kpi", "rank"], sort=False)
        }

    sb, sn = series(base), series(new)
    units = dict(
        zip(
            zip(new.summary["kpi"], new.summary["rank"], strict=True),
            new.summary["unit"],
            strict=True,
        )
    )
    rows = []
    for kpi in Kpi:
        for rank in ranks:
            key = (str(kpi), rank)
            if key not in sb or key not in sn:
                continue
            a, b = sb[key], sn[key]
            tested = len(a) >= MIN_SAMPLES and len(b) >= MIN_SAMPLES
            shift = hodges_lehmann(a, b)
            med = float(np.median(a)) if len(a) else math.nan
            rel = shift / abs(med) if med else (math.inf if shift else 0.0)
            step_share = rel
            scale = abs(med) if math.isfinite(med) else 0.0
            if kpi in TIME_CATEGORIES:
                steps = sb.get((str(Kpi.STEP_TIME), rank), np.empty(0))
                step = float(np.median(steps)) if len(steps) else math.nan
                step_share = shift / step if step and math.isfinite(step) else math.nan
                scale = step if math.isfinite(step) else 0.0
            # H0: the change is at most min_change (BASE moved by the margin, towards NEW)
            margin = math.copysign(config.min_change * scale, shift if shift else 1.0)
            p = mann_whitney(a + margin, b, config.exact_max_samples)[1] if tested else math.nan
            rows.append(
                {
                    "kpi": str(kpi),
                    "rank": rank,
                    "unit": units.get(key, UNITS[kpi]),
                    "family": str(Family.JOB if rank == JOB_RANK else Family.RANK),
                    "base_steps": len(a),
                    "new_steps": len(b),
                    "base_p50": _pctl(a, 50),
                    "new_p50": _pctl(b, 50),
                    "base_p90": _pctl(a, 90),
                    "new_p90": _pctl(b, 90),
                    "shift": shift,
                    "rel_change": rel,
                    "step_share": step_share,
                    "p_value": p,
                    "p_adjusted": math.nan,
                    "change": str(Change.UNTESTED if not tested else Change.NO_CHANGE),
                }
            )
    out = _frame(rows, KPI_CHANGE_COLUMNS)
    for family in Family:
        idx = out.index[out["family"] == str(family)]
        out.loc[idx, "p_adjusted"] = holm(out.loc[idx, "p_value"].to_numpy())
    level = config.alpha / 2
    for i, r in out.iterrows():
        if r["change"] == Change.UNTESTED or not (r["p_adjusted"] < level):
            continue
        effect = r["step_share"] if r["kpi"] in TIME_CATEGORIES else r["rel_change"]
        if not (abs(effect) >= config.min_change):
            continue
        worse = (r["shift"] < 0) if r["kpi"] in HIGHER_IS_BETTER else (r["shift"] > 0)
        out.at[i, "change"] = str(Change.REGRESSION if worse else Change.IMPROVEMENT)
    return out


def _per_step_ops(a: Analysis, steps: dict[int, int]) -> pd.DataFrame:
    """(name, kind, rank, s per step) of the compared op kinds."""
    s = a.op_stats
    if not len(s):
        return s.assign(per_step=[])
    s = s[s["kind"].isin(OP_KINDS)].copy()
    n = s["rank"].map(lambda r: max(1, steps.get(int(r), 1)))
    s["per_step"] = s["total_ns"].astype("float64") / n / 1e9
    return s[["name", "kind", "rank", "per_step"]]


def compare_ops(
    base: Analysis, new: Analysis, kb: Kpis, kn: Kpis, config: CompareConfig
) -> pd.DataFrame:
    """OP_CHANGE_COLUMNS: each op's summed time per step (mean over ranks), BASE vs NEW."""

    def steps_of(k: Kpis) -> dict[int, int]:
        s = k.samples[(k.samples["kpi"] == str(Kpi.STEP_TIME)) & (k.samples["rank"] >= 0)]
        return {int(r): len(g) for r, g in s.groupby("rank")}

    ob, on = _per_step_ops(base, steps_of(kb)), _per_step_ops(new, steps_of(kn))
    if not len(ob) and not len(on):
        return _empty(OP_CHANGE_COLUMNS)
    step = kb.values(Kpi.STEP_TIME)
    step_s = float(np.median(step)) if len(step) else math.nan
    mb = ob.groupby(["name", "kind"])["per_step"].mean()
    mn = on.groupby(["name", "kind"])["per_step"].mean()
    rb = ob.set_index(["name", "kind", "rank"])["per_step"]
    rn = on.set_index(["name", "kind", "rank"])["per_step"]
    rows = []
    for key in sorted(set(mb.index) | set(mn.index)):
        b = float(mb.get(key, 0.0))
        n = float(mn.get(key, 0.0))
        delta = n - b
        share = delta / step_s if step_s else math.nan
        if key not in mb.index:
            change = OpChange.APPEARED
        elif key not in mn.index:
            change = OpChange.DISAPPEARED
        elif abs(share) >= config.min_change:
            change = OpChange.SLOWER if delta > 0 else OpChange.FASTER
        else:
            change = OpChange.SAME
        top_rank, top = -1, -1.0
        ranks = {int(i[2]) for i in rb.index if i[:2] == key} | {
            int(i[2]) for i in rn.index if i[:2] == key
        }
        for r in ranks:
            d = abs(float(rn.get((*key, r), 0.0)) - float(rb.get((*key, r), 0.0)))
            if d > top:
                top_rank, top = r, d
        rows.append(
            {
                "name": str(key[0]),
                "kind": str(key[1]),
                "base_s": b,
                "new_s": n,
                "delta_s": delta,
                "rel_change": delta / b if b else math.nan,
                "step_share": share,
                "top_rank": top_rank,
                "change": str(change),
            }
        )
    out = _frame(rows, OP_CHANGE_COLUMNS)
    order = out["delta_s"].abs().sort_values(ascending=False, kind="mergesort").index
    return out.loc[order].reset_index(drop=True)


def _collective_rates(a: Analysis, k: Kpis) -> pd.DataFrame:
    """Wait and transfer per step (s) per (group, op, rank), within the profiled steps."""
    w = a.waits
    bd = a.breakdown
    bd = bd[bd["step"] >= 0]
    if not len(w) or not len(bd):
        return pd.DataFrame(columns=["group", "op", "rank", "wait", "transfer"])
    span = bd.groupby("rank").agg(s0=("start", "min"), s1=("end", "max"), n=("step", "size"))
    w = w.join(span, on="rank", how="inner")
    w = w[(w["arrival"] >= w["s0"]) & (w["arrival"] < w["s1"])]
    g = w.groupby(["group", "op", "rank"]).agg(
        wait=("wait_ns", "sum"), transfer=("transfer_ns", "sum"), n=("n", "first")
    )
    g["wait"] = g["wait"].astype(np.float64) / g["n"] / 1e9
    g["transfer"] = g["transfer"].astype(np.float64) / g["n"] / 1e9
    return g.drop(columns="n").reset_index()


def compare_collectives(base: Analysis, new: Analysis, kb: Kpis, kn: Kpis) -> pd.DataFrame:
    """COLLECTIVE_CHANGE_COLUMNS: wait and transfer per step, per (group, op), job then ranks."""
    cb, cn = _collective_rates(base, kb), _collective_rates(new, kn)
    rows = []
    same_world = kb.world_size == kn.world_size
    keys = sorted(
        {(g, o) for g, o in zip(cb["group"], cb["op"], strict=True)}
        | {(g, o) for g, o in zip(cn["group"], cn["op"], strict=True)}
    )
    for group, op in keys:
        sb = cb[(cb["group"] == group) & (cb["op"] == op)]
        sn = cn[(cn["group"] == group) & (cn["op"] == op)]

        def row(
            rank: int, b: pd.DataFrame, n: pd.DataFrame, group: Any = group, op: Any = op
        ) -> dict[str, Any]:
            bw, nw = (
                float(b["wait"].mean()) if len(b) else 0.0,
                float(n["wait"].mean()) if len(n) else 0.0,
            )
            bt = float(b["transfer"].mean()) if len(b) else 0.0
            nt = float(n["transfer"].mean()) if len(n) else 0.0
            return {
                "group": str(group),
                "op": str(op),
                "rank": rank,
                "base_wait_s": bw,
                "new_wait_s": nw,
                "delta_wait_s": nw - bw,
                "base_transfer_s": bt,
                "new_transfer_s": nt,
                "delta_transfer_s": nt - bt,
            }

        rows.append(row(JOB_RANK, sb, sn))
        if same_world:
            for r in sorted(set(sb["rank"]) | set(sn["rank"])):
                rows.append(row(int(r), sb[sb["rank"] == r], sn[sn["rank"] == r]))
    return _frame(rows, COLLECTIVE_CHANGE_COLUMNS)


def compare_stragglers(base: Analysis, new: Analysis) -> pd.DataFrame:
    """STRAGGLER_CHANGE_COLUMNS: stragglers that appeared, went away or persist."""
    sb, sn = set(base.straggler_ranks()), set(new.straggler_ranks())

    def info(a: Analysis, rank: int) -> dict[str, Any]:
        s = a.stragglers
        hit = s[s["rank"] == rank] if len(s) else s
        return hit.iloc[0].to_dict() if len(hit) else {}

    rows = []
    for rank in sorted(sb | sn):
        ib, i_n = info(base, rank), info(new, rank)
        change = (
            StragglerChange.PERSISTS
            if rank in sb and rank in sn
            else (StragglerChange.NEW if rank in sn else StragglerChange.GONE)
        )
        src = ib if change is StragglerChange.GONE else i_n
        rows.append(
            {
                "rank": rank,
                "change": str(change),
                "base_confidence": float(ib.get("confidence", math.nan)),
                "new_confidence": float(i_n.get("confidence", math.nan)),
                "cause": str(src.get("cause", "")),
                "wait_caused_s": float(src.get("wait_caused_s", math.nan)),
            }
        )
    order = {StragglerChange.NEW: 0, StragglerChange.GONE: 1, StragglerChange.PERSISTS: 2}
    rows.sort(key=lambda r: order[StragglerChange(str(r["change"]))])
    return _frame(rows, STRAGGLER_CHANGE_COLUMNS)


def compare_whatif(base: Analysis, new: Analysis) -> pd.DataFrame:
    """WHATIF_CHANGE_COLUMNS from ``Analysis.whatif`` (empty when neither run has one)."""
    wb = getattr(base, "whatif", None)
    wn = getattr(new, "whatif", None)
    frames = [w for w in (wb, wn) if w is not None and len(w)]
    if not frames:
        return _empty(WHATIF_CHANGE_COLUMNS)

    def index(w: Any) -> dict[tuple[str, int], Any]:
        if w is None or not len(w):
            return {}
        return {(str(r.scenario), int(r.rank)): r for r in w.itertuples()}

    ib, i_n = index(wb), index(wn)
    rows = []
    for key in list(ib) + [k for k in i_n if k not in ib]:
        b, n = ib.get(key), i_n.get(key)
        bs = float(b.saving_ns) / 1e9 if b is not None else math.nan
        ns = float(n.saving_ns) / 1e9 if n is not None else math.nan
        rows.append(
            {
                "scenario": key[0],
                "rank": key[1],
                "base_saving_s": bs,
                "new_saving_s": ns,
                "delta_s": (0.0 if math.isnan(ns) else ns) - (0.0 if math.isnan(bs) else bs),
                "base_saving_pct": float(b.saving_pct) if b is not None else math.nan,
                "new_saving_pct": float(n.saving_pct) if n is not None else math.nan,
            }
        )
    return _frame(rows, WHATIF_CHANGE_COLUMNS)
