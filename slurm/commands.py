"""Slurm's command-line tools in Slurm's own words, for every floor that talks to Slurm.

Two parts of rankscope ask Slurm things: the Slurm launcher (``rankscope.launchers.slurm``:
sinfo, sacct, squeue, sbatch, scancel about a run's job) and the merge's and analysis' Slurm
workers (``rankscope.analysis.engine.slurm_workers``: sbatch, squeue, scancel about the worker
jobs). The launchers and the analysis may not import each other, so what both need lives here,
on the shared floor, written once:

* :func:`run_tool` — the one way to run a Slurm tool: a bounded wait, and a missing tool and a
  tool that does not answer in time told apart as :class:`ToolMissing` and :class:`NoAnswer`,
  which each caller turns into its own one-line error (the launcher's ``SlurmError``, the
  workers' ``WorkersError``). They are not ``RankscopeError``: one that a caller forgot to
  translate is a bug and keeps its traceback.
* :class:`SlurmJobState` — a job's state as ``sacct``/``squeue`` print it; what a state means to
  a caller (the launcher's ``RunState``, the workers' "may still connect") is the caller's.
* :func:`sacct_job` / :func:`parse_sacct` and :func:`squeue` / :func:`parse_squeue` — the two
  ways to ask about jobs and the parsing of their output into :class:`JobInfo`.
* :func:`scancel`, and :func:`error_line`: what a tool said went wrong, in one line.

Units: every time is in seconds (``timeout_s``); job ids are Slurm's, as strings. Imports
nothing of rankscope: the floors above import this module, never the other way round.
"""

from __future__ import annotations

import enum
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

#: The columns :func:`sacct_job` asks for (``--parsable2``: ``|`` between them), in order.
SACCT_FORMAT = "JobIDRaw,State,ExitCode,NodeList,Elapsed,Reason"
#: The columns :func:`squeue` asks for: job id, state (long form), nodes, run time, reason.
SQUEUE_FORMAT = "%i|%T|%N|%M|%r"
#: What squeue says (lower case) about job ids it no longer knows: they left the queue long ago.
INVALID_JOB_ID = "invalid job id"
#: Reasons that mean "no reason" (squeue and sacct print them for jobs that are not waiting).
NO_REASON = frozenset({"None", "(null)"})


class SlurmJobState(enum.StrEnum):
    """A job's state as ``sacct``/``squeue`` print it (first word; ``CANCELLED by 0`` → CANCELLED).

    Every state squeue's and sacct's manuals list ("JOB STATE CODES"), long form.
    """

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
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


