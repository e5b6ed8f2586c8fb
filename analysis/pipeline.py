"""Run every analysis on a store with Dask: one task per rank, then small cross-rank steps.

Each per-rank task (:func:`rank_task`) opens the HDF5 store itself (h5py handles do not pickle;
the task gets the *path*), reads ONE rank's events, and returns small tables: the breakdown per
step, HTA's temporal numbers, what the rank did before each collective, op and range statistics.
The full store is never loaded into one pandas frame. The cross-rank steps (waits, stragglers,
verdicts, op spread) then run on the small collectives table and on those results.

Where the tasks run (:class:`ClusterSpec`): a ``LocalCluster`` sized to the machine (default),
the in-process synchronous scheduler, an existing scheduler (``scheduler="tcp://host:8786"``), or
a dask-jobqueue ``SLURMCluster`` with N single-core workers. Results are identical whatever runs
them: every task is deterministic and results are assembled in rank order.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

#: ``ClusterSpec.scheduler`` value that runs every task in this process, one after another.
SYNCHRONOUS = "synchronous"
#: ``ClusterSpec.scheduler`` value that starts a LocalCluster sized to the machine.
LOCAL = "local"
#: ``ClusterSpec.scheduler`` value (the default): in-process unless processes pay (:func:`choose`).
AUTO = "auto"
#: ``ClusterSpec.scheduler`` value: Dask's thread pool in this process (no child processes).
THREADS = "threads"
#: Events one core analyses per second in-process (measured on the 64-rank scale set:
#: 15.8 M events in 20 s on this project's 2-core machine, docs/performance.md).
IN_PROCESS_EVENTS_PER_S = 800_000
#: Seconds a LocalCluster costs before its first task (start-up, imports in every worker).
CLUSTER_START_S = 2.5
#: How long to wait for SLURMCluster workers to come up, in seconds.
SLURM_WORKER_TIMEOUT_S = 300


@dataclasses.dataclass
class ClusterSpec:
    """Where the per-rank tasks run."""

    scheduler: str = AUTO
    """``"auto"`` (in-process unless worker processes pay for their start-up, see :func:`choose`),
    ``"local"`` (a LocalCluster sized to the machine), ``"synchronous"`` (in-process, one task
    after another), ``"threads"`` (Dask's thread pool in this process), or the address of a
    running Dask scheduler (``tcp://host:8786``)."""
    slurm_workers: int | None = None
    """Start a dask-jobqueue SLURMCluster with this many single-core workers instead."""
    slurm_partition: str | None = None
    """Slurm partition for the SLURMCluster workers (Slurm's default when None)."""
    slurm_memory: str = "4GB"
    """Memory per SLURMCluster worker (a Slurm ``--mem`` value)."""
    slurm_log_dir: Path | None = None
    """Folder for the SLURMCluster job logs (the current folder when None)."""
    workers: int | None = None
    """LocalCluster workers (default: CPU cores, at most one per rank)."""
    main_is_guarded: bool = False
    """True when the caller knows ``__main__`` is safe to re-import in worker processes
    (rankscope's own CLI); otherwise ``"auto"`` decides from ``__main__`` itself."""

    def __post_init__(self) -> None:
        if self.slurm_workers is not None and self.slurm_workers < 1:
            raise ValueError(f"slurm_workers must be >= 1, got {self.slurm_workers}")
        if self.slurm_workers is not None and self.scheduler not in (LOCAL, AUTO, ""):
            raise ValueError("give either a scheduler address or slurm_workers, not both")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if not self.scheduler:
            self.scheduler = AUTO


def _cores() -> int:
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def processes_are_safe(main_is_guarded: bool = False) -> bool:
    """Can worker processes start here without re-running the user's code?

    Dask starts workers with ``multiprocessing``'s *spawn*, which re-imports the ``__main__``
    module. From a plain script without an ``if __name__ == "__main__":`` guard that re-runs the
    script's top level in every worker (and the workers' own ``analyze()`` call fails to
    bootstrap). Safe: the REPL and Jupyter (``__main__`` has no file), and callers that know their
    ``__main__`` carries the guard (``main_is_guarded``: rankscope's own CLI); never inside a
    worker process itself.
    """
    import multiprocessing
    import sys

    if multiprocessing.parent_process() is not None:
        return False  # a child process: never start another cluster from here
    if main_is_guarded:
        return True
    main = sys.modules.get("__main__")
    return main is None or getattr(main, "__file__", None) is None


@dataclasses.dataclass(frozen=True)
class Choice:
    """Where the per-rank tasks run, and why (one short line for the user)."""

    scheduler: str
    """SYNCHRONOUS, THREADS, LOCAL, or a scheduler address."""
    reason: str
    """Why, in a few words (printed by the CLI)."""


def choose(spec: ClusterSpec, n_ranks: int, n_events: int) -> Choice:
    """Pick where an ``"auto"`` analysis runs: in-process unless processes pay.

    With ``w = min(cores, ranks)`` workers the work takes about ``T / w + CLUSTER_START_S``
    instead of ``T = n_events / IN_PROCESS_EVENTS_PER_S`` in-process, so processes pay when
    ``T * (1 - 1/w) > CLUSTER_START_S``. Where processes cannot start safely (a plain script,
    :func:`processes_are_safe`) threads run instead, even when ``"local"`` was asked for: a
    bootstrapping error in every worker helps nobody. Any other explicit scheduler is honoured.
    """
    if spec.slurm_workers is not None:
        return Choice(LOCAL, f"{spec.slurm_workers} Slurm worker(s)")
    safe = processes_are_safe(spec.main_is_guarded)
    unsafe_note = (
        "threads: worker processes would re-run this script's top level (call analyze() under "
        '`if __name__ == "__main__":` and pass ClusterSpec(main_is_guarded=True) for processes)'
    )
    if spec.scheduler == LOCAL:
        return Choice(LOCAL, "a LocalCluster, as asked") if safe else Choice(THREADS, unsafe_note)
    if spec.scheduler != AUTO:
        return Choice(spec.scheduler, "as asked")
    workers = _local_workers(spec, n_ranks)
    seconds = n_events / IN_PROCESS_EVENTS_PER_S
    if workers < 2 or seconds * (1 - 1 / workers) <= CLUSTER_START_S:
        return Choice(
            SYNCHRONOUS,
            f"in-process ({n_events:,} events, ~{seconds:.1f} s of work: "
            "worker processes would not pay off)",
        )
    if not safe:
        return Choice(THREADS, unsafe_note)
    return Choice(LOCAL, f"{workers} worker processes ({n_events:,} events)")


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
    """What each rank did before each collective: stragglers.WINDOW_COLUMNS."""
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

    def whole(self) -> pd.DataFrame:
        """The whole-run breakdown row of each rank."""
        from rankscope.analysis.breakdown import WHOLE_RUN_STEP

        return self.breakdown[self.breakdown["step"] == WHOLE_RUN_STEP].reset_index(drop=True)

    def straggler_ranks(self) -> list[int]:
        """Ranks reported as stragglers, most significant first."""
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


def rank_task(
    path: str,
    rank: int,
    coll_rows: pd.DataFrame,
    grid_phase_ns: int,
    drop_last_step: bool | None,
) -> dict[str, Any]:
    """Everything computed from ONE rank's events; opens the store itself (runs on a worker)."""
    import numpy as np
    from rankscope.analysis import breakdown as bd
    from rankscope.analysis.ops import annotation_stats, op_stats
    from rankscope.analysis.schema import EventKind
    from rankscope.analysis.store import open_store
    from rankscope.analysis.stragglers import arrival_points

    with open_store(path) as store:
        events = store.events(rank)
        lanes = store.lanes(rank)
        host = str(store.rank_meta(rank).get("host", ""))
    device, measure = bd.painter(events, lanes)
    steps = bd.step_windows(events, lanes, device)
    profiled = steps[steps["step"] >= 0] if (steps["step"] >= 0).any() else steps
    out: dict[str, Any] = {
        "rank": rank,
        "host": host,
        "breakdown": bd.measure_windows(measure, device, steps, rank),
        "points": arrival_points(coll_rows, measure, steps, rank),
        "op_stats": op_stats(events, rank, spans=profiled),
        "annotations": annotation_stats(events, rank, spans=profiled),
        "hta": None,
    }
    if device is bd.Device.GPU:
        if drop_last_step is None:
            is_step = events["kind"].to_numpy() == int(EventKind.PROFILER_STEP)
            drop_last_step = len(np.unique(events["step"].to_numpy()[is_step])) >= 2
        out["hta"] = bd.hta_temporal_breakdown(
            events, lanes, rank=rank, grid_phase_ns=grid_phase_ns, drop_last_step=drop_last_step
        )
    return out


def _local_workers(spec: ClusterSpec, n_ranks: int) -> int:
    return max(1, min(spec.workers or _cores(), max(n_ranks, 1)))


def _run_tasks(
    tasks: list[Any], spec: ClusterSpec, on_done: Callable[[], None], n_ranks: int
) -> list[dict[str, Any]]:
    """Compute the delayed ``tasks`` where ``spec`` says; results in task order."""
    import dask

    if spec.scheduler == SYNCHRONOUS and spec.slurm_workers is None:
        results = []
        for t in tasks:
            results.append(dask.compute(t, scheduler="synchronous")[0])
            on_done()
        return results
    if spec.scheduler == THREADS and spec.slurm_workers is None:
        from concurrent.futures import ThreadPoolExecutor
        from concurrent.futures import as_completed as done_in_order

        with ThreadPoolExecutor(max_workers=_local_workers(spec, n_ranks)) as pool:
            futs = [pool.submit(dask.compute, t, scheduler="synchronous") for t in tasks]
            for _ in done_in_order(futs):
                on_done()
            return [f.result()[0] for f in futs]
    from distributed import Client, as_completed

    cluster: Any = None
    if spec.slurm_workers is not None:
        from dask_jobqueue import SLURMCluster

        kwargs: dict[str, Any] = {"cores": 1, "processes": 1, "memory": spec.slurm_memory}
        if spec.slurm_partition:
            kwargs["queue"] = spec.slurm_partition
        if spec.slurm_log_dir is not None:
            kwargs["log_directory"] = str(spec.slurm_log_dir)
        cluster = SLURMCluster(**kwargs)
        cluster.scale(jobs=spec.slurm_workers)
        address: Any = cluster
    elif spec.scheduler == LOCAL:
        from distributed import LocalCluster

        cluster = LocalCluster(
            n_workers=_local_workers(spec, n_ranks),
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=40,
        )
        address = cluster
    else:
        address = spec.scheduler
    try:
        with Client(address, set_as_default=False) as client:
            if spec.slurm_workers is not None:
                client.wait_for_workers(spec.slurm_workers, timeout=SLURM_WORKER_TIMEOUT_S)
            futures = client.compute(tasks)
            for _ in as_completed(futures, loop=client.loop):
                on_done()
            return list(client.gather(futures))
    finally:
        if cluster is not None:
            cluster.close()


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
    import dask
    import pandas as pd
    from rankscope.analysis import breakdown as bd
    from rankscope.analysis.bottleneck import pipeline_stages
    from rankscope.analysis.collectives import collective_waits, wait_totals
    from rankscope.analysis.ops import across_ranks
    from rankscope.analysis.store import open_store
    from rankscope.analysis.stragglers import arrival_windows, find_stragglers
    from rankscope.analysis.verdict import verdicts

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
        n_events = sum(int(store.rank_meta(r).get("events", 0)) for r in ranks)
    choice = choose(spec, len(ranks), n_events)
    if choice.scheduler != spec.scheduler:
        spec = dataclasses.replace(spec, scheduler=choice.scheduler)
    colls["last_start"] = colls.groupby("coll")["start"].transform("max")
    drop_last: bool | None = bool(steps["step"].nunique() >= 2) if len(steps) else None
    offsets = dict(zip(clock["rank"].astype(int), clock["offset_ns"].astype("int64"), strict=False))
    tasks = [
        dask.delayed(rank_task, pure=True)(
            str(store_path),
            rank,
            colls[colls["rank"] == rank][["coll", "start", "end", "last_start"]].reset_index(
                drop=True
            ),
            int(offsets.get(rank, 0)) % bd.HTA_GRID_NS,
            drop_last,
            dask_key_name=f"rankscope-rank-{rank}",
        )
        for rank in ranks
    ]
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], len(tasks))

    results = sorted(_run_tasks(tasks, spec, tick, len(ranks)), key=lambda r: r["rank"])

    def cat(key: str) -> pd.DataFrame:
        frames = [r[key] for r in results if r[key] is not None and len(r[key])]
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
    return Analysis(
        path=store_path,
        meta=meta,
        world_size=world,
        hosts={int(r["rank"]): r["host"] for r in results},
        breakdown=breakdown,
        hta=cat("hta"),
        waits=waits,
        comm_totals=totals,
        windows=windows,
        stragglers=find_stragglers(waits, windows, profiled, clock),
        pipeline=pipeline_stages(waits, windows, profiled),
        verdicts=verdicts(whole, totals),
        op_stats=op_table,
        ops=across_ranks(op_table),
        annotations=across_ranks(cat("annotations")),
        clock=clock,
        problems=problems,
        scheduler=choice,
    )


# -- one DataFrame per call, from a store (for notebooks) ------------------------------------

StoreLike = Any
"""An :class:`Analysis`, a :class:`rankscope.analysis.store.Store`, a ``trace.h5`` path or a run
directory."""

#: Analyses kept in this process for the ``*_table`` helpers (most recent stores).
CACHED_ANALYSES = 4


def _path_of(store: StoreLike) -> Path:
    path = getattr(store, "path", None)
    return Path(path if path is not None else store)


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
    from rankscope.analysis.store import resolve_store_path

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
    from rankscope.analysis.collectives import collective_waits
    from rankscope.analysis.store import open_store

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
