"""What runs on each node of a Slurm job: the node plan, the rendezvous, torchrun, the task record.

Placement — **one submitit task per node, each running torchrun for its local ranks** with c10d
rendezvous at the first node. Chosen over one task per GPU (submitit's distributed environment)
because then every node runs exactly what a local run runs: torchrun stays the process manager,
so the per-rank runtime, ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, the user's torchrun flags
(``--max-restarts``, ``--monitor-interval`` …) and torchrun's failure report (which rank died, how)
are the same as with ``rankscope run`` on one machine; submitit's processes, pickles and logs
grow with nodes, not GPUs; and one Slurm CPU/GPU allocation per node is what torchrun expects.

Rendezvous — task 0 picks a free port *on the first node* (the submitting host cannot know which
ports are free there) and publishes ``host:port`` in ``RUN/slurm/rendezvous-JOB-RESTART.json`` on
the shared filesystem; the other tasks wait for that file. Node 0's torchrun hosts the c10d store
(``--rdzv-conf is_host=1``, the others ``is_host=0``): explicit, because torch's guess from host
names fails for emulated nodes and multi-homed hosts.

:func:`run_node` is pickled by submitit by reference (``rankscope.launchers.slurm.node.run_node``)
and runs inside the job; :class:`NodePlan` is its only argument, plain data.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.errors import UsageError
from rankscope.launchers import rundir
from rankscope.launchers.hang_watch import HangRule
from rankscope.launchers.output import tee
from rankscope.launchers.rundir import RunState, utc_now
from rankscope.launchers.slurm.commands import scancel
from rankscope.launchers.slurm.node_hang import SignalRelay, watch_batch_job
from rankscope.launchers.slurm.node_live import start_live_monitor, stop_live_monitor
from rankscope.launchers.slurm.records import SLURM_DIR, TASK_FORMAT, read_task_records
from rankscope.launchers.torchrun import (
    TORCHELASTIC_DIR,
    flag_value,
    log_dir_args,
    prune_empty_dirs,
)

#: Rendezvous address published by task 0: ``{"host": ..., "port": ...}``.
RENDEZVOUS_FORMAT = "rendezvous-{job_id}-{restart}.json"
#: Output of each node's torchrun inside ``RUN/logs``.
TORCHRUN_LOG_FORMAT = "torchrun-{job_id}-node{node:03d}.log"
#: Each node task's folder for torchrun's error files, under ``logs/torchelastic/``: a node's
#: own, so its task removes what stayed empty without touching another node's.
ELASTIC_NODE_FORMAT = "{job_id}-node{node:03d}"
#: Seconds a non-zero node task waits for the rendezvous file of task 0.
RENDEZVOUS_WAIT_S = 300.0
#: Seconds a failed node waits for the other nodes' own failure reports before srun stops them.
FAILURE_GRACE_S = 30.0
#: torchrun flags rankscope sets on Slurm (flag -> takes a value); the user's copies are dropped.
RENDEZVOUS_OWNED: dict[str, bool] = {
    "--standalone": False,
    "--nnodes": True,
    "--node-rank": True,
    "--node_rank": True,
    "--rdzv-backend": True,
    "--rdzv_backend": True,
    "--rdzv-endpoint": True,
    "--rdzv_endpoint": True,
    "--rdzv-id": True,
    "--rdzv_id": True,
    "--rdzv-conf": True,
    "--rdzv_conf": True,
    "--master-addr": True,
    "--master_addr": True,
    "--master-port": True,
    "--master_port": True,
}


def node_torchrun_args(torchrun_args: list[str], gpus_per_node: int = 0) -> tuple[list[str], int]:
    """Each node's torchrun flags and its number of ranks.

    The user's flags minus the rendezvous ones rankscope sets on Slurm; without
    ``--nproc-per-node``, one rank per GPU Slurm gives the node (torchrun's own default is 1).
    """
    out: list[str] = []
    i = 0
    while i < len(torchrun_args):
        tok = torchrun_args[i]
        flag, has_value, _ = tok.partition("=")
        if flag in RENDEZVOUS_OWNED:
            i += 1 if (has_value or not RENDEZVOUS_OWNED[flag]) else 2
            continue
        out.append(tok)
        i += 1
    given = flag_value(out, ("--nproc-per-node", "--nproc_per_node"))
    if given is None:
        nproc = max(1, gpus_per_node)
        return [f"--nproc-per-node={nproc}", *out], nproc
    if given.isdigit():
        return out, int(given)
    if given == "gpu" and gpus_per_node:
        return out, gpus_per_node
    raise UsageError(f"--nproc-per-node {given}: give a number of ranks per node on Slurm")


@dataclass(frozen=True)
class NodePlan:
    """What every node task runs (pickled by submitit, so plain data only: strings, numbers and
    the frozen :class:`HangRule`)."""

    run_dir: str
    """Run directory on the shared filesystem."""
    cwd: str
    """Working directory of the submitting shell (the script path is relative to it)."""
    nnodes: int
    """Number of nodes (= tasks)."""
    torchrun_args: tuple[str, ...]
    """The user's torchrun flags without the rendezvous ones (rankscope sets those)."""
    rank_argv: tuple[str, ...]
    """``-m rankscope.launchers.rank [--module] SCRIPT ARGS…``."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment added for the ranks (run directory, profiler settings, the spec's env)."""
    hang_rule: HangRule | None = None
    """The hang rule node 0 watches the ranks with, for a batch job nobody follows (None: the
    submitting process follows the job and watches them itself; ``node_hang.py``)."""
    live_monitor: bool = False
    """Node 0 runs the live monitor beside torchrun (a batch job nobody follows: changes
    noticed, windows triggered; ``node_live.py``). False when the submitting process follows
    the job: it monitors it itself."""


def _free_port() -> int:
    """A TCP port free on this host right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _publish_rendezvous(path: Path, host: str) -> tuple[str, int]:
    port = _free_port()
    rundir.write_json_atomic(path, {"host": host, "port": port, "written_at": utc_now()})
    return host, port


def _await_rendezvous(path: Path, timeout: float) -> tuple[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = rundir.read_json(path)
            return str(data["host"]), int(data["port"])
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no rendezvous address from node 0 in {path} after {timeout:.0f} s"
                ) from None
            time.sleep(0.2)


def run_node(plan: NodePlan) -> dict[str, Any]:
    """Body of one node's submitit task: rendezvous, torchrun, record; raise when it fails.

    Runs inside the Slurm job. The task record (``RUN/slurm/task-JOB-NNN.json``) says which host
    it ran on, when, and how torchrun ended (with torchrun's per-rank failure summary).
    """
    import submitit
    from rankscope.launchers.torchrun import torchrun_failures

    job_env = submitit.JobEnvironment()
    job_id, node = str(job_env.job_id), int(job_env.node)
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    run_dir = Path(plan.run_dir)
    slurm_dir = run_dir / SLURM_DIR
    task_path = slurm_dir / TASK_FORMAT.format(job_id=job_id, node=node)
    record: dict[str, Any] = {
        "node": node,
        "host": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "pid": os.getpid(),
        "state": str(RunState.RUNNING),
        "exit_code": None,
        "started_at": utc_now(),
        "ended_at": None,
        "failures": [],
    }
    rundir.write_json_atomic(task_path, record)
    # submitit's USR2 handler would end this task early; rankscope does not requeue
    # (slurm_options.py's docstring)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    rdzv_path = slurm_dir / RENDEZVOUS_FORMAT.format(job_id=job_id, restart=restart)
    if node == 0:
        host, port = _publish_rendezvous(rdzv_path, job_env.hostnames[0])
    else:
        host, port = _await_rendezvous(rdzv_path, RENDEZVOUS_WAIT_S)
    elastic_dir = (
        run_dir
        / rundir.LOGS_DIR
        / TORCHELASTIC_DIR
        / ELASTIC_NODE_FORMAT.format(job_id=job_id, node=node)
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={plan.nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={host}:{port}",
        f"--rdzv-id=rankscope-{job_id}",
        f"--rdzv-conf=is_host={1 if node == 0 else 0}",
        *log_dir_args(list(plan.torchrun_args), elastic_dir),
        *plan.torchrun_args,
        *plan.rank_argv,
    ]
    env = {**os.environ, **plan.env, "PYTHONUNBUFFERED": "1"}
    log = run_dir / rundir.LOGS_DIR / TORCHRUN_LOG_FORMAT.format(job_id=job_id, node=node)
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"rankscope: node {node}/{plan.nnodes}: {shlex.join(cmd)}", flush=True)
    proc = subprocess.Popen(
        cmd,
        cwd=plan.cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    if proc.stdout is None:  # cannot happen with stdout=PIPE; keeps the type checker honest
        raise RuntimeError("torchrun started without an output pipe")
    pump = threading.Thread(target=tee, args=(proc.stdout, log, sys.stdout.buffer), daemon=True)
    pump.start()
    relay = SignalRelay(run_dir, job_id, proc.pid).start()
    running = threading.Event()
    running.set()
    if node == 0 and plan.hang_rule is not None:
        watch_batch_job(run_dir, job_id, plan.hang_rule, running, lambda: scancel(job_id))
    monitor = start_live_monitor(run_dir) if node == 0 and plan.live_monitor else None
    code = proc.wait()
    running.clear()
    relay.stop()
    stop_live_monitor(monitor)
    pump.join(timeout=10)
    prune_empty_dirs(elastic_dir)
    failures = torchrun_failures(log.read_text(errors="replace")) if code != 0 else []
    record.update(
        state=str(RunState.COMPLETED if code == 0 else RunState.FAILED),
        exit_code=code,
        ended_at=utc_now(),
        failures=failures,
    )
    rundir.write_json_atomic(task_path, record)
    if code != 0:
        # Exiting non-zero makes srun stop the other nodes at once (--kill-on-bad-exit). First give
        # their torchruns a moment to see their own ranks fail and write the failure summary
        # (which rank died, how): a node stopped by srun only reports SIGTERM.
        _await_other_nodes(run_dir, job_id, node, plan.nnodes, FAILURE_GRACE_S)
        raise RuntimeError(f"torchrun on node {node} exited with {code} (log: {log})")
    return {"node": node, "exit_code": code}


def _await_other_nodes(run_dir: Path, job_id: str, node: int, nnodes: int, timeout: float) -> None:
    """Wait up to ``timeout`` s until no other node's task record of the job says ``running``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tasks = read_task_records(run_dir, job_id)
        running = [
            n
            for n in range(nnodes)
            if n != node and tasks.get(n, {}).get("state") == str(RunState.RUNNING)
        ]
        if not running:
            return
        time.sleep(0.5)
