"""Slurm workers for :func:`rankscope.analysis.engine.scheduler.run_each`: a dask-jobqueue SLURMCluster
whose jobs are submitted, waited for, watched, cancelled and cleaned up in Slurm's own words.

``--slurm-workers N`` (``ClusterSpec.slurm_workers``) fails in ways a local pool does not: sbatch
refuses the job, the jobs wait in the queue, a job is cancelled or dies while its worker holds
tasks. dask-jobqueue submits from its event loop and only logs what goes wrong there, and Dask
waits forever for workers nobody will submit again; so each case is checked here and ends the
run with ONE :class:`~rankscope.errors.WorkersError` line (sbatch's refusal,
``squeue``'s state and reason, the telling line of the job's log), never a hang or a traceback.
When the run ends, however it ends, the jobs are cancelled and, once they have left the queue,
``ClusterSpec.slurm_work_dir`` (their logs and Dask's scratch space) is removed.

Kept apart from the scheduler module, as the launchers keep their Slurm backend apart by role:
the runner's loop calls only :meth:`SlurmWorkers.check` between two waits. Slurm's tools are run,
and their output read, by :mod:`rankscope.slurm.commands` (shared with the Slurm launcher); this
module says what their answers mean for the workers, in its own words. Times are in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.errors import UsageError, WorkersError
from rankscope.slurm.commands import (
    JobInfo,
    NoAnswer,
    Otherwise,
    SlurmJobState,
    ToolMissing,
    error_line,
    run_tool,
    scancel,
    squeue,
)

if TYPE_CHECKING:
    from rankscope.analysis.engine.scheduler import ClusterSpec

#: How long to wait for SLURMCluster workers to come up, in seconds (a queue can be slow).
SLURM_WORKER_TIMEOUT_S = 300
#: Environment variable overriding :data:`SLURM_WORKER_TIMEOUT_S` (busy clusters, tests).
SLURM_WORKER_TIMEOUT_ENV = "RANKSCOPE_SLURM_WORKER_TIMEOUT"
#: Seconds between two looks at the Slurm jobs while waiting for workers or results.
SLURM_POLL_S = 5.0
#: Seconds every worker job may have ended while Dask still lists workers (orphans) before the
#: merge or analysis gives up with one line: two polls (:data:`SLURM_POLL_S`), ample for the
#: scheduler to notice that a killed worker's connection closed; a worker still listed after that
#: is an orphan (see :meth:`SlurmWorkers.check`). At 30 s a merge with orphan workers ended
#: 39-44 s after the scancel on this project's loaded 2-core machine, too close to the 60 s bound
#: (docs/reliability.md); at 10 s, 17-21 s.
SLURM_ENDED_GRACE_S = 10.0
#: Seconds :meth:`SlurmWorkers.finish` may take after its first scancel: closing Dask's client
#: and cluster and waiting for the jobs to leave the queue share them, so the merge or analysis
#: ends within this bound of Ctrl-C or of giving up, whatever state Dask is in.
SLURM_FINISH_TIMEOUT_S = 20.0
#: Of :data:`SLURM_FINISH_TIMEOUT_S`, the most the Dask client's close may take (the cluster's
#: close and the wait for the queue get the rest).
SLURM_CLIENT_CLOSE_S = 5.0
#: Of :data:`SLURM_FINISH_TIMEOUT_S`, the most the SLURMCluster's close may take (the wait for
#: the jobs to leave the queue gets the rest).
SLURM_CLUSTER_CLOSE_S = 10.0
#: Seconds between two looks at the queue while waiting for the cancelled jobs to leave it.
SLURM_QUEUE_POLL_S = 0.5
#: Seconds any one sbatch/squeue call may take.
SLURM_COMMAND_TIMEOUT_S = 30.0
#: Slurm job states in which a worker job may still connect or is connected.
SLURM_ACTIVE_STATES: frozenset[SlurmJobState] = frozenset(
    {
        SlurmJobState.PENDING,
        SlurmJobState.CONFIGURING,
        SlurmJobState.RUNNING,
        SlurmJobState.REQUEUED,
        SlurmJobState.REQUEUE_HOLD,
        SlurmJobState.RESIZING,
        SlurmJobState.SUSPENDED,
    }
)
#: Slurm job states in which a job's processes may still run (it is not gone yet).
SLURM_LIVE_STATES: frozenset[SlurmJobState] = SLURM_ACTIVE_STATES | {
    SlurmJobState.COMPLETING,
    SlurmJobState.SIGNALING,
    SlurmJobState.STAGE_OUT,
}
#: Characters of a job's log line quoted in an error.
LOG_LINE_CHARS = 200


class SlurmWorkers:
    """The jobs of one SLURMCluster: submitted, waited for, watched, cancelled, cleaned up.

    dask-jobqueue submits the jobs from its event loop and only logs what goes wrong there, so a
    refused submission or a job that died would look like a queue that never moves; hence the
    checks here, in Slurm's own words. Job ids are kept as they appear: Dask forgets the job of a
    worker it lost, and the cleanup must still wait for that job.
    """

    poll_s: float = SLURM_POLL_S
    """Seconds the runner waits for a result before it calls :meth:`check`."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.n = int(spec.slurm_workers or 1)
        self.timeout_s = _start_timeout(spec)
        self.cluster: Any = None
        self.job_ids: list[str] = []
        self.log_dir: Path | None = None
        self._empty_since: float | None = None
        self._ended_since: float | None = None

    def start(self) -> Any:
        """Create the SLURMCluster, check that sbatch accepts its job, submit ``n`` jobs."""
        import dask

        slurm_cluster = _slurm_cluster_class()
        spec = self.spec
        kwargs: dict[str, Any] = {"cores": 1, "processes": 1, "memory": spec.slurm_memory}
        if spec.slurm_partition:
            kwargs["queue"] = spec.slurm_partition
        if not dask.config.get("jobqueue.slurm.scheduler-options", None):
            # any free port for the dashboard: a second merge (or a notebook's cluster) on 8787
            # would print a warning into the user's terminal
            kwargs["scheduler_options"] = {"dashboard_address": ":0"}
        if spec.slurm_job_name:
            kwargs["job_name"] = spec.slurm_job_name
        work = spec.slurm_work_dir
        if work is not None:
            try:
                work.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise WorkersError(
                    f"--slurm-workers: cannot create the workers' folder {work} "
                    f"({exc.strerror or exc})"
                ) from None
            if dask.config.get("jobqueue.slurm.local-directory", None) is None:
                kwargs["local_directory"] = str(work)
        configured_logs = dask.config.get("jobqueue.slurm.log-directory", None)
        if spec.slurm_log_dir is not None or (configured_logs is None and work is not None):
            self.log_dir = spec.slurm_log_dir or work
            kwargs["log_directory"] = str(self.log_dir)
        elif configured_logs:
            self.log_dir = Path(configured_logs)
        self.cluster = slurm_cluster(**kwargs)
        self._check_submission(self.cluster.job_script())
        self.cluster.scale(jobs=self.n)
        return self.cluster

    def _check_submission(self, script: str) -> None:
        """``sbatch --test-only`` on the workers' job script: a refusal is one line now."""
        try:
            with _not_available():
                res = run_tool(
                    ["sbatch", "--test-only"], timeout_s=SLURM_COMMAND_TIMEOUT_S, stdin=script
                )
        except NoAnswer as exc:
            raise WorkersError(
                f"--slurm-workers: sbatch did not answer within {exc.timeout_s:.0f} s",
                exit_code=UsageError.exit_code,
            ) from None
        if res.returncode != 0:
            said = error_line(res.stderr + res.stdout, otherwise=Otherwise.LAST)[:LOG_LINE_CHARS]
            raise WorkersError(
                f"--slurm-workers {self.n}: sbatch refused the worker job: "
                f"{said or f'exit status {res.returncode}'}",
                exit_code=UsageError.exit_code,
            )

    def _note_jobs(self) -> None:
        """Record the ids of the jobs dask-jobqueue has submitted so far."""
        if self.cluster is None:
            return
        try:
            jobs = list(self.cluster.workers.values())
        except RuntimeError:  # changed by the cluster's event loop meanwhile: next time
            return
        for job in jobs:
            job_id = getattr(job, "job_id", None)
            if job_id and str(job_id) not in self.job_ids:
                self.job_ids.append(str(job_id))

    def _states(self) -> dict[str, JobInfo] | None:
        """What squeue says about the known jobs (a job squeue no longer lists is missing);
        None when Slurm does not answer."""
        if not self.job_ids:
            return {}
        try:
            with _not_available():
                return squeue(self.job_ids, timeout_s=SLURM_COMMAND_TIMEOUT_S, all_states=True)
        except NoAnswer:
            return None

    def wait_for_workers(self, client: Any) -> None:
        """Return once ``n`` workers are connected; one line when a job ended first or the time
        (:attr:`timeout_s`) ran out."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                client.wait_for_workers(self.n, timeout=self.poll_s)
                return
            except TimeoutError:
                pass
            self._note_jobs()
            states = self._states()
            if states is not None and len(self.job_ids) >= self.n:
                ended = [j for j in self.job_ids if _state(states, j) not in SLURM_ACTIVE_STATES]
                if ended:
                    raise WorkersError(
                        f"Slurm worker job {ended[0]} ended before all {self.n} workers had "
                        f"connected ({self._job(ended[0], states)})"
                    )
            if time.monotonic() > deadline:
                connected = len(client.nthreads())
                jobs = "; ".join(self._job(j, states) for j in self.job_ids) or "none submitted"
                raise WorkersError(
                    f"the Slurm workers did not start within {self.timeout_s:.0f} s: "
                    f"{connected} of {self.n} connected ({jobs}); to wait longer set "
                    f"{SLURM_WORKER_TIMEOUT_ENV}=SECONDS"
                )

    def check(self, client: Any) -> None:
        """While tasks run: an error once every worker is gone and no job can bring one back
        (every job ended, or none connected for :attr:`timeout_s` while Slurm does not say).

        Also when Slurm says every job has ended for ``SLURM_ENDED_GRACE_S`` although Dask
        still lists workers: a worker whose job ended is an orphan process, and waiting on it
        would never end. Slurm loses processes whose parent died before them wherever it
        tracks processes by parentage (``ProctrackType=proctrack/linuxproc``, no cgroups):
        ``scancel`` sends SIGTERM to the job's processes, the batch shell dies at once, its
        child (the worker's nanny, still closing, or a worker it restarts meanwhile) is
        reparented to init, and the SIGKILL that follows ``KillWait`` seconds later no longer
        finds it: the job is CANCELLED while the process lives on, connected."""
        if client.nthreads():
            self._empty_since = None
            if self._all_jobs_ended_for() > SLURM_ENDED_GRACE_S:
                raise WorkersError(
                    f"every Slurm worker was lost before the tasks finished{self.describe()}"
                )
            return
        self._ended_since = None
        now = time.monotonic()
        self._empty_since = self._empty_since or now
        self._note_jobs()
        states = self._states()
        if states is not None and any(
            _state(states, j) in SLURM_ACTIVE_STATES for j in self.job_ids
        ):
            if now - self._empty_since <= self.timeout_s:
                return
        elif states is None and now - self._empty_since <= self.timeout_s:
            return
        raise WorkersError(
            f"every Slurm worker was lost before the tasks finished{self.describe()}"
        )

    def _all_jobs_ended_for(self) -> float:
        """Seconds since Slurm first said none of the jobs is active (0: some is, or Slurm does
        not answer)."""
        self._note_jobs()
        states = self._states()
        if (
            states is None
            or not self.job_ids
            or any(_state(states, j) in SLURM_ACTIVE_STATES for j in self.job_ids)
        ):
            self._ended_since = None
            return 0.0
        now = time.monotonic()
        self._ended_since = self._ended_since or now
        return now - self._ended_since

    def describe(self, states: dict[str, JobInfo] | None = None) -> str:
        """`` (job 12 CANCELLED: <its log's telling line>; job 13 …)`` for an error line."""
        self._note_jobs()
        states = self._states() if states is None else states
        if not self.job_ids:
            return ""
        return " (" + "; ".join(self._job(j, states) for j in self.job_ids) + ")"

    def _job(self, job_id: str, states: dict[str, JobInfo] | None) -> str:
        """One job for an error line: its state and reason, and its log's telling line."""
        info = (states or {}).get(job_id)
        state = "state unknown" if states is None else str(info.state) if info else "ended"
        text = f"job {job_id} {state}"
        if info is not None and info.reason:
            text += f" ({info.reason})"
        line = _log_line(self.log_dir or Path.cwd(), job_id)
        return f"{text}: {line}" if line else text

    def finish(self, client: Any = None) -> None:
        """End the workers and clean up, within :data:`SLURM_FINISH_TIMEOUT_S` of the first
        scancel whatever state Dask is in; then remove :attr:`ClusterSpec.slurm_work_dir`.

        Slurm ends the jobs first: every job seen is cancelled before Dask is asked anything,
        because Dask's own close retires the workers gracefully and waits on them, which a
        worker blocked in a system call or an orphan process can stall. Then the ``client``
        (the runner's) and the cluster are closed, each within its share of the time, and
        given up on when they do not close in time (:func:`_close_within`); jobs submitted
        meanwhile are cancelled too; then, until the time is up, the jobs are waited for to
        leave the queue (a job still starting could write into the folder again).
        """
        deadline = time.monotonic() + SLURM_FINISH_TIMEOUT_S
        try:
            self._note_jobs()
            self._cancel()
            if client is not None:
                _close_within(client, min(deadline, time.monotonic() + SLURM_CLIENT_CLOSE_S))
            if self.cluster is not None:
                _close_within(self.cluster, min(deadline, time.monotonic() + SLURM_CLUSTER_CLOSE_S))
                known = len(self.job_ids)
                self._note_jobs()  # still being submitted by dask-jobqueue at the first look
                if len(self.job_ids) > known:
                    self._cancel()
            self._wait_until_gone(deadline)
        finally:
            if self.spec.slurm_work_dir is not None:
                shutil.rmtree(self.spec.slurm_work_dir, ignore_errors=True)

    def _cancel(self) -> None:
        """scancel every job seen (also those Dask forgot); Slurm ends their processes."""
        if self.job_ids:
            with _not_available(), contextlib.suppress(NoAnswer):
                scancel(self.job_ids, timeout_s=SLURM_COMMAND_TIMEOUT_S)

    def _wait_until_gone(self, deadline: float) -> None:
        """Wait until no job seen is left in the queue in a live state, or ``deadline``."""
        while self.job_ids and time.monotonic() < deadline:
            states = self._states()
            if states is None or not any(
                _state(states, j) in SLURM_LIVE_STATES for j in self.job_ids
            ):
                return
            time.sleep(SLURM_QUEUE_POLL_S)


def _close_within(thing: Any, deadline: float) -> None:
    """Close a Dask client or cluster, waiting at most until ``deadline``; give up on it otherwise.

    Their ``close(timeout=...)`` stops waiting at the timeout but leaves the object half
    closed, and Python would try again at exit without that bound (the client when it is
    collected, the cluster in distributed's atexit hook): a given-up object is marked closed
    and forgotten, so nothing waits on it again. Its jobs are cancelled already; a worker
    still connected notices its scheduler is gone and ends itself.
    """
    try:
        thing.close(timeout=max(deadline - time.monotonic(), 0.1))
    except (Exception, asyncio.CancelledError):  # timed out, or the connection is gone
        _forget(thing)


def _forget(thing: Any) -> None:
    """Mark a Dask client or cluster whose close was given up as closed (see _close_within)."""
    from distributed import Client
    from distributed.core import Status
    from distributed.deploy.spec import SpecCluster

    if isinstance(thing, Client):
        thing.status = "closed"  # else Client.__del__ closes it again, for up to 40 s
    elif isinstance(thing, SpecCluster):
        SpecCluster._instances.discard(thing)  # distributed's atexit close_clusters
        thing.status = Status.closed


def _slurm_cluster_class() -> Any:
    """dask-jobqueue's SLURMCluster, imported without its side effect on Ctrl-C.

    Importing ``dask_jobqueue`` replaces the process's SIGINT handler by one that calls
    ``sys.exit()`` (its ``runner`` module), which made Ctrl-C during a Slurm merge or analysis a
    silent exit with status 0 instead of "interrupted" (130). The handler in place before the
    import is put back.
    """
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    try:
        from dask_jobqueue import SLURMCluster
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)
    return SLURMCluster


def _state(states: dict[str, JobInfo], job_id: str) -> SlurmJobState | None:
    """squeue's state of ``job_id`` (None when squeue no longer lists it: it ended)."""
    info = states.get(job_id)
    return None if info is None else info.state


def _start_timeout(spec: ClusterSpec) -> float:
    """Seconds to wait for the workers: the spec's, else ``$RANKSCOPE_SLURM_WORKER_TIMEOUT``,
    else :data:`SLURM_WORKER_TIMEOUT_S`."""
    if spec.slurm_start_timeout_s is not None:
        return float(spec.slurm_start_timeout_s)
    text = os.environ.get(SLURM_WORKER_TIMEOUT_ENV, "").strip()
    if not text:
        return float(SLURM_WORKER_TIMEOUT_S)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise UsageError(f"{SLURM_WORKER_TIMEOUT_ENV}={text!r}: give a number of seconds > 0")
    return value


@contextlib.contextmanager
def _not_available() -> Iterator[None]:
    """A Slurm tool that is not on PATH as the workers' one line (exit status 2)."""
    try:
        yield
    except ToolMissing as exc:
        raise WorkersError(
            f"Slurm is not available here: `{exc.tool}` is not on PATH (--slurm-workers submits "
            "Slurm jobs; without Slurm use --scheduler)",
            exit_code=UsageError.exit_code,
        ) from None


def _log_line(folder: Path, job_id: str) -> str:
    """The telling line of a worker job's log (dask-jobqueue names them ``NAME-JOBID.err`` /
    ``.out``; Slurm's default is ``slurm-JOBID.out``): Slurm's own verdict
    (``slurmstepd: error: *** JOB 12 … CANCELLED …``), else the last error, else the last line."""
    lines: list[str] = []
    for pattern in (f"*-{job_id}.err", f"*-{job_id}.out", f"slurm-{job_id}.out"):
        for path in sorted(folder.glob(pattern)):
            try:
                with path.open("rb") as fh:
                    fh.seek(max(0, path.stat().st_size - 8192))
                    text = fh.read().decode(errors="replace")
            except OSError:
                continue
            lines += [line.strip() for line in text.splitlines() if line.strip()]
    for wanted in ("slurmstepd:", "error"):
        found = [line for line in lines if wanted in line.lower()]
        if found:
            return found[-1][:LOG_LINE_CHARS]
    return lines[-1][:LOG_LINE_CHARS] if lines else ""
