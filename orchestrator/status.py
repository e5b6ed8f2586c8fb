"""``rankscope status RUN``: the state of a run, local or Slurm, from any shell.

Reads ``RUN/run.json``; for a Slurm run it also asks Slurm (``sacct``, then ``squeue``) and
writes what changed back to ``run.json`` (queued → running → completed/failed/cancelled/timeout),
so it works after the submitting process has exited. Prints the run, one row per Slurm task
(node, host, state, exit code), the merge job, the store, and the failures with their ranks;
while the job runs, the live line from its ranks' step logs (docs/live.md), and the changes the
live monitor noticed (``RUN/changes.jsonl``). A job hung and left running (``--on-hang wait``) is
shown ``hung``, kept running, with how to end it.
``--json`` prints the refreshed ``run.json`` instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rankscope.launchers.rundir import RunState
from rankscope.launchers.spec import LauncherKind


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope status``."""
    parser.add_argument("run_dir", type=Path, metavar="RUN", help="run directory (holds run.json)")
    parser.add_argument("--json", action="store_true", help="print the refreshed run.json")


def refresh(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """Ask the run's backend for news, record them in ``run.json``; return the record and a note.

    The note says why the backend could not be asked (Slurm down): the record is then shown
    as last written.
    """
    from rankscope.launchers.base import launcher_for_run
    from rankscope.launchers.rundir import load_run

    note = launcher_for_run(run_dir).refresh(run_dir)
    return load_run(run_dir), note


def describe(run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The figures ``status`` prints (also handy for tests): state, tasks, merge, failures."""
    from rankscope.launchers import rundir
    from rankscope.launchers.base import launcher_for_run

    out: dict[str, Any] = {
        "run_dir": str(run_dir),
        "launcher": record.get("launcher"),
        "state": record.get("state"),
        "exit_code": record.get("exit_code"),
        "world_size": record.get("world_size"),
        "started_at": record.get("started_at"),
        "ended_at": record.get("ended_at"),
        "failures": record.get("failures") or [],
        "hang": record.get("hang"),
        "store": str(run_dir / rundir.STORE_NAME)
        if (run_dir / rundir.STORE_NAME).exists()
        else None,
    }
    out.update(launcher_for_run(run_dir, record).status_details(run_dir, record))
    out["live"] = None
    if record.get("state") == RunState.RUNNING:  # what its ranks' step logs say (docs/live.md)
        from rankscope.orchestrator.live import status_line

        out["live"] = status_line(run_dir, record)
    hang = record.get("hang") or {}
    if record.get("state") == RunState.RUNNING and hang.get("headline"):
        # --on-hang wait: the processes live on (run.json says running, truthfully), but what a
        # user asking needs first is that the job is hung, and how to end it
        out["state"] = RunState.HUNG
        out["kept_running"] = True
    changes = run_dir / rundir.CHANGES_FILE
    out["changes"] = changes.read_text().splitlines() if changes.is_file() else []
    return out


def print_status(info: dict[str, Any]) -> None:
    """Print ``describe``'s figures with rich."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    colour: dict[str, str] = {
        RunState.COMPLETED: "green",
        RunState.RUNNING: "cyan",
        RunState.QUEUED: "yellow",
        RunState.PENDING: "yellow",
        RunState.FAILED: "red",
        RunState.TIMEOUT: "red",
        RunState.HUNG: "red",
        RunState.CANCELLED: "magenta",
        RunState.INTERRUPTED: "magenta",
    }
    state = str(info["state"])
    head = f"[bold]{escape(info['run_dir'])}[/bold]: [{colour.get(state, 'white')}]{state}[/]"
    if info.get("job_id"):
        reason = f", waiting: {info['slurm_reason']}" if info.get("slurm_reason") else ""
        head += f"  (Slurm job {info['job_id']}: {info.get('slurm_state') or '?'}{escape(reason)})"
    if info.get("exit_code") is not None:
        head += f"  exit code {info['exit_code']}"
    if info.get("kept_running"):
        end = (
            f"rankscope cancel {escape(info['run_dir'])}"
            if info["launcher"] == LauncherKind.SLURM
            else "Ctrl-C in its terminal"
        )
        head += f"  (kept running for a debugger, --on-hang wait: {end} ends it)"
    console.print(head)
    console.print(
        f"launcher {info['launcher']}, {info.get('world_size') or '?'} ranks, "
        f"started {info.get('started_at') or '-'}, ended {info.get('ended_at') or '-'}"
    )
    if info["tasks"]:
        table = Table(title="tasks (one per node)", title_justify="left")
        for col in ("node", "host", "state", "exit code"):
            table.add_column(col, justify="left" if col in ("host", "state") else "right")
        for t in info["tasks"]:
            table.add_row(
                str(t["node"]),
                str(t.get("host") or "-"),
                f"[{colour.get(t['state'], 'white')}]{t['state']}[/]",
                "-" if t.get("exit_code") is None else str(t["exit_code"]),
            )
        console.print(table)
    if info.get("merge_job_id"):
        console.print(f"merge job {info['merge_job_id']}: {info.get('merge_state') or '?'}")
    if info.get("live"):
        console.print(escape(info["live"]))
    for line in info.get("changes") or []:
        try:
            said = json.loads(line).get("sentence")
        except ValueError:
            continue
        console.print(f"[yellow]change[/yellow]: {escape(str(said))}")
    console.print(f"store: {info['store'] or '(not merged yet)'}")
    for f in info["failures"]:
        who = "launcher" if f.get("rank") is None else f"rank {f['rank']}"
        mark = " (root cause)" if f.get("root_cause") else ""
        console.print(f"[red]{who} failed{mark}[/red]: {escape(str(f.get('error')))}")
    hang = info.get("hang") or {}
    if hang.get("headline"):
        console.print(f"[red]hung[/red]: {escape(str(hang['headline']))}")
        for c in hang.get("culprits") or []:
            console.print(
                f"  rank {c.get('rank')} ({c.get('state')}): {escape(str(c.get('where')))}"
            )
    for note in info["notes"]:
        console.print(f"[yellow]note[/yellow]: {escape(note)}")


def main(args: argparse.Namespace) -> int:
    """Refresh and print the state of one run (exit 0; 1 if ``run.json`` is unusable)."""
    run_dir = Path(args.run_dir).resolve()
    record, note = refresh(run_dir)
    if args.json:
        print(json.dumps(record, indent=1))
        return 0
    info = describe(run_dir, record)
    if note:
        info["notes"].insert(0, note)
    print_status(info)
    return 0
