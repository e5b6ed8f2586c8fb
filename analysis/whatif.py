"""What if: replay a job's steps with its slow parts made normal, and say what that buys.

The replay model (docs/analysis.md, "What if") is a dependency graph rebuilt from the store's
tables; every time is int64 ns on the aligned clock.

**Nodes.** Per rank, its *own* points in program order: each profiled step's start and end
(``Store.steps()``) and its arrival at each collective / P2P op (``Store.collectives()``
``start``); per collective, the last arrival; per (collective, rank), its end.

**Edges** (``EDGE_COLUMNS``; a node's replayed time is the latest over its incoming edges of
source time + weight; a node without incoming edges keeps its measured time):

* *work* — from a rank's previous own point ``p`` to its next own point ``x``: the rank's own
  work between them, ``(x − p) − exposed communication in [p, x]`` (the breakdown painter's
  ``comm_exposed_ns``: a collective in flight and nothing else running — on a GPU rank the NCCL
  stream alone, on a CPU rank the main thread blocked in or on a collective).
* *resume* — from each end ``e`` of one of the rank's earlier ops with ``p < e ≤ x`` to ``x``:
  the own work after it, ``(x − e) − exposed communication in [e, x]``. With the *work* edge
  this says: the rank reaches ``x`` when it has done its own work since ``p`` *and* since the
  collective it was (or may have been) blocked on ended — an NCCL kernel queued behind the
  previous one on its stream, a main thread waiting in ``recv`` or in the DDP reducer.
* *arrive* — each rank's arrival to the collective's last arrival (weight 0): collectives are
  barriers; a P2P pair is a collective of two, so a recv cannot end before its send started.
* *transfer* — the last arrival to each rank's end: ``end − last arrival``, the transfer
  (:mod:`rankscope.analysis.collectives`' definition), kept as measured.
* *early* — a rank whose op ended ``lag`` before the last arrival either was not held by it (a
  small NCCL send that returns once its data is handed over: its duration is its own) or the
  last arrival's recorded start trails the real one (a gloo op's on a loaded CPU, clock error:
  a gloo send waits for its recv to be posted, a recv for its send): its end follows its own
  arrival by ``min(duration, lag)`` and the last arrival by ``−lag`` (a transfer edge, the one
  negative kind besides late resumes), exact on the measured run either way.

Step ``s`` lasts ``max over ranks of its end − min over ranks of its start`` (the step ends when
the last rank finishes it). The first step of each run of consecutive profiled steps keeps its
measured start (time between profiler windows was not recorded); later steps follow from the
previous step's end. Replaying the unmodified weights gives the measured times back wherever
the last candidate edge into every own point carries no exposed communication; where it does
(exposed communication that ended because the rank went on, not because a collective it was
blocked on ended — Python gaps while a gloo bucket is in flight), the replay is early by it.
:func:`fidelity` reports the error per step.

**Scenarios** change weights, never the graph (:func:`scenarios`): a rank *like the median rank*
(each own work edge scaled down to the median over ranks of the same point — same step,
position in the step and op — i.e. its excess removed, never made slower); *all ranks* like
the median; *communication fully overlapped* (every transfer and early end 0: the barriers
stay, so waiting for a late rank is not removed); *no input stall* (the time the step waited
for the DataLoader — CPU: the main thread in ``enumerate(DataLoader)#…``; GPU: the device idle
while the host is there — taken out of every work edge); and user-given ones
(:class:`Scenario`, e.g. :func:`scale_events`: one op's kernels ×0.5 on one rank).

Assumptions, and where they are wrong: collectives are barriers with a fixed transfer (a
straggler that also slows the link, or congestion that depends on who sends together, is not
modelled); a rank's own work is its own (contention between ranks on one CPU or node moves with
the fix and is not modelled); the dependency structure of the measured run is kept (an op that
only *happened* to follow a collective end is treated as blocked on it: a fix can then look a
little better than it is); steps are replayed one after the other, with no cross-step effects
other than the chain of step ends.

Why one module of ~750 lines: the dependency graph of one job, its replay and the scenarios that
reweight it are one model, read together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

#: Statistic over profiled steps in every what-if figure. The mean, not the median: an
#: intermittent straggler (slow in 30 % of the steps) leaves the median step untouched, yet
#: fixing it saves 30 % of its delay per step on average — the time the job would save.
STEP_STATISTIC = "mean"

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

#: Columns of :func:`scenarios` (ns; statistic over profiled steps: ``STEP_STATISTIC``).
SCENARIO_COLUMNS: dict[str, str] = {
    "scenario": "str",
    "rank": "int32",  # the rank the scenario fixes, -1 for job-wide ones
    "measured_step_ns": "float64",  # measured step time
    "replayed_step_ns": "float64",  # replay of the unmodified job (== measured when exact)
    "predicted_step_ns": "float64",  # replay with the scenario's weights
    "saving_ns": "float64",  # replayed - predicted
    "saving_pct": "float64",  # saving / replayed * 100
    "replay_error_pct": "float64",  # largest |error| of the unmodified replay over the steps
}

#: Scenario names (``SCENARIO_COLUMNS`` ``scenario``).
STRAGGLER_LIKE_MEDIAN = "straggler like the median rank"
BOTTLENECK_LIKE_MEDIAN = "bottleneck like the median rank"
ALL_LIKE_MEDIAN = "all ranks like the median rank"
COMM_OVERLAPPED = "communication fully overlapped"
NO_INPUT_STALL = "no input stall"
#: Layered jobs (:mod:`rankscope.analysis.rootcause`): a slow worker like the other ranks of
#: its stage; the imbalanced stage's own work scaled to the other stages'; every stage's to the
#: mean stage's (total conserved); every own-work edge at its peers' median (no data imbalance).
PEER_LIKE = "straggler like its peers"
STAGE_LIKE_OTHERS = "imbalanced stage like the other stages"
STAGES_BALANCED = "stages balanced"
NO_DATA_IMBALANCE = "no data imbalance"
#: The transfers crossing a slow host pair (:mod:`rankscope.analysis.links`) at the median of
#: the same transfers elsewhere.
SLOW_LINKS_LIKE_OTHERS = "slow links like the other links"
#: A stable key per built-in scenario (summary.json ``what_if.scenarios[].kind``): readers select
#: on these, never on the names, whose wording may improve; user scenarios have ``custom``.
SCENARIO_KEYS: dict[str, str] = {
    STRAGGLER_LIKE_MEDIAN: "straggler_like_median",
    BOTTLENECK_LIKE_MEDIAN: "bottleneck_like_median",
    ALL_LIKE_MEDIAN: "all_like_median",
    COMM_OVERLAPPED: "communication_overlapped",
    NO_INPUT_STALL: "no_input_stall",
    PEER_LIKE: "straggler_like_peers",
    STAGE_LIKE_OTHERS: "stage_like_others",
    STAGES_BALANCED: "stages_balanced",
    NO_DATA_IMBALANCE: "no_data_imbalance",
    SLOW_LINKS_LIKE_OTHERS: "slow_links_like_others",
}
#: The scenarios that fix one named rank (``rank`` >= 0).
RANK_SCENARIOS = (STRAGGLER_LIKE_MEDIAN, BOTTLENECK_LIKE_MEDIAN, PEER_LIKE)


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
        the START and STEP_END nodes by step, found once per model (:func:`step_times` runs
        once per replay, dozens of times per analysis; the node kinds are text)."""
        import numpy as np

        if self._step_points is None:
            kind = self.nodes["kind"].to_numpy(object)
            step = self.nodes["step"].to_numpy(np.int64)
            s_rows, e_rows = np.flatnonzero(kind == START), np.flatnonzero(kind == STEP_END)
            steps = np.unique(step[np.concatenate([s_rows, e_rows])])
            s_pos = np.searchsorted(steps, step[s_rows])
            e_pos = np.searchsorted(steps, step[e_rows])
            self._step_points = (steps, s_rows, s_pos, e_rows, e_pos)
        return self._step_points


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A named change of the replay's weights: ``weights(model) -> new w_ns per edge``."""

    name: str
    weights: Callable[[Model], np.ndarray]
    rank: int = -1


