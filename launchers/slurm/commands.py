"""Slurm's command-line tools, wrapped: sinfo, sacct/squeue, sbatch (the merge job) and scancel.

Every call has a time limit (:data:`COMMAND_TIMEOUT_S`) and turns a missing tool, an unreachable
controller or a refusal into one :class:`SlurmError` line that says how to get a cluster. Job
states come from ``sacct`` (accounting is required: without it a finished job is invisible),
falling back to ``squeue`` while the job is queued or running.
"""

from __future__ import annotations

import enum
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rankscope.errors import RankscopeError
from rankscope.launchers import rundir
from rankscope.launchers.rundir import RunState

#: Output of the merge job inside ``RUN/logs`` (``%j`` = its job id).
MERGE_LOG = "merge-%j.out"
#: Time limit of the merge job, in minutes.
MERGE_TIME_MIN = 30
#: The ``rankscope`` command the merge job runs (``rankscope finalize RUN``; hidden from --help).
FINALIZE_COMMAND = "finalize"
#: Seconds one sacct/squeue/sinfo/sbatch/scancel call may take.
COMMAND_TIMEOUT_S = 60.0
#: How to bring up a cluster, for messages about a missing one.
LOCAL_CLUSTER_HINT = (
    "start the local test cluster with `bash slurm/slurm-up.sh` and "
    "`source /tmp/rankscope-slurm/env.sh`, or run locally without --slurm"
)


class SlurmError(RankscopeError):
    """Slurm is missing, unreachable, or refused the job (one line, exit status 2)."""

    exit_code = 2


class SlurmJobState(enum.StrEnum):
    """A job's state as ``sacct``/``squeue`` print it (first word; ``CANCELLED by 0`` → CANCELLED)."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    REQUEUED = "REQUEUED"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"
    RESIZING = "RESIZING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    DEADLINE = "DEADLINE"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    PREEMPTED = "PREEMPTED"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"

    @property
    def run_state(self) -> RunState:
        """The rankscope state this Slurm state means."""
        return _RUN_STATES.get(self, RunState.FAILED)


_RUN_STATES: dict[SlurmJobState, RunState] = {
    SlurmJobState.PENDING: RunState.QUEUED,
    SlurmJobState.CONFIGURING: RunState.QUEUED,
    SlurmJobState.REQUEUED: RunState.QUEUED,
    SlurmJobState.RUNNING: RunState.RUNNING,
    SlurmJobState.COMPLETING: RunState.RUNNING,
    SlurmJobState.SUSPENDED: RunState.RUNNING,
    SlurmJobState.STOPPED: RunState.RUNNING,
    SlurmJobState.RESIZING: RunState.RUNNING,
    SlurmJobState.COMPLETED: RunState.COMPLETED,
    SlurmJobState.CANCELLED: RunState.CANCELLED,
    SlurmJobState.PREEMPTED: RunState.CANCELLED,
    SlurmJobState.REVOKED: RunState.CANCELLED,
    SlurmJobState.TIMEOUT: RunState.TIMEOUT,
    SlurmJobState.DEADLINE: RunState.TIMEOUT,
}


def slurm_env(slurm_conf: str | None = None) -> dict[str, str]:
    """This process's environment, with ``SLURM_CONF`` from ``run.json`` when the shell has none."""
    env = dict(os.environ)
    if slurm_conf and not env.get("SLURM_CONF"):
        env["SLURM_CONF"] = slurm_conf
    return env


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command; SlurmError when it is missing or does not answer in time."""
    if shutil.which(cmd[0], path=(env or os.environ).get("PATH")) is None:
        raise SlurmError(
            f"Slurm is not available here: `{cmd[0]}` is not on PATH; {LOCAL_CLUSTER_HINT}"
        )
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(
            f"`{cmd[0]}` did not answer within {COMMAND_TIMEOUT_S:.0f} s; is slurmctld up?"
        ) from exc


def first_line(text: str) -> str:
    """The first line of a tool's output that says "error", else its first line: one-line messages."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[0]


