"""Where Dask work runs, and the one runner that runs it: shared by the merge and the analysis.

Both commands fan one task out per rank: the merge parses a rank's traces
(``rankscope.orchestrator.ingest.rank_columns.parse_source``), the analysis measures a rank's events
(``rankscope.analysis.engine.driver.rank_task``). They share the scheduler vocabulary
(:class:`ClusterSpec`, ``"auto"`` / ``"processes"`` / ``"local"`` / ``"synchronous"`` /
``"threads"`` / an address), the choice of where ``"auto"`` runs (:func:`choose`: in-process
until worker processes pay for their start-up; on Linux forked ones, which start in
milliseconds), the runner (:func:`run_each`) and the command-line flags
(:func:`add_cluster_flags`, :func:`cluster_spec_from_args`), so one word means the same for both,
is spelled once for both, and the user reads the same one-line reason from both.

Slurm workers (``--slurm-workers N``, a dask-jobqueue SLURMCluster) are started, watched and
cleaned up by :mod:`rankscope.analysis.engine.slurm_workers`; whatever fails there, or kills the workers
of a local pool, ends the run with ONE :class:`WorkersError` line, never a hang or a traceback.

Why one module of ~510 lines: the vocabulary, the choice, the runner and the flags are one
contract that the merge and the analysis share; split, each word would be spelled in two places.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
from collections.abc import Callable, Generator, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rankscope.config_flags import NO_FLAG, flag, positive_int
from rankscope.errors import UsageError
from rankscope.errors import (
    WorkersError as WorkersError,  # raised here; defined with the other errors
)

if TYPE_CHECKING:
    from rankscope.analysis.engine.slurm_workers import SlurmWorkers

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
#: ``ClusterSpec.scheduler`` value: worker processes forked from this one (Linux): they start in
#: milliseconds with every module already imported and never re-run ``__main__``, so they pay
#: where a LocalCluster's start-up does not (2 cores: merge + analysis of 64 ranks x 40 steps
#: 17.2 s in-process, 12.9 s forked; docs/performance.md). Dask's own word for a process pool.
PROCESSES = "processes"
#: Seconds forked workers cost before and after their tasks: the fork itself (0.02 s for 2
#: workers), then the copy-on-write pages the children touch (every object they read has its
#: reference count written) and the results pickled back through a pipe. Measured as the CPU
#: time 2 forked workers add to the same analysis in-process (parent + children, 8-rank
#: ``param_dlrm_8rank``, 7 interleaved pairs on this project's 2-core machine): 0.51 s mean
#: (-0.02 to 0.88 s); taken whole, as on a busy machine the workers do not overlap it.
FORK_START_S = 0.5
#: Events one core analyses per second in-process (measured on the 64-rank scale set:
#: 15.8 M events in 20 s on this project's 2-core machine, docs/performance.md).
IN_PROCESS_EVENTS_PER_S = 800_000
#: Seconds a LocalCluster costs before its first task (start-up, imports in every worker).
CLUSTER_START_S = 2.5
#: Fixed seconds of one analysis rank task whatever its events (open the store, a dozen small
#: per-rank tables): measured 0.05-0.1 s on this project's 2-core machine with 1,024 ranks of
#: ~1,000 events, where the events alone predicted 1.3 s of work for 83 s (issue 15).
ANALYSIS_RANK_S = 0.05


@dataclasses.dataclass
class ClusterSpec:
    """Where the per-rank tasks run. The first three fields are ``merge``'s and ``analyze``'s flags,
    their docstrings the flags' help (:mod:`rankscope.config_flags`; read back by
    :mod:`.cluster_flags`); the others are set by code. ``"auto"`` decides by :func:`choose`,
    ``"synchronous"`` runs one task after another, ``"threads"`` is Dask's thread pool."""

    scheduler: str = dataclasses.field(
        default=AUTO, metadata=flag(metavar="WHERE", exclusive="where")
    )
    """where the per-rank tasks run: 'auto' (default: in this process unless worker processes pay
    for their start-up), 'processes' (worker processes forked from this one, Linux), 'local' (a
    LocalCluster sized to this machine), 'threads', 'synchronous' (in this process), or a Dask
    scheduler address (tcp://host:8786)"""
    slurm_workers: int | None = dataclasses.field(
        default=None, metadata=flag(metavar="N", parse=positive_int, exclusive="where")
    )
    """run the per-rank tasks on N one-core Slurm jobs (a dask-jobqueue SLURMCluster); the traces
    and the output must be on a filesystem the nodes share"""
    slurm_partition: str | None = dataclasses.field(default=None, metadata=flag(metavar="NAME"))
    """partition of the --slurm-workers jobs (default: the cluster's)"""
    slurm_memory: str = dataclasses.field(default="4GB", metadata=NO_FLAG)
    """Memory per SLURMCluster worker (a Slurm ``--mem`` value)."""
    slurm_log_dir: Path | None = dataclasses.field(default=None, metadata=NO_FLAG)
    """Folder for the SLURMCluster job logs, kept (``slurm_work_dir``, else the current folder,
    when None)."""
    slurm_work_dir: Path | None = dataclasses.field(default=None, metadata=NO_FLAG)
    """Folder the workers may write into, created for the run and removed once their jobs are
    gone: the job logs (unless ``slurm_log_dir``) and Dask's scratch space (unless dask's
    ``jobqueue.slurm.local-directory`` names one). Give one on a filesystem every node sees and
    the caller can clean (the merge puts it beside its output); None keeps dask-jobqueue's
    defaults (logs in the current folder, scratch in the node's temporary folder)."""
    slurm_job_name: str | None = dataclasses.field(default=None, metadata=NO_FLAG)
    """Slurm job name of the workers (what ``squeue`` and ``sacct`` show); dask-jobqueue's
    ``dask-worker`` when None."""
    slurm_start_timeout_s: float | None = dataclasses.field(default=None, metadata=NO_FLAG)
    """Seconds to wait for every worker to connect (``$RANKSCOPE_SLURM_WORKER_TIMEOUT``, else
    ``slurm_workers.SLURM_WORKER_TIMEOUT_S``, when None)."""
    workers: int | None = dataclasses.field(default=None, metadata=NO_FLAG)
    """Worker processes of a LocalCluster or a fork pool (default: CPU cores, at most one per
    rank)."""
    main_is_guarded: bool = dataclasses.field(default=False, metadata=NO_FLAG)
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


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the system tells it)."""
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


def can_fork() -> bool:
    """Can this process fork its workers (:data:`PROCESSES`)?

    Linux only: macOS' system libraries are not safe to use after a fork (Python itself starts
    processes there by spawning since 3.8) and Windows has no fork. Never from a worker process
    itself, forked or started by Dask: the work is already spread there.
    """
    import multiprocessing
    import sys

    return sys.platform.startswith("linux") and multiprocessing.parent_process() is None


@dataclasses.dataclass(frozen=True)
class Choice:
    """Where the per-rank tasks run, and why (one short line for the user)."""

    scheduler: str
    """SYNCHRONOUS, THREADS, PROCESSES, LOCAL, or a scheduler address."""
    reason: str
    """Why, in a few words (printed by the CLI)."""


def choose(
    spec: ClusterSpec,
    n_ranks: int,
    n_events: int,
    rank_s: float = 0.0,
    events_per_s: float = IN_PROCESS_EVENTS_PER_S,
) -> Choice:
    """Pick where ``"auto"`` work (a merge or an analysis) runs: in-process unless processes pay.

    With ``w`` workers adding parallelism the work takes about ``T / w + start`` instead of
    ``T = n_events / events_per_s + n_ranks * rank_s`` in-process (``rank_s``: the fixed cost of
    one rank's task, ``ANALYSIS_RANK_S`` for the analysis; ``events_per_s``: one core's rate,
    :data:`IN_PROCESS_EVENTS_PER_S` for the analysis, the merge's parse rate for the merge:
    ``orchestrator/ingest/merge.py``), so processes pay when
    ``T * (1 - 1/w) > start``. Where this process can fork (:func:`can_fork`) the workers are
    forked (``start`` = :data:`FORK_START_S`, ``w = min(cores, ranks)``: the parent only waits for
    and stores their results); elsewhere a LocalCluster (``start`` = :data:`CLUSTER_START_S`,
    ``w = min(cores - 1, ranks)``: its scheduler and the unpickling keep the parent's core busy).
    ``spec.workers`` sizes either. Where a LocalCluster cannot start safely (a plain script,
    :func:`processes_are_safe`) threads run instead, even when ``"local"`` was asked for: a
    bootstrapping error in every worker helps nobody. Any other explicit scheduler is honoured.
    """
    if spec.slurm_workers is not None:
        where = f" in partition {spec.slurm_partition}" if spec.slurm_partition else ""
        return Choice(LOCAL, f"{spec.slurm_workers} Slurm worker job(s){where}")
    safe = processes_are_safe(spec.main_is_guarded)
    unsafe_note = (
        "threads: worker processes would re-run this script's top level (call analyze() under "
        '`if __name__ == "__main__":` and pass ClusterSpec(main_is_guarded=True) for processes)'
    )
    if spec.scheduler == LOCAL:
        return Choice(LOCAL, "a LocalCluster, as asked") if safe else Choice(THREADS, unsafe_note)
    if spec.scheduler == PROCESSES and not can_fork():
        return Choice(THREADS, "threads: forked worker processes need Linux (and not a worker)")
    if spec.scheduler != AUTO:
        return Choice(spec.scheduler, "as asked")
    workers = _local_workers(spec, n_ranks)
    seconds = n_events / events_per_s + n_ranks * rank_s
    if can_fork():
        if workers >= 2 and seconds * (1 - 1 / workers) > FORK_START_S:
            return Choice(
                PROCESSES,
                f"{workers} forked worker processes ({n_events:,} events, ~{seconds:.1f} s of work)",
            )
        why = "one core" if workers < 2 and n_ranks >= 2 and not spec.workers else "too little"
        return Choice(
            SYNCHRONOUS,
            f"in-process ({n_events:,} events, ~{seconds:.1f} s of work; worker processes "
            f"would not pay off: {why})",
        )
    # Without a size from the user, the parent keeps a core busy (the scheduler, unpickling the
    # results and, in a merge, writing the store), so only the others add parallelism: on 2
    # cores a LocalCluster was 3x slower than in-process at 1 M events (docs/performance.md).
    parallel = min(spec.workers, n_ranks) if spec.workers else min(cores() - 1, n_ranks)
    if parallel < 2 or seconds * (1 - 1 / parallel) <= CLUSTER_START_S:
        why = (
            f"{cores()} cores: one is the parent's, worker processes would not pay off"
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
    return max(1, min(spec.workers or cores(), max(n_ranks, 1)))


def run_each(
    func: Callable[..., Result],
    calls: Sequence[tuple[Any, ...]],
    spec: ClusterSpec,
    n_ranks: int,
) -> Generator[Result, None, None]:
    """Yield ``func(*args)`` for every ``args`` in ``calls``, as each finishes, where ``spec`` says.

    Results come in the order they finish (callers that need an order sort them); at most
    ``IN_FLIGHT_PER_WORKER × workers`` calls run or wait at once, and each result is handed over
    and forgotten before the next call is submitted, so the caller can stream them (the merge
    parks each parsed rank on disk at once). ``spec.scheduler`` is a concrete choice
    (:func:`choose` resolves ``"auto"``): in-process, Dask's thread pool, a LocalCluster, a
    SLURMCluster (``spec.slurm_workers``) or a running scheduler's address. A caller that may stop
    early closes the generator (``contextlib.closing``): that stops the workers at once.
    """
    if spec.slurm_workers is None and spec.scheduler == SYNCHRONOUS:
        for args in calls:
            yield func(*args)
        return
    limit = IN_FLIGHT_PER_WORKER * _local_workers(spec, n_ranks)
    if spec.slurm_workers is None and spec.scheduler == THREADS:
        yield from _run_threads(func, calls, _local_workers(spec, n_ranks), limit)
        return
    if spec.slurm_workers is None and spec.scheduler == PROCESSES:
        from concurrent.futures.process import BrokenProcessPool

        from rankscope.analysis.engine.forked_workers import run_forked

        try:
            yield from run_forked(func, calls, _local_workers(spec, n_ranks), limit)
        except BrokenProcessPool:
            raise WorkersError(
                "a forked worker process died (killed for memory?); rerun with "
                "--scheduler synchronous to use this process alone"
            ) from None
        return
    yield from _run_distributed(func, calls, spec, n_ranks)


def _run_threads(
    func: Callable[..., Result], calls: Sequence[tuple[Any, ...]], workers: int, limit: int
) -> Iterator[Result]:
    """A thread pool in this process (no child processes: safe from a plain script)."""
    from concurrent.futures import ThreadPoolExecutor

    from rankscope.analysis.engine.forked_workers import in_flight

    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield from in_flight(pool, func, calls, limit)


#: Dask's own log records of a lost worker that this module handles and says in one line
#: (:class:`WorkersError`): (logger, start of the message, name of the exception it carries or
#: ""). The scheduler, in this process for Slurm workers, logs "Couldn't gather keys" when the
#: worker holding a finished result is gone; a gather :func:`result_of` stopped waiting on ends
#: with Dask's internal ``AllExit``, which asyncio logs with a traceback when the abandoned task
#: is collected.
HANDLED_DASK_LOGS = (
    ("distributed.scheduler", "Couldn't gather keys", ""),
    ("asyncio", "Task exception was never retrieved", "AllExit"),
)


class _HandledByUs(logging.Filter):
    """Drops one logger's records that start with ``prefix`` (and carry an exception named
    ``exception``, when given): see :data:`HANDLED_DASK_LOGS`."""

    def __init__(self, prefix: str, exception: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.exception = exception

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        if not self.exception:
            return False
        kind = record.exc_info[0] if record.exc_info else None
        return kind is None or kind.__name__ != self.exception


def _drop_handled_dask_logs() -> None:
    """Install the :data:`HANDLED_DASK_LOGS` filters once per process (they drop nothing else)."""
    for name, prefix, exception in HANDLED_DASK_LOGS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _HandledByUs) and f.prefix == prefix for f in log.filters):
            log.addFilter(_HandledByUs(prefix, exception))


#: Level of Dask's own stderr handlers while a run and its clean-up last: its INFO records
#: (a scheduler's "State start", "Batched Comm Closed" with a traceback when a worker we cancelled
#: goes away) are not the user's business; what fails reaches the user as one line of ours.
DASK_LOG_LEVEL = logging.ERROR


@contextlib.contextmanager
def quiet_dask_logs(level: int = DASK_LOG_LEVEL) -> Iterator[None]:
    """Dask's stderr handlers at ``level`` inside, restored after.

    A SLURMCluster (like a LocalCluster) quiets them only until its own close ends, and records
    of the scheduler's connections to workers that are being cancelled can come later, while
    the client or the cluster is still closing: this context spans the whole run, clean-up
    included (:func:`_run_distributed`)."""
    handlers = [
        h
        for h in logging.getLogger("distributed").handlers
        if isinstance(h, logging.StreamHandler) and h.level < level
    ]
    old = [h.level for h in handlers]
    for h in handlers:
        h.setLevel(level)
    try:
        yield
    finally:
        for h, was in zip(handlers, old, strict=True):
            h.setLevel(was)


def _run_distributed(
    func: Callable[..., Result], calls: Sequence[tuple[Any, ...]], spec: ClusterSpec, n_ranks: int
) -> Iterator[Result]:
    """:func:`_run_on_cluster` with Dask's own log records quiet (:func:`quiet_dask_logs`)."""
    import distributed  # noqa: F401  (sets up Dask's log handlers, which are quieted here)

    with quiet_dask_logs():
        yield from _run_on_cluster(func, calls, spec, n_ranks)


