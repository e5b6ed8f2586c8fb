"""``rankscope analyze RUN_DIR_or_trace.h5``: breakdown, collectives, stragglers, verdicts.

Prints the terminal summary and writes ``summary.json`` / ``report.html`` (atomically). For a run
directory both go to ``RUN/report/`` unless ``--json`` / ``--html`` say otherwise; a run directory
without ``trace.h5`` is merged first. ``rankscope run`` calls :func:`print_run_summary` at its end.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.errors import InputFileError, RankscopeError
from rankscope.launchers import rundir

if TYPE_CHECKING:
    from rankscope.analysis.engine.scheduler import ClusterSpec

#: Width of the summary when stdout is not a terminal (rich would use 80 columns).
PIPE_WIDTH = 110
#: File names taken as a store by ``analyze`` (an HDF5 signature makes any name one).
STORE_SUFFIXES = (".h5", ".hdf5")
#: Slurm job name of the analysis' ``--slurm-workers`` (a merge first names its own).
ANALYZE_JOB_NAME = "rankscope-analyze"


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope analyze`` (import-light)."""
    parser.add_argument(
        "path",
        type=Path,
        help="a run directory, a folder of Kineto traces, one trace file, or a merged trace.h5",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write summary.json here")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write the HTML report here")
    from rankscope.analysis.engine.cluster_flags import add_cluster_flags

    add_cluster_flags(parser)  # the merge's flags too: a merge analyze runs first uses them
    parser.add_argument(
        "--top-ops", type=int, default=8, metavar="N", help="ops shown in the terminal (default 8)"
    )
    parser.add_argument(
        "--all-ranks",
        action="store_true",
        help="list every rank in the terminal tables (above 16 ranks they are summarised)",
    )
    from rankscope.orchestrator.merge import add_rank_from

    add_rank_from(parser)


def resolve_store(
    path: Path,
    *,
    merge: bool = True,
    scheduler: str | None = None,
    rank_from: str | None = None,
    cluster: ClusterSpec | None = None,
) -> Path:
    """The store to analyse for ``path``, checked readable (so a bad one fails in one line).

    ``path`` is a store file, a run directory or folder of traces, or one Kineto trace file. A
    folder or trace without an up-to-date store is merged (``scheduler``, or the whole
    ``cluster`` spec — Slurm workers — as ``rankscope merge``) into the store ``rankscope merge
    PATH`` writes: ``trace.h5`` in the folder, or beside the trace. An existing store is used as
    it is when no input is newer; ``merge=False`` never merges (``rankscope run`` merged
    already). ``rank_from``: ``--rank-from`` of the merge.
    """
    if cluster is None:
        from rankscope.analysis.engine.scheduler import AUTO, ClusterSpec

        cluster = ClusterSpec(scheduler=scheduler or AUTO, main_is_guarded=True)
    elif scheduler is not None:
        raise ValueError("give resolve_store scheduler= or cluster=, not both")
    if not path.exists():
        raise InputFileError(f"{path}: no such file or directory")
    if path.is_file():
        if _is_store_file(path):
            return _checked(path)
        return _store_for_trace(path, merge=merge, cluster=cluster, rank_from=rank_from)
    store = path / rundir.STORE_NAME
    if store.exists():
        newer = _newer_input(store, [path]) if merge else None
        if newer is None:
            return _checked(store)
        print(f"{newer} is newer than {store}: merging again", file=sys.stderr)
    elif not merge:
        raise InputFileError(f"{path}: no {rundir.STORE_NAME} (run `rankscope merge {path}` first)")
    return _checked(_merge(path, cluster, rank_from))


def _is_store_file(path: Path) -> bool:
    """A store by its name (``.h5`` …) or its HDF5 signature; it is then opened as one."""
    import h5py

    return path.name.endswith(STORE_SUFFIXES) or bool(h5py.is_hdf5(path))


def _store_for_trace(
    trace: Path, *, merge: bool, cluster: ClusterSpec, rank_from: str | None = None
) -> Path:
    """The store of one trace file: ``trace.h5`` beside it, merged from it when out of date.

    The store is the one ``rankscope merge TRACE`` writes; it is reused while it was merged from
    this very file and is newer than it. One merged from other inputs (the whole folder) is
    never overwritten by a merge of one of its files.
    """
    from rankscope.analysis.store.reader import open_store
    from rankscope.orchestrator.ingest.discovery import TraceHead, is_trace_name, sniff

    head = sniff(trace)
    if head is TraceHead.EXPORT:
        raise InputFileError(
            f"{trace}: a Perfetto export written by rankscope, not a trace to analyse; "
            "analyze the store or run folder it was exported from"
        )
    if not (head is TraceHead.TRACE or (head is TraceHead.UNREADABLE and is_trace_name(trace))):
        raise InputFileError(
            f"{trace}: neither a rankscope store (HDF5 trace.h5) nor a Kineto trace "
            "(.json, .json.gz)"
        )
    store = trace.parent / rundir.STORE_NAME
    if store.exists():
        with open_store(store) as s:
            source = str(s.meta.get("source") or "")
        if source != str(trace.resolve()):
            raise InputFileError(
                f"{trace}: {store} holds another merge ({source or 'unknown source'}); analyze "
                f"that, or merge this file elsewhere: rankscope merge {trace} -o OTHER.h5"
            )
        if _newer_input(store, [trace]) is None or not merge:
            print(f"using {store} (merged from {trace}; up to date)")
            return _checked(store)
    elif not merge:
        raise InputFileError(f"{trace}: no {rundir.STORE_NAME} beside it (run `rankscope merge`)")
    return _checked(_merge(trace, cluster, rank_from))


