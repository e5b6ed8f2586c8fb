"""A job's output: copied line by line to its log file unchanged and to a console.

One copier, :func:`tee`, serves both backends: the local launcher copies torchrun's output to
``RUN/logs/torchrun.log`` and the terminal (without Kineto's trace markers, :class:`ConsoleFilter`),
and each Slurm node task copies its torchrun's output to ``RUN/logs/torchrun-JOB-nodeNNN.log`` and
to the task's stdout (submitit's log, unfiltered). The log is what failure summaries are read from,
so it always gets every byte; the console is a courtesy and stops at its first write error.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO

#: Kineto's trace markers, printed to stderr by every rank each time a profiler window starts
#: and stops ("USDT:2026-11-30 10:34:11 6603:6603 SyncActivityProfilerHandler.cpp:52]
#: profiler_start"). Only ``KINETO_LOG_LEVEL=6`` silences them at the source, and that also
#: silences Kineto's errors, so they are kept in the log and left out of the terminal instead.
KINETO_MARKER_RE = re.compile(
    rb"USDT:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w.]+:\d+\] profiler_(?:start|stop)"
)


class ConsoleFilter:
    """Drops Kineto's trace markers (:data:`KINETO_MARKER_RE`) from the lines shown in the terminal.

    Kineto writes a marker and its newline in two writes, so the markers of several ranks run
    together on one line ("…profiler_startUSDT:…profiler_start") and their newlines follow as
    empty lines: each line that held N markers owes N-1 newlines, and that many of the following
    empty lines are dropped too. Whatever else a line holds is kept.
    """

    def __init__(self) -> None:
        self._owed_newlines = 0
        self.muted = False
        """Show nothing more (the job is being ended after a hang: its teardown noise — the
        ranks' tracebacks — stays in the log, the terminal keeps rankscope's paragraph)."""

    def mute(self) -> None:
        """From now on, nothing reaches the terminal (the log still gets every byte)."""
        self.muted = True

    def __call__(self, line: bytes) -> bytes | None:
        """The line to show, or None to show nothing."""
        if self.muted:
            return None
        rest, markers = KINETO_MARKER_RE.subn(b"", line)
        if not markers:
            if self._owed_newlines and not line.strip(b"\r\n"):
                self._owed_newlines -= 1
                return None
            return line
        self._owed_newlines += markers - (1 if line.endswith(b"\n") else 0)
        return rest if rest.strip() else None


def tee(
    src: IO[bytes],
    log: Path,
    echo: IO[bytes] | None,
    shown: Callable[[bytes], bytes | None] | None = None,
) -> None:
    """Copy ``src`` to ``log`` (appended, unchanged) and to ``echo`` until ``src`` ends.

    ``shown`` picks what ``echo`` gets of each line (None: nothing); without it, every line.
    Runs in a thread of its own; closes ``src`` at the end.
    """
    fh: IO[bytes] | None = log.open("ab")
    for line in iter(src.readline, b""):
        if fh is not None:
            try:
                fh.write(line)
                fh.flush()
            except OSError as exc:  # a full disk: the job's output must keep flowing
                _drop_log(fh, log, exc, echo)
                fh = None
        if echo is None:
            continue
        out = line if shown is None else shown(line)
        if out is None:
            continue
        try:
            echo.write(out)
            echo.flush()
        except (OSError, ValueError):
            echo = None
    if fh is not None:
        with contextlib.suppress(OSError):
            fh.close()
    src.close()


def _drop_log(fh: IO[bytes], log: Path, exc: OSError, echo: IO[bytes] | None) -> None:
    """Stop writing ``log`` after a failed write: one line on the console, the copy goes on
    (a reader that stopped would block the job on a full pipe)."""
    from rankscope.atomic import write_cause

    with contextlib.suppress(OSError):
        fh.close()
    if echo is not None:
        line = f"rankscope: warning: {log}: cannot write ({write_cause(exc)}); the log stops here\n"
        with contextlib.suppress(OSError, ValueError):
            echo.write(line.encode())
            echo.flush()
