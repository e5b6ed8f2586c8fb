"""Slurm backend: the job goes to Slurm through submitit; a dependent job merges it when it ends.

This module is the launcher (:class:`SlurmLauncher`: submit, follow, status, cancel) and the
entry of ``slurm/rankscope.sbatch`` (``python -m rankscope.launchers.slurm prepare``). The rest of
the backend lives by role in ``options.py`` (what the job asks for, the run flags),
``commands.py`` (sinfo/sacct/squeue/sbatch/scancel, through :mod:`rankscope.slurm.commands`),
``node.py`` (what runs on each node: placement, rendezvous, torchrun) and ``records.py``
(``run.json``'s ``slurm`` object and the per-task records).

Merge — right after the job, rankscope submits a second, one-CPU job with
``--dependency=afterany:JOB``: it runs whatever way the first one ended (completed, failed,
cancelled, timed out) and executes ``python -m rankscope finalize RUN``
(``orchestrator/finalize.py``), which records the final state from Slurm's accounting
(:func:`settle_final_state`), then merges and analyses the run in-process.

State — job states come from ``sacct``, falling back to ``squeue`` while the job is queued or
running (``rankscope status RUN`` / ``rankscope cancel RUN`` work from another shell after the
submitting process has exited).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from rankscope.config_flags import Flags
from rankscope.errors import RankscopeError, UsageError
from rankscope.launchers import rundir
from rankscope.launchers.base import JobOutcome, Launcher, RunHandle, create_run_dir
from rankscope.launchers.hang_watch import EXIT_HUNG, HangRule, RankProgress
from rankscope.launchers.rundir import RunRecord, RunState, load_run, update_run, utc_now
from rankscope.launchers.slurm.commands import (
    MERGE_TIME_MIN,
    SlurmError,
    check_slurm,
    first_line,
    query_job,
    run_state,
    scancel,
    slurm_env,
    submit_merge_job,
)
from rankscope.launchers.slurm.node import NodePlan, node_torchrun_args, run_node
from rankscope.launchers.slurm.node_hang import (
    ended_because_hung,
    failing_nodes,
    hang_rule,
    request_stack_signal,
    rule_options,
    run_watched,
)
from rankscope.launchers.slurm.options import SlurmOptions, load_defaults
from rankscope.launchers.slurm.records import (
    MergeState,
    SlurmJobRef,
    merge_state,
    read_task_records,
    root_cause_across_nodes,
    task_states,
    update_slurm,
)
from rankscope.launchers.spec import LauncherKind, ProfilerSettings, RunSpec
from rankscope.launchers.torchrun import flag_value, rank_argv, rank_settings_env
from rankscope.slurm.commands import SlurmJobState

#: submitit's folder (pickles, per-task stdout/stderr) inside ``RUN/logs``; ``%j`` = job id.
SUBMITIT_FOLDER = "slurm-%j"
#: Seconds the merge job waits for Slurm's accounting to show the job's final state.
SETTLE_S = 120.0
#: Seconds between two job-state queries while following a job.
FOLLOW_POLL_S = 2.0


class SlurmLauncher(Launcher):
    """Submit through submitit: one task per node, torchrun in each, a dependent merge job."""

    kind: ClassVar[LauncherKind] = LauncherKind.SLURM
    started_state: ClassVar[RunState] = RunState.QUEUED
    ranks_are_local: ClassVar[bool] = False

    def __init__(self, *, echo: bool = True) -> None:
        self.echo = echo
        """Print the job ids when submitting (``rankscope run`` prints them)."""

    # ---------------------------------------------------- `rankscope status` / `cancel`
    def refresh(self, run_dir: Path) -> str | None:
        """Ask Slurm (sacct, then squeue); a note when Slurm cannot be asked."""
        try:
            self.attach(run_dir).state()
        except SlurmError as exc:
            return f"{exc} (showing run.json as last written)"
        return None

    def status_details(self, run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
        """The job ids, Slurm's state and pending reason, one row per task, the merge job."""
        slurm = record.get("slurm") or {}
        out: dict[str, Any] = {
            "job_id": slurm.get("job_id"),
            "slurm_state": slurm.get("state"),
            "slurm_reason": (slurm.get("reason") or None)
            if slurm.get("state") == "PENDING"
            else None,
            "merge_job_id": slurm.get("merge_job_id"),
            "tasks": task_states(run_dir, record),
            "notes": [],
        }
        try:
            state = merge_state(
                {**record, "run_dir": str(run_dir)}, slurm_env(slurm.get("slurm_conf"))
            )
        except SlurmError as exc:
            state = None
            out["notes"].append(f"cannot ask Slurm about the merge job: {exc}")
        out["merge_state"] = None if state is None else str(state)
        return out

    def cancel_run(self, run_dir: Path) -> str:
        """scancel the job (every rank gets SIGTERM and flushes); the merge job still runs."""
        handle = self.attach(run_dir)
        before = RunState(handle.record()["state"])
        if not before.finished:
            before = handle.state()  # it may have ended meanwhile
        if before.finished:
            return f"{run_dir} already ended: {before}"
        state = handle.cancel()
        slurm = handle.record().get("slurm") or {}
        merge = slurm.get("merge_job_id")
        then = f"; merge job {merge} merges the windows already written" if merge else ""
        hung = " (the run hung: report/hang.json)" if state == RunState.HUNG else ""
        return f"Slurm job {slurm.get('job_id')} cancelled{hung}{then}"

    # ---------------------------------------------------------------- hooks
    def _start(self, spec: RunSpec, run_dir: Path) -> SlurmJobRef:
        import submitit

        raw = dict(spec.options.get("slurm") or {})
        if not raw:
            raw = {**load_defaults(), "nodes": spec.nnodes or 1}
        user_nnodes = flag_value(spec.torchrun_args, ("--nnodes",))
        if not spec.options.get("nodes_given", True) and user_nnodes and user_nnodes.isdigit():
            raw["nodes"] = int(user_nnodes)  # torchrun's spelling of the node count
        options = SlurmOptions.from_dict(raw)
        if user_nnodes is not None and user_nnodes != str(options.nodes):
            raise UsageError(
                f"--nnodes {user_nnodes} contradicts --nodes {options.nodes}; on Slurm give --nodes only"
            )
        env = slurm_env()
        check_slurm(options.partition, env)
        torchrun_args, nproc = node_torchrun_args(spec.torchrun_args, options.gpus_per_node)
        plan = NodePlan(
            run_dir=str(run_dir),
            cwd=str(Path.cwd()),
            nnodes=options.nodes,
            torchrun_args=tuple(torchrun_args),
            rank_argv=tuple(rank_argv(spec)),
            env=rank_settings_env(spec, run_dir),
            hang_rule=None if spec.options.get("follow") else hang_rule(spec.options),
            live_monitor=not spec.options.get("follow"),
        )
        executor = submitit.SlurmExecutor(
            folder=run_dir / rundir.LOGS_DIR / SUBMITIT_FOLDER, max_num_timeout=0
        )
        executor.update_parameters(**options.executor_parameters(nproc, f"rankscope-{spec.name}"))
        try:
            # submitit prints sbatch's stderr itself before raising: keep the error to one line
            with contextlib.redirect_stderr(io.StringIO()):
                job = executor.submit(run_node, plan)
        except Exception as exc:  # submitit wraps sbatch's refusal in its own error types
            raise SlurmError(f"sbatch refused the job: {first_line(str(exc))}") from exc
        job_id = str(job.job_id)
        try:
            merge_id: str | None = submit_merge_job(
                run_dir,
                job_id,
                partition=options.partition,
                account=options.account,
                qos=options.qos,
                name=f"rankscope-merge-{spec.name}",
                env=env,
            )
        except SlurmError as exc:
            merge_id = None
            print(
                f"rankscope run: warning: {exc}; merge later with `rankscope merge {run_dir}`",
                file=sys.stderr,
            )
        if self.echo:
            print(
                f"rankscope run: submitted Slurm job {job_id} ({options.nodes} node(s) x {nproc} rank(s)); "
                f"merge job {merge_id or '-'} runs when it ends",
                flush=True,
            )
        return SlurmJobRef(
            run_dir=run_dir,
            job_id=job_id,
            merge_job_id=merge_id,
            nodes=options.nodes,
            follow=bool(spec.options.get("follow", False)),
            slurm_conf=env.get("SLURM_CONF"),
            torchrun_args=list(torchrun_args),
            nproc_per_node=nproc,
        )

    def _record_fields(self, job: SlurmJobRef) -> dict[str, Any]:
        record = load_run(job.run_dir)
        options = (record.get("options") or {}).get("slurm") or {}
        return {
            "nnodes": job.nodes,
            "nproc_per_node": job.nproc_per_node,
            "world_size": job.nodes * job.nproc_per_node,
            # what each node's torchrun got (plus --nnodes and the c10d rendezvous at node 0)
            "torchrun_args": job.torchrun_args,
            "slurm": {
                "job_id": job.job_id,
                "merge_job_id": job.merge_job_id,
                "state": str(SlurmJobState.PENDING),
                "nodes": job.nodes,
                "options": options,
                "slurm_conf": job.slurm_conf,
                "submitit_folder": str(job.run_dir / rundir.LOGS_DIR / SUBMITIT_FOLDER),
                "merge": {"job_id": job.merge_job_id, "state": str(MergeState.PENDING)},
            },
        }

    def _attach(self, run_dir: Path, record: dict[str, Any]) -> SlurmJobRef | None:
        slurm = record.get("slurm") or {}
        if not slurm.get("job_id"):
            return None
        return SlurmJobRef(
            run_dir=Path(run_dir),
            job_id=str(slurm["job_id"]),
            merge_job_id=slurm.get("merge_job_id"),
            nodes=int(slurm.get("nodes") or record.get("nnodes") or 1),
            slurm_conf=slurm.get("slurm_conf"),
        )

    def _poll(self, job: SlurmJobRef) -> JobOutcome | None:
        info = query_job(job.job_id, job.env)
        record = load_run(job.run_dir)
        if info is None:
            return None  # not visible yet: still queued as far as we know
        state = run_state(info.state)
        slurm = dict(record.get("slurm") or {})
        if not state.finished:
            if (
                record.get("state") != str(state)
                or slurm.get("state") != str(info.state)
                or slurm.get("reason", "") != info.reason
            ):
                slurm.update(state=str(info.state), nodelist=info.nodelist, reason=info.reason)
                update_run(job.run_dir, state=str(state), slurm=slurm)
            return None
        exit_code = info.exit_code
        if state == RunState.CANCELLED and ended_because_hung(record):
            state, exit_code = RunState.HUNG, EXIT_HUNG
        tasks = read_task_records(job.run_dir, job.job_id)
        failures: list[dict[str, Any]] = []
        if state == RunState.FAILED:
            seen: set[int] = set()
            for rec in tasks.values():
                for f in rec.get("failures") or []:
                    if f.get("rank") not in seen:
                        seen.add(f.get("rank"))
                        failures.append(f)
            failures = root_cause_across_nodes(failures)
            if not failures:
                failures.append(
                    {
                        "rank": None,
                        "error": f"Slurm job {job.job_id} {info.state}",
                        "exit_code": info.exit_code,
                    }
                )
        slurm.update(
            state=str(info.state),
            exit_code=info.exit_code,
            nodelist=info.nodelist,
            elapsed=info.elapsed,
        )
        outcome = JobOutcome(
            state=state, exit_code=exit_code, failures=failures, fields={"slurm": slurm}
        )
        slurm["tasks"] = task_states(job.run_dir, {**record, "state": str(state), "slurm": slurm})
        return outcome

    def _wait(self, job: SlurmJobRef, timeout: float | None) -> JobOutcome | None:
        """Without ``follow``: return at once (a batch job). With it: poll until the job ends
        (or ``timeout`` seconds pass), then until its merge job ends (Ctrl-C:
        :meth:`_stop_following`)."""
        if not job.follow:
            print(
                f"rankscope run: follow it with `rankscope status {job.run_dir}` "
                f"(stop it with `rankscope cancel {job.run_dir}`)",
                flush=True,
            )
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = self._until_ended(job, deadline)
        return None if outcome is None else self._await_merge(job, outcome)

    def _stop_following(self, job: SlurmJobRef) -> bool:
        """Ctrl-C stops following, never the job (it keeps running; ``rankscope cancel``)."""
        print(
            f"\nrankscope: stopped following; Slurm job {job.job_id} goes on "
            f"(rankscope status {job.run_dir} / rankscope cancel {job.run_dir})",
            file=sys.stderr,
        )
        return True

    def _until_ended(self, job: SlurmJobRef, deadline: float | None) -> JobOutcome | None:
        """Poll until the job ends (its outcome) or ``deadline`` (monotonic s) passes (None)."""
        while True:
            outcome = self._poll(job)
            if outcome is not None or (deadline is not None and time.monotonic() >= deadline):
                return outcome
            time.sleep(FOLLOW_POLL_S)

    def _await_merge(self, job: SlurmJobRef, outcome: JobOutcome) -> JobOutcome:
        """The job has ended: wait for its merge job (bounded by its time limit, not by the
        caller's slice: the follower must never merge beside it), then re-read the outcome."""
        deadline = time.monotonic() + MERGE_TIME_MIN * 60 + SETTLE_S
        while job.merge_job_id and time.monotonic() < deadline:
            info = query_job(job.merge_job_id, job.env)
            if info is not None and run_state(info.state).finished:
                break
            time.sleep(FOLLOW_POLL_S)
        return self._poll(job) or outcome  # re-read: the merge job changed run.json

    # ---------------------------------------------------------------- hangs
    def follows(self, job: SlurmJobRef) -> bool:
        """Only with ``--follow`` (a batch job is watched by its first node: node_hang.py)."""
        return job.follow

    def _running(self, job: SlurmJobRef) -> bool:
        """Slurm has started the job (``run.json``'s state, which the follow's polls update)."""
        return load_run(job.run_dir).get("state") != str(RunState.QUEUED)

    def _failing(self, job: SlurmJobRef) -> bool:
        """A node's torchrun reported a failure (a dead rank): the job is failing, not hung."""
        return failing_nodes(job.run_dir, job.job_id)

    def _signal_ranks(self, job: SlurmJobRef, ranks: list[RankProgress]) -> list[int]:
        """The ranks run on other nodes: their node tasks relay the signal (node_hang.py)."""
        return request_stack_signal(job.run_dir, job.job_id, ranks)

    def _end_hung(self, job: SlurmJobRef) -> JobOutcome:
        """scancel, then follow the job to its end and its merge job (which records ``hung``
        and merges the windows written before the hang)."""
        cancelled = self._cancel(job, interrupt=False)
        outcome = self._until_ended(job, time.monotonic() + SETTLE_S)
        return cancelled if outcome is None else self._await_merge(job, outcome)

    def _finish(self, handle: RunHandle, outcome: JobOutcome) -> RunState:
        """Base behaviour, keeping what the merge job wrote meanwhile (``slurm.merge``)."""
        slurm = outcome.fields.get("slurm")
        if isinstance(slurm, dict):
            fresh = load_run(handle.run_dir).get("slurm") or {}
            for key in ("merge", "merge_job_id"):
                if key in fresh:
                    slurm[key] = fresh[key]
        return super()._finish(handle, outcome)

    def _cancel(self, job: SlurmJobRef, *, interrupt: bool) -> JobOutcome:
        """scancel: Slurm sends SIGTERM (ranks flush), then SIGKILL; the merge job still runs.
        A job ended while it hung (its hang recorded: ended by the watch, or diagnosed and left
        running with ``--on-hang wait`` until now) is ``hung``, not ``cancelled``."""
        scancel(job.job_id, job.env)
        record = load_run(job.run_dir)
        slurm = dict(record.get("slurm") or {})
        slurm.update(state=str(SlurmJobState.CANCELLED), cancelled_at=utc_now())
        if not interrupt and ended_because_hung(record):
            return JobOutcome(state=RunState.HUNG, exit_code=EXIT_HUNG, fields={"slurm": slurm})
        return JobOutcome(state=RunState.CANCELLED, exit_code=None, fields={"slurm": slurm})