# -- per rank: the measures the own-work edges need --------------------------------------------


def rank_clock(
    events: pd.DataFrame, lanes: pd.DataFrame, times: np.ndarray, painted: Any = None
) -> pd.DataFrame:
    """Cumulative exposed communication and input stall of one rank at ``times`` (CLOCK_COLUMNS).

    Measured by the breakdown's painter (:func:`rankscope.analysis.breakdown.painter`), from
    the earliest of ``times``: a difference of two rows is the measure between them. Runs per
    rank (it reads that rank's events); the pipeline's rank task calls it with the painter it
    already built (``painted``: ``(device, measure)``), so the interval sets are built once.
    """
    import numpy as np
    import pandas as pd
    from rankscope.analysis import breakdown as bd

    times = np.asarray(times, np.int64)
    if len(times) == 0 or len(events) == 0:
        z = np.zeros(len(times), np.int64)
        return pd.DataFrame({"time_ns": times, "exposed_ns": z, "input_ns": z})
    device, measure = painted if painted is not None else bd.painter(events, lanes)
    lo = np.full(len(times), int(times.min()), np.int64)
    got = measure(lo, times)
    zeros = np.zeros(len(times), np.int64)
    stall = got.get("idle_input_ns" if device is bd.Device.GPU else "input_ns", zeros)
    return pd.DataFrame(
        {
            "time_ns": times,
            "exposed_ns": np.asarray(got.get("comm_exposed_ns", zeros), np.int64),
            "input_ns": np.asarray(stall, np.int64),
        }
    ).astype(CLOCK_COLUMNS)


