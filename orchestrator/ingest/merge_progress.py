"""What the merge tells the user while it runs: one line per input problem, and a progress bar.

Separate from the driver (``orchestrator/ingest/merge.py``) because both the driver and the decisions
on which ranks to keep (``orchestrator/ingest/rank_selection.py``) print problems, and both must print
them through the bar's console while it is shown (a plain ``print`` would tear the bar).
Everything goes to stderr; ``quiet`` silences it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.orchestrator.ingest.discovery import Problem
    from rankscope.orchestrator.ingest.rank_columns import RankResult


def _say(problem: Problem, quiet: bool, progress: Any = None) -> None:
    """Print one problem on one line (stderr), naming the file."""
    if quiet:
        return
    line = f"rankscope merge: {problem.file}: {problem.problem}"
    if progress is not None and getattr(progress, "console", None) is not None:
        progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
    else:
        print(line, file=sys.stderr)


class _Progress:
    """Rich progress bar: bytes of input parsed (files on disk) and ranks done, on stderr."""

    def __init__(self, quiet: bool, n: int, total_bytes: int) -> None:
        self.console: Any = None
        self._bar: Any = None
        self._n = n
        self._done = 0
        if quiet:
            return
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self._bar = Progress(
            TextColumn("merging {task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self._task = self._bar.add_task(f"0/{n} ranks", total=max(total_bytes, 1))

    def advance(self, result: RankResult) -> None:
        """One rank source finished (its files' sizes count as done)."""
        self._done += 1
        if self._bar is not None:
            size = sum(p.stat().st_size for _, p in result.source.files if p.exists())
            self._bar.update(self._task, advance=size, description=f"{self._done}/{self._n} ranks")

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
