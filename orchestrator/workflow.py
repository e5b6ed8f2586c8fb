"""The one path from traces to reports: a store (merged when needed) → its analysis → the
terminal summary, summary.json and report.html.

``rankscope analyze`` (:func:`merge_analyse_report` with its flags), the end of ``rankscope run``
(:func:`after_run`), a Slurm run's merge job (``rankscope finalize``: :func:`merge` and
:func:`merge_analyse_report` in this process) and the commands that only need the store
(``view``, ``export``, ``compare``: :func:`resolve_store`) all go through here, so a store is
found, merged, refused, analysed and reported the same way whichever command the user typed.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.errors import InputFileError, RankscopeError
from rankscope.launchers import rundir

if TYPE_CHECKING:
    from rankscope.analysis.engine.driver import Analysis
    from rankscope.analysis.engine.scheduler import ClusterSpec
    from rankscope.analysis.render.summary_json import Summarised
    from rankscope.orchestrator.ingest.comm_kernels import CommVocabulary
    from rankscope.orchestrator.ingest.source_reads import ReadAhead

#: Width of the summary when stdout is not a terminal (rich would use 80 columns).
PIPE_WIDTH = 110
#: File names taken as a store by ``analyze`` (an HDF5 signature makes any name one).
STORE_SUFFIXES = (".h5", ".hdf5")
#: Slurm job name of the analysis' ``--slurm-workers`` (a merge first names its own).
ANALYZE_JOB_NAME = "rankscope-analyze"
#: Terminal rows of the top-ops table unless asked otherwise (``--top-ops``).
TOP_OPS = 8


@dataclasses.dataclass(frozen=True)
class Workflow:
    """What one merge → analyse → report does; ``rankscope analyze``'s flags fill it."""

    cluster: ClusterSpec | None = None
    """Where the merge's and the analysis' per-rank tasks run (None: ``auto``, in this process
    unless worker processes pay for their start-up)."""
    merge: bool = True
    """Merge a folder or trace whose store is missing or older than its inputs (False: a missing
    store is an error: ``rankscope run`` merged already)."""
    rank_from: str | None = None
    """``--rank-from`` of a merge run first (a regular expression naming the rank in a file name)."""
    json_path: Path | None = None
    """Where summary.json goes (None: ``RUN/report/summary.json`` for a folder, else nowhere)."""
    html_path: Path | None = None
    """Where report.html goes (None: ``RUN/report/report.html`` for a folder, else nowhere)."""
    top_ops: int = TOP_OPS
    """Rows of the terminal's top-ops table."""
    all_ranks: bool = False
    """List every rank in the terminal tables and the HTML report (above 16 they are summarised)."""
    progress: bool = True
    """Show the per-rank progress bar on stderr."""
    read_ahead: ReadAhead | None = None
    """The traces' reads begun in a forked process at start-up (``source_reads.ReadAhead``, which
    the caller owns; ``rankscope analyze`` starts it when :func:`merge_is_due`), taken by a merge
    run first instead of reading again."""
    comm: CommVocabulary | None = None
    """The communication kernels of a merge run first (``--comm-kernel``, the config file's);
    a store merged with other user patterns is merged again. None: as the store was merged."""


def merge_analyse_report(path: Path, wf: Workflow) -> Analysis:
    """Store of ``path`` (merged when needed) → analysis → terminal summary and reports written
    atomically (``wrote …`` for each); returns the analysis.

    The garbage collector runs at an analysis's pace meanwhile (:func:`paced_collector`), and
    pandas keeps strings as objects (:func:`object_strings`: the same results, less overhead on
    the analysis' many small frames)."""
    from rankscope.collector import paced_collector
    from rankscope.pandas_strings import object_strings

    with paced_collector(), object_strings():
        return _merge_analyse_report(path, wf)


def _merge_analyse_report(path: Path, wf: Workflow) -> Analysis:
    """:func:`merge_analyse_report` proper."""
    from rankscope.analysis.engine.scheduler import AUTO, ClusterSpec
    from rankscope.analysis.render.report import print_summary
    from rankscope.analysis.render.summary_json import summarise

    cluster = wf.cluster or ClusterSpec(scheduler=AUTO, main_is_guarded=True)
    _refuse_unprofiled_run(path)
    store = resolve_store(
        path,
        merge=wf.merge,
        cluster=cluster,
        rank_from=wf.rank_from,
        comm=wf.comm,
        read_ahead=wf.read_ahead,
    )
    analysis = run_analysis(
        store,
        dataclasses.replace(cluster, slurm_job_name=ANALYZE_JOB_NAME),
        show_progress=wf.progress,
    )
    json_path, html_path = wf.json_path, wf.html_path
    if path.is_dir():
        report = path / rundir.REPORT_DIR
        json_path = json_path or report / rundir.SUMMARY_JSON
        html_path = html_path or report / rundir.REPORT_HTML
    console = _console()
    # findings, advice and the summary document once, for the terminal and both files
    summarised = summarise(analysis)
    print_summary(
        analysis, console, top_ops=wf.top_ops, all_ranks=wf.all_ranks, summarised=summarised
    )
    for p in write_reports(
        analysis, json_path, html_path, all_ranks=wf.all_ranks, summarised=summarised
    ):
        console.print(f"wrote {p}")
    return analysis