def _merge(path: Path, cluster: ClusterSpec, rank_from: str | None = None) -> Path:
    """Merge ``path`` into its default store (prints the clock line and where it went)."""
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    return Path(merge_run_dir(path, cluster=cluster, main_is_guarded=True, rank_from=rank_from))


def _newer_input(store: Path, inputs: list[Path]) -> Path | None:
    """The first input trace file modified after ``store`` was written, else None."""
    from rankscope.orchestrator.ingest.discovery import discover

    written = store.stat().st_mtime_ns
    sources, _, _ = discover(inputs)
    for source in sources:
        for _, f in source.files:
            try:
                if f.stat().st_mtime_ns > written:
                    return f
            except OSError:
                continue
    return None


def _checked(store: Path) -> Path:
    """``store`` once it opens as a rankscope store (InputFileError naming it otherwise)."""
    from rankscope.analysis.store.reader import open_store

    with open_store(store):
        return store


def run_analysis(store: Path, spec: Any, *, show_progress: bool = True) -> Any:
    """Analyse ``store`` with a progress bar on stderr."""
    from rankscope.analysis.engine.driver import analyze
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not show_progress:
        analysis = analyze(store, spec)
    else:
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

            analysis = analyze(store, spec, progress=tick)
    # one short line: where the work ran and why (docs/reading-output.md)
    console.print(
        f"[dim]analysis: {analysis.scheduler.reason}[/dim]", highlight=False, soft_wrap=True
    )
    return analysis


def write_reports(
    analysis: Any, json_path: Path | None, html_path: Path | None, *, all_ranks: bool = False
) -> list[Path]:
    """Write summary.json and/or the HTML report atomically; returns what was written.

    A report that cannot be written (full disk, quota, read-only folder) raises
    :class:`~rankscope.errors.OutputError`: one line naming it and the cause, the previous file
    untouched, no temporary file left (``rankscope.atomic``; docs/reliability.md).
    """
    from rankscope.analysis.render.report import render_html, render_json

    written = []
    if json_path is not None:
        rundir.write_bytes_atomic(json_path, render_json(analysis).encode())
        written.append(json_path)
    if html_path is not None:
        rundir.write_bytes_atomic(html_path, render_html(analysis, all_ranks=all_ranks).encode())
        written.append(html_path)
    return written


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope analyze``."""
    from rankscope.analysis.engine.cluster_flags import cluster_spec_from_args
    from rankscope.analysis.render.report import print_summary

    path: Path = args.path
    # One spec for both: a merge that must run first uses the same workers (its own "auto"
    # choice, for its own size, when none were asked for).
    cluster = cluster_spec_from_args(args, main_is_guarded=True)
    _refuse_unprofiled_run(path)
    store = resolve_store(path, cluster=cluster, rank_from=getattr(args, "rank_from", None))
    analysis = run_analysis(store, dataclasses.replace(cluster, slurm_job_name=ANALYZE_JOB_NAME))
    json_path, html_path = args.json, args.html
    if path.is_dir():
        report = path / rundir.REPORT_DIR
        json_path = json_path or report / rundir.SUMMARY_JSON
        html_path = html_path or report / rundir.REPORT_HTML
    console = _console()
    print_summary(
        analysis, console, top_ops=args.top_ops, all_ranks=getattr(args, "all_ranks", False)
    )
    for p in write_reports(
        analysis, json_path, html_path, all_ranks=getattr(args, "all_ranks", False)
    ):
        console.print(f"wrote {p}")
    return 0


def _refuse_unprofiled_run(path: Path) -> None:
    """A run folder without a store whose ranks recorded no window: say why, in one line."""
    if not (path.is_dir() and (path / rundir.RUN_JSON).is_file()):
        return
    if (path / rundir.STORE_NAME).exists():
        return
    from rankscope.orchestrator.run import nothing_profiled, run_summary

    try:
        why = nothing_profiled(run_summary(path))
    except (OSError, ValueError, KeyError, RankscopeError):
        return  # an unreadable run.json / meta.json: the merge reports it with its file
    if why:
        raise InputFileError(f"{path}: {why}")


def print_run_summary(run_dir: Path) -> None:
    """End of ``rankscope run``: analyse the merged run, print the summary, write RUN/report/."""
    from rankscope.analysis.engine.driver import ClusterSpec
    from rankscope.analysis.render.report import print_summary

    run_dir = Path(run_dir)
    store = resolve_store(run_dir, merge=False)
    spec = ClusterSpec(main_is_guarded=True)
    analysis = run_analysis(store, spec, show_progress=sys.stderr.isatty())
    console = _console()
    print_summary(analysis, console)
    report = run_dir / rundir.REPORT_DIR
    for p in write_reports(analysis, report / rundir.SUMMARY_JSON, report / rundir.REPORT_HTML):
        console.print(f"wrote {p}")