def own_points(steps: pd.DataFrame, collectives: pd.DataFrame) -> pd.DataFrame:
    """Every time at which a rank's measures are needed: ``rank``, ``time_ns`` (sorted, unique)."""
    import pandas as pd

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
    import numpy as np
    import pandas as pd

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
    # the step holding each arrival (the rank's step window around it), else -1
    for rank, idx in own.groupby("rank").groups.items():
        mine = st[st["rank"] == rank].sort_values("start")
        sub = own.loc[idx]
        arr = (sub["kind"] == ARRIVAL).to_numpy()
        t = sub["time_ns"].to_numpy(np.int64)
        k = np.searchsorted(mine["start"].to_numpy(np.int64), t, side="right") - 1
        ok = (k >= 0) & (t <= mine["end"].to_numpy(np.int64)[np.maximum(k, 0)])
        step = np.where(ok, mine["step"].to_numpy(np.int64)[np.maximum(k, 0)], -1)
        own.loc[np.asarray(idx)[arr], "step"] = step[arr]
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

    edges: list[pd.DataFrame] = []
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
    # early: from its arrival min(duration, lag), from the last arrival -lag (module docstring)
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
        clock = clocks.get(int(rank))
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
        for k, j in zip(blocked, first, strict=True):
            cand = np.flatnonzero(arr_pos_all[j:] < x[k])
            if len(cand):
                late[k] = j + cand[0]
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
    edge_df = pd.concat(edges, ignore_index=True)
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


def _edges(src: Any, dst: Any, kind: str, rank: Any, w: Any, inp: Any = 0) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    src = np.asarray(src, np.int64)
    n = len(src)
    return pd.DataFrame(
        {
            "src": src,
            "dst": np.asarray(dst, np.int64),
            "kind": kind,
            "rank": np.broadcast_to(np.asarray(rank, np.int64), (n,)).copy(),
            "w_ns": np.broadcast_to(np.asarray(w, np.int64), (n,)).copy(),
            "input_ns": np.broadcast_to(np.asarray(inp, np.int64), (n,)).copy(),
        }
    )


def _cumulative(clock: pd.DataFrame | None, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, input) cumulative measures of a rank's clock table at times ``t``."""
    import numpy as np

    if clock is None or len(clock) == 0:
        z = np.zeros(len(t), np.int64)
        return z, z
    c = clock.sort_values("time_ns")
    ct = c["time_ns"].to_numpy(np.int64)
    idx = np.clip(np.searchsorted(ct, t), 0, len(ct) - 1)
    if not np.array_equal(ct[idx], t):
        raise ValueError("rank_clock table does not cover every point of the rank")
    return c["exposed_ns"].to_numpy(np.int64)[idx], c["input_ns"].to_numpy(np.int64)[idx]


