"""The launcher's questions to Slurm: is there a cluster (sinfo), how is the job (sacct/squeue),
the merge job (sbatch), cancel (scancel) — and the launcher's words for Slurm's answers.

The tools run through :mod:`rankscope.slurm.commands` (the one way to run them, their output's
parsing, :class:`~rankscope.slurm.commands.SlurmJobState`, shared with the Slurm workers of the
merge and the analysis); this module bounds every call by :data:`COMMAND_TIMEOUT_S` (seconds)
and turns a missing tool, an unreachable controller or a refusal into one :class:`SlurmError`
line that says how to get a cluster, and says what a Slurm state means to a run
(:func:`run_state`: ``RunState`` is the launchers'). Job states come from ``sacct`` (accounting is
required: without it a finished job is invisible), falling back to ``squeue`` while the job is
queued or running.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

from rankscope.errors import RankscopeError
from rankscope.launchers import rundir
from rankscope.launchers.rundir import RunState
from rankscope.slurm.commands import (
    JobInfo,
    NoAnswer,
    SlurmJobState,
    ToolMissing,
    error_line,
    missing_tool,
    parse_sacct,
    run_tool,
    sacct_job,
    squeue,
)
from rankscope.slurm.commands import scancel as scancel_jobs

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


#: What each Slurm job state means to a run (any other: it failed).
_RUN_STATES: dict[SlurmJobState, RunState] = {
    SlurmJobState.PENDING: RunState.QUEUED,
    SlurmJobState.CONFIGURING: RunState.QUEUED,
    SlurmJobState.REQUEUED: RunState.QUEUED,
    SlurmJobState.REQUEUE_HOLD: RunState.QUEUED,
    SlurmJobState.REQUEUE_FED: RunState.QUEUED,
    SlurmJobState.RESV_DEL_HOLD: RunState.QUEUED,
    SlurmJobState.RUNNING: RunState.RUNNING,
    SlurmJobState.COMPLETING: RunState.RUNNING,
    SlurmJobState.SIGNALING: RunState.RUNNING,
    SlurmJobState.STAGE_OUT: RunState.RUNNING,
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


def run_state(state: SlurmJobState) -> RunState:
    """The rankscope state a Slurm job state means."""
    return _RUN_STATES.get(state, RunState.FAILED)


def slurm_env(slurm_conf: str | None = None) -> dict[str, str]:
    """This process's environment, with ``SLURM_CONF`` from ``run.json`` when the shell has none."""
    env = dict(os.environ)
    if slurm_conf and not env.get("SLURM_CONF"):
        env["SLURM_CONF"] = slurm_conf
    return env


def _not_available(tool: str) -> SlurmError:
    """The one line for a Slurm tool that is not on PATH."""
    return SlurmError(f"Slurm is not available here: `{tool}` is not on PATH; {LOCAL_CLUSTER_HINT}")


@contextlib.contextmanager
def _slurm_errors() -> Iterator[None]:
    """A Slurm tool that is missing or does not answer in time, as one :class:`SlurmError` line."""
    try:
        yield
    except ToolMissing as exc:
        raise _not_available(exc.tool) from None
    except NoAnswer as exc:
        raise SlurmError(
            f"`{exc.tool}` did not answer within {exc.timeout_s:.0f} s; is slurmctld up?"
        ) from exc


def first_line(text: str) -> str:
    """What a tool said went wrong (:func:`~rankscope.slurm.commands.error_line`), for a one-line
    message; ``no output`` when it said nothing."""
    return error_line(text) or "no output"


def check_slurm(partition: str | None = None, env: dict[str, str] | None = None) -> list[str]:
    """Check that sbatch exists, the controller answers and ``partition`` exists; return partitions.

    Raises :class:`SlurmError` naming what is missing and how to get a cluster.
    """
    env = dict(os.environ) if env is None else env
    missing = missing_tool(("sbatch", "sinfo", "sacct", "squeue", "scancel"), env)
    if missing is not None:
        raise _not_available(missing)
    conf = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if env.get("SLURM_CONF") and not Path(conf).is_file():
        # sinfo retries a missing configuration file for 60 s before it gives up: say it at once
        raise SlurmError(
            f"cannot reach the Slurm controller (SLURM_CONF={conf}): the file does not exist; {LOCAL_CLUSTER_HINT}"
        )
    with _slurm_errors():
        res = run_tool(["sinfo", "--noheader", "--format=%P"], timeout_s=COMMAND_TIMEOUT_S, env=env)
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


def query_job(job_id: str, env: dict[str, str] | None = None) -> JobInfo | None:
    """The job's state from accounting (sacct), else from the queue (squeue); None if unknown.

    A job that accounting says is still PENDING is looked up in the queue too: sacct's
    ``Reason`` is the one slurmctld had set when it sent the job's record, which can be before
    the scheduler gave the job its reason, and it is not updated while the job waits (seen: a
    job held by ``--begin`` showed reason ``None`` in sacct for minutes while squeue said
    ``BeginTime``). The queue is slurmctld's live view, so its state and reason win while the
    job has not ended.
    """
    with _slurm_errors():
        res = sacct_job(job_id, timeout_s=COMMAND_TIMEOUT_S, env=env)
        accounted = parse_sacct(job_id, res.stdout) if res.returncode == 0 else None
        if accounted is not None and accounted.state != SlurmJobState.PENDING:
            return accounted
        sacct_error = "" if res.returncode == 0 else first_line(res.stderr)
        # not in accounting yet (just submitted), still pending, or no accounting: ask the queue
        listed = squeue([job_id], timeout_s=COMMAND_TIMEOUT_S, env=env)
    queued = (listed or {}).get(str(job_id))
    if accounted is not None:
        # The queue may say the job has just ended: its exit code is accounting's, so accounting's
        # record stands until it says so too.
        return queued if queued is not None and not run_state(queued.state).finished else accounted
    if queued is not None:
        return queued
    if sacct_error:
        if listed is not None:  # squeue answered (or no longer knows the id): the job has left
            raise SlurmError(
                f"job {job_id} has left the queue and Slurm accounting does not answer "
                f"({sacct_error}): its final state is unknown (slurmdbd is required)"
            )
        raise SlurmError(f"cannot ask Slurm about job {job_id}: {sacct_error}")
    return None


def scancel(job_id: str, env: dict[str, str] | None = None) -> None:
    """Cancel a job (Slurm sends SIGTERM to its steps, SIGKILL ``KillWait`` seconds later)."""
    with _slurm_errors():
        res = scancel_jobs([job_id], timeout_s=COMMAND_TIMEOUT_S, env=env)
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
    with _slurm_errors():
        res = run_tool(cmd, timeout_s=COMMAND_TIMEOUT_S, env=env)
    merge_id = res.stdout.strip().split(";")[0]
    if res.returncode != 0 or not merge_id.isdigit():
        raise SlurmError(f"sbatch refused the merge job: {first_line(res.stderr or res.stdout)}")
    return merge_id
