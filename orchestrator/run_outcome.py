"""What a finished run did, read back from its run directory: the per-rank summary printed at
the end of ``rankscope run``, and the one line saying why nothing was profiled.

Apart from the command (``run.py``) because the merge → analyse → report workflow reads it too
(``workflow.py`` refuses a run that profiled nothing with that line) and the command calls the
workflow: one module each way, no cycle. Durations are seconds; sizes bytes, printed with
binary prefixes.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _duration_s(record: dict[str, Any]) -> float | None:
    """Seconds between ``started_at`` and ``ended_at`` of run.json."""
    try:
        start = dt.datetime.fromisoformat(record["started_at"].replace("Z", "+00:00"))
        end = dt.datetime.fromisoformat(record["ended_at"].replace("Z", "+00:00"))
    except (KeyError, AttributeError, TypeError, ValueError):
        return None
    return (end - start).total_seconds()


def run_summary(run_dir: Path) -> dict[str, Any]:
    """Figures of a run: per rank windows/events/bytes/samples, totals, duration in s."""
    from rankscope.launchers.base import read_rank_metas
    from rankscope.launchers.rundir import load_run

    record = load_run(run_dir)
    metas = read_rank_metas(run_dir)
    ranks = []
    for rank, meta in sorted(metas.items()):
        windows = meta.get("windows", [])
        error = meta.get("error")
        ranks.append(
            {
                "rank": rank,
                "host": meta.get("host"),
                "windows": len(windows),
                "events": sum(int(w.get("events", 0)) for w in windows),
                "bytes": sum(int(w.get("bytes", 0)) for w in windows),
                "clock_samples": len(meta.get("clock", {}).get("samples", [])),
                "clock_leader": meta.get("clock", {}).get("leader_rank"),
                "clock_reference": meta.get("clock", {}).get("reference_rank"),
                "steps": meta.get("steps"),
                "profiler": meta.get("profiler", {}),
                "error": None if not error else f"{error.get('type')}: {error.get('message')}",
            }
        )
    return {
        "run_dir": str(run_dir),
        "state": record.get("state"),
        "exit_code": record.get("exit_code"),
        "duration_s": _duration_s(record),
        "world_size": record.get("world_size"),
        "ranks": ranks,
        "windows": sum(r["windows"] for r in ranks),
        "events": sum(r["events"] for r in ranks),
        "bytes": sum(r["bytes"] for r in ranks),
        "failures": record.get("failures", []),
    }


def nothing_profiled(summary: dict[str, Any]) -> str | None:
    """Why a finished run recorded no profiler window, and how to fix it (None when it did).

    The ranks count the steps they saw (``meta.json`` ``steps``): none at all means the loop has
    no ``optimizer.step()`` and calls no ``rankscope.step()``; fewer than the schedule needs
    before its first recorded step means the run was shorter than the schedule.
    """
    if summary["windows"] or not summary["ranks"]:
        return None
    steps = [r["steps"] for r in summary["ranks"] if r.get("steps") is not None]
    prof: dict[str, Any] = next((r["profiler"] for r in summary["ranks"] if r.get("profiler")), {})
    if not steps:
        return "no rank recorded a profiler window (the ranks wrote no step count)."
    seen = max(steps)
    if seen == 0:
        return (
            "nothing was profiled: no training step was seen (no optimizer.step() and no "
            "rankscope.step() in the loop). Call rankscope.step() once per iteration "
            "(`import rankscope`; a no-op outside rankscope run), or step a torch.optim optimizer."
        )
    first = int(prof.get("skip_first", 0)) + int(prof.get("wait", 0)) + int(prof.get("warmup", 0))
    return (
        f"nothing was profiled: the ranks saw {seen} step(s), but the schedule records from step "
        f"{first + 1} on (--skip-first {prof.get('skip_first', 0)}, --wait {prof.get('wait', 0)}, "
        f"--warmup {prof.get('warmup', 0)}); run more steps or lower those flags."
    )


def _clock_label(r: dict[str, Any]) -> str:
    """The run table's clock cell, in the merge's words (docs/reading-output.md)."""
    leader, reference = r["clock_leader"], r.get("clock_reference")
    if leader is None:
        return "-"  # no init_process_group: nothing to align
    if r["clock_samples"]:
        return f"runtime ({r['clock_samples']} samples)"
    if leader == reference or (reference is None and r["rank"] == leader):
        return "reference"
    return f"same clock as rank {leader}"


def print_run_outcome(run_dir: Path) -> dict[str, Any]:
    """Print the end-of-run table (rich) and return the figures."""
    from rankscope.launchers.rundir import RunState
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    s = run_summary(run_dir)
    console = Console(stderr=False, highlight=False)
    table = Table(title=f"rankscope run: {s['state']}", title_justify="left")
    for col in ("rank", "host", "windows", "events", "bytes", "clock"):
        table.add_column(col, justify="left" if col == "host" else "right")
    for r in s["ranks"]:
        clock = _clock_label(r)
        table.add_row(
            str(r["rank"]),
            str(r["host"]),
            str(r["windows"]),
            f"{r['events']:,}",
            _human_bytes(r["bytes"]),
            clock,
        )
    duration = s["duration_s"]
    table.caption = (
        f"{len(s['ranks'])} ranks, {s['windows']} windows, {s['events']:,} events, "
        f"{_human_bytes(s['bytes'])}, {'?' if duration is None else f'{duration:.1f} s'}"
    )
    table.caption_justify = "left"
    console.print(table)
    for i, f in enumerate(s["failures"]):
        who = "launcher" if f.get("rank") is None else f"rank {f['rank']}"
        label = "failed first" if i == 0 and len(s["failures"]) > 1 else "failed"
        console.print(f"[red]{who} {label}[/red]: {escape(str(f.get('error')))}")
    if s["failures"]:
        # the terminal was spared the ranks' tracebacks (launchers/output.py): say where they are
        from rankscope.launchers.rundir import LOGS_DIR

        console.print(f"the ranks' output and tracebacks: {run_dir / LOGS_DIR}")
    console.print(f"run directory: {run_dir}")
    why = nothing_profiled(s) if s["state"] == RunState.COMPLETED else None
    if why:
        Console(stderr=True, highlight=False).print(
            f"[bold yellow]rankscope run: warning:[/bold yellow] {escape(why)}"
        )
    return s
