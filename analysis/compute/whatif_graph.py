"""The what-if replay graph of one job: its nodes and edges (``NODE_COLUMNS``,
``EDGE_COLUMNS``), the per-rank measures its own-work edges need (:func:`rank_clock`, ns on the
aligned clock) and :func:`build`, which rebuilds it from the store's tables with its evaluation
order (:func:`_levels`).

What the nodes and edges mean, and the model's assumptions, are described in full in
:mod:`rankscope.analysis.engine.whatif` (the entry point: replay, step times, the what-if table).
Separate from it because building the graph is the largest and most intricate part of the
model, and the pipeline's per-rank tasks need only :func:`own_points` and :func:`rank_clock`
from here; the replay and the scenarios only read a built :class:`Model`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.store.range_queries import first_below

#: Node kinds (``NODE_COLUMNS`` ``kind``).
START, ARRIVAL, STEP_END, LAST_ARRIVAL, END = "start", "arrival", "step_end", "last_arrival", "end"
#: Edge kinds (``EDGE_COLUMNS`` ``kind``).
WORK, RESUME, LATE = "work", "resume", "late"
ARRIVE, TRANSFER, EARLY = "arrive", "transfer", "early"
OWN_EDGES = (WORK, RESUME)

#: Columns of :attr:`Model.nodes`: one row per node, row index == node id.
NODE_COLUMNS: dict[str, str] = {
    "node": "int64",
    "kind": "str",  # START, ARRIVAL, STEP_END (own points); LAST_ARRIVAL; END
    "rank": "int32",  # -1 for LAST_ARRIVAL (a collective's)
    "step": "int64",  # profiled step holding the point; -1 outside every step
    "pos": "int64",  # own points: position within the rank's step (0 = its start); else -1
    "op": "str",  # the collective's op (ARRIVAL, LAST_ARRIVAL, END); "" for step points
    "coll": "int64",  # collective id (Store.collectives() "coll"), -1 for step points
    "time_ns": "int64",  # measured time, ns, aligned clock
}

#: Columns of :attr:`Model.edges`.
EDGE_COLUMNS: dict[str, str] = {
    "src": "int64",
    "dst": "int64",
    "kind": "str",  # WORK, RESUME, LATE, ARRIVE, TRANSFER, EARLY
    "rank": "int32",  # the rank whose work / transfer it is
    "w_ns": "int64",  # weight: own work (WORK, RESUME), transfer or duration (TRANSFER, EARLY)
    "input_ns": "int64",  # input stall inside the edge's span (own edges; else 0)
}

#: Columns of :func:`rank_clock`: cumulative measures of one rank at given times (ns).
CLOCK_COLUMNS: dict[str, str] = {
    "time_ns": "int64",
    "exposed_ns": "int64",  # exposed communication from the rank's first point to time_ns
    "input_ns": "int64",  # input stall (CPU: DataLoader; GPU: device idle in the DataLoader)
}


@dataclasses.dataclass
class Model:
    """The replay graph of one job (``NODE_COLUMNS``, ``EDGE_COLUMNS``) and its evaluation order."""

    nodes: pd.DataFrame
    edges: pd.DataFrame
    levels: list[np.ndarray] = dataclasses.field(repr=False)
    """Edge indices grouped by the depth of their destination node (evaluation order)."""

    _step_points: tuple[np.ndarray, ...] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    def own_mask(self) -> np.ndarray:
        """Edges carrying a rank's own work (WORK and RESUME)."""
        return self.edges["kind"].isin(OWN_EDGES).to_numpy().copy()

    def step_points(self) -> tuple[np.ndarray, ...]:
        """``(steps, start rows, their steps' positions, end rows, their steps' positions)``:
        the START and STEP_END nodes by step, found once per model
        (:func:`~rankscope.analysis.engine.whatif.step_times` runs once per replay, dozens of times per
        analysis; the node kinds are text)."""
        if self._step_points is None:
            kind = self.nodes["kind"].to_numpy(object)
            step = self.nodes["step"].to_numpy(np.int64)
            s_rows, e_rows = np.flatnonzero(kind == START), np.flatnonzero(kind == STEP_END)
            steps = np.unique(step[np.concatenate([s_rows, e_rows])])
            s_pos = np.searchsorted(steps, step[s_rows])
            e_pos = np.searchsorted(steps, step[e_rows])
            self._step_points = (steps, s_rows, s_pos, e_rows, e_pos)
        return self._step_points


