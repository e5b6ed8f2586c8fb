"""The live monitor of a Slurm batch job, started by its first node beside torchrun.

A job that ``rankscope run`` follows is watched by that process (the live line, changes noticed,
windows triggered: docs/live.md). A batch job nobody follows — ``rankscope run --slurm`` without
``--follow``, or the sbatch template — gets the same monitor on its first node, where the job
itself runs: :func:`start_live_monitor` starts :data:`MONITOR_COMMAND` (the orchestrator's hidden
``rankscope monitor RUN``: the monitor judges changes with the analysis' change detection, which
this floor may not import, so it is started as a command, not imported) with the node task's
output, and :func:`stop_live_monitor` ends it once torchrun has ended (SIGTERM: it takes a last
look first). It also ends by itself when the node task is gone, and with the job's other
processes when Slurm cancels the job.
Seconds unless a name says otherwise.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: The command the first node runs, after the run folder: ``rankscope monitor RUN``.
MONITOR_COMMAND = ("-m", "rankscope", "monitor")
#: Seconds the monitor gets to take its last look and end after SIGTERM, then after SIGKILL.
MONITOR_STOP_S = 10.0


def start_live_monitor(run_dir: Path) -> subprocess.Popen[bytes] | None:
    """Start the monitor of the job in ``run_dir`` (its lines go to this task's output); None
    when it cannot start (said on one line: the job runs on without it)."""
    try:
        return subprocess.Popen(
            [sys.executable, *MONITOR_COMMAND, str(run_dir)], stdin=subprocess.DEVNULL
        )
    except OSError as exc:
        print(f"rankscope (node 0): no live monitor: {exc}", flush=True)
        return None


def stop_live_monitor(proc: subprocess.Popen[bytes] | None) -> int | None:
    """End the monitor (SIGTERM, then SIGKILL after :data:`MONITOR_STOP_S`); its exit status."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout=MONITOR_STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=MONITOR_STOP_S)