def _run_on_cluster(
    func: Callable[..., Result], calls: Sequence[tuple[Any, ...]], spec: ClusterSpec, n_ranks: int
) -> Iterator[Result]:
    """dask.distributed: a LocalCluster, a SLURMCluster, or a running scheduler's address.

    However it ends (the last result, an error, Ctrl-C, the caller closing the generator), Slurm
    workers are ended by :meth:`SlurmWorkers.finish`, which cancels their jobs before Dask's own
    close and bounds every wait; the other clusters close as Dask closes them.
    """
    from distributed import Client

    _drop_handled_dask_logs()
    cluster: Any = None
    slurm: SlurmWorkers | None = None
    client: Any = None
    try:
        if spec.slurm_workers is not None:
            from rankscope.analysis.engine import slurm_workers

            slurm = slurm_workers.SlurmWorkers(spec)
            address: Any = slurm.start()
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
            client = Client(address, timeout=f"{CONNECT_TIMEOUT_S}s", set_as_default=False)
        except OSError as exc:
            raise UsageError(f"--scheduler {spec.scheduler}: cannot connect ({exc})") from None
        if slurm is not None:
            slurm.wait_for_workers(client)
        yield from _stream(func, calls, client, slurm)
    finally:
        if slurm is not None:
            slurm.finish(client)  # the jobs cancelled first, every wait bounded
        else:
            try:
                if client is not None:
                    client.close()
            finally:
                if cluster is not None:
                    cluster.close()


