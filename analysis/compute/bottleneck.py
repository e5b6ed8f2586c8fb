"""Pipeline bottlenecks: which stage the receivers' waits trace back to, pair by pair.

Point-to-point pairs (a send and its recv, ``schema.P2P_OPS``) are left out of the straggler test
(:mod:`rankscope.analysis.compute.stragglers`): in a pipeline the earlier stage is "last" at every recv of
the next one by construction (the bubble). Here each receiver's wait is traced back instead —
to the sender when the sender's own extra work explains it, else upstream through the wait the
sender itself had, else to nobody (a balanced pipeline's bubble) — and a stage that most of the
waiting traces back to is the pipeline's bottleneck. Pure functions of the waits table and the
arrival windows; definitions in docs/analysis.md, "Pipeline bottleneck".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from rankscope.analysis.compute.exact_reductions import clip_low0, group_positions, pandas_sum
from rankscope.analysis.compute.stragglers import MIN_RUN_FRACTION, OWN_FRACTION, Cause

#: Receiver waits shorter than this (ns) are not traced back (scheduling noise, not a stage).
MIN_P2P_WAIT_NS = 50_000
#: A pipeline bottleneck is the root of at least this many receivers' waits.
MIN_ROOT_PAIRS = 3
#: ... and of at least this share of all the waiting in recvs.
MIN_ROOT_SHARE = 0.5

#: Columns of :func:`p2p_roots`: one row per (send, recv) pair (ns).
ROOT_COLUMNS: dict[str, str] = {
    "coll": "int64",
    "sender": "int32",
    "receiver": "int32",
    "wait_ns": "int64",  # the receiver's wait for the sender
    "extra_ns": "int64",  # the sender's own work before sending, beyond the typical stage's
    "root": "int32",  # rank whose own extra work the wait traces back to; -1 none
    "caused_ns": "int64",  # part of the wait charged to the root: min(wait, the root's extra)
    "via": "int32",  # pairs followed upstream to reach the root (0: the sender itself)
}

#: Columns of :func:`pipeline_stages` (seconds where ``_s``).
PIPELINE_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "sends": "int64",
    "root_pairs": "int64",  # receivers' waits that trace back to this rank
    "wait_traced_s": "float64",  # those waits, in full
    "wait_share": "float64",  # wait_traced_s / all the waiting in recvs
    "wait_caused_s": "float64",  # the part of them its own extra work explains
    "compute_extra_s": "float64",  # summed over its sends where it is the root
    "input_extra_s": "float64",
    "host_extra_s": "float64",
    "cause": "str",
    "is_bottleneck": "bool",
}


def _typical_stage(sends: pd.DataFrame, col: str) -> float:
    """The typical stage's ``col`` over send windows: median over ranks of each rank's median.

    Per rank first, so that one slow stage — however many sends it has — cannot move it.
    """
    return float(sends.groupby("rank")[col].median().median())


def _direct_values(
    sends: pd.DataFrame, coll: np.ndarray, direct: np.ndarray, col: str
) -> np.ndarray | None:
    """Per pair of the roots table: its sender's ``col`` (``sends``, indexed by coll) where the
    pair is direct (``via`` 0), 0 where the sender has no window; NaN elsewhere (never read).
    None when the windows have no such column."""
    if col not in sends:
        return None
    out = np.full(len(coll), np.nan)
    out[direct] = sends[col].reindex(coll[direct]).fillna(0).to_numpy(np.float64)
    return out


def p2p_roots(waits: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Trace each receiver's wait back to the pipeline stage whose own extra work caused it.

    A receiver waits because its sender sent late. The sender's *own* work before sending (its
    arrival window: compute + input + host time since its previous sync point) is compared with
    the typical stage's — the median over ranks of each rank's median send window, so one slow
    stage cannot move the reference. When that extra explains at least ``OWN_FRACTION`` of the
    wait, the sender is the root. Otherwise the sender was late because it was itself waiting:
    if its previous sync point is a recv in which it waited, the root of that pair is the root
    of this one (followed pair by pair, in time order), else the wait is the pipeline's schedule
    and has no root (-1) — the bubble of a balanced pipeline traces back to nobody.
    """
    from rankscope.analysis.store.schema import P2P_OPS

    empty = pd.DataFrame({c: pd.Series(dtype=d) for c, d in ROOT_COLUMNS.items()})
    pairs = waits[waits["op"].isin(P2P_OPS) & (waits["n_ranks"] == 2)]
    send = pairs[pairs["op"] == "send"].set_index("coll")
    recv = pairs[pairs["op"] == "recv"].set_index("coll")
    both = send.index.intersection(recv.index)
    if len(both) == 0:
        return empty
    send, recv = send.loc[both], recv.loc[both]
    own = send[["rank", "arrival"]].reset_index()
    parts = ["compute_ns", "input_ns", "idle_ns"]
    if len(windows):
        own = own.merge(windows[["coll", "rank", *parts]], on=["coll", "rank"], how="left")
    for p in parts:
        own[p] = own[p].fillna(0) if p in own else 0
    own["own_ns"] = own[parts].sum(axis=1)
    own["extra_ns"] = own["own_ns"] - _typical_stage(own, "own_ns")
    own = own.set_index("coll")
    table = pd.DataFrame(
        {
            "coll": both.to_numpy(np.int64),
            "sender": send["rank"].to_numpy(np.int32),
            "receiver": recv["rank"].to_numpy(np.int32),
            "wait_ns": recv["wait_ns"].to_numpy(np.int64),
            "extra_ns": own.loc[both, "extra_ns"].to_numpy(np.float64).round().astype(np.int64),
            "arrival": send["arrival"].to_numpy(np.int64),
        }
    ).sort_values("arrival", kind="stable")
    # each rank's sync points (ends of all its collectives and pairs), to find what a sender
    # last waited in before it sent
    ends = {
        int(r): (g["end"].to_numpy(np.int64), g["coll"].to_numpy(np.int64))
        for r, g in waits.sort_values("end", kind="stable").groupby("rank")
    }
    waited_in = {
        (int(c), int(r)): int(w)
        for c, r, w in recv.reset_index()[["coll", "rank", "wait_ns"]].itertuples(index=False)
    }
    resolved: dict[int, tuple[int, int, int]] = {}  # coll -> (root, caused, via)
    out = []
    for coll, s, _d, wait, extra, arrival in table.itertuples(index=False):
        root, caused, via = -1, 0, 0
        if wait >= MIN_P2P_WAIT_NS:
            if extra >= OWN_FRACTION * wait:
                root, caused = int(s), int(min(wait, extra))
            else:
                mine = ends.get(int(s))
                if mine is not None:
                    k = int(np.searchsorted(mine[0], arrival, "right")) - 1
                    if k >= 0:
                        prev = int(mine[1][k])
                        if waited_in.get((prev, int(s)), 0) >= MIN_P2P_WAIT_NS and prev in resolved:
                            up_root, up_caused, up_via = resolved[prev]
                            if up_root >= 0:
                                root, caused, via = up_root, min(int(wait), up_caused), up_via + 1
        resolved[int(coll)] = (root, caused, via)
        out.append((root, caused, via))
    table["root"], table["caused_ns"], table["via"] = (
        [o[0] for o in out],
        [o[1] for o in out],
        [o[2] for o in out],
    )
    return table[list(ROOT_COLUMNS)].astype(ROOT_COLUMNS).sort_values("coll").reset_index(drop=True)


