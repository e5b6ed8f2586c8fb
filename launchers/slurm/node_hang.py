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
job with ``scancel`` (unless ``--on-hang wait``). The merge job then records the state ``hung``
and writes the diagnosis (``rankscope finalize``: the analysis is the orchestrator's).
Seconds unless a name says ``_ns``.
"""

from __future__ import annotations

import contextlib
import json
import os
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
    ``on_hang``, before it cancels the job): its ``CANCELLED`` means ``hung``."""
    hang = record.get("hang") or {}
    return bool(hang) and hang.get("on_hang") in (str(OnHang.REPORT), str(OnHang.KILL))