def _stream(
    func: Callable[..., Result],
    calls: Sequence[tuple[Any, ...]],
    client: Any,
    slurm: SlurmWorkers | None,
) -> Iterator[Result]:
    """Submit ``calls`` to ``client`` and yield results as they finish (:func:`run_each`).

    With Slurm workers the wait is cut every few seconds to look at the jobs: Dask
    reruns the tasks of a lost worker on the others, but once every worker is gone it would wait
    for new ones forever (nobody submits them), so that is an error (:meth:`SlurmWorkers.check`).
    """
    from distributed import KilledWorker, wait

    workers = max(1, len(client.nthreads()))
    pending = iter(calls)
    running = {
        client.submit(func, *a, pure=False)
        for a in itertools.islice(pending, IN_FLIGHT_PER_WORKER * workers)
    }
    poll = slurm.poll_s if slurm is not None else None
    while running:
        try:
            with client.as_current():  # wait() asks for "the" client; ours is not the default
                done, running = wait(running, timeout=poll, return_when="FIRST_COMPLETED")
        except TimeoutError:
            assert slurm is not None  # no timeout without Slurm workers
            slurm.check(client)
            continue
        for fut in done:
            try:
                result = result_of(
                    fut, poll, None if slurm is None else partial(slurm.check, client)
                )
            except KilledWorker as exc:
                where = slurm.describe() if slurm is not None else ""
                raise WorkersError(
                    f"every worker that ran task {exc.task} died ({_attempts(exc)}){where}"
                ) from None
            fut.release()
            nxt = next(pending, None)
            if nxt is not None:
                running.add(client.submit(func, *nxt, pure=False))
            yield result


def result_of(fut: Any, poll_s: float | None, check: Callable[[], None] | None) -> Any:
    """``fut.result()``, looking at the workers (``check``, which raises once they are all
    gone) every ``poll_s`` seconds while it waits.

    A finished future is not a result in hand: the value lives on the worker that computed it
    until it is gathered. When that worker's job is cancelled in between, Dask reschedules the
    task and ``result()`` waits for it to be computed again — forever, when no worker is left
    ("Couldn't gather keys … queued": a merge that did not end within 60 s of its workers'
    scancel). Without ``check`` (local workers) it waits as Dask does."""
    if check is None or poll_s is None:
        return fut.result()
    while True:
        try:
            return fut.result(timeout=poll_s)
        except TimeoutError:
            check()


def _attempts(exc: Any) -> str:
    """How often Dask tried a KilledWorker's task ("3 attempts": ``allowed_failures + 1``)."""
    allowed = getattr(exc, "allowed_failures", None)
    return f"{allowed + 1} attempts" if isinstance(allowed, int) else "several attempts"
