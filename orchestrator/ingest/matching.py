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

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
from rankscope.orchestrator.ingest.column_tables import (
    Columns,
    concat_rows,
    distinct,
    group_max,
    group_min,
    rows_of,
)
from rankscope.orchestrator.ingest.comm_links import RANK_COMM_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

#: Ops whose participants all finish within a short time of each other and none of which can
#: finish before every participant started (used for clock fitting and causality checks).
SYNCHRONIZING_OPS = frozenset(
    {"allreduce", "allgather", "reducescatter", "alltoall", "sendrecv", "barrier"}
)
#: Key prefix of a send / recv whose peer is unknown: no other rank can produce its key.
UNKNOWN_PEER_PREFIX = "p2p?|"
#: Columns of :func:`match`'s table, in order.
MATCHED_COLUMNS = (
    "coll", "key", "group", "seq", "op", "bytes", "rank", "start", "end", "event", "gpu"
)  # fmt: skip


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


def match(per_rank: dict[int, Columns]) -> Columns:
    """Long-form collectives table: one row per (collective, rank), as columns.

    ``per_rank[rank]``: that rank's comm events (RANK_COMM_COLUMNS, as the merge's per-rank task
    makes them: ``rank_columns._comm_table``; start/end in ns of the rank's clock; ``gpu``: True
    for GPU kernels, False for host-side gloo ops). Returns :data:`MATCHED_COLUMNS`: ``coll`` is
    a dense id in order of the key's earliest start (ties: the keys' text order; the merge
    renumbers after clock alignment). ``seq`` is the trace's sequence number, else the position
    of the collective within its (group, op) in time order; a point-to-point pair's op is that
    of its lower rank's row. Rows in (coll, rank) order.

    The table does not depend on the order of ``per_rank`` (the ranks are taken in ascending
    order): a merge on worker processes receives the ranks' results as they finish, and the
    pair's op, so its ``seq``, used to follow that order.

    In numpy, not pandas (``groupby``'s min, max, first and cumcount as ``ufunc.at`` and one
    pass over the collectives): the merge of a job whose clocks need no fit imports no pandas
    (``clock.align_columns``). ``tests/test_matching_table.py`` checks it against that pandas form.
    """
    parts = []
    for rank, comm in sorted(per_rank.items()):
        n = len(comm["event"])
        if not n:
            continue
        part = {c: np.asarray(comm[c]) for c in RANK_COMM_COLUMNS}
        part["key"] = rank_keys(comm, rank)
        part["rank"] = np.full(n, rank, dtype=np.int32)
        parts.append(part)
    if not parts:
        return {c: np.array([], dtype=object) for c in MATCHED_COLUMNS}
    allc = concat_rows(parts)
    # A key seen twice on one rank (should not happen) keeps its first occurrence.
    codes: dict[str, int] = {}
    key_code = np.fromiter(
        (codes.setdefault(k, len(codes)) for k in allc["key"].tolist()), np.int64, len(allc["key"])
    )
    first_seen = np.unique(
        key_code * (int(allc["rank"].max()) + 1) + allc["rank"], return_index=True
    )
    allc = rows_of(allc, np.sort(first_seen[1]))
    key_code = key_code[np.sort(first_seen[1])]
    keys = list(codes)
    # ids in order of each key's earliest start, ties in the keys' text order (a sorted groupby)
    text_order = np.empty(len(keys), dtype=np.int64)
    text_order[np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)] = (
        np.arange(len(keys))
    )
    first = group_min(key_code, allc["start"].astype(np.int64), len(keys))
    by_start = _stable_order(text_order, first)
    ids = np.empty(len(keys), dtype=np.int64)
    ids[by_start] = np.arange(len(keys))
    coll = ids[key_code]
    allc["coll"] = coll
    # Fill seq where the trace had none: order of the collective within its (group, op).
    seq_max = group_max(coll, allc["seq"], len(keys))
    no_seq = seq_max[coll] < 0
    if no_seq.any():
        rows = np.flatnonzero(no_seq)
        numbered, first_row = np.unique(coll[rows], return_index=True)
        counter: dict[tuple[Any, Any], int] = {}
        order = np.empty(len(numbered), dtype=np.int64)
        groups = allc["group"][rows[first_row]].tolist()
        ops = allc["op"][rows[first_row]].tolist()
        for j, pair in enumerate(zip(groups, ops, strict=True)):
            order[j] = counter.get(pair, 0)
            counter[pair] = order[j] + 1
        seq = allc["seq"].copy()
        seq[rows] = order[np.searchsorted(numbered, coll[rows])]
        allc["seq"] = seq
    else:
        allc["seq"] = seq_max[coll]
    allc["bytes"] = group_max(coll, allc["bytes"], len(keys))[coll]
    out = {c: allc[c] for c in MATCHED_COLUMNS}
    return rows_of(out, _stable_order(out["rank"], out["coll"]))