def settle_final_state(run_dir: Path, settle_s: float = SETTLE_S) -> RunState:
    """Wait up to ``settle_s`` seconds for accounting to show the job's final state; return it.

    The merge job's first step (``rankscope finalize``): the state, exit code, failures and task
    states are recorded in ``run.json`` as the launcher's poll finds them. Accounting briefly
    unreachable is retried; after ``settle_s`` the run is merged in whatever state it shows.
    """
    handle = SlurmLauncher().attach(run_dir)
    deadline = time.monotonic() + settle_s
    state = RunState(handle.record()["state"])
    while True:
        try:
            state = handle.state()
        except SlurmError as exc:  # accounting briefly unreachable: retry, then merge anyway
            print(f"rankscope finalize: {exc}", flush=True)
        if state.finished or time.monotonic() >= deadline:
            return state
        time.sleep(FOLLOW_POLL_S)


def prepare_run(argv: list[str]) -> Path:
    """For ``slurm/rankscope.sbatch``: create the run directory of THIS job and its merge job.

    Reads the job from Slurm's environment (``SLURM_JOB_ID``, ``SLURM_JOB_NUM_NODES``, …), writes
    ``run.json`` (launcher ``slurm``, state ``running``), submits the ``afterany`` merge job and
    returns the run directory.
    """
    parser = argparse.ArgumentParser(prog="python -m rankscope.launchers.slurm prepare")
    parser.add_argument("--out", type=Path, default=Path("rankscope-runs"))
    parser.add_argument("--name", default="")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    Flags(HangRule).add(parser)  # the rule the first node watches with (node_hang.run_watched)
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise UsageError(
            "prepare runs inside a Slurm job (no $SLURM_JOB_ID); submit slurm/rankscope.sbatch with sbatch"
        )
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    spec = RunSpec(
        script=args.script,
        script_args=list(args.script_args),
        torchrun_args=[f"--nproc-per-node={args.nproc_per_node}"],
        profiler=ProfilerSettings.from_json(os.environ[rundir.ENV_PROFILER])
        if os.environ.get(rundir.ENV_PROFILER)
        else ProfilerSettings(),
        out=args.out,
        name=args.name,
        launcher=LauncherKind.SLURM,
        command=["sbatch", "slurm/rankscope.sbatch", args.script, *args.script_args],
        nnodes=nodes,
        nproc_per_node=args.nproc_per_node,
        options={"hang": rule_options(Flags(HangRule).build(args))},
    )
    run_dir = create_run_dir(spec.out, spec.name)
    partition = os.environ.get("SLURM_JOB_PARTITION")
    account = os.environ.get("SLURM_JOB_ACCOUNT")
    qos = os.environ.get("SLURM_JOB_QOS")
    RunRecord.of_spec(
        spec,
        run_dir,
        launcher=LauncherKind.SLURM,
        state=RunState.RUNNING,
        host=socket.gethostname(),
        slurm={
            "job_id": job_id,
            "merge_job_id": None,
            "state": str(SlurmJobState.RUNNING),
            "nodes": nodes,
            "nodelist": os.environ.get("SLURM_JOB_NODELIST", ""),
            "slurm_conf": os.environ.get("SLURM_CONF"),
            "submitted_by": "sbatch template",
            "merge": {"job_id": None, "state": str(MergeState.PENDING)},
        },
    ).write(run_dir)
    merge_id = submit_merge_job(
        run_dir,
        job_id,
        partition=partition,
        account=account,
        qos=qos,
        name=f"rankscope-merge-{spec.name}",
    )
    update_slurm(
        run_dir, merge_job_id=merge_id, merge={"job_id": merge_id, "state": str(MergeState.PENDING)}
    )
    return run_dir


def main(argv: list[str] | None = None) -> int:
    """``python -m rankscope.launchers.slurm prepare …`` (used by the sbatch template, not by people).

    The merge job's own step is an orchestrator command (``rankscope finalize RUN``): it merges
    and analyses, which this floor may not import.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = (
        "usage: python -m rankscope.launchers.slurm prepare ARGS | watch RUN -- TORCHRUN_COMMAND..."
    )
    if len(argv) > 3 and argv[0] == "watch" and argv[2] == "--":
        return run_watched(Path(argv[1]), argv[3:])
    if not argv or argv[0] != "prepare":
        print(usage, file=sys.stderr)
        return 2
    try:
        print(prepare_run(argv[1:]))
        return 0
    except RankscopeError as exc:
        print(f"rankscope slurm {argv[0]}: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