def _levels(n_nodes: int, edges: pd.DataFrame) -> list[np.ndarray]:
    """Edges grouped by their destination's depth (Kahn's algorithm); raises on a cycle."""
    import numpy as np

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


# -- replay ----------------------------------------------------------------------------------


def replay(model: Model, weights: np.ndarray | None = None) -> np.ndarray:
    """Replayed time (ns) of every node: the latest over its incoming edges of source + weight;
    nodes without incoming edges keep their measured time."""
    import numpy as np

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
    import numpy as np
    import pandas as pd

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


# -- scenarios -------------------------------------------------------------------------------


def typical_work(model: Model, exclude: Iterable[int] = ()) -> np.ndarray:
    """Per edge: the median over ranks of the WORK edge into the same point (same step, position
    in the step and op) — the median rank's own work there; -1 where not an own edge.

    ``exclude``: ranks left out of the median (the ones being fixed: a straggler's target is the
    typical *other* rank — with 2 ranks, a median that includes the straggler is halfway to it
    and would predict half the saving); all ranks count where no other rank has that point.
    """
    import numpy as np

    e, n = model.edges, model.nodes
    work = e[e["kind"] == WORK]
    key_cols = ["step", "pos", "op"]
    keyed = n.loc[work["dst"].to_numpy(), key_cols].reset_index(drop=True)
    keyed["w"] = work["w_ns"].to_numpy()
    med = keyed.groupby(key_cols, sort=False)["w"].median()
    left_out = set(exclude)
    if left_out:
        others = ~work["rank"].isin(left_out).to_numpy()
        med_others = keyed[others].groupby(key_cols, sort=False)["w"].median()
        med = med_others.combine_first(med)
    out = np.full(len(e), -1.0)
    own = model.own_mask()
    dst_keys = n.loc[e["dst"].to_numpy()[own], key_cols]
    out[own] = med.reindex(pd_index(dst_keys)).to_numpy(float)
    return out


def pd_index(frame: pd.DataFrame) -> Any:
    import pandas as pd

    return pd.MultiIndex.from_frame(frame)


def like_median(model: Model, ranks: Iterable[int] | None = None) -> np.ndarray:
    """Weights with the own work of ``ranks`` (None: every rank) brought down to the median
    rank's at each point (the median of the other ranks when ``ranks`` are named): each WORK edge becomes ``min(w, median)`` — its excess removed, never
    made slower — and the RESUME edges into the same point lose the same excess (the own work
    after the end they start from is what remained of the WORK edge's: the rank's own time
    before that end is unchanged, so the excess is taken from what comes after it)."""
    import numpy as np

    ranks = None if ranks is None else list(ranks)
    e = model.edges
    w = e["w_ns"].to_numpy(np.int64)
    typical = typical_work(model, () if ranks is None else ranks)
    kind = e["kind"].to_numpy()
    chosen = model.own_mask()
    if ranks is not None:
        chosen &= e["rank"].isin(list(ranks)).to_numpy()
    dst = e["dst"].to_numpy(np.int64)
    excess = np.zeros(len(model.nodes), np.int64)
    is_work = chosen & (kind == WORK) & (typical >= 0)
    excess[dst[is_work]] = np.maximum(w[is_work] - np.round(typical[is_work]).astype(np.int64), 0)
    return np.where(chosen, np.maximum(w - excess[dst], 0), w)


def overlapped(model: Model) -> np.ndarray:
    """Weights with every transfer (and early end) 0: communication hidden under compute; the
    barrier (waiting for the last rank) stays."""
    import numpy as np

    kind = model.edges["kind"].to_numpy()
    w = model.edges["w_ns"].to_numpy(np.int64).copy()
    comm = (kind == TRANSFER) | (kind == EARLY)
    w[comm] = np.minimum(w[comm], 0)
    return w