def pipeline_stages(
    waits: pd.DataFrame,
    windows: pd.DataFrame,
    profiled_ns: pd.Series | None = None,
) -> pd.DataFrame:
    """Per rank that sends point to point: the receivers' waits it is the root of, and why.

    A rank is the pipeline's **bottleneck** when it is the root (:func:`p2p_roots`) of at least
    ``MIN_ROOT_PAIRS`` waits that add up to at least ``MIN_ROOT_SHARE`` of all the waiting in
    recvs, and the part of them its own extra work explains is at least ``MIN_RUN_FRACTION`` of
    the median rank's profiled time. The cause is the largest
    part of its own extra work (compute, input, host) over the sends where it is the root.
    Empty without matched pairs. Stragglers by collectives are :func:`find_stragglers`.
    """
    empty = pd.DataFrame(
        {c: pd.Series(dtype=d if d != "str" else object) for c, d in PIPELINE_COLUMNS.items()}
    )
    roots = p2p_roots(waits, windows)
    if roots.empty:
        return empty
    total = float(roots["wait_ns"].sum())
    median_profiled = (
        float(profiled_ns.median()) if profiled_ns is not None and len(profiled_ns) else 0.0
    )
    parts = {Cause.OWN_COMPUTE: "compute_ns", Cause.INPUT: "input_ns", Cause.HOST: "idle_ns"}
    # the sender's window of every pair, and the typical stage's value of each part
    sent = roots[["coll", "sender"]].rename(columns={"sender": "rank"})
    sends = sent.merge(windows, on=["coll", "rank"], how="inner") if len(windows) else sent
    typical = {c: _typical_stage(sends, col) if col in sends else 0.0 for c, col in parts.items()}
    sends = sends.set_index("coll")
    # Each root's pairs, in the table's order, as positions (not a filter of the table per rank:
    # 1.6 ms a rank at 256 ranks), reduced as pandas reduces (exact_reductions); the direct
    # pairs' sender windows read once.
    by_root = group_positions(roots["root"].to_numpy())
    caused_ns = roots["caused_ns"].to_numpy()
    wait_ns = roots["wait_ns"].to_numpy()
    direct = roots["via"].to_numpy() == 0
    own = {
        c: _direct_values(sends, roots["coll"].to_numpy(), direct, col) for c, col in parts.items()
    }
    none = np.zeros(0, np.intp)
    rows = []
    for rank, sent_at in group_positions(roots["sender"].to_numpy()).items():
        mine = by_root.get(rank, none)
        caused = float(caused_ns[mine].sum())
        traced = float(wait_ns[mine].sum())
        mine_direct = mine[direct[mine]]
        # (the sender's window, missing = 0, less the typical stage's) clipped at 0, summed
        extras = {
            c: float(pandas_sum(clip_low0(values[mine_direct] - typical[c])))
            if values is not None
            else 0.0
            for c, values in own.items()
        }
        cause = max(extras, key=lambda c: extras[c]) if caused > 0 else Cause.UNKNOWN
        if caused > 0 and extras[cause] <= 0:
            cause = Cause.UNKNOWN
        share = traced / total if total > 0 else 0.0
        material = median_profiled <= 0 or caused >= MIN_RUN_FRACTION * median_profiled
        rows.append(
            {
                "rank": int(rank),
                "sends": len(sent_at),
                "root_pairs": len(mine),
                "wait_traced_s": traced / 1e9,
                "wait_share": share,
                "wait_caused_s": caused / 1e9,
                "compute_extra_s": extras[Cause.OWN_COMPUTE] / 1e9,
                "input_extra_s": extras[Cause.INPUT] / 1e9,
                "host_extra_s": extras[Cause.HOST] / 1e9,
                "cause": str(cause),
                "is_bottleneck": bool(
                    len(mine) >= MIN_ROOT_PAIRS and share >= MIN_ROOT_SHARE and material
                ),
            }
        )
    out = pd.DataFrame(rows).sort_values(
        ["is_bottleneck", "wait_caused_s"], ascending=[False, False]
    )
    return out.reset_index(drop=True).astype(
        {k: v for k, v in PIPELINE_COLUMNS.items() if v != "str"}
    )
