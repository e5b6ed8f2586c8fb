"""What one rank's own trace says about each communication event: the NCCL metadata of the
``record_param_comms`` op that launched a kernel, the send/recv ops of a coalesced batch, and
which peer names win when the runtime's annotation names one too.

Why: the matching (``orchestrator/ingest/matching.py``) keys a collective by ``(group, Seq)`` and a
send/recv by its two ends, but Kineto copies only part of ``record_param_comms``' args onto the
NCCL kernel it launches — the group and ``Dst Rank`` / ``Src Rank``, never ``Seq`` — and a
``batch_isend_irecv`` on CUDA runs all its sends and recvs as ONE ``SendRecv`` kernel, launched
inside the batch's ``nccl:coalesced`` Work after the ops' own ``record_param_comms``, so that
kernel may carry no metadata at all. The rules, in order (docs/analysis.md, "Point-to-point
pairs"):

1. **Link** (:func:`link_enqueue`): a kernel's ``record_param_comms`` is the one on the thread of
   the kernel's launch (same correlation id) whose span holds the launch. ``record_param_comms``
   ops do not nest, so the latest one starting at or before the launch is the only candidate.
   The link is by time rather than by ``External id`` because older Kineto wrote the
   correlation id there (``tests/data/param_dlrm_8rank``).
2. **Fill** (:func:`fill_from_enqueue`): what the kernel lacks (Seq -1, no group, a
   ``sendrecv`` op, no peer, no bytes) is taken from its ``record_param_comms``; what the kernel
   has is kept (the same values when both have them).
3. **Coalesced batches** (:func:`expand_coalesced`): the send/recv ``record_param_comms`` ops of
   a thread that launched no kernel are the batch of the next ``nccl:coalesced`` Work on that
   thread (those after the previous batch or linked op); the first comm kernel launched from the
   thread at or after that Work started (and before the thread's next one) is the batch's kernel. Its row becomes one row per op
   (op, peer, group, Seq and bytes of the op; start and end of the kernel: NCCL runs the batch as
   one kernel, so no op's own end is known). A batch without such a kernel, and a send/recv op
   that is neither linked nor in a batch, is counted (:class:`LinkCounts`) and left out: it is
   never given a guessed kernel.
4. **Which peer** (:func:`prefer_trace`): the trace's ``Dst Rank`` / ``Src Rank`` win over the
   runtime's annotation (``launchers/p2p.py``); where both name a peer and differ, the
   disagreement is counted.

Peers are global ranks. All times are ns of the rank's raw clock. The tables are columns
(``column_tables.Columns``, one numpy array each, rows aligned), not DataFrames: the merge's per-rank task
builds them where pandas is not imported (``source_reads.ReadAhead``; ``matching.match`` makes
the DataFrame).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from rankscope.analysis.compute.launch_match import launch_rows
from rankscope.analysis.store.schema import P2P_OPS, EventKind
from rankscope.orchestrator.ingest.column_tables import Columns, concat_rows, distinct, rows_of
from rankscope.orchestrator.ingest.vocabulary import NCCL_COALESCED, PEER_OPS

#: Columns of one rank's communication table as produced by the merge's per-rank task.
RANK_COMM_COLUMNS = (
    "event", "op", "group", "seq", "bytes", "step", "start", "end", "gpu", "peer"
)  # fmt: skip


def normalise_groups(groups: np.ndarray, comm_cpu: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """Group names for one rank's comm events where the trace gave none (``matching.py``'s
    module docstring): a GPU event's ``stream#i`` (i: its lane's first-seen order among them), a
    host (gloo) one's ``gloo``; named groups kept.

    ``comm_cpu``: True for gloo ops (host side); ``lane``: the event's lane id.
    """
    names = np.array([str(g) for g in groups.tolist()], dtype=object)
    missing = names == ""
    cpu = comm_cpu.astype(bool)
    gpu_missing = missing & ~cpu
    if gpu_missing.any():
        lanes = lane[gpu_missing].tolist()
        order = {lane_id: i for i, lane_id in enumerate(dict.fromkeys(lanes))}
        names[gpu_missing] = [f"stream#{order[x]}" for x in lanes]
    names[missing & cpu] = "gloo"
    return names


@dataclasses.dataclass
class LinkCounts:
    """What one rank's linking could not settle (the merge records each non-zero count)."""

    disagreements: int = 0
    """send/recv ops whose runtime annotation names another peer (or direction) than the
    trace's ``Dst Rank`` / ``Src Rank``; the trace's is kept"""
    without_kernel: int = 0
    """send/recv ``record_param_comms`` ops (in a coalesced batch or not) whose NCCL kernel is
    not in the trace: left out of the comm table, so never paired"""

    def notes(self) -> list[str]:
        """One line per non-zero count, for the merge's problems."""
        out = []
        if self.disagreements:
            out.append(
                f"{self.disagreements} send/recv op(s): the runtime's peer annotation disagrees "
                "with the trace's Dst/Src Rank (the trace's kept)"
            )
        if self.without_kernel:
            out.append(
                f"{self.without_kernel} send/recv op(s) whose NCCL kernel is not in the trace "
                "(a record_param_comms without a launch, outside any coalesced batch's): not "
                "paired"
            )
        return out


