"""``rankscope analyze RUN_DIR_or_trace.h5``: breakdown, collectives, stragglers, verdicts.

Prints the terminal summary and writes ``summary.json`` / ``report.html`` (atomically). For a run
directory both go to ``RUN/report/`` unless ``--json`` / ``--html`` say otherwise; a run directory
without ``trace.h5`` is merged first. ``rankscope run`` calls :func:`print_run_summary` at its end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rankscope.errors import InputFileError, UsageError
from rankscope.launchers import rundir

#: Width of the summary when stdout is not a terminal (rich would use 80 columns).
PIPE_WIDTH = 110
#: Runs with at most this many ranks are analysed in-process at the end of ``rankscope run``
#: (starting a LocalCluster would cost more than it saves).
RUN_SUMMARY_SYNC_RANKS = 8


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope analyze`` (import-light)."""
    parser.add_argument("path", type=Path, help="a run directory or a merged trace.h5")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write summary.json here")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write the HTML report here")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="Dask scheduler address (tcp://host:8786), or 'synchronous' to run in-process "
        "(default: a LocalCluster sized to this machine)",
    )
    where.add_argument(
        "--slurm-workers",
        type=int,
        metavar="N",
        help="run the per-rank tasks on N Slurm workers (dask-jobqueue)",
    )
    parser.add_argument("--slurm-partition", metavar="NAME", help="partition for --slurm-workers")
    parser.add_argument(
        "--top-ops", type=int, default=8, metavar="N", help="ops shown in the terminal (default 8)"
    )


def resolve_store(path: Path, *, merge: bool = True) -> Path:
    """The store to analyse for ``path``; merges a run directory that has none yet."""
    if not path.exists():
        raise InputFileError(f"{path}: no such file or directory")
    if path.is_file():
        return path
    store = path / rundir.STORE_NAME
    if store.exists():
        return store
    if not merge:
        raise InputFileError(f"{path}: no {rundir.STORE_NAME} (run `rankscope merge {path}` first)")
    try:
        from rankscope.orchestrator.merge import merge_run_dir
    except ModuleNotFoundError:
        raise InputFileError(f"{path}: no {rundir.STORE_NAME} and no merge available") from None
    return Path(merge_run_dir(path))


def _spec(args: argparse.Namespace) -> Any:
    from rankscope.analysis.pipeline import LOCAL, ClusterSpec

    try:
        return ClusterSpec(
            scheduler=args.scheduler or LOCAL,
            slurm_workers=args.slurm_workers,
            slurm_partition=args.slurm_partition,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run_analysis(store: Path, spec: Any, *, show_progress: bool = True) -> Any:
    """Analyse ``store`` with a progress bar on stderr."""
    from rankscope.analysis.pipeline import analyze
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not show_progress:
        return analyze(store, spec)
    with Progress(
        TextColumn("analysing ranks"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("ranks", total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return analyze(store, spec, progress=tick)


def write_reports(analysis: Any, json_path: Path | None, html_path: Path | None) -> list[Path]:
    """Write summary.json and/or the HTML report atomically; returns what was written."""
    from rankscope.analysis.report import render_html, render_json

    written = []
    if json_path is not None:
        rundir.write_bytes_atomic(json_path, render_json(analysis).encode())
        written.append(json_path)
    if html_path is not None:
        rundir.write_bytes_atomic(html_path, render_html(analysis).encode())
        written.append(html_path)
    return written


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope analyze``."""
    from rankscope.analysis.report import print_summary

    path: Path = args.path
    if args.slurm_workers is not None and args.slurm_workers < 1:
        raise UsageError(f"--slurm-workers must be >= 1, got {args.slurm_workers}")
    store = resolve_store(path)
    analysis = run_analysis(store, _spec(args))
    json_path, html_path = args.json, args.html
    if path.is_dir():
        report = path / rundir.REPORT_DIR
        json_path = json_path or report / rundir.SUMMARY_JSON
        html_path = html_path or report / rundir.REPORT_HTML
    console = _console()
    print_summary(analysis, console, top_ops=args.top_ops)
    for p in write_reports(analysis, json_path, html_path):
        console.print(f"wrote {p}")
    return 0


def print_run_summary(run_dir: Path) -> None:
    """End of ``rankscope run``: analyse the merged run, print the summary, write RUN/report/."""
    from rankscope.analysis.pipeline import LOCAL, SYNCHRONOUS, ClusterSpec
    from rankscope.analysis.report import print_summary
    from rankscope.analysis.store import open_store

    run_dir = Path(run_dir)
    store = resolve_store(run_dir, merge=False)
    with open_store(store) as s:
        n = len(s.ranks)
    spec = ClusterSpec(scheduler=SYNCHRONOUS if n <= RUN_SUMMARY_SYNC_RANKS else LOCAL)
    analysis = run_analysis(store, spec, show_progress=sys.stderr.isatty())
    console = _console()
    print_summary(analysis, console)
    report = run_dir / rundir.REPORT_DIR
    for p in write_reports(analysis, report / rundir.SUMMARY_JSON, report / rundir.REPORT_HTML):
        console.print(f"wrote {p}")
