"""Run every analysis on a store with Dask: one task per rank, then small cross-rank steps.

Each per-rank task (``rank_task.rank_task``, returning a typed ``RankResult``) opens the HDF5 store itself (h5py handles do not pickle;
the task gets the *path*), reads ONE rank's events, and returns small tables: the breakdown per
step, HTA's temporal numbers, what the rank did before each collective, op and range statistics.
The full store is never loaded into one pandas frame. The cross-rank steps (waits, stragglers,
verdicts, op spread) then run on the small collectives table and on those results.

Where the tasks run (:class:`ClusterSpec`, chosen and run by :mod:`rankscope.analysis.engine.scheduler`,
which the merge shares): in-process while worker processes would not pay (the default, ``"auto"``),
processes forked from this one (Linux), a ``LocalCluster`` sized to the machine, Dask's thread pool, an existing scheduler
(``scheduler="tcp://host:8786"``), or a dask-jobqueue ``SLURMCluster`` with N single-core workers.
Results are identical whatever runs them: every task is deterministic and results are assembled
in rank order. The scheduler names are re-exported here, beside :func:`analyze` that takes them.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import pandas as pd
from rankscope.analysis.compute import step_series
from rankscope.analysis.compute.step_series import RunSteps
from rankscope.analysis.engine.rank_task import RankResult as RankResult
from rankscope.analysis.engine.rank_task import rank_task as rank_task
from rankscope.analysis.engine.scheduler import ANALYSIS_RANK_S, run_each
from rankscope.analysis.engine.scheduler import AUTO as AUTO
from rankscope.analysis.engine.scheduler import LOCAL as LOCAL
from rankscope.analysis.engine.scheduler import SYNCHRONOUS as SYNCHRONOUS
from rankscope.analysis.engine.scheduler import THREADS as THREADS
from rankscope.analysis.engine.scheduler import Choice as Choice
from rankscope.analysis.engine.scheduler import ClusterSpec as ClusterSpec
from rankscope.analysis.engine.scheduler import choose as choose

if TYPE_CHECKING:
    from rankscope.analysis.compute.hta_across import HtaAnalyses
    from rankscope.analysis.compute.memory import MemoryAnalysis
    from rankscope.analysis.engine.overview import Overview
    from rankscope.analysis.store.reader import Store


@dataclasses.dataclass
class Analysis:
    """Everything the analyses found in one store (DataFrames; times in ns unless ``_s``)."""

    path: Path
    """The store that was analysed."""
    meta: dict[str, Any]
    """The store's root attributes (run id, world size, versions)."""
    world_size: int
    """World size of the job."""
    hosts: dict[int, str]
    """Host name per rank."""
    breakdown: pd.DataFrame
    """Per rank and step, plus one whole-run row per rank (step -1): breakdown.BREAKDOWN_COLUMNS."""
    hta: pd.DataFrame
    """HTA-compatible temporal breakdown and overlap per GPU rank: breakdown.HTA_COLUMNS."""
    waits: pd.DataFrame
    """Per collective and rank: collectives.WAIT_COLUMNS."""
    comm_totals: pd.DataFrame
    """Per rank: collectives.TOTAL_COLUMNS (wall-time wait/transfer within the profiled steps)."""
    windows: pd.DataFrame
    """What each rank did before each collective: arrivals.WINDOW_COLUMNS."""
    stragglers: pd.DataFrame
    """Per rank, most significant first: stragglers.STRAGGLER_COLUMNS."""
    pipeline: pd.DataFrame
    """Per rank that sends point to point: bottleneck.PIPELINE_COLUMNS (empty without pairs)."""
    verdicts: pd.DataFrame
    """Per rank: verdict.VERDICT_COLUMNS."""
    op_stats: pd.DataFrame
    """Per rank and op: ops.OP_STAT_COLUMNS."""
    ops: pd.DataFrame
    """Top ops across ranks: ops.ACROSS_COLUMNS."""
    annotations: pd.DataFrame
    """record_function ranges across ranks: ops.ACROSS_COLUMNS."""
    clock: pd.DataFrame
    """The store's clock table (schema.CLOCK_COLUMNS)."""
    problems: pd.DataFrame
    """What the merge could not ingest (schema.PROBLEM_COLUMNS)."""
    scheduler: Choice = dataclasses.field(default_factory=lambda: Choice(SYNCHRONOUS, ""))
    """Where the per-rank tasks ran, and why."""
    memory: MemoryAnalysis = dataclasses.field(default_factory=lambda: _no_memory())
    """Memory peaks, leaks, imbalance, holders, headroom (memory.MemoryAnalysis; empty frames
    without memory events)."""
    whatif: pd.DataFrame = dataclasses.field(default_factory=lambda: _no_whatif())
    """What fixing the stragglers, the bottlenecks, every rank, the communication or the input
    would save per step: whatif_scenarios.SCENARIO_COLUMNS (empty when no model could be built: one rank,
    no profiled steps, no collectives)."""
    op_table: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty_frame())
    """Per rank, op and (with record_shapes) input shapes: the ``key_averages()`` table —
    calls, self/total CPU and device time (ns): ops.OP_TABLE_COLUMNS."""
    op_table_across: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty_frame())
    """The op table across ranks (mean per rank, spread, slowest rank): ops.OP_TABLE_ACROSS_COLUMNS."""
    attention_calls: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty_frame())
    """Every scaled-dot-product-attention call and its backend: attention.ATTENTION_CALL_COLUMNS."""
    attention: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty_frame())
    """SDPA time per rank and backend: attention.ATTENTION_BACKEND_COLUMNS."""
    overview: Overview | None = None
    """Every rank's time per category in bins of one grid, for the rank × time overview
    (overview.Overview); None without profiled steps."""
    links: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty_frame())
    """Host pairs whose transfers could be compared with the same transfers elsewhere, slowest
    first: links.LINK_COLUMNS (``is_slow``: a slow link; empty when no pair could be judged)."""
    unmatched_comm: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty_frame())
    """Per rank, its communication kernels in no collective (DeepEP, NVSHMEM, custom
    all-reduce, user patterns: communication time left out of the waiting / transfer split):
    unmatched_comm.UNMATCHED_COLUMNS."""
    gc: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty_frame())
    """Python garbage collections per rank and profiled step: gc_pauses.GC_COLUMNS (empty when
    the trace has no ``Python GC`` events)."""
    rank_meta: dict[int, dict[str, Any]] | None = None
    """Each rank's store attributes (``Store.rank_meta``: host, device, meta.json, …) as the
    analysis read them, so that the report's KPIs (``kpis.rank_facts``) do not open the store
    and decode them again (~10 ms of an 8-rank report); None: not kept (read from the store)."""
    capability: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """Per GPU rank, the highest compute capability of its GPUs (the traces'
    ``deviceProperties``); absent for CPU ranks and stores merged before it was kept."""
    gpu_feed: HtaAnalyses = dataclasses.field(default_factory=lambda: _no_gpu_feed())
    """HTA's idle-time breakdown, kernel launch statistics, queue length and kernel sequences of
    every GPU rank, and which ranks differ (hta_across.HtaAnalyses; empty frames on CPU jobs)."""
    critical_path: pd.DataFrame | None = None
    """Each profiled step's critical path through the what-if graph, which spans every rank,
    summed per rank and edge kind (critical_path.CRITICAL_COLUMNS); None without a graph."""
    run_steps: RunSteps = dataclasses.field(default_factory=lambda: _no_run_steps())
    """Every step of the whole run from the ranks' step logs, the windows' places and the live
    monitor's changes (step_series.RunSteps; empty frames for runs without step logs)."""
    rootcause: Any = None
    """For a layered job (collectives of sub-groups: tensor / data / pipeline parallel), the
    slow workers, stage and data imbalances judged against each rank's peers
    (rootcause.RootCause; their verdicts replace the flat stragglers'); None for flat jobs."""

    def whole(self) -> pd.DataFrame:
        """The whole-run breakdown row of each rank."""
        from rankscope.analysis.compute.breakdown import WHOLE_RUN_STEP

        return self.breakdown[self.breakdown["step"] == WHOLE_RUN_STEP].reset_index(drop=True)

    def straggler_ranks(self) -> list[int]:
        """Ranks reported as stragglers, most significant first (a layered job's slow workers)."""
        if self.rootcause is not None:
            return list(self.rootcause.straggler_ranks())
        s = self.stragglers
        return [int(r) for r in s.loc[s["is_straggler"], "rank"]] if len(s) else []

    def flagged_ranks(self) -> list[int]:
        """Stragglers, then pipeline bottlenecks that are not also stragglers (views mark both)."""
        strag = self.straggler_ranks()
        return strag + [r for r in self.bottleneck_ranks() if r not in strag]

    def bottleneck_ranks(self) -> list[int]:
        """Pipeline stages whose own extra work the others' recv waits trace back to."""
        p = self.pipeline
        return [int(r) for r in p.loc[p["is_bottleneck"], "rank"]] if len(p) else []