def prefer_trace(
    ops: np.ndarray, peers: np.ndarray, ann_ops: np.ndarray, ann_peers: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(op, peer, disagree) of each event from the trace's and the annotation's (op, peer).

    ``peers``: from the trace's args (-1 unknown); ``ann_*``: from the runtime's annotation
    around the call (``rank_columns._p2p_peers``; op unchanged and peer -1 without one). The
    trace wins where it names a peer; ``disagree`` marks events where both name one and the
    peer or the direction differs.
    """
    known = peers >= 0
    both = known & (ann_peers >= 0)
    disagree = both & ((ann_peers != peers) | (ann_ops != ops))
    return np.where(known, ops, ann_ops), np.where(known, peers, ann_peers), disagree


def _launches(comm: Columns, columns: Columns) -> tuple[np.ndarray, np.ndarray]:
    """(host ts, thread lane) of the launch of each comm row's kernel; -1 for CPU events and
    kernels whose launch is not in the trace."""
    ev = comm["event"]
    ts = np.full(len(ev), -1, dtype=np.int64)
    lane = np.full(len(ev), -1, dtype=np.int64)
    gpu = columns["kind"][ev] == EventKind.KERNEL_COMM
    if gpu.any():
        launch = launch_rows(columns["corr"], columns["kind"], ev[gpu])
        found = launch >= 0
        rows = np.flatnonzero(gpu)[found]
        ts[rows] = columns["ts"][launch[found]]
        lane[rows] = columns["lane"][launch[found]]
    return ts, lane


def link_enqueue(comm: Columns, enqueue: Columns, columns: Columns) -> np.ndarray:
    """For each comm row, the row of ``enqueue`` (its ``record_param_comms``) whose span holds
    the kernel's launch on the launching thread; -1 for none (rule 1 of the module docstring)."""
    link = np.full(len(comm["event"]), -1, dtype=np.int64)
    if not len(link) or not len(enqueue["event"]):
        return link
    l_ts, l_lane = _launches(comm, columns)
    e_ev = enqueue["event"]
    e_start = columns["ts"][e_ev]
    e_end = e_start + columns["dur"][e_ev]
    e_lane = columns["lane"][e_ev].astype(np.int64)
    for lane in distinct(l_lane[l_lane >= 0]).tolist():
        mine = np.flatnonzero(e_lane == lane)
        if not len(mine):
            continue
        mine = mine[np.argsort(e_start[mine], kind="stable")]
        kernels = np.flatnonzero(l_lane == lane)
        k = np.searchsorted(e_start[mine], l_ts[kernels], side="right") - 1
        inside = (k >= 0) & (e_end[mine[np.maximum(k, 0)]] >= l_ts[kernels])
        link[kernels[inside]] = mine[k[inside]]
    return link


def fill_from_enqueue(comm: Columns, enqueue: Columns, link: np.ndarray) -> None:
    """Fill what each linked kernel row lacks from its ``record_param_comms`` (rule 2), in place
    (each column replaced whole, in its own dtype)."""
    rows = np.flatnonzero(link >= 0)
    if not len(rows):
        return
    src = link[rows]
    op = comm["op"].copy()
    op[rows] = np.where(op[rows] == "sendrecv", enqueue["op"][src], op[rows])
    comm["op"] = op
    for col, missing in (("seq", -1), ("bytes", -1), ("group", "")):
        have = comm[col].copy()
        mine = have[rows]
        have[rows] = np.where(mine == missing, enqueue[col][src], mine)
        comm[col] = have
    peer = comm["peer"].copy()
    p2p = np.isin(op[rows], list(P2P_OPS))
    peer[rows] = np.where(p2p & (peer[rows] < 0), enqueue["peer"][src], peer[rows])
    comm["peer"] = peer


def expand_coalesced(
    comm: Columns, enqueue: Columns, link: np.ndarray, columns: Columns, strings: list[str]
) -> tuple[Columns, int]:
    """Comm rows with each coalesced batch's kernel split into its send/recv ops (rule 3), and
    the number of send/recv ``record_param_comms`` ops left without a kernel.

    The returned rows are in the order of their events (ts), the ops of one batch in the order
    they were issued, which is the order both ends of a pipeline count their sends and recvs in.
    """
    if not len(enqueue["event"]):
        return comm, 0
    e_op = enqueue["op"]
    linked = np.zeros(len(e_op), dtype=bool)
    linked[link[link >= 0]] = True
    pending = np.flatnonzero(np.isin(e_op, list(P2P_OPS)) & ~linked)
    if not len(pending):
        return comm, 0
    e_ev = enqueue["event"]
    e_start = columns["ts"][e_ev]
    e_end = e_start + columns["dur"][e_ev]
    e_lane = columns["lane"][e_ev].astype(np.int64)
    code = next((i for i, s in enumerate(strings) if s == NCCL_COALESCED), -1)
    works = np.flatnonzero(columns["name"] == code) if code >= 0 else np.zeros(0, np.int64)
    l_ts, l_lane = _launches(comm, columns)
    free = (link < 0) & np.isin(comm["op"], list(PEER_OPS)) & (l_ts >= 0)
    batch_of = np.full(len(e_op), -1, dtype=np.int64)  # comm row of the op's batch kernel
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    for lane in distinct(columns["lane"][works]).tolist():
        w_ts = np.sort(columns["ts"][works[columns["lane"][works] == lane]])
        # a batch's ops come after the previous Work and after any op that launched its own kernel
        bounds = np.sort(e_end[linked & (e_lane == lane)])
        k = np.searchsorted(bounds, w_ts, side="right") - 1
        after = np.maximum(
            np.where(k >= 0, bounds[np.maximum(k, 0)] if len(bounds) else lo, lo),
            np.concatenate([[lo], w_ts[:-1]]),
        )
        stop = np.concatenate([w_ts[1:], [hi]])
        ops = pending[e_lane[pending] == lane]
        ops = ops[np.argsort(e_start[ops], kind="stable")]
        first = np.searchsorted(e_start[ops], after, side="right")
        last = np.searchsorted(e_start[ops], w_ts, side="left")
        kernels = np.flatnonzero(free & (l_lane == lane))
        kernels = kernels[np.argsort(l_ts[kernels], kind="stable")]
        c = np.searchsorted(l_ts[kernels], w_ts, side="left")  # first launch in the Work or after
        has = (last > first) & (c < len(kernels))
        has[has] &= l_ts[kernels[c[has]]] < stop[has]
        for j in np.flatnonzero(has).tolist():
            batch_of[ops[first[j] : last[j]]] = kernels[c[j]]
    without = int(np.count_nonzero(batch_of[pending] < 0))
    members = pending[batch_of[pending] >= 0]
    if not len(members):
        return comm, without
    members = members[np.argsort(e_ev[members], kind="stable")]
    kernels = batch_of[members]
    expanded = rows_of(comm, kernels)
    for col in ("op", "peer", "seq", "bytes"):
        expanded[col] = enqueue[col][members]
    groups = enqueue["group"][members]
    expanded["group"] = np.where(groups != "", groups, expanded["group"])
    kept = rows_of(comm, np.setdiff1d(np.arange(len(comm["event"])), kernels))
    out = concat_rows([kept, expanded])
    # in event order, a batch's rows in issue order (two stable sorts: the rows' order on a tie)
    sub = np.concatenate([np.zeros(len(kept["event"]), np.int64), np.arange(1, len(members) + 1)])
    order = np.argsort(sub, kind="stable")
    order = order[np.argsort(out["event"][order], kind="stable")]
    return rows_of(out, order), without
