"""The what-if replay of a built graph (:mod:`rankscope.analysis.compute.whatif_graph`): every node's
replayed time (:func:`replay`, ns on the aligned clock), the step times it implies
(:func:`step_times`), how well the unmodified replay matches the measured run (:func:`fidelity`)
and the what-if table (:func:`scenarios`: each scenario's predicted step time and saving).

Separate from :mod:`rankscope.analysis.engine.whatif` (the entry points, which may analyse a store to
name its stragglers) so that the analysis pipeline and the root-cause analysis can replay a model
without importing the entry point that imports them: no import cycle. The model itself is
described in :mod:`rankscope.analysis.engine.whatif`'s module docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from rankscope.analysis.compute.whatif_scenarios import (
    ALL_LIKE_MEDIAN,
    BOTTLENECK_LIKE_MEDIAN,
    COMM_OVERLAPPED,
    NO_INPUT_STALL,
    SCENARIO_COLUMNS,
    STRAGGLER_LIKE_MEDIAN,
    Scenario,
    _fix,
    like_median,
    overlapped,
    without_input,
)

if TYPE_CHECKING:
    from rankscope.analysis.compute.whatif_graph import Model

#: Statistic over profiled steps in every what-if figure. The mean, not the median: an
#: intermittent straggler (slow in 30 % of the steps) leaves the median step untouched, yet
#: fixing it saves 30 % of its delay per step on average — the time the job would save.
STEP_STATISTIC = "mean"

#: Columns of :func:`step_times` (ns).
STEP_COLUMNS: dict[str, str] = {
    "step": "int64",
    "ranks": "int64",
    "start_ns": "int64",  # earliest start over ranks
    "end_ns": "int64",  # latest end over ranks
    "step_ns": "int64",
}

#: Columns of :func:`fidelity`: measured vs replayed (unmodified) step time per step.
FIDELITY_COLUMNS: dict[str, str] = {
    "step": "int64",
    "measured_ns": "int64",
    "replayed_ns": "int64",
    "error_pct": "float64",  # (replayed - measured) / measured * 100
}


def replay(model: Model, weights: np.ndarray | None = None) -> np.ndarray:
    """Replayed time (ns) of every node: the latest over its incoming edges of source + weight;
    nodes without incoming edges keep their measured time."""
    e = model.edges
    w = e["w_ns"].to_numpy(np.int64) if weights is None else np.asarray(weights, np.int64)
    src, dst = e["src"].to_numpy(np.int64), e["dst"].to_numpy(np.int64)
    t = model.nodes["time_ns"].to_numpy(np.int64).copy()
    has_in = np.zeros(len(t), bool)
    has_in[dst] = True
    t[has_in] = np.iinfo(np.int64).min
    for level in model.levels:
        np.maximum.at(t, dst[level], t[src[level]] + w[level])
    return t


def step_times(model: Model, times: np.ndarray | None = None) -> pd.DataFrame:
    """Per profiled step: ``max`` end − ``min`` start over the ranks (STEP_COLUMNS), on the
    measured times or on replayed ``times``."""
    n = model.nodes
    t = n["time_ns"].to_numpy(np.int64) if times is None else np.asarray(times, np.int64)
    steps, s_rows, s_pos, e_rows, e_pos = model.step_points()
    if len(s_rows) == 0:
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in STEP_COLUMNS.items()})
    ranks = np.bincount(s_pos, minlength=len(steps))
    start = np.full(len(steps), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(start, s_pos, t[s_rows])
    end = np.full(len(steps), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(end, e_pos, t[e_rows])
    ended = np.zeros(len(steps), bool)
    ended[e_pos] = True
    keep = (ranks > 0) & ended  # steps with a start and an end, in step order
    out = pd.DataFrame(
        {
            "step": steps[keep],
            "ranks": ranks[keep],
            "start_ns": start[keep],
            "end_ns": end[keep],
            "step_ns": end[keep] - start[keep],
        }
    )
    return out[list(STEP_COLUMNS)].astype(STEP_COLUMNS)


def fidelity(model: Model) -> pd.DataFrame:
    """Measured vs replayed (unmodified weights) step time per step (FIDELITY_COLUMNS)."""
    measured = step_times(model)
    replayed = step_times(model, replay(model))
    out = measured[["step", "step_ns"]].rename(columns={"step_ns": "measured_ns"})
    out["replayed_ns"] = replayed["step_ns"].to_numpy()
    out["error_pct"] = (
        (out["replayed_ns"] - out["measured_ns"]) / out["measured_ns"].clip(lower=1) * 100.0
    )
    return out.astype(FIDELITY_COLUMNS)


def _stat(values: pd.Series) -> float:
    return float(getattr(values, STEP_STATISTIC)()) if len(values) else float("nan")


# -- the what-if table -----------------------------------------------------------------------


def scenarios(
    model: Model,
    stragglers: Sequence[int] = (),
    bottlenecks: Sequence[int] = (),
    custom: Sequence[Scenario] = (),
    only_custom: bool = False,
) -> pd.DataFrame:
    """The what-if table (SCENARIO_COLUMNS): each straggler and pipeline bottleneck like the
    median rank, all ranks like the median rank, communication fully overlapped, no input
    stall, then ``custom`` (``only_custom``: those alone); figures are the ``STEP_STATISTIC``
    over the profiled steps."""
    measured = step_times(model)
    base = step_times(model, replay(model))
    err = (base["step_ns"] - measured["step_ns"]).abs() / measured["step_ns"].clip(lower=1) * 100
    error = float(err.max()) if len(err) else float("nan")
    plan: list[Scenario] = [
        *(Scenario(STRAGGLER_LIKE_MEDIAN, _fix(r), int(r)) for r in stragglers),
        *(Scenario(BOTTLENECK_LIKE_MEDIAN, _fix(r), int(r)) for r in bottlenecks),
        Scenario(ALL_LIKE_MEDIAN, lambda m: like_median(m)),
        Scenario(COMM_OVERLAPPED, overlapped),
        Scenario(NO_INPUT_STALL, without_input),
        *custom,
    ]
    if only_custom:
        plan = list(custom)
    rows = []
    m_stat, b_stat = _stat(measured["step_ns"]), _stat(base["step_ns"])
    for sc in plan:
        pred = _stat(step_times(model, replay(model, sc.weights(model)))["step_ns"])
        saving = b_stat - pred
        rows.append(
            (
                sc.name,
                sc.rank,
                m_stat,
                b_stat,
                pred,
                saving,
                100.0 * saving / b_stat if b_stat > 0 else np.nan,
                error,
            )
        )
    return pd.DataFrame(rows, columns=list(SCENARIO_COLUMNS)).astype(SCENARIO_COLUMNS)