# -- per rank: the measures the own-work edges need --------------------------------------------


def rank_clock(
    events: pd.DataFrame, lanes: pd.DataFrame, times: np.ndarray, painted: Any = None
) -> pd.DataFrame:
    """Cumulative exposed communication and input stall of one rank at ``times`` (CLOCK_COLUMNS).

    Measured by the breakdown's painter (:func:`rankscope.analysis.compute.breakdown.painter`), from
    the earliest of ``times``: a difference of two rows is the measure between them. Runs per
    rank (it reads that rank's events); the pipeline's rank task calls it with the painter it
    already built (``painted``: ``(device, measure)``), so the interval sets are built once.
    """
    from rankscope.analysis.compute import breakdown as bd

    times = np.asarray(times, np.int64)
    if len(times) == 0 or len(events) == 0:
        z = np.zeros(len(times), np.int64)
        return pd.DataFrame({"time_ns": times, "exposed_ns": z, "input_ns": z})
    device, measure = painted if painted is not None else bd.painter(events, lanes)
    lo = np.full(len(times), int(times.min()), np.int64)
    got = measure(lo, times)
    zeros = np.zeros(len(times), np.int64)
    stall = got.get("idle_input_ns" if device is bd.Device.GPU else "input_ns", zeros)
    clock = {
        "time_ns": times,
        "exposed_ns": np.asarray(got.get("comm_exposed_ns", zeros), np.int64),
        "input_ns": np.asarray(stall, np.int64),
    }
    return pd.DataFrame({c: clock[c].astype(d) for c, d in CLOCK_COLUMNS.items()})


def own_points(steps: pd.DataFrame, collectives: pd.DataFrame) -> pd.DataFrame:
    """Every time at which a rank's measures are needed: ``rank``, ``time_ns`` (sorted, unique)."""
    frames = [
        steps[["rank", "start"]].set_axis(["rank", "time_ns"], axis=1),
        steps[["rank", "end"]].set_axis(["rank", "time_ns"], axis=1),
        collectives[["rank", "start"]].set_axis(["rank", "time_ns"], axis=1),
        collectives[["rank", "end"]].set_axis(["rank", "time_ns"], axis=1),
    ]
    out = pd.concat(frames, ignore_index=True).astype({"rank": "int32", "time_ns": "int64"})
    return out.drop_duplicates().sort_values(["rank", "time_ns"], ignore_index=True)


# -- the graph -------------------------------------------------------------------------------


