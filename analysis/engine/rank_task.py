"""The analysis' per-rank half: :func:`rank_task` measures ONE rank's events and returns a
:class:`RankResult` (small tables), wherever the scheduler runs it.

The task opens the HDF5 store itself (h5py handles do not pickle; it gets the *path*) and reads
one rank, so the whole store is never in one process' memory; ``pipeline.analyze`` fans it out
and joins the results. The result is a typed dataclass, not a dict read back by string keys:
a field renamed here is a type error there.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.engine.overview import Grid, RankCells


@dataclasses.dataclass
class RankResult:
    """What one rank's task returns (every time in ns; frames per their modules' contracts)."""

    rank: int
    """The rank."""
    host: str
    """Its host, as its meta.json says."""
    breakdown: pd.DataFrame
    """Per step and the whole run: breakdown.BREAKDOWN_COLUMNS."""
    points: pd.DataFrame
    """What it did before each collective: arrivals.POINT_COLUMNS."""
    op_stats: pd.DataFrame
    """Per op: ops.OP_STAT_COLUMNS."""
    annotations: pd.DataFrame
    """Per record_function range: ops.OP_STAT_COLUMNS."""
    memory: dict[str, Any] | None
    """memory.rank_memory's small frames; None without memory events."""
    op_table: pd.DataFrame
    """The key_averages-grade table: ops.OP_TABLE_COLUMNS."""
    attention: pd.DataFrame
    """Its SDPA calls: attention.ATTENTION_CALL_COLUMNS."""
    gc: pd.DataFrame
    """Python GC pauses per step: gc_pauses.GC_COLUMNS."""
    hta: pd.DataFrame | None = None
    """HTA's temporal breakdown (GPU ranks); None on CPU ranks."""
    idle_time: pd.DataFrame | None = None
    """HTA's idle-time breakdown per stream (kernel_launches.IDLE_COLUMNS); None on CPU ranks."""
    launches: pd.DataFrame | None = None
    """HTA's launch statistics, one row per launch (kernel_launches.LAUNCH_COLUMNS)."""
    launch_summary: pd.DataFrame | None = None
    """Its launches summed (kernel_launches.LAUNCH_SUMMARY_COLUMNS)."""
    queue: pd.DataFrame | None = None
    """Queue length of each CUDA stream over time (kernel_launches.QUEUE_COLUMNS)."""
    sequences: pd.DataFrame | None = None
    """Frequent kernel sequences (kernel_sequences.SEQUENCE_COLUMNS)."""
    host_wait: pd.DataFrame | None = None
    """The whole GPU idle waiting for the host in its profiled steps (host_feed.HOST_WAIT_COLUMNS)."""
    blocking_copies: pd.DataFrame | None = None
    """Its pinned host-to-device copies the host waited for (host_feed.BLOCKING_COPY_COLUMNS)."""
    whatif_clock: pd.DataFrame | None = None
    """Its cumulative measures at its own points, for the what-if (whatif_graph.CLOCK_COLUMNS);
    None when not measured."""
    overview: RankCells | None = None
    """Its overview bins (overview.RankCells); None without profiled steps."""
    unmatched_comm: pd.DataFrame | None = None
    """Its communication kernels in no collective: unmatched_comm.UNMATCHED_COLUMNS."""


def rank_task(
    path: str,
    rank: int,
    coll_rows: pd.DataFrame,
    grid_phase_ns: int,
    drop_last_step: bool | None,
    whatif_times: np.ndarray | None = None,
    grid: Grid | None = None,
) -> RankResult:
    """Everything computed from ONE rank's events; opens the store itself (runs on a worker).
    The analyses share their common views of the events (``compute/rank_views.py``).

    ``whatif_times``: the rank's own points (whatif_graph.own_points), measured for the what-if
    replay with the painter built here (whatif_graph.rank_clock); None: not measured.
    ``grid``: the overview's bins (overview.Grid); None: no overview."""
    from rankscope.analysis.compute.rank_views import shared_views

    with shared_views():
        return _rank_task(path, rank, coll_rows, grid_phase_ns, drop_last_step, whatif_times, grid)


