"""``rankscope monitor RUN``: the live monitor of a Slurm batch job, on the job's first node
(hidden from ``--help``: the node runs it, not people).

A job that a ``rankscope run`` process follows (a local run, ``--slurm --follow``) is watched by
that process: the live line on its terminal, changes noticed, windows triggered
(``orchestrator/live.py``). A batch job — ``rankscope run --slurm`` without ``--follow``, or one
submitted with ``slurm/rankscope.sbatch`` — has no such process, so its first node starts this
command beside torchrun (``launchers/slurm/node_live.py``): the same
:class:`~rankscope.orchestrator.live.LiveMonitor`, with the settings ``run.json`` recorded, reads
the ranks' step logs on the shared filesystem, appends what it notices to ``RUN/changes.jsonl``
(``rankscope status RUN`` shows them), writes ``RUN/trigger.json`` for the extra window, and
prints its lines into the node's output (the job's log: plain lines, not redrawn).

It lives on this floor because it judges changes with the analysis' change detection
(``analysis/compute/step_changes.py``), which the launchers floor may not import; the node starts
it as a command, as it starts ``rankscope finalize --hang-only``. It ends when the node asks
(SIGTERM once torchrun has ended; Slurm's own when the job is cancelled), after one last look so
that the final steps are judged too, or when the node task that started it is gone (its parent
changed: nothing would stop it then).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.orchestrator.live import LiveMonitor

#: Seconds between two looks. Each look opens every rank's step log on the shared filesystem
#: (a metadata operation per rank), so it looks less often than a local run's monitor
#: (``launchers/local.py``'s 0.1 s); the ranks flush their step logs every 0.05 s
#: (``hang_probe.REQUEST_POLL_S``), and a change is noticed within its window of steps plus this.
POLL_S = 0.25


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope monitor`` (import-light)."""
    parser.add_argument("run_dir", type=Path, metavar="RUN", help="run directory of a Slurm job")


def monitor_for(run_dir: Path, record: dict[str, Any], out: IO[str]) -> LiveMonitor:
    """The live monitor of the run ``record`` (``run.json``) describes: its profiler schedule
    (the windows' steps are left out of the series), its live options (``rankscope run``'s
    ``--trigger``, ``--max-triggers``, ``--total-steps``; the defaults for the sbatch template)
    and its number of ranks."""
    from rankscope.launchers.spec import ProfilerSettings
    from rankscope.orchestrator.live import LiveMonitor
    from rankscope.orchestrator.live_options import LiveOptions

    options = LiveOptions.from_dict((record.get("options") or {}).get("live") or {})
    settings = ProfilerSettings.from_dict(record.get("profiler") or {})
    return LiveMonitor(run_dir, settings, options, record.get("world_size"), out=out)


def follow(
    monitor: LiveMonitor,
    stop: threading.Event,
    orphaned: Callable[[], bool],
    poll_s: float = POLL_S,
) -> None:
    """Look every ``poll_s`` s until ``stop`` is set or ``orphaned()`` says the node task has
    gone; then one last look, and the live line is ended."""
    try:
        while not stop.is_set() and not orphaned():
            monitor.poll()
            stop.wait(poll_s)
        monitor.poll()  # the steps made since the last look
    finally:
        monitor.close()


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope monitor`` (run by a batch job's first node); 0 when stopped."""
    from rankscope.launchers.rundir import load_run

    run_dir = Path(args.run_dir).resolve()
    record = load_run(run_dir)  # an unusable run.json: one line (InputFileError), exit 1
    monitor = monitor_for(run_dir, record, sys.stdout)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stop.set())
    parent = os.getppid()
    follow(monitor, stop, lambda: os.getppid() != parent)
    return 0