def build(
    steps: pd.DataFrame, collectives: pd.DataFrame, clocks: dict[int, pd.DataFrame] | None = None
) -> Model:
    """The replay graph from ``Store.steps()``, ``Store.collectives()`` and per-rank
    :func:`rank_clock` tables (``clocks[rank]``, covering :func:`own_points`; without one, a
    rank's exposed communication and input stall count as 0 — every gap is its own work)."""
    clocks = clocks or {}
    st = steps.astype({"rank": "int64", "step": "int64", "start": "int64", "end": "int64"})
    co = collectives.astype({"coll": "int64", "rank": "int64", "start": "int64", "end": "int64"})
    # -- own points per rank, in program order
    own = pd.concat(
        [
            pd.DataFrame(
                {
                    "kind": START,
                    "rank": st["rank"],
                    "step": st["step"],
                    "op": "",
                    "coll": -1,
                    "time_ns": st["start"],
                    "order": 0,
                }
            ),
            pd.DataFrame(
                {
                    "kind": ARRIVAL,
                    "rank": co["rank"],
                    "step": -1,
                    "op": co["op"].astype(str),
                    "coll": co["coll"],
                    "time_ns": co["start"],
                    "order": 1,
                }
            ),
            pd.DataFrame(
                {
                    "kind": STEP_END,
                    "rank": st["rank"],
                    "step": st["step"],
                    "op": "",
                    "coll": -1,
                    "time_ns": st["end"],
                    "order": 2,
                }
            ),
        ],
        ignore_index=True,
    )
    own = own.sort_values(["rank", "time_ns", "order", "coll"], kind="stable", ignore_index=True)
    # the step holding each arrival (the rank's step window around it), else -1; on arrays
    # (a frame filter and a .loc write per rank were most of this at 256 ranks)
    own_step_col = own["step"].to_numpy(np.int64).copy()
    own_is_arrival = (own["kind"] == ARRIVAL).to_numpy()
    own_time = own["time_ns"].to_numpy(np.int64)
    st_rank, st_start = st["rank"].to_numpy(np.int64), st["start"].to_numpy(np.int64)
    st_end, st_num = st["end"].to_numpy(np.int64), st["step"].to_numpy(np.int64)
    for rank, idx in own.groupby("rank").groups.items():
        pick = np.flatnonzero(st_rank == rank)
        pick = pick[st_start[pick].argsort(kind="quicksort")]  # sort_values("start")'s order
        rows = np.asarray(idx)
        arr = own_is_arrival[rows]
        t = own_time[rows]
        k = np.searchsorted(st_start[pick], t, side="right") - 1
        ok = (k >= 0) & (t <= st_end[pick][np.maximum(k, 0)])
        step = np.where(ok, st_num[pick][np.maximum(k, 0)], -1)
        own_step_col[rows[arr]] = step[arr]
    own["step"] = own_step_col
    own["pos"] = own.groupby(["rank", "step"]).cumcount().astype("int64")
    n_own = len(own)
    # -- collective nodes
    lastarr = co.groupby("coll", sort=True).agg(time_ns=("start", "max"), op=("op", "first"))
    n_last = len(lastarr)
    last_id = pd.Series(np.arange(n_own, n_own + n_last), index=lastarr.index)
    ends = co[["coll", "rank", "op", "end"]].reset_index(drop=True)
    end_ids = np.arange(n_own + n_last, n_own + n_last + len(ends))
    nodes = pd.concat(
        [
            own[["kind", "rank", "step", "pos", "op", "coll", "time_ns"]],
            pd.DataFrame(
                {
                    "kind": LAST_ARRIVAL,
                    "rank": -1,
                    "step": -1,
                    "pos": -1,
                    "op": lastarr["op"].astype(str).to_numpy(),
                    "coll": lastarr.index.to_numpy(),
                    "time_ns": lastarr["time_ns"].to_numpy(),
                }
            ),
            pd.DataFrame(
                {
                    "kind": END,
                    "rank": ends["rank"],
                    "step": -1,
                    "pos": -1,
                    "op": ends["op"].astype(str),
                    "coll": ends["coll"],
                    "time_ns": ends["end"],
                }
            ),
        ],
        ignore_index=True,
    )
    nodes.insert(0, "node", np.arange(len(nodes), dtype=np.int64))
    nodes = nodes.astype({k: v for k, v in NODE_COLUMNS.items() if v != "str"})
    # end nodes inherit the step of their rank's arrival
    arrival_node = pd.Series(
        own.index[own["kind"] == ARRIVAL].to_numpy(),
        index=pd.MultiIndex.from_frame(own.loc[own["kind"] == ARRIVAL, ["coll", "rank"]]),
    )
    key = pd.MultiIndex.from_frame(ends[["coll", "rank"]])
    arr_of_end = arrival_node.reindex(key).to_numpy(np.int64)
    nodes.loc[end_ids, "step"] = own["step"].to_numpy()[arr_of_end]

    edges: list[dict[str, Any]] = []
    t_all = nodes["time_ns"].to_numpy(np.int64)
    # -- collectives: arrive, transfer / early
    last_of = last_id.reindex(ends["coll"]).to_numpy(np.int64)
    edges.append(_edges(arr_of_end, last_of, ARRIVE, ends["rank"], 0))
    e_t, a_t, l_t = t_all[end_ids], t_all[arr_of_end], t_all[last_of]
    held = e_t >= l_t
    edges.append(
        _edges(last_of[held], end_ids[held], TRANSFER, ends["rank"][held], (e_t - l_t)[held])
    )
    early = ~held
    # early: from its arrival min(duration, lag), from the last arrival -lag (the module
    # docstring of rankscope.analysis.engine.whatif)
    lag = l_t - e_t
    edges.append(
        _edges(
            arr_of_end[early],
            end_ids[early],
            EARLY,
            ends["rank"][early],
            np.minimum(np.maximum(e_t - a_t, 0), lag)[early],
        )
    )
    edges.append(_edges(last_of[early], end_ids[early], TRANSFER, ends["rank"][early], -lag[early]))
    # -- own work, per rank
    end_rank = ends["rank"].to_numpy(np.int64)
    own_kind, own_step = own["kind"].to_numpy(object), own["step"].to_numpy()
    for rank, idx in own.groupby("rank", sort=True).groups.items():
        ids = np.asarray(idx, np.int64)  # own node ids in program order (own is sorted)
        t = t_all[ids]
        clock = _clock_arrays(clocks.get(int(rank)))
        exposed, stall = _cumulative(clock, t)
        mine_end = end_ids[end_rank == rank]
        e_sorted = mine_end[np.argsort(t_all[mine_end], kind="stable")]
        te = t_all[e_sorted]
        ex_e, in_e = _cumulative(clock, te)
        kind = own_kind[ids]
        step = own_step[ids]
        # a step start without its previous step on this rank starts a block: measured time
        prev_step = np.concatenate([[np.iinfo(np.int64).min], step[:-1]])
        block = (kind == START) & ((prev_step != step - 1) | (np.arange(len(ids)) == 0))
        has_pred = (np.arange(len(ids)) > 0) & ~block
        x = np.flatnonzero(has_pred)
        p = x - 1
        # ends in (p, x] of ops this rank arrived at before x (program order): resume edges
        arr_pos_all = np.searchsorted(ids, arr_of_end[e_sorted - end_ids[0]])
        lo = np.searchsorted(te, t[p], side="right")
        hi = np.searchsorted(te, t[x], side="right")
        count = hi - lo
        xi = np.repeat(np.arange(len(x)), count)
        # the ends lo..hi-1 of each x, flattened (one arange over the repeated offsets)
        ej = (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)).astype(
            np.int64
        ) + np.repeat(lo, count)
        ok = arr_pos_all[ej] < x[xi]
        # an end only resumes a rank that was blocked before it: with no exposed communication
        # in (p, e] the rank computed up to that end (an overlapped gradient reduce-scatter on
        # its own stream) and the WORK edge already gives x; a fix must not hold x behind it
        ok &= ex_e[ej] > exposed[p[xi]]
        xi, ej = xi[ok], ej[ok]
        # late resume: blocked in (p, x] (exposed communication) — a gloo op's recorded end can
        # trail the moment the main thread resumed: the first end after x of an op the rank
        # arrived at before x, less the time from x to that end (tight on the measured run)
        late = np.full(len(x), -1, np.int64)
        blocked = np.flatnonzero(exposed[x] > exposed[p])
        first = np.searchsorted(te, t[x[blocked]], side="right")
        late[blocked] = first_below(arr_pos_all, first, x[blocked])
        # exposed communication after the last end in (p, x], with no later end to explain it
        # (a gloo send whose recorded start trails its c10d call): kept as the rank's own time
        last_end = np.full(len(x), -1, np.int64)
        np.maximum.at(last_end, xi, ej)
        after = np.where(last_end >= 0, ex_e[np.maximum(last_end, 0)], exposed[p])
        unexplained = np.where(late >= 0, 0, exposed[x] - after)
        own_w = (t[x] - t[p]) - (exposed[x] - exposed[p]) + unexplained
        edges.append(_edges(ids[p], ids[x], WORK, rank, own_w, stall[x] - stall[p]))
        w = (t[x[xi]] - te[ej]) - (exposed[x[xi]] - ex_e[ej]) + unexplained[xi]
        edges.append(_edges(e_sorted[ej], ids[x[xi]], RESUME, rank, w, stall[x[xi]] - in_e[ej]))
        has = late >= 0
        edges.append(
            _edges(e_sorted[late[has]], ids[x[has]], LATE, rank, t[x[has]] - te[late[has]])
        )
    edge_df = _edge_frame(edges)
    not_late = (edge_df["kind"] != LATE).to_numpy()
    clip = not_late & (edge_df["kind"] != TRANSFER).to_numpy()  # an early end's is negative
    edge_df.loc[clip, "w_ns"] = edge_df.loc[clip, "w_ns"].clip(lower=0)
    edge_df["input_ns"] = edge_df["input_ns"].clip(lower=0)
    edge_df = edge_df.astype({k: v for k, v in EDGE_COLUMNS.items() if v != "str"})
    try:
        levels = _levels(len(nodes), edge_df)
    except ValueError:  # a late resume closed a cycle (P2P orders differ): go without them
        edge_df = edge_df[not_late].reset_index(drop=True)
        levels = _levels(len(nodes), edge_df)
    return Model(nodes=nodes[list(NODE_COLUMNS)], edges=edge_df, levels=levels)