def _rank_task(
    path: str,
    rank: int,
    coll_rows: pd.DataFrame,
    grid_phase_ns: int,
    drop_last_step: bool | None,
    whatif_times: np.ndarray | None,
    grid: Grid | None,
) -> RankResult:
    """:func:`rank_task` proper."""
    from rankscope.analysis.compute import breakdown as bd
    from rankscope.analysis.compute.arrivals import arrival_points
    from rankscope.analysis.compute.attention import attention_calls
    from rankscope.analysis.compute.gc_pauses import gc_per_step
    from rankscope.analysis.compute.memory import rank_memory
    from rankscope.analysis.compute.ops import annotation_stats, op_stats, op_table
    from rankscope.analysis.compute.unmatched_comm import unmatched_comm
    from rankscope.analysis.compute.whatif_graph import rank_clock
    from rankscope.analysis.engine.overview import rank_cells
    from rankscope.analysis.store.reader import open_store
    from rankscope.analysis.store.schema import EVENT_COLUMNS, EventKind

    with open_store(path) as store:
        shapes = store.has_shapes(rank)
        events = store.events(
            rank, columns=[*EVENT_COLUMNS, "shapes", "dtypes"] if shapes else None
        )
        lanes = store.lanes(rank)
        host = str(store.rank_attr(rank, "host", ""))
        memory = rank_memory(store, rank)
    device, sets = bd.rank_sets(events, lanes)
    measure = bd.measurer(device, sets)
    steps = bd.step_windows(events, lanes, device)
    profiled = steps[steps["step"] >= 0] if (steps["step"] >= 0).any() else steps
    out = RankResult(
        rank=int(rank),
        host=host,
        breakdown=bd.measure_windows(measure, device, steps, rank),
        points=arrival_points(coll_rows, measure, steps, rank),
        op_stats=op_stats(events, rank, spans=profiled),
        annotations=annotation_stats(events, rank, spans=profiled),
        memory=memory,
        op_table=op_table(events, rank, lanes=lanes, group_by_shape=shapes),
        attention=attention_calls(events, rank, lanes),
        gc=gc_per_step(events, rank),
        unmatched_comm=unmatched_comm(events, coll_rows, rank),
    )
    if grid is not None:
        out.overview = rank_cells(events, lanes, coll_rows, grid, rank, (device, sets), steps)
    if whatif_times is not None and len(whatif_times):
        out.whatif_clock = rank_clock(events, lanes, whatif_times, (device, measure))
    if device is bd.Device.GPU:
        if drop_last_step is None:
            is_step = events["kind"].to_numpy() == int(EventKind.PROFILER_STEP)
            drop_last_step = len(np.unique(events["step"].to_numpy()[is_step])) >= 2
        out.hta = bd.hta_temporal_breakdown(
            events, lanes, rank=rank, grid_phase_ns=grid_phase_ns, drop_last_step=drop_last_step
        )
        _hta_analyses(out, events, lanes, grid_phase_ns, drop_last_step)
        from rankscope.analysis.compute import host_feed

        out.host_wait = host_feed.host_wait(events, lanes, rank=rank, windows=steps, sets=sets)
        out.blocking_copies = host_feed.blocking_copies(events, lanes, rank=rank)
    return out


def _hta_analyses(
    out: RankResult,
    events: pd.DataFrame,
    lanes: pd.DataFrame,
    grid_phase_ns: int,
    drop_last_step: bool,
) -> None:
    """HTA's idle time, launch statistics, queue length and kernel sequences of a GPU rank."""
    from rankscope.analysis.compute import kernel_launches as kl
    from rankscope.analysis.compute.kernel_sequences import kernel_sequences

    kw: dict[str, Any] = {
        "rank": out.rank,
        "grid_phase_ns": grid_phase_ns,
        "drop_last_step": drop_last_step,
    }
    out.idle_time = kl.idle_time(events, lanes, **kw)
    out.launches = kl.launches(events, lanes, **kw)
    out.launch_summary = kl.launch_summary(out.launches, out.rank)
    out.queue = kl.queue_length(events, lanes, **kw)
    out.sequences = kernel_sequences(events, lanes, **kw)