class SlurmCommandError(Exception):
    """A Slurm tool could not be asked (see :class:`ToolMissing`, :class:`NoAnswer`)."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(message)
        self.tool = tool


class ToolMissing(SlurmCommandError):
    """The tool is not on the PATH the command would run with: no Slurm here."""

    def __init__(self, tool: str) -> None:
        super().__init__(tool, f"`{tool}` is not on PATH")


class NoAnswer(SlurmCommandError):
    """The tool did not end within its bound (``timeout_s``); it has been killed."""

    def __init__(self, tool: str, timeout_s: float) -> None:
        super().__init__(tool, f"`{tool}` did not answer within {timeout_s:g} s")
        self.timeout_s = timeout_s


def missing_tool(tools: Iterable[str], env: Mapping[str, str] | None = None) -> str | None:
    """The first of ``tools`` not on ``env``'s PATH (this process's without ``env``), else None."""
    path = (os.environ if env is None else env).get("PATH")
    return next((tool for tool in tools if shutil.which(tool, path=path) is None), None)


def run_tool(
    args: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run one Slurm tool and wait at most ``timeout_s`` for it; its exit status is the caller's.

    ``env`` is the tool's whole environment (this process's without it; its PATH is where the
    tool is looked for), ``stdin`` its input. Raises :class:`ToolMissing` when the tool is not
    on that PATH, :class:`NoAnswer` when it did not end in time (it is killed first).
    """
    tool = args[0]
    if missing_tool([tool], env) is not None:
        raise ToolMissing(tool)
    try:
        return subprocess.run(
            list(args),
            input=stdin,
            capture_output=True,
            text=True,
            env=None if env is None else dict(env),
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:  # removed between the look and the start
        raise ToolMissing(tool) from None
    except subprocess.TimeoutExpired:
        raise NoAnswer(tool, timeout_s) from None


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
    """Why the job waits or ended as it did, when Slurm gives one (``""`` for ``None``)."""


def parse_state(text: str) -> SlurmJobState | None:
    """The state in a sacct/squeue state column (``CANCELLED by 0``, sacct's truncated
    ``PENDING+``); None for a word that is no state."""
    word = text.strip().split(" ")[0].rstrip("+")
    try:
        return SlurmJobState(word)
    except ValueError:
        return None


def _reason(text: str) -> str:
    """A reason column, ``""`` when it says there is none."""
    text = text.strip()
    return "" if text in NO_REASON else text


def sacct_job(
    job_id: str, *, timeout_s: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Ask accounting about the allocation of ``job_id`` (read it with :func:`parse_sacct`).

    Raises :class:`ToolMissing` / :class:`NoAnswer` (:func:`run_tool`).
    """
    args = [
        "sacct",
        "--allocations",
        "--noheader",
        "--parsable2",
        "--starttime=2000-01-01",
        f"--jobs={job_id}",
        f"--format={SACCT_FORMAT}",
    ]
    return run_tool(args, timeout_s=timeout_s, env=env)


def parse_sacct(job_id: str, stdout: str) -> JobInfo | None:
    """The allocation line of ``job_id`` in sacct's output (:data:`SACCT_FORMAT`); None if absent.

    The exit code ``CODE:SIGNAL`` becomes CODE, or 128 + SIGNAL when a signal ended the script;
    the reason is kept for a pending job only (sacct's is the one the job was submitted with).
    """
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 6 or parts[0] != str(job_id):
            continue
        state = parse_state(parts[1])
        if state is None:
            continue
        code, _, sig = parts[2].partition(":")
        exit_code: int | None = None
        if code.isdigit():
            exit_code = int(code)
            if exit_code == 0 and sig.isdigit() and int(sig):
                exit_code = 128 + int(sig)
        reason = _reason(parts[5]) if state == SlurmJobState.PENDING else ""
        return JobInfo(str(job_id), state, exit_code, parts[3], parts[4], reason)
    return None


def squeue(
    job_ids: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    all_states: bool = False,
) -> dict[str, JobInfo] | None:
    """The queue's view of ``job_ids``: ``{job id: JobInfo}`` of those it lists (a job that has
    left the queue is absent; ``{}`` when squeue says the ids are no longer valid); None when
    squeue fails otherwise. ``all_states``: also jobs that have just ended (``--states=all``).

    Raises :class:`ToolMissing` / :class:`NoAnswer` (:func:`run_tool`).
    """
    args = ["squeue", "--noheader"]
    if all_states:
        args.append("--states=all")
    args += [f"--jobs={','.join(job_ids)}", f"--format={SQUEUE_FORMAT}"]
    res = run_tool(args, timeout_s=timeout_s, env=env)
    if res.returncode != 0:
        return {} if INVALID_JOB_ID in res.stderr.lower() else None
    return parse_squeue(res.stdout)


def parse_squeue(stdout: str) -> dict[str, JobInfo]:
    """squeue's lines (:data:`SQUEUE_FORMAT`) as ``{job id: JobInfo}``, in their order; a line
    whose state is no :class:`SlurmJobState` is left out."""
    jobs: dict[str, JobInfo] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|", 4)
        if len(parts) < 5 or not parts[0]:
            continue
        state = parse_state(parts[1])
        if state is not None:
            jobs[parts[0]] = JobInfo(parts[0], state, None, parts[2], parts[3], _reason(parts[4]))
    return jobs


def scancel(
    job_ids: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Cancel jobs (Slurm sends SIGTERM to their steps, SIGKILL ``KillWait`` seconds later).

    Raises :class:`ToolMissing` / :class:`NoAnswer` (:func:`run_tool`).
    """
    return run_tool(["scancel", *map(str, job_ids)], timeout_s=timeout_s, env=env)


class Otherwise(enum.Enum):
    """Which line :func:`error_line` gives when no line says "error"."""

    FIRST = "first"
    """The first line (a tool that says one thing first: sbatch's "unrecognized option")."""
    LAST = "last"
    """The last line (a log or an output whose conclusion comes last)."""


def error_line(text: str, *, otherwise: Otherwise = Otherwise.FIRST) -> str:
    """What a Slurm tool said went wrong, for a one-line message: its first line that says
    "error" (any case; the specific one: sbatch follows it with a generic "Batch job submission
    failed"), else its first or last line (``otherwise``), stripped; ``""`` when it said
    nothing. The caller words the empty case and cuts the line to its own length."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    if errors:
        return errors[0]
    if not lines:
        return ""
    return lines[0] if otherwise is Otherwise.FIRST else lines[-1]