def merge_into_store(
    path: Path,
    cluster: ClusterSpec | None = None,
    rank_from: str | None = None,
    comm: CommVocabulary | None = None,
    read_ahead: ReadAhead | None = None,
) -> Path:
    """Merge ``path`` into its default store (``store_names.store_for``; prints the clock line
    and where it went); Ctrl-C during it is reported as an interrupt. Returns the store.
    ``read_ahead``: reads begun at start-up (``merge_run_dir``)."""
    from rankscope.orchestrator.ingest.merge import merge_run_dir
    from rankscope.orchestrator.merge import interrupt_wins

    with interrupt_wins():
        return Path(
            merge_run_dir(
                path,
                cluster=cluster,
                main_is_guarded=True,
                rank_from=rank_from,
                comm=comm,
                read_ahead=read_ahead,
            )
        )


def after_run(run_dir: Path, *, merge_traces: bool, analyse: bool) -> None:
    """The end of ``rankscope run``: merge, then analyse and report; a failure of either is a
    warning that never touches the run (its traces are kept), and a failed merge leaves nothing
    to analyse."""
    steps: list[tuple[str, Any]] = []
    if merge_traces:
        steps.append(("merge_run_dir", lambda: merge_into_store(run_dir)))
    if analyse:
        steps.append(("print_run_summary", lambda: print_run_summary(run_dir)))
    for name, step in steps:
        try:
            step()
        except Exception as exc:
            print(
                f"rankscope run: warning: {name} failed ({type(exc).__name__}: {exc}); "
                f"the traces in {run_dir} are kept",
                file=sys.stderr,
            )
            if name == "merge_run_dir":
                break  # nothing to analyse without a store


def print_run_summary(run_dir: Path) -> None:
    """Analyse a merged run, print the summary, write ``RUN/report/`` (the store must exist)."""
    merge_analyse_report(Path(run_dir), Workflow(merge=False, progress=sys.stderr.isatty()))


def resolve_store(
    path: Path,
    *,
    merge: bool = True,
    scheduler: str | None = None,
    rank_from: str | None = None,
    cluster: ClusterSpec | None = None,
    comm: CommVocabulary | None = None,
    read_ahead: ReadAhead | None = None,
) -> Path:
    """The store to analyse for ``path``, checked readable (so a bad one fails in one line).

    ``path`` is a store file, a run directory or folder of traces, or one Kineto trace file. A
    folder or trace without an up-to-date store is merged (``scheduler``, or the whole
    ``cluster`` spec — Slurm workers — as ``rankscope merge``) into the store ``rankscope merge
    PATH`` writes (one naming rule, ``store_names.store_for``): ``trace.h5`` in the folder, or
    the trace's own store beside it (``a.json.gz`` → ``a.rankscope.h5``). An existing store is
    used as it is when no input is newer and it was merged with the same user patterns of
    communication kernels (``comm``; None: not checked); ``merge=False`` never merges
    (``rankscope run`` merged already). ``rank_from``: ``--rank-from`` of the merge;
    ``read_ahead``: its reads begun at start-up (:func:`merge_is_due`).
    """
    from rankscope.orchestrator.ingest.store_names import store_for

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
        return _store_for_trace(
            path,
            merge=merge,
            cluster=cluster,
            rank_from=rank_from,
            comm=comm,
            read_ahead=read_ahead,
        )
    store = store_for(path)
    if store.exists():
        why = _stale(store, path, comm) if merge else None
        if why is None:
            return _checked(store)
        print(f"{why}: merging again", file=sys.stderr)
    elif not merge:
        raise InputFileError(f"{path}: no {store.name} (run `rankscope merge {path}` first)")
    return _checked(merge_into_store(path, cluster, rank_from, comm, read_ahead))