def _empty_frame() -> pd.DataFrame:
    return pd.DataFrame()


def _no_memory() -> MemoryAnalysis:
    from rankscope.analysis.compute.memory import MemoryAnalysis

    return MemoryAnalysis.empty()


def _no_gpu_feed() -> HtaAnalyses:
    from rankscope.analysis.compute.hta_across import HtaAnalyses

    return HtaAnalyses()


def _no_run_steps() -> RunSteps:
    return step_series.no_steps()


def _no_whatif() -> pd.DataFrame:
    from rankscope.analysis.compute.whatif_scenarios import SCENARIO_COLUMNS

    return pd.DataFrame({c: pd.Series(dtype=d) for c, d in SCENARIO_COLUMNS.items()})


def _whatif(
    steps: pd.DataFrame,
    colls: pd.DataFrame,
    clocks: dict[int, pd.DataFrame],
    stragglers: list[int],
    bottlenecks: list[int],
) -> pd.DataFrame:
    """The what-if table of a flat job (:func:`_whatif_and_root` without a layered model)."""
    return _whatif_and_root(steps, colls, clocks, stragglers, bottlenecks)[0]


def _whatif_and_root(
    steps: pd.DataFrame,
    colls: pd.DataFrame,
    clocks: dict[int, pd.DataFrame],
    stragglers: list[int],
    bottlenecks: list[int],
    layered: Callable[[Any], Any] | None = None,
    extra: Sequence[Any] = (),
) -> tuple[pd.DataFrame, Any, pd.DataFrame | None]:
    """The what-if table (whatif_scenarios.SCENARIO_COLUMNS) from the rank tasks' clocks, and for a
    layered job ``layered(model)`` (rootcause.RootCause: its slow workers are fixed like their
    peers, its job-wide scenarios close the table); the table is empty where the replay has
    nothing to replay across ranks (one rank, no steps, no collectives) or its graph cannot be
    built (analyze never fails for it: the block is then left out). ``extra``: more scenarios
    (whatif_scenarios.Scenario: the slow links like the others), last. Third: each step's
    critical path through the graph (critical_path.CRITICAL_COLUMNS; None without a graph)."""
    import logging

    from rankscope.analysis.compute import whatif_graph, whatif_replay

    stepped = steps[steps["step"] >= 0] if len(steps) else steps
    if stepped["rank"].nunique() < 2 or not len(colls):
        return _no_whatif(), None, None
    try:
        model = whatif_graph.build(stepped, colls, clocks)
        root = layered(model) if layered is not None else None
        if root is not None:
            stragglers = []
        fixes = [r for r in bottlenecks if r not in stragglers]
        table = whatif_replay.scenarios(model, stragglers, fixes)
        if root is not None and len(root.whatif):
            mine = root.whatif
            ranked = mine[mine["rank"] >= 0]
            table = pd.concat([ranked, table, mine[mine["rank"] < 0]], ignore_index=True)
        if extra:
            last = whatif_replay.scenarios(model, custom=extra, only_custom=True)
            table = pd.concat([table, last], ignore_index=True)
        from rankscope.analysis.compute.critical_path import critical_path

        return table, root, critical_path(model, whatif_replay.replay(model))
    except (ValueError, KeyError, IndexError) as exc:  # a graph the model cannot take
        logging.getLogger(__name__).warning("what-if left out: %s", exc)
        return _no_whatif(), None, None


