"""Hangs of a Slurm job, on its nodes: the stack signal relayed to a node's own ranks, and the
watch that the first node keeps over a batch job nobody follows.

**The stack signal.** A rank that does not answer the hang request gets
:data:`~rankscope.launchers.hang_probe.STACK_SIGNAL` (faulthandler writes its stacks from C). On
Slurm its pid lives on another node, so the watcher cannot ``os.kill`` it, and ``scancel
--signal=USR2`` cannot single it out: Slurm signals every process of a step, torchrun included,
whose default action on SIGUSR2 is to end — the job would die instead of telling where it is. So
the watcher writes ``RUN/slurm/stack-signal-JOB.json`` (rank → pid) on the shared folder, and
every node task relays it (:class:`SignalRelay`) to the pids listed that are its own torchrun's
descendants (a pid means something on one node only).

**A batch job** (``rankscope run --slurm`` without ``--follow``, or the sbatch template): the
submitting process has gone, so the first node's task watches the ranks' progress with the same
:class:`~rankscope.launchers.hang_watch.HangWatch` and rule (:func:`watch_batch_job`): on a hang
it asks every rank, records the notice in ``run.json`` (``hang``, with ``on_hang``) and ends the
job with ``scancel``. The merge job then records the state ``hung`` and writes the diagnosis
(``rankscope finalize``: the analysis is the orchestrator's). With ``--on-hang wait`` the job is
left running and nothing ends it soon, so node 0 has the diagnosis written at once by
``rankscope finalize --hang-only`` (:data:`DIAGNOSE_NOW`, a command: this floor may not import
the analysis); cancelled later, the job is ``hung`` (:func:`ended_because_hung`).

**The sbatch template** runs torchrun under ``srun`` itself, with no submitit task around it:
each node's task is :func:`run_watched` (``python -m rankscope.launchers.slurm watch RUN --
TORCHRUN…``), which starts torchrun, relays the stack signal and, on the first node, watches
with the rule ``prepare`` recorded in ``run.json`` (``options.hang``) and runs the live monitor
beside it (``node_live.py``), as a batch job's first node does.
Seconds unless a name says ``_ns``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankscope.errors import RankscopeError
from rankscope.launchers import rundir
from rankscope.launchers.hang_probe import STACK_SIGNAL
from rankscope.launchers.hang_watch import (
    HangRule,
    HangWatch,
    OnHang,
    RankProgress,
    report_hang,
)
from rankscope.launchers.rundir import RunState
from rankscope.launchers.slurm.records import SLURM_DIR, read_task_records

#: The request to relay the stack signal: ``{"token", "pids": {rank: pid}}``, in ``RUN/slurm/``.
STACK_SIGNAL_FORMAT = "stack-signal-{job_id}.json"
#: Seconds between two looks of a node task at the relay request and of node 0 at the progress.
NODE_POLL_S = 0.5
#: How many parents up a rank may sit below its node's torchrun (torchrun → rank is 1).
MAX_DEPTH = 4
#: The command node 0 runs to diagnose a hang it leaves running (``--on-hang wait``), after the
#: run folder: the orchestrator's ``rankscope finalize --hang-only RUN``.
DIAGNOSE_NOW = ("-m", "rankscope", "finalize", "--hang-only")
#: Seconds that command may take (it imports the analysis and reads every rank's answer).
DIAGNOSE_TIMEOUT_S = 300.0


def request_stack_signal(run_dir: Path, job_id: str, ranks: list[RankProgress]) -> list[int]:
    """Ask the node tasks of job ``job_id`` to send the stack signal to ``ranks``; the ranks
    asked for (delivery is the nodes': a rank already gone is simply not found)."""
    pids = {str(p.rank): p.pid for p in ranks if p.pid}
    doc = {"token": time.time_ns(), "pids": pids}
    path = Path(run_dir) / SLURM_DIR / STACK_SIGNAL_FORMAT.format(job_id=job_id)
    try:
        rundir.write_json_atomic(path, doc)
    except (OSError, RankscopeError):
        return []
    return sorted(int(r) for r in pids)


def _parent(pid: int) -> int | None:
    """The parent of ``pid`` on this host (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` runs below ``ancestor`` on this host (at most :data:`MAX_DEPTH` up)."""
    current: int | None = pid
    for _ in range(MAX_DEPTH):
        current = _parent(current) if current else None
        if current is None or current <= 1:
            return False
        if current == ancestor:
            return True
    return False


class SignalRelay:
    """A node task's daemon thread: sends the stack signal to its own ranks when asked."""

    def __init__(self, run_dir: Path, job_id: str, torchrun_pid: int) -> None:
        self.path = Path(run_dir) / SLURM_DIR / STACK_SIGNAL_FORMAT.format(job_id=job_id)
        self.torchrun_pid = torchrun_pid
        self._stop = threading.Event()
        self._done: object = None
        self._thread = threading.Thread(
            target=self._run, name="rankscope-signal-relay", daemon=True
        )

    def start(self) -> SignalRelay:
        """Start relaying (returns itself)."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop relaying (torchrun has ended)."""
        self._stop.set()

    def relay_once(self) -> list[int]:
        """Signal the pids of a new request that are this node's ranks; the pids signalled."""
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []
        if not isinstance(doc, dict) or doc.get("token") == self._done:
            return []
        self._done = doc.get("token")
        sent = []
        for pid in (doc.get("pids") or {}).values():
            if isinstance(pid, int) and descends_from(pid, self.torchrun_pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, STACK_SIGNAL)
                    sent.append(pid)
        return sent

    def _run(self) -> None:
        while not self._stop.wait(NODE_POLL_S):
            self.relay_once()


def failing_nodes(run_dir: Path, job_id: str) -> bool:
    """Whether a node task of the job recorded that its torchrun failed (a rank died)."""
    return any(
        rec.get("state") == str(RunState.FAILED)
        for rec in read_task_records(run_dir, job_id).values()
    )


def watch_batch_job(
    run_dir: Path,
    job_id: str,
    rule: HangRule,
    running: threading.Event,
    end_job: Callable[[], None],
) -> threading.Thread:
    """Node 0's watch over a batch job (module docstring), in a daemon thread that stops when
    ``running`` is cleared; ``end_job`` (scancel of the job) ends a hung job."""

    def body() -> None:
        watch = HangWatch(
            run_dir, rule, local=False, failing=lambda: failing_nodes(run_dir, job_id)
        )
        while running.is_set():
            time.sleep(NODE_POLL_S)
            notice = watch.check()
            if notice is None or not running.is_set():
                continue
            report_hang(
                watch,
                notice,
                lambda ranks: request_stack_signal(run_dir, job_id, ranks),
                who="rankscope (node 0)",
            )
            if rule.on_hang == OnHang.WAIT:
                diagnose_now(run_dir)
                continue
            print(
                f"rankscope: ending hung Slurm job {job_id} (--on-hang {rule.on_hang})", flush=True
            )
            with contextlib.suppress(RankscopeError):
                end_job()
            return

    thread = threading.Thread(target=body, name="rankscope-hang-watch", daemon=True)
    thread.start()
    return thread


def diagnose_now(run_dir: Path) -> bool:
    """Have the hang that node 0 recorded diagnosed now (the paragraph on this task's output,
    ``report/hang.json``, ``run.json``'s ``hang``) by :data:`DIAGNOSE_NOW`; False when that
    command failed or did not finish in time (the merge job diagnoses it when the job ends)."""
    try:
        done = subprocess.run(
            [sys.executable, *DIAGNOSE_NOW, str(run_dir)],
            stdin=subprocess.DEVNULL,
            timeout=DIAGNOSE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def run_watched(run_dir: Path, command: list[str]) -> int:
    """The sbatch template's node task (module docstring): run ``command`` (torchrun) with this
    process's output, relay the stack signal to its ranks and, on the job's first node, watch
    them with the rule recorded in ``run.json`` and run the live monitor beside them
    (``node_live.py``); torchrun's exit status."""
    from rankscope.launchers.slurm.commands import scancel
    from rankscope.launchers.slurm.node_live import start_live_monitor, stop_live_monitor

    job_id = os.environ.get("SLURM_JOB_ID", "")
    first = os.environ.get("SLURM_NODEID", "0") == "0"
    options = rundir.load_run(run_dir).get("options") or {}
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    relay = SignalRelay(run_dir, job_id, proc.pid).start()
    running = threading.Event()
    running.set()
    monitor = None
    if first and job_id:
        watch_batch_job(run_dir, job_id, hang_rule(options), running, lambda: scancel(job_id))
        monitor = start_live_monitor(run_dir)
    try:
        return proc.wait()
    finally:
        running.clear()
        relay.stop()
        stop_live_monitor(monitor)


def rule_options(rule: HangRule) -> dict[str, Any]:
    """The hang rule as a spec's ``options["hang"]`` (read back by :func:`hang_rule`)."""
    return {"hang_after_s": rule.hang_after_s, "on_hang": str(rule.on_hang)}


def hang_rule(options: dict[str, Any]) -> HangRule:
    """The hang rule ``rankscope run`` recorded in the spec's options (``hang``)."""
    raw = options.get("hang") or {}
    after = raw.get("hang_after_s")
    return HangRule(
        hang_after_s=None if after is None else float(after),
        on_hang=OnHang(raw.get("on_hang") or OnHang.REPORT),
    )


def ended_because_hung(record: dict[str, Any]) -> bool:
    """``run.json`` says the job was ended because it hung (the watch records its notice, with
    ``on_hang``, before it cancels the job), or was ended while it hung (``--on-hang wait``: the
    hang diagnosed, the job left running until someone cancelled it): its ``CANCELLED`` means
    ``hung``."""
    hang = record.get("hang") or {}
    if not hang:
        return False
    ends = hang.get("on_hang") in (str(OnHang.REPORT), str(OnHang.KILL))
    return ends or bool(hang.get("on_hang") == str(OnHang.WAIT) and hang.get("headline"))