def without_input(model: Model) -> np.ndarray:
    """Weights with the input stall taken out of every own edge."""
    import numpy as np

    e = model.edges
    w = e["w_ns"].to_numpy(np.int64)
    own = model.own_mask()
    return np.where(own, np.maximum(w - e["input_ns"].to_numpy(np.int64), 0), w)


def scale_events(
    model: Model, events: pd.DataFrame, rank: int, mask: np.ndarray, factor: float, name: str = ""
) -> Scenario:
    """A user scenario: the events of ``rank`` selected by ``mask`` (e.g. one op's kernels) take
    ``factor`` times as long. Each own edge of the rank loses ``(1 − factor) ×`` the time those
    events cover inside its span (the union; assumed to be on the rank's path between the two
    points, as kernels on one stream or ops on the main thread are)."""
    import numpy as np
    from rankscope.analysis.breakdown import interval_union, measure_below

    ts = events["ts"].to_numpy(np.int64)[mask]
    starts, ends = interval_union(ts, ts + events["dur"].to_numpy(np.int64)[mask])
    t = model.nodes["time_ns"].to_numpy(np.int64)

    def weights(m: Model) -> np.ndarray:
        e = m.edges
        w = e["w_ns"].to_numpy(np.int64)
        sel = m.own_mask() & (e["rank"].to_numpy() == rank)
        src, dst = e["src"].to_numpy(np.int64)[sel], e["dst"].to_numpy(np.int64)[sel]
        covered = measure_below(starts, ends, t[dst]) - measure_below(starts, ends, t[src])
        out = w.copy()
        out[sel] = np.maximum(w[sel] - np.round((1.0 - factor) * covered).astype(np.int64), 0)
        return out

    return Scenario(name or f"rank {rank}: selected events x{factor:g}", weights, rank)


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
    import numpy as np
    import pandas as pd

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


def _fix(rank: int) -> Callable[[Model], np.ndarray]:
    return lambda m: like_median(m, [rank])


# -- from a store ----------------------------------------------------------------------------


def model_of_store(store: Any) -> Model:
    """:func:`build` from an open :class:`rankscope.analysis.store.Store` (reads every rank's
    events once, for :func:`rank_clock`)."""
    steps = store.steps()
    colls = store.collectives()
    points = own_points(steps, colls)
    clocks = {}
    for rank, sub in points.groupby("rank", sort=True):
        rank = int(rank)
        if rank not in store.ranks:
            continue
        clocks[rank] = rank_clock(store.events(rank), store.lanes(rank), sub["time_ns"].to_numpy())
    return build(steps, colls, clocks)


def what_if(
    source: Any,
    stragglers: Sequence[int] | None = None,
    bottlenecks: Sequence[int] | None = None,
    custom: Sequence[Scenario] | Callable[[Model], Sequence[Scenario]] = (),
) -> pd.DataFrame:
    """The what-if table (SCENARIO_COLUMNS) of a store: ``source`` is an
    :class:`~rankscope.analysis.pipeline.Analysis` (its stragglers and bottlenecks are used), a
    :class:`~rankscope.analysis.store.Store`, a ``trace.h5`` or a run directory (then without
    ``stragglers`` / ``bottlenecks`` the store is analysed to name them). ``custom``: scenarios,
    or a function of the model that makes them (e.g. with :func:`scale_events`)."""
    from rankscope.analysis.store import open_store

    analysis = source if hasattr(source, "straggler_ranks") else None
    if analysis is None and (stragglers is None or bottlenecks is None):
        from rankscope.analysis.pipeline import analysis_of

        analysis = analysis_of(source)
    if stragglers is None:
        stragglers = analysis.straggler_ranks() if analysis is not None else []
    if bottlenecks is None:
        bottlenecks = analysis.bottleneck_ranks() if analysis is not None else []
    if hasattr(source, "collectives") and hasattr(source, "events"):
        model = model_of_store(source)
    else:
        path = analysis.path if analysis is not None else Path(source)
        with open_store(path) as store:
            model = model_of_store(store)
    extra = custom(model) if callable(custom) else custom
    return scenarios(
        model, list(stragglers), [b for b in bottlenecks if b not in stragglers], extra
    )