def merge_is_due(path: Path) -> bool:
    """Will :func:`resolve_store` merge ``path``? Told without opening a store (so without
    h5py), for ``rankscope analyze`` to begin reading the traces while it imports
    (``source_reads.ReadAhead``): True for a folder whose store is missing or older than one of
    its traces, and a trace file without its store. Other stale stores (merged with other comm
    kernels, a trace's store older than it) are merged again without reads begun ahead."""
    from rankscope.orchestrator.ingest.discovery import is_trace_name
    from rankscope.orchestrator.ingest.store_names import store_for

    if path.is_dir():
        store = store_for(path)
        return not store.exists() or _newer_input(store, [path]) is not None
    return path.is_file() and is_trace_name(path) and not store_for(path).exists()


def _stale(store: Path, path: Path, comm: CommVocabulary | None) -> str | None:
    """Why ``store`` must be merged again from ``path`` (a newer input, other user patterns of
    communication kernels), or None when it is up to date."""
    newer = _newer_input(store, [path])
    if newer is not None:
        return f"{newer} is newer than {store}"
    if comm is None:
        return None
    from rankscope.analysis.store.reader import open_store
    from rankscope.orchestrator.ingest.comm_kernels import COMM_KERNELS_ATTR

    with open_store(store) as s:
        had = s.meta.get(COMM_KERNELS_ATTR) or []
    if list(had) != list(comm.user_patterns):
        return f"{store} was merged with other --comm-kernel patterns ({had or 'none'})"
    return None


def _is_store_file(path: Path) -> bool:
    """A store by its name (``.h5`` …) or its HDF5 signature; it is then opened as one."""
    import h5py

    return path.name.endswith(STORE_SUFFIXES) or bool(h5py.is_hdf5(path))


def _store_for_trace(
    trace: Path,
    *,
    merge: bool,
    cluster: ClusterSpec,
    rank_from: str | None = None,
    comm: CommVocabulary | None = None,
    read_ahead: ReadAhead | None = None,
) -> Path:
    """The store of one trace file: its own (``store_names.store_for``), merged from it when
    out of date.

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
    from rankscope.orchestrator.ingest.store_names import store_for

    store = store_for(trace)
    if store.exists():
        with open_store(store) as s:
            source = str(s.meta.get("source") or "")
        if source != str(trace.resolve()):
            raise InputFileError(
                f"{trace}: {store} holds another merge ({source or 'unknown source'}); analyze "
                f"that, or merge this file elsewhere: rankscope merge {trace} -o OTHER.h5"
            )
        why = _stale(store, trace, comm) if merge else None
        if why is None:
            print(f"using {store} (merged from {trace}; up to date)")
            return _checked(store)
        print(f"{why}: merging again", file=sys.stderr)
    elif not merge:
        raise InputFileError(f"{trace}: no {store} (run `rankscope merge {trace}`)")
    return _checked(merge_into_store(trace, cluster, rank_from, comm, read_ahead))


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
    analysis: Any,
    json_path: Path | None,
    html_path: Path | None,
    *,
    all_ranks: bool = False,
    summarised: Summarised | None = None,
) -> list[Path]:
    """Write summary.json and/or the HTML report atomically; returns what was written.
    ``summarised``: the analysis' findings, advice and document when the caller built them
    (``summary_json.summarise``), else built here once for both files.

    A report that cannot be written (full disk, quota, read-only folder) raises
    :class:`~rankscope.errors.OutputError`: one line naming it and the cause, the previous file
    untouched, no temporary file left (``rankscope.atomic``; docs/reliability.md).
    """
    from rankscope.analysis.render.report import render_html, render_json
    from rankscope.analysis.render.summary_json import summarise

    written: list[Path] = []
    if json_path is None and html_path is None:
        return written
    built = summarise(analysis) if summarised is None else summarised
    if json_path is not None:
        rundir.write_bytes_atomic(json_path, render_json(analysis, built).encode())
        written.append(json_path)
    if html_path is not None:
        html = render_html(analysis, all_ranks=all_ranks, summarised=built)
        rundir.write_bytes_atomic(html_path, html.encode())
        written.append(html_path)
    return written


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def _refuse_unprofiled_run(path: Path) -> None:
    """A run folder without a store whose ranks recorded no window: say why, in one line."""
    if not (path.is_dir() and (path / rundir.RUN_JSON).is_file()):
        return
    if (path / rundir.STORE_NAME).exists():
        return
    from rankscope.orchestrator.run_outcome import nothing_profiled, run_summary

    try:
        why = nothing_profiled(run_summary(path))
    except (OSError, ValueError, KeyError, RankscopeError):
        return  # an unreadable run.json / meta.json: the merge reports it with its file
    if why:
        raise InputFileError(f"{path}: {why}")
