"""Frequent CUDA kernel sequences — fusion candidates — of ONE rank, as Holistic Trace Analysis
(HTA) 0.5.0's ``get_frequent_cuda_kernel_sequences`` counts them.

A *sequence* is an operator's name followed by the names of the GPU events launched anywhere
below it on its host thread, in GPU start order. The operators are those whose name contains
``operator`` (HTA's ``operator_name``, a substring) at the shallowest call depth such an operator
has on the rank (so an op nested in another match is not counted twice) and that launch at least
``min_len`` GPU events. Identical sequences are counted; the most frequent first. A sequence seen
many times is a fixed chain of small kernels one fused kernel (``torch.compile``, a fused
implementation) could replace.

Pure function of one rank's events and lanes, on the events as HTA loads them
(:func:`breakdown.hta_view`); nesting is torch's rule (:func:`op_nesting.nest`), which for the
properly nested ranges of one thread is HTA's call stack.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from rankscope.analysis.compute.breakdown import hta_view
from rankscope.analysis.compute.kernel_launches import lane_streams
from rankscope.analysis.compute.op_nesting import nest
from rankscope.analysis.store.frames import from_rows
from rankscope.analysis.store.schema import text_codes

#: HTA's ``min_pattern_len`` default: an operator launching fewer GPU events is no candidate.
MIN_PATTERN_LEN = 3
#: The operators rankscope counts from, each on its own (HTA takes one per call): every ATen
#: operator at the shallowest ATen depth (the ops the model called, not the ops they call), and
#: every backward function autograd runs (``autograd::engine::evaluate_function: XBackward0``).
DEFAULT_OPERATORS = ("aten::", "autograd::engine::evaluate_function")
#: Separator of the names in a sequence (HTA's).
SEPARATOR = "|"

#: Columns of :func:`kernel_sequences` (one row per distinct sequence; ns summed over its counts).
SEQUENCE_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "operator": "str",  # the substring the sequence's operators were found by
    "pattern": "str",  # operator|kernel|kernel|…
    "count": "int64",
    "kernels": "int64",  # GPU events in the sequence
    "gpu_ns": "int64",  # the sequence's GPU events' durations, summed over its occurrences
    "cpu_ns": "int64",  # the operators' durations, summed over its occurrences
}


def _depths(parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parent), np.int64)
    up = parent[rows]
    while True:
        above = up >= 0
        if not above.any():
            return depth
        depth[rows[above]] += 1
        up = np.where(above, parent[np.maximum(up, 0)], -1)


def kernel_sequences(
    events: pd.DataFrame,
    lanes: pd.DataFrame,
    *,
    rank: int = 0,
    grid_phase_ns: int = 0,
    drop_last_step: bool = True,
    operators: tuple[str, ...] = DEFAULT_OPERATORS,
    min_len: int = MIN_PATTERN_LEN,
) -> pd.DataFrame:
    """The rank's kernel sequences per operator, most frequent first (``SEQUENCE_COLUMNS``).

    What does not depend on the operator (HTA's view of the events, the host threads' nesting,
    each GPU event's launching host event) is built once for all of them (:class:`_Rank`)."""
    prepared = _Rank(events, lanes, grid_phase_ns, drop_last_step)
    rows = [row for op in operators for row in _sequences(prepared, rank, op, min_len)]
    return from_rows(rows, SEQUENCE_COLUMNS)


class _Rank:
    """One rank's events as every operator's sequences read them: HTA's view (``ts``, ``end``),
    the host events' nesting (``parent``, ``depth``), the names as text, and each GPU event
    with its launching host event (same correlation id: ``gpu``, ``launcher``)."""

    def __init__(
        self, events: pd.DataFrame, lanes: pd.DataFrame, grid_phase_ns: int, drop_last_step: bool
    ) -> None:
        ts, end, kept = hta_view(events, lanes, grid_phase_ns, drop_last_step)
        n = len(ts)
        lane = events["lane"].to_numpy().astype(np.int64)
        stream = lane_streams(lanes)[lane] if len(lanes) else np.full(n, -1)
        host = kept & (stream < 0)
        rows = np.flatnonzero(host)
        order = rows[np.lexsort((-end[rows], ts[rows], lane[rows]))]
        self.ts, self.end, self.host = ts, end, host
        self.parent = nest(order, lane, ts, end, n)
        self.depth = _depths(self.parent, rows)
        # the names as text, and as codes into their distinct texts: an operator's name test runs
        # once per distinct name, not once per event (numpy's char.find on a fixed-width array
        # of every event's name was a third of the function)
        self.codes, texts = text_codes(events["name"])
        self.names = texts[self.codes]  # text_values: the same array
        self.distinct: list[str] = texts.tolist()
        corr = events["corr"].to_numpy()
        gpu = np.flatnonzero(kept & (stream >= 0) & (corr >= 0))
        launcher_rows = rows[corr[rows] >= 0]
        lc, first = np.unique(corr[launcher_rows], return_index=True)
        launcher_rows = launcher_rows[first]
        pos = np.searchsorted(lc, corr[gpu])
        ok = (pos < len(lc)) & (lc[np.minimum(pos, max(len(lc) - 1, 0))] == corr[gpu])
        self.gpu, self.launcher = gpu[ok], launcher_rows[pos[ok]]


#: One row of :data:`SEQUENCE_COLUMNS`: rank, operator, pattern, count, kernels, gpu_ns, cpu_ns.
Row = tuple[int, str, str, int, int, int, int]


def _sequences(r: _Rank, rank: int, operator: str, min_len: int) -> list[Row]:
    """The rows of one operator's sequences, most frequent first (ties: by pattern)."""
    ts, end, names, parent, depth = r.ts, r.end, r.names, r.parent, r.depth
    named = np.fromiter((operator in t for t in r.distinct), bool, len(r.distinct))
    cand = r.host & named[r.codes] if len(r.distinct) else np.zeros(len(r.host), bool)
    if not cand.any():
        return []
    min_depth = depth[cand].min()
    # each GPU event's launching host event, then its ancestor at min_depth
    gpu, owner = r.gpu, r.launcher
    while True:  # climb to the depth of the candidates
        deeper = depth[owner] > min_depth
        if not deeper.any():
            break
        owner = np.where(deeper, parent[owner], owner)
    at_root = (depth[owner] == min_depth) & cand[owner]
    gpu, owner = gpu[at_root], owner[at_root]
    if not len(gpu):
        return []
    # each owner's GPU events in start order (stable: ties keep their row order), then one
    # group per owner: its kernels' count, names joined, durations summed
    order = np.lexsort((ts[gpu], owner))
    gpu, owner = gpu[order], owner[order]
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    counts = np.diff(np.r_[starts, len(owner)])
    gpu_ns = np.add.reduceat(end[gpu] - ts[gpu], starts)
    keep = counts >= min_len
    kernel_names = names[gpu].tolist()
    owners = owner[starts[keep]]
    # identical sequences counted, in the order they first occur: [count, kernels, gpu, cpu]
    found: dict[str, list[int]] = {}
    for head, a, c, g, cpu in zip(
        names[owners].tolist(),
        starts[keep].tolist(),
        counts[keep].tolist(),
        gpu_ns[keep].tolist(),
        (end[owners] - ts[owners]).tolist(),
        strict=True,
    ):
        pattern = head + SEPARATOR + SEPARATOR.join(kernel_names[a : a + c])
        seen = found.get(pattern)
        if seen is None:
            found[pattern] = [1, c, g, cpu]
        else:
            seen[0] += 1
            seen[2] += g
            seen[3] += cpu
    ranked = sorted(found.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [(rank, operator, pattern, *v) for pattern, v in ranked]  # type: ignore[misc]
