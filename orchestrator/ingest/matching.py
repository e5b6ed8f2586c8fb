"""Cross-rank matching of collectives: which event on each rank is the same collective.

Inputs are the per-rank communication events found by the reader (NCCL kernels on GPU streams,
``gloo:*`` ops on ``pt_gloo_runloop`` threads). A collective is identified across ranks by a key:

* ``(group, seq)`` when the trace carries a sequence number (``Seq`` in the
  ``record_param_comms`` args of recent PyTorch, Mar 2026; Kineto does not copy it to the
  kernel, which takes it from the ``record_param_comms`` that launched it —
  ``orchestrator/ingest/comm_links.py``) — exact, even when a rank's trace lacks some of the group's ops;
* else ``(group, op, step, k)``: the group's call order, the k-th op of that kind in profiler step
  ``step`` of that group (``k`` counts per rank in time order; every rank of a group calls its
  collectives in one order). Counting inside a step keeps one missing event from shifting every
  later match. ``group`` is the ``Process Group Name`` when the trace (kernel or its
  ``record_param_comms``) says it, else ``gloo`` for gloo ops, else ``stream#i`` (the i-th
  communication stream of the rank, in order of first use — stream ids differ across ranks,
  their order does not).

Send/recv kernels of NCCL (``SendRecv``, used by all-to-all) are matched the same way; this is
what all-to-all in DLRM-style models produces: every rank runs the same grouped send/recv.

Point-to-point ops (``send`` / ``recv``, :data:`~rankscope.analysis.store.schema.P2P_OPS`) are not
collectives of their group: in a pipeline rank 1 receives from 0 and sends to 2, so neither a
sequence number nor "the k-th recv" lines them up across ranks (the ``Seq`` PyTorch passed for
a send was the group's next collective number, the same for every p2p op between two
collectives; whether recent builds use a p2p counter is not confirmed, so it is not used). They are paired instead: the k-th send from s to d in a profiler step is the k-th
recv on d from s in that step (both sides issue in program order; the ops of a
``batch_isend_irecv`` in the order they were issued), key ``(s, d, step, k)``. The peer (``peer``
column, a global rank) is the trace's own ``Dst Rank`` / ``Src Rank`` where it has them, else the
rank runtime's annotation (``launchers/p2p.py``; ``orchestrator/ingest/comm_links.py`` says which wins).
Without either each send / recv stays a collective of one rank (key prefix
:data:`UNKNOWN_PEER_PREFIX`, counted by :func:`without_peer`): unmatched rather than wrongly
matched; so does an op whose peer's counterpart is in no trace.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from rankscope.orchestrator.ingest.comm_links import RANK_COMM_COLUMNS, Columns

#: Ops whose participants all finish within a short time of each other and none of which can
#: finish before every participant started (used for clock fitting and causality checks).
SYNCHRONIZING_OPS = frozenset(
    {"allreduce", "allgather", "reducescatter", "alltoall", "sendrecv", "barrier"}
)
#: Key prefix of a send / recv whose peer is unknown: no other rank can produce its key.
UNKNOWN_PEER_PREFIX = "p2p?|"


def rank_keys(comm: Columns | pd.DataFrame, rank: int) -> np.ndarray:
    """Match key (a string) for each comm event of ONE rank (columns RANK_COMM_COLUMNS; ``op``
    and ``group`` text, as the merge's comm table holds them).

    ``rank``: the rank's global rank (point-to-point keys name both ends; module docstring).
    The events are taken in time order (stable on equal starts), ``k`` counting per (pair,
    step) for send / recv and per (group, op, step) for collectives without ``Seq``.

    One pass in Python over plain values: the same keys as pandas' string columns and
    ``groupby().cumcount()`` (``tests/test_matching_keys.py`` checks them against that form on
    every job of tests/data and random tables), ~10x faster on the ~10^3 comm events of a
    rank of a pipeline job, whose merge ran this for each of its ranks.
    """
    from rankscope.analysis.store.schema import P2P_OPS

    n = len(comm["op"])
    if not n:
        return np.array([], dtype=object)
    ops = np.asarray(comm["op"], dtype=object)
    groups = np.asarray(comm["group"], dtype=object)
    steps = np.asarray(comm["step"]).tolist()
    seqs = np.asarray(comm["seq"]).tolist()
    peers = np.asarray(comm["peer"], dtype=np.int64).tolist() if "peer" in comm else [-1] * n
    keys: list[str] = [""] * n
    p2p_seen: dict[tuple[str, int], int] = {}
    coll_seen: dict[tuple[str, str, int], int] = {}
    for i in np.argsort(np.asarray(comm["start"]), kind="stable").tolist():
        op, step = ops[i], steps[i]
        if op in P2P_OPS:
            peer = peers[i]
            pair = f"{rank}>{peer}" if op == "send" else f"{peer}>{rank}"
            k = p2p_seen.get((pair, step), 0)
            p2p_seen[pair, step] = k + 1
            if peer >= 0:
                keys[i] = f"p2p|{pair}|p={step}|k={k}"
            else:  # unknown peer: a key no other rank can produce (a collective of this rank)
                keys[i] = f"{UNKNOWN_PEER_PREFIX}r={rank}|o={op}|p={step}|k={k}"
        elif seqs[i] >= 0:
            keys[i] = f"g={groups[i]}|s={seqs[i]}"
        else:
            group = groups[i]
            k = coll_seen.get((group, op, step), 0)
            coll_seen[group, op, step] = k + 1
            keys[i] = f"g={group}|o={op}|p={step}|k={k}"
    return np.array(keys, dtype=object)


def match(per_rank: dict[int, Columns]) -> pd.DataFrame:
    """Long-form collectives table: one row per (collective, rank).

    ``per_rank[rank]``: that rank's comm events (RANK_COMM_COLUMNS, as the merge's per-rank task
    makes them: ``rank_columns._comm_table``; start/end in ns of the rank's clock; ``gpu``: True
    for GPU kernels, False for host-side gloo ops). Returns columns
    ``key, group, seq, op, bytes, rank, start, end, event, gpu`` plus ``coll``
    (dense id in order of the key's earliest start; the merge renumbers after clock alignment).
    ``seq`` is the trace's sequence number, else the position of the collective within its
    (group, op) in time order; a point-to-point pair's op is that of its lower rank's row.

    The table does not depend on the order of ``per_rank`` (the ranks are taken in ascending
    order): a merge on worker processes receives the ranks' results as they finish, and the
    pair's op, so its ``seq``, used to follow that order.
    """
    frames = []
    for rank, comm in sorted(per_rank.items()):
        if not len(comm["event"]):
            continue
        f = pd.DataFrame({c: comm[c] for c in RANK_COMM_COLUMNS})
        f["key"] = rank_keys(comm, rank)
        f["rank"] = np.int32(rank)
        frames.append(f)
    columns = ["coll", "key", "group", "seq", "op", "bytes", "rank", "start", "end", "event", "gpu"]
    if not frames:
        return pd.DataFrame({c: [] for c in columns})
    allc = pd.concat(frames, ignore_index=True)
    # A key seen twice on one rank (should not happen) keeps its first occurrence.
    allc = allc.drop_duplicates(["key", "rank"], keep="first")
    first = allc.groupby("key")["start"].min().sort_values(kind="stable")
    ids = pd.Series(np.arange(len(first), dtype=np.int64), index=first.index)
    allc["coll"] = ids.loc[allc["key"]].to_numpy()
    # Fill seq where the trace had none: order of the collective within its (group, op).
    no_seq = allc.groupby("coll")["seq"].transform("max") < 0
    if no_seq.any():
        per_coll = (
            allc.loc[no_seq].groupby("coll").agg(group=("group", "first"), op=("op", "first"))
        )
        per_coll = per_coll.sort_index()
        per_coll["order"] = per_coll.groupby(["group", "op"]).cumcount()
        allc.loc[no_seq, "seq"] = per_coll["order"].loc[allc.loc[no_seq, "coll"]].to_numpy()
    else:
        allc["seq"] = allc.groupby("coll")["seq"].transform("max")
    allc["bytes"] = allc.groupby("coll")["bytes"].transform("max")
    return allc.loc[:, columns].sort_values(["coll", "rank"], kind="stable").reset_index(drop=True)


def without_peer(colls: pd.DataFrame) -> int:
    """Send/recv rows of :func:`match`'s table whose peer is unknown (their key names none).

    The other send/recv rows that stay alone named a peer whose counterpart is in no trace (a
    rank not traced, an op outside the profiled window): the store keeps the count of the first
    kind (``schema.P2P_WITHOUT_PEER_ATTR``) so that the findings can say which is which.
    """
    if colls.empty:
        return 0
    return int(colls["key"].str.startswith(UNKNOWN_PEER_PREFIX).sum())


def renumber(colls: pd.DataFrame) -> pd.DataFrame:
    """Dense ``coll`` ids 0..n-1 in order of each collective's first (aligned) start."""
    if colls.empty:
        return colls
    first = colls.groupby("coll")["start"].min().sort_values(kind="stable")
    mapping = pd.Series(np.arange(len(first), dtype=np.int64), index=first.index)
    out = colls.copy()
    out["coll"] = mapping.loc[out["coll"]].to_numpy()
    return out.sort_values(["coll", "rank"], kind="stable").reset_index(drop=True)
