"""Where Dask work runs, and the one runner that runs it: shared by the merge and the analysis.

Both commands fan one task out per rank: the merge parses a rank's traces
(``rankscope.orchestrator.rank_columns.parse_source``), the analysis measures a rank's events
(``rankscope.analysis.pipeline.rank_task``). They share the scheduler vocabulary
(:class:`ClusterSpec`, ``"auto"`` / ``"local"`` / ``"synchronous"`` / ``"threads"`` / an address),
the choice of where ``"auto"`` runs (:func:`choose`: in-process until worker processes pay for
their start-up) and the runner (:func:`run_each`), so one word means the same for both and the
user reads the same one-line reason from both.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rankscope.errors import UsageError

#: What a task returns.
Result = TypeVar("Result")

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
    """Pick where ``"auto"`` work (a merge or an analysis) runs: in-process unless processes pay.

    With ``w`` workers adding parallelism the work takes about ``T / w + CLUSTER_START_S``
    instead of ``T = n_events / IN_PROCESS_EVENTS_PER_S`` in-process, so processes pay when
    ``T * (1 - 1/w) > CLUSTER_START_S``; ``w = min(cores - 1, ranks)`` (the parent keeps a core
    busy) unless ``spec.workers`` sizes the cluster. Where processes cannot start safely (a plain script,
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
    # Without a size from the user, the parent keeps a core busy (the scheduler, unpickling the
    # results and, in a merge, writing the store), so only the others add parallelism: on 2
    # cores a LocalCluster was 3x slower than in-process at 1 M events (docs/performance.md).
    parallel = min(spec.workers, n_ranks) if spec.workers else min(_cores() - 1, n_ranks)
    seconds = n_events / IN_PROCESS_EVENTS_PER_S
    if parallel < 2 or seconds * (1 - 1 / parallel) <= CLUSTER_START_S:
        why = (
            f"{_cores()} cores: one is the parent's, worker processes would not pay off"
            if parallel < 2 and not spec.workers and n_ranks >= 2
            else "worker processes would not pay off"
        )
        return Choice(
            SYNCHRONOUS, f"in-process ({n_events:,} events, ~{seconds:.1f} s of work; {why})"
        )
    if not safe:
        return Choice(THREADS, unsafe_note)
    return Choice(LOCAL, f"{workers} worker processes ({n_events:,} events)")


#: Tasks kept in flight per worker: enough to keep every worker busy, few enough that finished
#: results (the merge's are whole ranks of columns) never pile up in the parent's memory.
IN_FLIGHT_PER_WORKER = 2
#: How long to wait for a Dask scheduler at a given address, in seconds.
CONNECT_TIMEOUT_S = 20


def _local_workers(spec: ClusterSpec, n_ranks: int) -> int:
    return max(1, min(spec.workers or _cores(), max(n_ranks, 1)))


def run_each(
    func: Callable[..., Result],
    calls: Sequence[tuple[Any, ...]],
    spec: ClusterSpec,
    n_ranks: int,
) -> Iterator[Result]:
    """Yield ``func(*args)`` for every ``args`` in ``calls``, as each finishes, where ``spec`` says.

    Results come in the order they finish (callers that need an order sort them); at most
    ``IN_FLIGHT_PER_WORKER × workers`` calls run or wait at once, and each result is handed over
    and forgotten before the next call is submitted, so the caller can stream them (the merge
    parks each parsed rank on disk at once). ``spec.scheduler`` is a concrete choice
    (:func:`choose` resolves ``"auto"``): in-process, Dask's thread pool, a LocalCluster, a
    SLURMCluster (``spec.slurm_workers``) or a running scheduler's address.
    """
    if spec.slurm_workers is None and spec.scheduler == SYNCHRONOUS:
        for args in calls:
            yield func(*args)
        return
    limit = IN_FLIGHT_PER_WORKER * _local_workers(spec, n_ranks)
    if spec.slurm_workers is None and spec.scheduler == THREADS:
        yield from _run_threads(func, calls, _local_workers(spec, n_ranks), limit)
        return
    yield from _run_distributed(func, calls, spec, n_ranks)


def _run_threads(
    func: Callable[..., Result], calls: Sequence[tuple[Any, ...]], workers: int, limit: int
) -> Iterator[Result]:
    """A thread pool in this process (no child processes: safe from a plain script)."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    pending = iter(calls)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        running: set[Future[Result]] = {
            pool.submit(func, *a) for a in itertools.islice(pending, limit)
        }
        while running:
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                nxt = next(pending, None)
                if nxt is not None:
                    running.add(pool.submit(func, *nxt))
                yield fut.result()


def _run_distributed(
    func: Callable[..., Result], calls: Sequence[tuple[Any, ...]], spec: ClusterSpec, n_ranks: int
) -> Iterator[Result]:
    """dask.distributed: a LocalCluster, a SLURMCluster, or a running scheduler's address."""
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
            silence_logs=logging.ERROR,
        )
        address = cluster
    else:
        address = spec.scheduler
    try:
        try:
            client = Client(address, timeout=f"{CONNECT_TIMEOUT_S}s", set_as_default=False)
        except OSError as exc:
            raise UsageError(f"--scheduler {spec.scheduler}: cannot connect ({exc})") from None
        with client:
            if spec.slurm_workers is not None:
                client.wait_for_workers(spec.slurm_workers, timeout=SLURM_WORKER_TIMEOUT_S)
            workers = max(1, len(client.scheduler_info().get("workers", {})))
            pending = iter(calls)
            first = [
                client.submit(func, *a, pure=False)
                for a in itertools.islice(pending, IN_FLIGHT_PER_WORKER * workers)
            ]
            queue = as_completed(first, loop=client.loop)
            for fut in queue:
                result = fut.result()
                fut.release()
                nxt = next(pending, None)
                if nxt is not None:
                    queue.add(client.submit(func, *nxt, pure=False))
                yield result
    finally:
        if cluster is not None:
            cluster.close()
