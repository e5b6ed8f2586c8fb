"""``rankscope export RUN_or_trace.h5 --perfetto OUT.json[.gz]``: one aligned trace for Perfetto.

Writes Chrome trace-event JSON (ui.perfetto.dev and chrome://tracing load it): one process per
rank, one thread per lane, µs on the aligned clock, collectives linked across ranks by flow
events (format: :mod:`rankscope.analysis.render.perfetto`). A run directory without ``trace.h5`` is
merged first. The output is written to a temporary name beside it and renamed; a write that
fails (full disk, quota, read-only) is one line naming the file and the cause, the previous file
untouched and no temporary file left (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from rankscope.atomic import output_error
from rankscope.errors import InputFileError, OutputError, UsageError

#: ``--window-steps`` syntax: ``N`` or ``FIRST:LAST`` (inclusive ProfilerStep numbers).
STEPS_PATTERN = re.compile(r"^\s*(\d+)\s*(?::\s*(\d+)\s*)?$")


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope export`` (import-light)."""
    parser.add_argument("path", type=Path, help="a run directory or a merged trace.h5")
    parser.add_argument(
        "--perfetto",
        type=Path,
        required=True,
        metavar="OUT",
        help="write Chrome trace JSON here (.json, or .json.gz to compress)",
    )
    parser.add_argument(
        "--ranks", metavar="LIST", help="only these ranks, comma separated (e.g. 0,2)"
    )
    parser.add_argument(
        "--window-steps",
        metavar="FIRST:LAST",
        help="only the events overlapping ProfilerSteps FIRST..LAST (inclusive; or one step N)",
    )


def parse_ranks(text: str | None) -> list[int] | None:
    """``"0,2"`` -> ``[0, 2]``; None stays None. Raises UsageError on anything else."""
    if text is None:
        return None
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--ranks: expected comma-separated rank numbers, got {text!r}") from None
    if not ranks or any(r < 0 for r in ranks):
        raise UsageError(f"--ranks: expected comma-separated rank numbers, got {text!r}")
    return sorted(set(ranks))


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """``"3:5"`` -> ``(3, 5)``, ``"4"`` -> ``(4, 4)``. Raises UsageError on anything else."""
    if text is None:
        return None
    m = STEPS_PATTERN.match(text)
    if m is None:
        raise UsageError(f"--window-steps: expected FIRST:LAST or N, got {text!r}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if last < first:
        raise UsageError(f"--window-steps: last step {last} is before first step {first}")
    return first, last


def _check_output(out: Path) -> None:
    """Fail early, in one line, when ``out`` cannot be written."""
    if out.is_dir():
        raise InputFileError(f"{out}: is a directory, not an output file")
    parent = out.parent
    if not parent.is_dir():
        raise InputFileError(f"{out}: folder {parent} does not exist")
    import os

    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputFileError(f"{out}: folder {parent} is not writable")


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope export``."""
    from rankscope.analysis.render.perfetto import export_perfetto
    from rankscope.analysis.store.reader import open_store
    from rankscope.analysis.views.timeline import step_window
    from rankscope.orchestrator.workflow import resolve_store
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    ranks = parse_ranks(args.ranks)
    steps = parse_steps(args.window_steps)
    out: Path = args.perfetto
    _check_output(out)
    store_path = resolve_store(args.path)
    console = Console(stderr=True)
    with open_store(store_path) as store:
        missing = [r for r in ranks or [] if r not in store.ranks]
        if missing:
            raise UsageError(f"--ranks: {missing} not in {store_path} (ranks: {store.ranks})")
        window = None
        if steps is not None:
            try:
                window = step_window(store, *steps)
            except KeyError as exc:
                raise UsageError(f"--window-steps: {exc.args[0]}") from None
        with Progress(
            TextColumn("exporting ranks"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        ) as bar:
            task = bar.add_task("ranks", total=len(ranks or store.ranks))

            def tick(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            try:
                stats = export_perfetto(store, out, ranks=ranks, window=window, progress=tick)
            except OutputError:
                raise  # one line naming the file and the cause, nothing left (rankscope.atomic)
            except OSError as exc:
                raise output_error(out, exc) from exc
    total = sum(stats.events.values())
    print(
        f"wrote {out}: {total:,} events from {len(stats.events)} ranks, "
        f"{stats.flows:,} collectives linked (open it in https://ui.perfetto.dev)"
    )
    return 0
