"""The host-event tree of one rank in numpy: who nests in whom, torch's redispatch rule, and
sums over subtrees — the kernels of ``ops.op_tree`` (torch's ``key_averages`` tree).

Why numpy: these ran as Python loops over every host event (a stack walk, two passes of the
redispatch rule, a reverse pass for device totals), ~20 ms of a rank's ~30 ms op table at 23 k
events. Each is the same rule, decided for all events at once; ``tests/test_ops_table.py``
checks them against torch's walks on thousands of random event sets.
"""

from __future__ import annotations

import numpy as np


def merge_redispatch(
    order: np.ndarray, parent: np.ndarray, names: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Drop an event that is the only child of an event of the same name (a redispatch such as
    ``aten::div`` → ``aten::div``), its children moving up to that parent: what torch's
    ``EventList._remove_dup_nodes`` does before ``key_averages``.

    Returns ``order`` without the dropped events and the parents with every dropped event
    skipped (its children's, and its own, parent is its nearest kept ancestor). Torch's rule
    walks parents before children, moving an only child's children up as it goes; that comes to
    the same as asking of each event's *original* parent whether it had one child of the same
    name, so all events are decided at once."""
    parent = parent.copy()
    has = order[parent[order] >= 0]
    children = np.bincount(parent[has], minlength=len(parent))
    p = parent[has]
    dropped = np.zeros(len(parent), bool)
    dropped[has] = (children[p] == 1) & (names[p] == names[has])
    while True:  # a parent that was dropped hands over its own (redispatch chains: a few levels)
        up = order[(parent[order] >= 0) & dropped[np.maximum(parent[order], 0)]]
        if not len(up):
            break
        parent[up] = parent[parent[up]]
    return order[~dropped[order]], parent


def nest(
    order: np.ndarray, lane: np.ndarray, ts: np.ndarray, end: np.ndarray, n: int
) -> np.ndarray:
    """Each host event's parent (row, -1 none) by torch's rule (``EventList._populate_cpu_children``):
    ``order`` is the host events sorted by (lane, start, -end); walking it with a stack per lane,
    the stack is popped until its top contains the event, which is then its parent.

    That parent is always the event's nearest predecessor in the lane that contains it (ends at
    or after its end and after its start): an event between the two that ended after the
    parent would itself contain the event, and one that did not was popped. So every parent is
    found at once, by binary lifting over a sparse table of range maxima of the end times (a
    Python loop per event took ~10 ms per 20 k events, a third of a rank's op table).
    """
    m = len(order)
    if m == 0:
        return np.full(n, -1, np.int64)
    e_sorted, s_sorted, ln = end[order], ts[order], lane[order]
    first = np.flatnonzero(np.r_[True, ln[1:] != ln[:-1]])
    lane_start = np.repeat(first, np.diff(np.r_[first, m]))
    need = np.maximum(e_sorted, s_sorted + 1)  # what a container's end must reach
    table = [e_sorted]  # table[k][x] = max(end over positions x .. x + 2**k - 1)
    while 2 ** len(table) <= m:
        prev, half = table[-1], 2 ** (len(table) - 1)
        table.append(np.maximum(prev[:-half], prev[half:]))
    pos = np.arange(m)
    for k in range(len(table) - 1, -1, -1):  # skip back over blocks without a container
        cand = pos - 2**k
        ok = cand >= lane_start
        idx = np.flatnonzero(ok)
        ok[idx] = table[k][cand[idx]] < need[idx]
        pos = np.where(ok, cand, pos)
    parent = pos - 1
    has = parent >= lane_start
    parent = np.where(has, parent, -1)
    out = np.full(n, -1, np.int64)
    out[order[has]] = order[parent[has]]
    return out


def subtree_sums(order: np.ndarray, parent: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` summed over each event's subtree (itself and every event below it); ``order``:
    the tree's events, ``parent``: their parents (-1 none). Depth by depth, deepest first."""
    depth = np.zeros(len(order), np.int64)
    up = parent[order]
    while True:
        above = up >= 0
        if not above.any():
            break
        depth[above] += 1
        up = np.where(above, parent[np.maximum(up, 0)], -1)
    total = values.copy()
    for level in range(int(depth.max(initial=0)), 0, -1):
        rows = order[depth == level]
        np.add.at(total, parent[rows], total[rows])
    return total