def _stable_order(minor: np.ndarray, major: np.ndarray) -> np.ndarray:
    """Row order by ``major``, then ``minor``, then position (two stable sorts: pandas'
    ``sort_values([major, minor], kind="stable")``)."""
    order = np.argsort(minor, kind="stable")
    return order[np.argsort(major[order], kind="stable")]


def without_peer(colls: Columns) -> int:
    """Send/recv rows of :func:`match`'s table whose peer is unknown (their key names none).

    The other send/recv rows that stay alone named a peer whose counterpart is in no trace (a
    rank not traced, an op outside the profiled window): the store keeps the count of the first
    kind (``schema.P2P_WITHOUT_PEER_ATTR``) so that the findings can say which is which.
    """
    return sum(1 for k in colls["key"].tolist() if k.startswith(UNKNOWN_PEER_PREFIX))


def renumber(colls: Columns) -> Columns:
    """Dense ``coll`` ids 0..n-1 in order of each collective's first (aligned) start; rows in
    (coll, rank) order."""
    if not len(colls["coll"]):
        return colls
    ids, inverse = np.unique(colls["coll"], return_inverse=True)
    first = group_min(inverse, colls["start"].astype(np.int64), len(ids))
    mapping = np.empty(len(ids), dtype=np.int64)
    mapping[np.argsort(first, kind="stable")] = np.arange(len(ids))
    out = dict(colls)
    out["coll"] = mapping[inverse]
    return rows_of(out, _stable_order(out["rank"], out["coll"]))


def rows_by_rank(colls: Columns, ranks: Iterable[int], columns: list[str]) -> dict[int, Columns]:
    """``columns`` of each rank's rows (in table order; no rows for a rank without any)."""
    rank = np.asarray(colls["rank"]).astype(np.int64)
    order = np.argsort(rank, kind="stable")  # each rank's rows together, in table order
    by_rank = rank[order]
    out = {}
    for r in ranks:
        rows = order[np.searchsorted(by_rank, r) : np.searchsorted(by_rank, r, side="right")]
        out[int(r)] = {c: np.asarray(colls[c])[rows] for c in columns}
    return out


def shared_rows(
    colls: Columns, ops: Iterable[str], ranks: int, exactly: bool = False
) -> np.ndarray:
    """Rows (a mask) of collectives of ``ops`` that ``ranks`` ranks or more (``exactly``: that
    many) take part in, counted among those ops' rows."""
    rows = np.isin(np.asarray(colls["op"], dtype=object), list(ops))
    if not rows.any():
        return rows
    coll = np.asarray(colls["coll"])[rows].astype(np.int64)
    rank = np.asarray(colls["rank"])[rows].astype(np.int64)
    ids, inverse = np.unique(coll, return_inverse=True)
    width = int(rank.max()) + 1
    pairs = distinct(inverse * width + rank)  # each (collective, rank) once
    counts = np.bincount(pairs // width, minlength=len(ids))[inverse]
    rows[rows] = counts == ranks if exactly else counts >= ranks
    return rows