def _edges(src: Any, dst: Any, kind: str, rank: Any, w: Any, inp: Any = 0) -> dict[str, Any]:
    """One run of edges of one ``kind`` (the columns of :data:`EDGE_COLUMNS`; ``kind`` once)."""
    src = np.asarray(src, np.int64)
    n = len(src)
    return {
        "src": src,
        "dst": np.asarray(dst, np.int64),
        "kind": kind,
        "rank": np.broadcast_to(np.asarray(rank, np.int64), (n,)).copy(),
        "w_ns": np.broadcast_to(np.asarray(w, np.int64), (n,)).copy(),
        "input_ns": np.broadcast_to(np.asarray(inp, np.int64), (n,)).copy(),
    }


def _edge_frame(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """The runs of :func:`_edges` as one frame, in order: ``pd.concat`` of a frame per run (its
    kind repeated), built once (three frames per rank were a tenth of the graph at 256 ranks)."""
    sizes = [len(r["src"]) for r in runs]
    if not sum(sizes):
        return pd.concat([pd.DataFrame(r) for r in runs], ignore_index=True)
    kinds = np.repeat(np.array([r["kind"] for r in runs], dtype=object), sizes)
    return pd.DataFrame(
        {
            c: kinds if c == "kind" else np.concatenate([r[c] for r in runs])
            for c in ("src", "dst", "kind", "rank", "w_ns", "input_ns")
        }
    )


#: A rank's clock table as arrays sorted by time: (time_ns, exposed_ns, input_ns); None: none.
ClockArrays = tuple[np.ndarray, np.ndarray, np.ndarray] | None


def _clock_arrays(clock: pd.DataFrame | None) -> ClockArrays:
    """A rank's :func:`rank_clock` table sorted by time, as arrays (read twice per rank by
    :func:`build`: sorted once). A table already in strictly increasing time order, as
    :func:`rank_clock` writes it, is its own sorted order; any other is sorted as
    ``sort_values("time_ns")`` sorts it."""
    if clock is None or len(clock) == 0:
        return None
    ct = clock["time_ns"].to_numpy(np.int64)
    if not (ct[1:] > ct[:-1]).all():
        clock = clock.sort_values("time_ns")
        ct = clock["time_ns"].to_numpy(np.int64)
    return ct, clock["exposed_ns"].to_numpy(np.int64), clock["input_ns"].to_numpy(np.int64)


def _cumulative(clock: ClockArrays, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, input) cumulative measures of a rank's clock (:func:`_clock_arrays`) at times
    ``t``."""
    if clock is None:
        z = np.zeros(len(t), np.int64)
        return z, z
    ct, exposed, stall = clock
    idx = np.clip(np.searchsorted(ct, t), 0, len(ct) - 1)
    if not np.array_equal(ct[idx], t):
        raise ValueError("rank_clock table does not cover every point of the rank")
    return exposed[idx], stall[idx]


def _levels(n_nodes: int, edges: pd.DataFrame) -> list[np.ndarray]:
    """Edges grouped by their destination's depth (Kahn's algorithm); raises on a cycle."""
    src = edges["src"].to_numpy(np.int64)
    dst = edges["dst"].to_numpy(np.int64)
    indeg = np.bincount(dst, minlength=n_nodes)
    order = np.argsort(src, kind="stable")
    starts = np.searchsorted(src[order], np.arange(n_nodes + 1))
    depth = np.zeros(n_nodes, np.int64)
    frontier = np.flatnonzero(indeg == 0)
    seen = len(frontier)
    remaining = indeg.copy()
    while len(frontier):
        # the out-edges of every frontier node: one gather over their ranges in ``order``
        lo, count = starts[frontier], starts[frontier + 1] - starts[frontier]
        first = np.repeat(lo - (np.cumsum(count) - count), count)
        out = order[np.arange(int(count.sum())) + first]
        if len(out) == 0:
            break
        d = dst[out]
        np.maximum.at(depth, d, depth[src[out]] + 1)
        np.subtract.at(remaining, d, 1)
        nxt = np.unique(d[remaining[d] == 0])
        seen += len(nxt)
        frontier = nxt
    if seen != n_nodes:
        raise ValueError("the replay graph has a cycle")
    edge_depth = depth[dst]
    by = np.argsort(edge_depth, kind="stable")
    cuts = np.flatnonzero(np.diff(edge_depth[by])) + 1
    return [a for a in np.split(by, cuts) if len(a)]