def check_slurm(partition: str | None = None, env: dict[str, str] | None = None) -> list[str]:
    """Check that sbatch exists, the controller answers and ``partition`` exists; return partitions.

    Raises :class:`SlurmError` naming what is missing and how to get a cluster.
    """
    env = dict(os.environ) if env is None else env
    for tool in ("sbatch", "sinfo", "sacct", "squeue", "scancel"):
        if shutil.which(tool, path=env.get("PATH")) is None:
            raise SlurmError(
                f"Slurm is not available here: `{tool}` is not on PATH; {LOCAL_CLUSTER_HINT}"
            )
    conf = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if env.get("SLURM_CONF") and not Path(conf).is_file():
        # sinfo retries a missing configuration file for 60 s before it gives up: say it at once
        raise SlurmError(
            f"cannot reach the Slurm controller (SLURM_CONF={conf}): the file does not exist; {LOCAL_CLUSTER_HINT}"
        )
    res = _run(["sinfo", "--noheader", "--format=%P"], env)
    if res.returncode != 0:
        raise SlurmError(
            f"cannot reach the Slurm controller (SLURM_CONF={conf}): {first_line(res.stderr)}; {LOCAL_CLUSTER_HINT}"
        )
    partitions = [p.strip() for p in res.stdout.split() if p.strip()]
    names = [p.rstrip("*") for p in partitions]
    if partition is not None and partition not in names:
        raise SlurmError(
            f"Slurm partition {partition!r} does not exist (partitions: {', '.join(partitions) or 'none'}); "
            "pick one with --partition or $RANKSCOPE_SLURM_PARTITION"
        )
    if partition is None and not any(p.endswith("*") for p in partitions):
        raise SlurmError(
            f"the cluster has no default partition; give --partition (partitions: {', '.join(names) or 'none'})"
        )
    return names


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about one job."""

    job_id: str
    """The job id."""
    state: SlurmJobState
    """Its state (first word of sacct's/squeue's)."""
    exit_code: int | None = None
    """Exit status of the batch script; 128 + N when a signal N ended it; None if unknown."""
    nodelist: str = ""
    """Nodes it ran on (Slurm's compressed form, e.g. ``n[1-2]``)."""
    elapsed: str = ""
    """Run time as Slurm prints it (``[D-]HH:MM:SS``)."""
    reason: str = ""
    """Why a pending job waits (squeue's reason), when known."""


def _parse_state(text: str) -> SlurmJobState | None:
    word = text.strip().split(" ")[0].rstrip("+")
    try:
        return SlurmJobState(word)
    except ValueError:
        return None


def query_job(job_id: str, env: dict[str, str] | None = None) -> JobInfo | None:
    """The job's state from accounting (sacct), else from the queue (squeue); None if unknown.

    A job that accounting says is still PENDING is looked up in the queue too: sacct's
    ``Reason`` is the one slurmctld had set when it sent the job's record, which can be before
    the scheduler gave the job its reason, and it is not updated while the job waits (seen: a
    job held by ``--begin`` showed reason ``None`` in sacct for minutes while squeue said
    ``BeginTime``). The queue is slurmctld's live view, so its state and reason win while the
    job has not ended.
    """
    res = _run(
        [
            "sacct",
            "--allocations",
            "--noheader",
            "--parsable2",
            "--starttime=2000-01-01",
            f"--jobs={job_id}",
            "--format=JobIDRaw,State,ExitCode,NodeList,Elapsed,Reason",
        ],
        env,
    )
    accounted = _sacct_job(job_id, res.stdout) if res.returncode == 0 else None
    if accounted is not None and accounted.state != SlurmJobState.PENDING:
        return accounted
    sacct_error = "" if res.returncode == 0 else first_line(res.stderr)
    # not in accounting yet (just submitted), still pending, or no accounting: ask the queue
    res = _run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%N|%M|%r"], env)
    queued = _squeue_job(job_id, res.stdout) if res.returncode == 0 else None
    if accounted is not None:
        # The queue may say the job has just ended: its exit code is accounting's, so accounting's
        # record stands until it says so too.
        return queued if queued is not None and not queued.state.run_state.finished else accounted
    if queued is not None:
        return queued
    if sacct_error:
        if res.returncode == 0 or "invalid job id" in res.stderr.lower():
            raise SlurmError(
                f"job {job_id} has left the queue and Slurm accounting does not answer "
                f"({sacct_error}): its final state is unknown (slurmdbd is required)"
            )
        raise SlurmError(f"cannot ask Slurm about job {job_id}: {sacct_error}")
    return None


def _sacct_job(job_id: str, stdout: str) -> JobInfo | None:
    """The allocation line of ``job_id`` in sacct's ``--parsable2`` output (query_job's format)."""
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 6 or parts[0] != str(job_id):
            continue
        state = _parse_state(parts[1])
        if state is None:
            continue
        code, _, sig = parts[2].partition(":")
        exit_code: int | None = None
        if code.isdigit():
            exit_code = int(code)
            if exit_code == 0 and sig.isdigit() and int(sig):
                exit_code = 128 + int(sig)
        reason = parts[5] if state == SlurmJobState.PENDING and parts[5] != "None" else ""
        return JobInfo(str(job_id), state, exit_code, parts[3], parts[4], reason)
    return None


def _squeue_job(job_id: str, stdout: str) -> JobInfo | None:
    """The job in squeue's ``%T|%N|%M|%r`` output (query_job's format)."""
    for line in stdout.splitlines():
        parts = line.split("|")
        state = _parse_state(parts[0])
        if state is not None:
            reason = parts[3] if len(parts) > 3 and parts[3] != "None" else ""
            return JobInfo(str(job_id), state, None, parts[1], parts[2], reason)
    return None


def scancel(job_id: str, env: dict[str, str] | None = None) -> None:
    """Cancel a job (Slurm sends SIGTERM to its steps, SIGKILL ``KillWait`` seconds later)."""
    res = _run(["scancel", str(job_id)], env)
    if res.returncode != 0:
        raise SlurmError(f"scancel {job_id} failed: {first_line(res.stderr)}")


def submit_merge_job(
    run_dir: Path,
    job_id: str,
    *,
    partition: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    name: str = "rankscope-merge",
    env: dict[str, str] | None = None,
) -> str:
    """Submit the job that finalises and merges ``run_dir`` once job ``job_id`` ends (any way).

    It runs ``python -m rankscope finalize RUN`` (the orchestrator's hidden command): a command
    line, so this floor names the command without importing the floor above.
    """
    command = shlex.join([sys.executable, "-m", "rankscope", FINALIZE_COMMAND, str(run_dir)])
    cmd = [
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        f"--dependency=afterany:{job_id}",
        "--kill-on-invalid-dep=no",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=1",
        f"--time={MERGE_TIME_MIN}",
        f"--output={run_dir / rundir.LOGS_DIR / MERGE_LOG}",
        f"--chdir={run_dir}",
    ]
    for flag, value in (("partition", partition), ("account", account), ("qos", qos)):
        if value:
            cmd.append(f"--{flag}={value}")
    cmd.append(f"--wrap={command}")
    res = _run(cmd, env)
    merge_id = res.stdout.strip().split(";")[0]
    if res.returncode != 0 or not merge_id.isdigit():
        raise SlurmError(f"sbatch refused the merge job: {first_line(res.stderr or res.stdout)}")
    return merge_id
