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
  (:mod:`rankscope.analysis.compute.collectives`' definition), kept as measured.
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

Where it lives: the graph (nodes, edges, per-rank clocks, :func:`build`) in
:mod:`rankscope.analysis.compute.whatif_graph`; the scenarios' weightings, names and table columns in
:mod:`rankscope.analysis.compute.whatif_scenarios`; the replay, the step times and the what-if table in
:mod:`rankscope.analysis.compute.whatif_replay`; here the entry points (:func:`what_if`,
:func:`model_of_store`). Every name stays importable from here (``whatif.NAME``); the analysis
modules that this module's :func:`what_if` imports (the pipeline, the root-cause analysis) import
from those three instead, so that there is no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.analysis.compute.whatif_graph import ARRIVAL as ARRIVAL
from rankscope.analysis.compute.whatif_graph import ARRIVE as ARRIVE
from rankscope.analysis.compute.whatif_graph import CLOCK_COLUMNS as CLOCK_COLUMNS
from rankscope.analysis.compute.whatif_graph import EARLY as EARLY
from rankscope.analysis.compute.whatif_graph import EDGE_COLUMNS as EDGE_COLUMNS
from rankscope.analysis.compute.whatif_graph import END as END
from rankscope.analysis.compute.whatif_graph import LAST_ARRIVAL as LAST_ARRIVAL
from rankscope.analysis.compute.whatif_graph import LATE as LATE
from rankscope.analysis.compute.whatif_graph import NODE_COLUMNS as NODE_COLUMNS
from rankscope.analysis.compute.whatif_graph import OWN_EDGES as OWN_EDGES
from rankscope.analysis.compute.whatif_graph import RESUME as RESUME
from rankscope.analysis.compute.whatif_graph import START as START
from rankscope.analysis.compute.whatif_graph import STEP_END as STEP_END
from rankscope.analysis.compute.whatif_graph import TRANSFER as TRANSFER
from rankscope.analysis.compute.whatif_graph import WORK as WORK
from rankscope.analysis.compute.whatif_graph import Model as Model
from rankscope.analysis.compute.whatif_graph import _cumulative as _cumulative
from rankscope.analysis.compute.whatif_graph import _edges as _edges
from rankscope.analysis.compute.whatif_graph import _levels as _levels
from rankscope.analysis.compute.whatif_graph import build as build
from rankscope.analysis.compute.whatif_graph import own_points as own_points
from rankscope.analysis.compute.whatif_graph import rank_clock as rank_clock
from rankscope.analysis.compute.whatif_replay import FIDELITY_COLUMNS as FIDELITY_COLUMNS
from rankscope.analysis.compute.whatif_replay import STEP_COLUMNS as STEP_COLUMNS
from rankscope.analysis.compute.whatif_replay import STEP_STATISTIC as STEP_STATISTIC
from rankscope.analysis.compute.whatif_replay import _stat as _stat
from rankscope.analysis.compute.whatif_replay import fidelity as fidelity
from rankscope.analysis.compute.whatif_replay import replay as replay
from rankscope.analysis.compute.whatif_replay import scenarios as scenarios
from rankscope.analysis.compute.whatif_replay import step_times as step_times
from rankscope.analysis.compute.whatif_scenarios import ALL_LIKE_MEDIAN as ALL_LIKE_MEDIAN
from rankscope.analysis.compute.whatif_scenarios import (
    BOTTLENECK_LIKE_MEDIAN as BOTTLENECK_LIKE_MEDIAN,
)
from rankscope.analysis.compute.whatif_scenarios import COMM_OVERLAPPED as COMM_OVERLAPPED
from rankscope.analysis.compute.whatif_scenarios import NO_DATA_IMBALANCE as NO_DATA_IMBALANCE
from rankscope.analysis.compute.whatif_scenarios import NO_INPUT_STALL as NO_INPUT_STALL
from rankscope.analysis.compute.whatif_scenarios import PEER_LIKE as PEER_LIKE
from rankscope.analysis.compute.whatif_scenarios import RANK_SCENARIOS as RANK_SCENARIOS
from rankscope.analysis.compute.whatif_scenarios import SCENARIO_COLUMNS as SCENARIO_COLUMNS
from rankscope.analysis.compute.whatif_scenarios import SCENARIO_KEYS as SCENARIO_KEYS
from rankscope.analysis.compute.whatif_scenarios import (
    SLOW_LINKS_LIKE_OTHERS as SLOW_LINKS_LIKE_OTHERS,
)
from rankscope.analysis.compute.whatif_scenarios import STAGE_LIKE_OTHERS as STAGE_LIKE_OTHERS
from rankscope.analysis.compute.whatif_scenarios import STAGES_BALANCED as STAGES_BALANCED
from rankscope.analysis.compute.whatif_scenarios import (
    STRAGGLER_LIKE_MEDIAN as STRAGGLER_LIKE_MEDIAN,
)
from rankscope.analysis.compute.whatif_scenarios import Scenario as Scenario
from rankscope.analysis.compute.whatif_scenarios import _fix as _fix
from rankscope.analysis.compute.whatif_scenarios import like_median as like_median
from rankscope.analysis.compute.whatif_scenarios import overlapped as overlapped
from rankscope.analysis.compute.whatif_scenarios import pd_index as pd_index
from rankscope.analysis.compute.whatif_scenarios import scale_events as scale_events
from rankscope.analysis.compute.whatif_scenarios import typical_work as typical_work
from rankscope.analysis.compute.whatif_scenarios import without_input as without_input

if TYPE_CHECKING:
    import pandas as pd


# -- from a store ----------------------------------------------------------------------------


def model_of_store(store: Any) -> Model:
    """:func:`build` from an open :class:`rankscope.analysis.store.reader.Store` (reads every rank's
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
    :class:`~rankscope.analysis.engine.driver.Analysis` (its stragglers and bottlenecks are used), a
    :class:`~rankscope.analysis.store.reader.Store`, a ``trace.h5`` or a run directory (then without
    ``stragglers`` / ``bottlenecks`` the store is analysed to name them). ``custom``: scenarios,
    or a function of the model that makes them (e.g. with :func:`scale_events`)."""
    from rankscope.analysis.engine.driver import Analysis
    from rankscope.analysis.store.reader import Store, open_store

    analysis = source if isinstance(source, Analysis) else None
    if analysis is None and (stragglers is None or bottlenecks is None):
        from rankscope.analysis.engine.driver import analysis_of

        analysis = analysis_of(source)
    if stragglers is None:
        stragglers = analysis.straggler_ranks() if analysis is not None else []
    if bottlenecks is None:
        bottlenecks = analysis.bottleneck_ranks() if analysis is not None else []
    if isinstance(source, Store):
        model = model_of_store(source)
    else:
        path = analysis.path if analysis is not None else Path(source)
        with open_store(path) as store:
            model = model_of_store(store)
    extra = custom(model) if callable(custom) else custom
    return scenarios(
        model, list(stragglers), [b for b in bottlenecks if b not in stragglers], extra
    )