def analyze(
    path: str | Path,
    spec: ClusterSpec | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Analysis:
    """Run every analysis on the store at ``path`` (a ``trace.h5`` or a run directory).

    ``progress(done, total)`` is called as rank tasks finish. Without ``spec`` (or with
    ``scheduler="auto"``) the work runs in-process unless worker processes pay for their start-up
    (:func:`choose`); ``Analysis.scheduler`` says what ran. Works from a plain script, a notebook
    and the REPL alike.
    """
    from rankscope.analysis.compute import breakdown as bd
    from rankscope.analysis.compute import memory as mem
    from rankscope.analysis.compute import rootcause
    from rankscope.analysis.compute.bottleneck import pipeline_stages
    from rankscope.analysis.compute.collectives import collective_waits, wait_totals
    from rankscope.analysis.compute.ops import across_ranks
    from rankscope.analysis.compute.stragglers import (
        arrival_windows,
        find_stragglers,
        step_cpu_table,
    )
    from rankscope.analysis.compute.verdict import verdicts
    from rankscope.analysis.compute.whatif_graph import own_points
    from rankscope.analysis.engine.overview import assemble, grid_for
    from rankscope.analysis.store.frames import per_rank
    from rankscope.analysis.store.reader import open_store

    spec = spec or ClusterSpec()
    with open_store(path) as store:
        store_path = store.path
        ranks = store.ranks
        meta = store.meta
        world = store.world_size
        colls = store.collectives()
        clock = store.clock()
        steps = store.steps()
        problems = store.problems()
        rank_metas = {r: store.rank_meta(r) for r in ranks}
        run_steps = step_series.run_steps(
            store.step_log_ranks(),
            store.step_log,
            {r: m.get("windows") for r, m in rank_metas.items()},
            store.changes(),
        )
    n_events = sum(int(m.get("events", 0)) for m in rank_metas.values())
    step_cpu = step_cpu_table({r: m.get("meta") for r, m in rank_metas.items()})
    choice = choose(spec, len(ranks), n_events, ANALYSIS_RANK_S)
    if choice.scheduler != spec.scheduler:
        spec = dataclasses.replace(spec, scheduler=choice.scheduler)
    colls["last_start"] = colls.groupby("coll")["start"].transform("max")
    drop_last: bool | None = bool(steps["step"].nunique() >= 2) if len(steps) else None
    offsets = dict(zip(clock["rank"].astype(int), clock["offset_ns"].astype("int64"), strict=False))
    stepped = steps[steps["step"] >= 0] if len(steps) else steps
    grid = grid_for(stepped, len(ranks))
    points = own_points(stepped, colls) if stepped["rank"].nunique() >= 2 and len(colls) else None
    point_times = (
        {int(r): g["time_ns"].to_numpy() for r, g in points.groupby("rank", sort=False)}
        if points is not None
        else {}
    )
    coll_rows = per_rank(colls, ranks, ["coll", "start", "end", "last_start", "event"])
    calls = [
        (
            str(store_path),
            rank,
            coll_rows[rank].reset_index(drop=True),
            int(offsets.get(rank, 0)) % bd.HTA_GRID_NS,
            drop_last,
            point_times.get(int(rank)),
            grid,
        )
        for rank in ranks
    ]
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], len(calls))

    results: list[RankResult] = []
    for result in run_each(rank_task, calls, spec, len(ranks)):
        results.append(result)
        tick()
    results.sort(key=lambda r: r.rank)

    def cat(key: str) -> pd.DataFrame:
        frames = [f for r in results if (f := getattr(r, key)) is not None and len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    breakdown = cat("breakdown")
    if len(breakdown) == 0:
        breakdown = pd.DataFrame(columns=list(bd.BREAKDOWN_COLUMNS))
    windows = arrival_windows(cat("points"))
    waits = collective_waits(colls, clock)
    spans = breakdown[breakdown["step"] >= 0][["rank", "start", "end"]]
    totals = wait_totals(waits, spans)
    whole = breakdown[breakdown["step"] == bd.WHOLE_RUN_STEP]
    profiled = whole.set_index("rank")["total_ns"] if len(whole) else None
    op_table = cat("op_stats")
    from rankscope.analysis.compute.hta_across import join

    # every field given here, so that no default factory builds a frame only to be replaced
    out = Analysis(
        path=store_path,
        meta=meta,
        world_size=world,
        hosts={r.rank: r.host for r in results},
        breakdown=breakdown,
        hta=cat("hta"),
        waits=waits,
        comm_totals=totals,
        windows=windows,
        stragglers=find_stragglers(
            waits,
            windows,
            profiled,
            clock,
            step_cpu=step_cpu,
            step_ns=float((stepped["end"] - stepped["start"]).median()) if len(stepped) else None,
        ),
        pipeline=pipeline_stages(waits, windows, profiled),
        verdicts=verdicts(whole, totals),
        op_stats=op_table,
        ops=across_ranks(op_table),
        annotations=across_ranks(cat("annotations")),
        clock=clock,
        problems=problems,
        scheduler=choice,
        memory=mem.memory_analysis((r.memory for r in results), requested=mem.requested_in(meta)),
        unmatched_comm=cat("unmatched_comm"),
        gpu_feed=join(results),
        run_steps=run_steps,
        op_table=cat("op_table"),
        attention_calls=cat("attention"),
        gc=cat("gc"),
        rank_meta=rank_metas,
    )
    from rankscope.analysis.compute.attention import attention_by_backend
    from rankscope.analysis.compute.ops import op_sort_of, op_table_across_ranks
    from rankscope.analysis.store.devices import rank_capability

    out.op_table_across = op_table_across_ranks(out.op_table, sort_by=op_sort_of(out.op_table))
    out.capability = {
        int(r): cc for r, m in rank_metas.items() if (cc := rank_capability(m)) is not None
    }
    out.attention = attention_by_backend(out.attention_calls)
    clocks = {r.rank: r.whatif_clock for r in results if r.whatif_clock is not None}
    if grid is not None:
        out.overview = assemble([r.overview for r in results if r.overview is not None], grid,
                                out.hosts)  # fmt: skip
    layered = None
    if rootcause.applies(colls):
        groups = {int(r): m.get("process_groups") for r, m in rank_metas.items()}
        gc = out.gc

        def layered(model: Any) -> Any:
            lay = rootcause.layout(ranks, groups, model)
            return rootcause.root_causes(model, lay, breakdown, colls, groups, gc)

    from rankscope.analysis.compute import links as lk

    instances = lk.instance_transfers(colls, out.hosts)
    out.links = lk.link_table(instances)
    fix = lk.link_fix_factors(instances, out.links)
    out.whatif, out.rootcause, out.critical_path = _whatif_and_root(
        steps, colls, clocks, out.straggler_ranks(), out.bottleneck_ranks(), layered,
        [lk.link_scenario(fix)] if fix else [],
    )  # fmt: skip
    return out


# -- one DataFrame per call, from a store (for notebooks) ------------------------------------

StoreLike = Union["Analysis", "Store", str, "os.PathLike[str]"]
"""What every "give me a store" function takes: an :class:`Analysis`, an open
:class:`rankscope.analysis.store.reader.Store`, a ``trace.h5`` path or a run directory — told apart by
``isinstance``, never by which attributes an object happens to have."""

#: Analyses kept in this process for the ``*_table`` helpers (most recent stores).
CACHED_ANALYSES = 4


def _path_of(store: StoreLike) -> Path:
    """The path a :data:`StoreLike` names (an analysis' or an open store's own file)."""
    return Path(store) if isinstance(store, str | os.PathLike) else Path(store.path)


_CACHE: collections.OrderedDict[tuple[Path, int, int, str], Analysis] = collections.OrderedDict()


def _cached(path: Path, stamp: tuple[int, int], spec: ClusterSpec | None) -> Analysis:
    """One analysis per (store, its mtime and size, spec): the table helpers share it."""
    key = (path, *stamp, repr(spec))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    result = _CACHE[key] = analyze(path, spec)
    while len(_CACHE) > CACHED_ANALYSES:
        _CACHE.popitem(last=False)
    return result


def analysis_of(store: StoreLike, spec: ClusterSpec | None = None) -> Analysis:
    """``store`` itself when it is an :class:`Analysis`, else its analysis, computed once per
    version of the store file in this process (a re-merged store is analysed again)."""
    from rankscope.analysis.store.reader import resolve_store_path

    if isinstance(store, Analysis):
        return store
    path = resolve_store_path(_path_of(store)).resolve()
    st = path.stat()
    return _cached(path, (st.st_mtime_ns, st.st_size), spec)


def breakdown_table(store: StoreLike, spec: ClusterSpec | None = None) -> pd.DataFrame:
    """Breakdown per rank and step (+ whole-run rows, step -1): breakdown.BREAKDOWN_COLUMNS."""
    return analysis_of(store, spec).breakdown


def waits_table(store: StoreLike) -> pd.DataFrame:
    """Wait / transfer / lateness per collective and rank (no per-rank work needed)."""
    from rankscope.analysis.compute.collectives import collective_waits
    from rankscope.analysis.store.reader import open_store

    if isinstance(store, Analysis):
        return store.waits
    with open_store(_path_of(store)) as s:
        return collective_waits(s.collectives(), s.clock())


def stragglers_table(store: StoreLike, spec: ClusterSpec | None = None) -> pd.DataFrame:
    """Per rank, most significant first: stragglers.STRAGGLER_COLUMNS."""
    return analysis_of(store, spec).stragglers


def verdict_table(store: StoreLike, spec: ClusterSpec | None = None) -> pd.DataFrame:
    """A verdict per rank: verdict.VERDICT_COLUMNS."""
    return analysis_of(store, spec).verdicts


def ops_table(store: StoreLike, spec: ClusterSpec | None = None) -> pd.DataFrame:
    """Top ops across ranks with their spread: ops.ACROSS_COLUMNS."""
    return analysis_of(store, spec).ops


def annotations_table(store: StoreLike, spec: ClusterSpec | None = None) -> pd.DataFrame:
    """record_function ranges across ranks: ops.ACROSS_COLUMNS."""
    return analysis_of(store, spec).annotations
