"""What rankscope records about a Slurm job: ``run.json``'s ``slurm`` object and the task records.

``run.json`` holds ``slurm: {job_id, merge_job_id, state, exit_code, tasks, merge, …}``
(docs/slurm.md); :func:`update_slurm` changes it, :func:`merge_state` reads the merge job's
:class:`MergeState`. Per-task states come from the records each node task writes in
``RUN/slurm/`` (:data:`TASK_FORMAT`) when it starts and when its torchrun ends: written by the
node body (``slurm_node.py``), read here for ``rankscope status`` and the launcher. All of it
works from another shell after the submitting process has exited: :class:`SlurmJobRef`, the
launcher's handle on a job, is rebuilt from ``run.json`` alone.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.launchers import rundir
from rankscope.launchers.rundir import RunState, load_run, update_run
from rankscope.launchers.slurm.commands import SlurmError, query_job, run_state, slurm_env

#: Folder of the Slurm records inside the run directory (rendezvous and per-task files).
SLURM_DIR = "slurm"
#: Record each node task writes when it starts and when torchrun ends.
TASK_FORMAT = "task-{job_id}-{node:03d}.json"
TASK_GLOB = "task-{job_id}-*.json"


class MergeState(enum.StrEnum):
    """Life of the dependent merge job, as recorded in ``run.json`` (``slurm.merge.state``)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    """No rank wrote a window (e.g. the job was cancelled while queued): nothing to merge."""

    @property
    def finished(self) -> bool:
        """True once the merge job can no longer change."""
        return self not in (MergeState.PENDING, MergeState.RUNNING)


#: Signals with which a failing job's teardown ends the ranks still running (torchrun and srun
#: send SIGTERM; Ctrl-C is SIGINT): a rank ended by one of them is a victim, not a cause.
TEARDOWN_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def root_cause_across_nodes(failures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The root cause among every node's failures (each node's torchrun names its own first
    failure ``root_cause``, not the job's).

    A rank that another signal ended (SIGKILL from the OOM killer or a user, SIGSEGV, SIGBUS…)
    cannot be the consequence of another rank's error on another node: the teardown that follows
    an error sends SIGTERM. The ranks that raised errors meanwhile are its victims (a collective
    whose peer vanished: "Connection closed by peer"). So when some ranks died of such signals
    and others of errors, only the former are root causes; otherwise the nodes' words stand."""
    killed = [
        f
        for f in failures
        if isinstance(f.get("exit_code"), int)
        and f["exit_code"] < 0
        and -f["exit_code"] not in TEARDOWN_SIGNALS
    ]
    if killed and len(killed) < len(failures):
        for f in failures:
            f["root_cause"] = any(f is k for k in killed)
    return failures


def read_task_records(run_dir: Path, job_id: str) -> dict[int, dict[str, Any]]:
    """The per-node task records of job ``job_id`` by node index (unreadable ones skipped)."""
    out: dict[int, dict[str, Any]] = {}
    folder = Path(run_dir) / SLURM_DIR
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob(TASK_GLOB.format(job_id=job_id))):
        try:
            data = rundir.read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("node"), int):
            out[data["node"]] = data
    return out


def task_states(run_dir: Path, record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per node task: node, host, state, exit code — for ``rankscope status``.

    A task that never wrote a record is ``queued`` while the job waits, else the job's state;
    a task still ``running`` in a finished job, or ended by a cancel or the time limit, takes
    the job's state (``cancelled``, ``timeout``).
    """
    slurm = record.get("slurm") or {}
    job_id = str(slurm.get("job_id", ""))
    nodes = int(slurm.get("nodes") or record.get("nnodes") or 1)
    job_state = RunState(record.get("state", RunState.QUEUED))
    tasks = read_task_records(run_dir, job_id) if job_id else {}
    rows = []
    for node in range(nodes):
        rec = tasks.get(node)
        if rec is None:
            state = RunState.QUEUED if not job_state.finished else job_state
            if job_state == RunState.RUNNING:
                state = RunState.RUNNING
            rows.append({"node": node, "host": None, "state": str(state), "exit_code": None})
            continue
        state = RunState(rec.get("state", RunState.RUNNING))
        if job_state in (RunState.CANCELLED, RunState.TIMEOUT) and state != RunState.COMPLETED:
            state = job_state
        elif job_state.finished and state == RunState.RUNNING:
            state = job_state if job_state != RunState.COMPLETED else RunState.FAILED
        rows.append(
            {
                "node": node,
                "host": rec.get("slurm_node") or rec.get("host"),
                "state": str(state),
                "exit_code": rec.get("exit_code"),
            }
        )
    return rows


def update_slurm(run_dir: Path, **changes: Any) -> dict[str, Any]:
    """Merge ``changes`` into ``run.json``'s ``slurm`` object (atomic rewrite)."""
    record = load_run(run_dir)
    slurm = dict(record.get("slurm") or {})
    slurm.update(changes)
    return update_run(run_dir, slurm=slurm)


def merge_state(record: dict[str, Any], env: dict[str, str] | None = None) -> MergeState | None:
    """State of the merge job: ``run.json``'s, corrected by Slurm when the job died unrecorded."""
    slurm = record.get("slurm") or {}
    merge_id = slurm.get("merge_job_id")
    if not merge_id:
        return None
    recorded = MergeState((slurm.get("merge") or {}).get("state", MergeState.PENDING))
    if recorded.finished:
        return recorded
    try:
        info = query_job(str(merge_id), env)
    except SlurmError:
        return recorded
    if info is None:
        return recorded
    state = run_state(info.state)
    if not state.finished:
        return MergeState.RUNNING if state == RunState.RUNNING else MergeState.PENDING
    if state == RunState.COMPLETED:
        # finished between its own last write and this query; re-read once
        again = MergeState(
            (load_run(record["run_dir"]).get("slurm") or {}).get("merge", {}).get("state", "failed")
        )
        return again if again.finished else MergeState.COMPLETED
    return MergeState.CANCELLED if state == RunState.CANCELLED else MergeState.FAILED


@dataclass
class SlurmJobRef:
    """The backend handle: enough to find the job again from any process (``run.json``)."""

    run_dir: Path
    """The run directory."""
    job_id: str
    """Slurm id of the training job."""
    merge_job_id: str | None
    """Slurm id of the dependent merge job."""
    nodes: int
    """Nodes (= tasks) of the job."""
    follow: bool = False
    """``wait`` blocks until the job and its merge end; otherwise it returns at once."""
    slurm_conf: str | None = None
    """``SLURM_CONF`` at submission (used when the current shell has none)."""
    torchrun_args: list[str] = field(default_factory=list)
    """torchrun flags of every node besides the rendezvous ones rankscope adds."""
    nproc_per_node: int = 1
    """Ranks per node."""

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm commands about this job."""
        return slurm_env(self.slurm_conf)
