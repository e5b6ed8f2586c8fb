"""Slurm workers for :func:`rankscope.analysis.scheduler.run_each`: a dask-jobqueue SLURMCluster
whose jobs are submitted, waited for, watched, cancelled and cleaned up in Slurm's own words.

``--slurm-workers N`` (``ClusterSpec.slurm_workers``) fails in ways a local pool does not: sbatch
refuses the job, the jobs wait in the queue, a job is cancelled or dies while its worker holds
tasks. dask-jobqueue submits from its event loop and only logs what goes wrong there, and Dask
waits forever for workers nobody will submit again; so each case is checked here and ends the
run with ONE :class:`~rankscope.analysis.scheduler.WorkersError` line (sbatch's refusal,
``squeue``'s state and reason, the telling line of the job's log), never a hang or a traceback.
When the run ends, however it ends, the jobs are cancelled and, once they have left the queue,
``ClusterSpec.slurm_work_dir`` (their logs and Dask's scratch space) is removed.

Kept apart from the scheduler module, as the launchers keep their Slurm backend apart by role:
the runner's loop calls only :meth:`SlurmWorkers.check` between two waits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.analysis.scheduler import WorkersError
from rankscope.errors import UsageError

if TYPE_CHECKING:
    from rankscope.analysis.scheduler import ClusterSpec

#: How long to wait for SLURMCluster workers to come up, in seconds (a queue can be slow).
SLURM_WORKER_TIMEOUT_S = 300
#: Environment variable overriding :data:`SLURM_WORKER_TIMEOUT_S` (busy clusters, tests).
SLURM_WORKER_TIMEOUT_ENV = "RANKSCOPE_SLURM_WORKER_TIMEOUT"
#: Seconds between two looks at the Slurm jobs while waiting for workers or results.
SLURM_POLL_S = 5.0
#: Seconds every worker job may have ended while Dask still lists workers (orphans) before the
#: merge or analysis gives up with one line.
SLURM_ENDED_GRACE_S = 30.0
#: Seconds to wait, once the workers are cancelled, for their jobs to leave the queue before
#: their folder is removed (a job still starting could write into it again).
SLURM_JOBS_GONE_TIMEOUT_S = 60.0
#: Seconds any one sbatch/squeue call may take.
SLURM_COMMAND_TIMEOUT_S = 30.0
#: Slurm job states (``squeue %T``) in which a worker job may still connect or is connected.
SLURM_ACTIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"}
)
#: Slurm job states in which a job's processes may still run (it is not gone yet).
SLURM_LIVE_STATES = SLURM_ACTIVE_STATES | {"COMPLETING", "SIGNALING", "STAGE_OUT"}
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
        res = _slurm_command(["sbatch", "--test-only"], script)
        if res is None:
            raise WorkersError(
                f"--slurm-workers: sbatch did not answer within {SLURM_COMMAND_TIMEOUT_S:.0f} s",
                exit_code=UsageError.exit_code,
            )
        if res.returncode != 0:
            raise WorkersError(
                f"--slurm-workers {self.n}: sbatch refused the worker job: "
                f"{_error_line(res.stderr + res.stdout) or f'exit status {res.returncode}'}",
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

    def _states(self) -> dict[str, tuple[str, str]] | None:
        """``{job id: (state, reason)}`` from squeue for the known jobs (a job squeue no longer
        lists is missing); None when Slurm does not answer."""
        if not self.job_ids:
            return {}
        res = _slurm_command(
            [
                "squeue",
                "--noheader",
                "--states=all",
                f"--jobs={','.join(self.job_ids)}",
                "--format=%i|%T|%r",
            ]
        )
        if res is None:
            return None
        if res.returncode != 0:
            return {} if "Invalid job id" in res.stderr else None
        states: dict[str, tuple[str, str]] = {}
        for line in res.stdout.splitlines():
            job_id, _, rest = line.strip().partition("|")
            state, _, reason = rest.partition("|")
            if job_id:
                states[job_id] = (state, reason)
        return states

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
                        f"Slurm worker job {ended[0]} ended before its worker connected "
                        f"({self._job(ended[0], states)})"
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
        still lists workers: a worker whose job ended is an orphan process (a task blocked in
        a system call can keep it up after ``scancel``), and waiting on it would never end."""
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

    def describe(self, states: dict[str, tuple[str, str]] | None = None) -> str:
        """`` (job 12 CANCELLED: <its log's telling line>; job 13 …)`` for an error line."""
        self._note_jobs()
        states = self._states() if states is None else states
        if not self.job_ids:
            return ""
        return " (" + "; ".join(self._job(j, states) for j in self.job_ids) + ")"

    def _job(self, job_id: str, states: dict[str, tuple[str, str]] | None) -> str:
        """One job for an error line: its state and reason, and its log's telling line."""
        state = _state(states, job_id) if states is not None else "state unknown"
        reason = (states or {}).get(job_id, ("", ""))[1]
        text = f"job {job_id} {state or 'ended'}"
        if reason and reason not in ("None", "(null)"):
            text += f" ({reason})"
        line = _log_line(self.log_dir or Path.cwd(), job_id)
        return f"{text}: {line}" if line else text

    def finish(self) -> None:
        """Close the cluster, cancel every job it submitted, wait until they have left the
        queue, then remove :attr:`ClusterSpec.slurm_work_dir` (nothing writes there any more)."""
        try:
            if self.cluster is not None:
                self._note_jobs()
                self.cluster.close()  # cancels the jobs it still knows
        finally:
            try:
                self._cancel_and_wait()
            finally:
                if self.spec.slurm_work_dir is not None:
                    shutil.rmtree(self.spec.slurm_work_dir, ignore_errors=True)

    def _cancel_and_wait(self) -> None:
        """scancel every job seen (also those Dask forgot), then wait (bounded) until none is
        left in the queue: a job still starting could create its log or scratch space again."""
        if not self.job_ids:
            return
        _slurm_command(["scancel", *self.job_ids])
        deadline = time.monotonic() + SLURM_JOBS_GONE_TIMEOUT_S
        while time.monotonic() < deadline:
            states = self._states()
            if states is None or not any(
                _state(states, j) in SLURM_LIVE_STATES for j in self.job_ids
            ):
                return
            time.sleep(0.5)


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


def _state(states: dict[str, tuple[str, str]], job_id: str) -> str:
    """squeue's state of ``job_id`` (``""`` when squeue no longer lists it: it ended)."""
    return states.get(job_id, ("", ""))[0]


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


def _slurm_command(
    args: list[str], stdin: str | None = None
) -> subprocess.CompletedProcess[str] | None:
    """Run one Slurm command; None when it did not answer in time. A missing command is the
    one-line "Slurm is not available here" error."""
    try:
        return subprocess.run(
            args,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=SLURM_COMMAND_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise WorkersError(
            f"Slurm is not available here: `{args[0]}` is not on PATH (--slurm-workers submits "
            "Slurm jobs; without Slurm use --scheduler)",
            exit_code=UsageError.exit_code,
        ) from None
    except subprocess.TimeoutExpired:
        return None


def _last_line(text: str) -> str:
    """The last non-empty line of ``text``, stripped and cut to :data:`LOG_LINE_CHARS`."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:LOG_LINE_CHARS] if lines else ""


def _error_line(text: str) -> str:
    """What a Slurm command said went wrong: its first ``error:`` line (the specific one; sbatch
    follows it with a generic "Batch job submission failed"), else its last line."""
    errors = [line.strip() for line in text.splitlines() if "error:" in line]
    return errors[0][:LOG_LINE_CHARS] if errors else _last_line(text)


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
