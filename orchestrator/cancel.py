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
    """Cancel the run's Slurm job; say what happens next."""
    from rankscope.errors import UsageError
    from rankscope.launchers.base import load_run
    from rankscope.launchers.rundir import RunState
    from rankscope.launchers.spec import LauncherKind

    run_dir = Path(args.run_dir).resolve()
    record = load_run(run_dir)
    if record.get("launcher") != LauncherKind.SLURM:
        pid = (record.get("local") or {}).get("pid")
        where = f" (torchrun pid {pid})" if pid else ""
        raise UsageError(f"{run_dir} is a local run{where}: stop it with Ctrl-C in its terminal")
    from rankscope.launchers.slurm import SlurmLauncher

    launcher = SlurmLauncher(echo=False)
    handle = launcher.attach(run_dir)
    before = RunState(handle.record()["state"])
    if not before.finished:
        before = handle.state()  # it may have ended meanwhile
    if before.finished:
        print(f"rankscope cancel: {run_dir} already ended: {before}")
        return 0
    state = handle.cancel()
    slurm = handle.record().get("slurm") or {}
    merge = slurm.get("merge_job_id")
    then = f"; merge job {merge} merges the windows already written" if merge else ""
    print(f"rankscope cancel: Slurm job {slurm.get('job_id')} {state}{then}")
    return 0
