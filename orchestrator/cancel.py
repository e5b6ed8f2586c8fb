"""``rankscope cancel RUN``: stop a Slurm run from any shell.

Runs ``scancel`` on the run's job: Slurm sends SIGTERM to every rank (each flushes the profiler
window in progress), then SIGKILL ``KillWait`` seconds later. The state becomes ``cancelled`` at
once; the dependent merge job still runs when the job has gone and merges the windows already
written. A local run is stopped with Ctrl-C in its own terminal.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope cancel``."""
    parser.add_argument("run_dir", type=Path, metavar="RUN", help="run directory of a Slurm run")


def main(args: argparse.Namespace) -> int:
    """Cancel the run through its backend (Slurm: scancel); say what happens next."""
    from rankscope.launchers.base import launcher_for_run

    run_dir = Path(args.run_dir).resolve()
    print(f"rankscope cancel: {launcher_for_run(run_dir).cancel_run(run_dir)}")
    return 0
