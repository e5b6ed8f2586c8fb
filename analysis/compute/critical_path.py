"""The critical path of each profiled step through the what-if graph, which spans every rank.

The replay (:func:`whatif_replay.replay`) gives each node the latest over its incoming edges of
source time + weight. Walking back from the step's last end along an incoming edge that sets
its destination's time exactly (a *tight* edge: the one the step was waiting on) to the step's
start gives a chain of edges whose weights sum to the step time: each rank's own work, the
transfers of the collectives, their barriers (weight 0). Summed per rank and edge kind it says
which ranks' work and which transfers make the step as long as it is.

Difference from Holistic Trace Analysis' ``critical_path_analysis``: HTA's graph is ONE rank's
(CPU ops, launches, kernels, stream and event dependencies) through one iteration; this one is
the whole job's, coarser inside a rank (own work between collective points, not kernels), so a
path runs through whichever ranks hold the step back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from rankscope.analysis.compute.whatif_graph import START, STEP_END

if TYPE_CHECKING:
    from rankscope.analysis.compute.whatif_graph import Model

#: Columns of :func:`critical_path`: per step, the path's weight per rank and edge kind (ns).
CRITICAL_COLUMNS: dict[str, str] = {
    "step": "int64",
    "rank": "int32",  # whose work or transfer the edges are
    "kind": "str",  # whatif_graph edge kind (work, resume, transfer, early; arrive/late: 0)
    "edges": "int64",
    "ns": "int64",  # the edges' summed weight on the path
    "step_ns": "int64",  # the path's length: last end - the start it runs from
}


def critical_path(model: Model, times: np.ndarray) -> pd.DataFrame:
    """Each step's critical path summed per (rank, edge kind) (``CRITICAL_COLUMNS``); ``times``:
    the replayed node times (``whatif_replay.replay(model)``)."""
    e = model.edges
    src, dst = e["src"].to_numpy(np.int64), e["dst"].to_numpy(np.int64)
    w = e["w_ns"].to_numpy(np.int64)
    tight = times[src] + w == times[dst]
    into: dict[int, int] = {}
    for i in np.flatnonzero(tight)[::-1]:  # the first tight edge into each node
        into[int(dst[i])] = int(i)
    kind = model.nodes["kind"].to_numpy(object)
    step = model.nodes["step"].to_numpy(np.int64)
    rows = []
    for s in np.unique(step[kind == STEP_END]):
        ends = np.flatnonzero((kind == STEP_END) & (step == s))
        node = int(ends[np.argmax(times[ends])])
        last, path = node, []
        while node in into and not (kind[node] == START and step[node] == s):
            i = into[node]
            path.append(i)
            node = int(src[i])
            if step[node] not in (s, -1):  # crossed into the previous step: its end is the start
                break
        if not path:
            continue
        p = e.iloc[path]
        length = int(times[last] - times[node])
        for (rank, k), g in p.groupby(["rank", "kind"], sort=True):
            rows.append((int(s), int(rank), str(k), len(g), int(g["w_ns"].sum()), length))
    return pd.DataFrame(rows, columns=list(CRITICAL_COLUMNS)).astype(CRITICAL_COLUMNS)
