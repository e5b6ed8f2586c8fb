"""A job's output: copied line by line to its log file unchanged and to a console.

One copier, :func:`tee`, serves both backends: the local launcher copies torchrun's output to
``RUN/logs/torchrun.log`` and the terminal (without Kineto's trace markers, :class:`ConsoleFilter`),
and each Slurm node task copies its torchrun's output to ``RUN/logs/torchrun-JOB-nodeNNN.log`` and
to the task's stdout (submitit's log, unfiltered). The log is what failure summaries are read from,
so it always gets every byte; the console is a courtesy and stops at its first write error.

The console leaves out what ``rankscope run``'s own summary says better: Python tracebacks (a
rank's uncaught exception, torchrun's ``ChildFailedError``) and torchrun's framed failure report
(:class:`TracebackFilter`). The first failing rank and its error are in the summary printed at the
end; the tracebacks are in the log.
"""

from __future__ import annotations

import contextlib
import enum
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


#: A line that opens a Python traceback (optionally behind torchrun's ``[rank0]:`` /
#: ``[default0]:`` prefix): the plain one and an exception group's (``  + Exception Group
#: Traceback``), as ``traceback.format_exception`` writes them, and the head of an exception
#: Python could not raise (``sys.unraisablehook``: "Exception ignored in: <function …>"), whose
#: traceback follows.
TRACEBACK_START_RE = re.compile(
    rb"^(?:\[[\w-]+\]:)?\s*(?:(?:\+ )?(?:Exception Group )?Traceback \(most recent call last\):"
    rb"|Exception ignored in)"
)
#: The lines ``traceback`` writes between chained exceptions.
CHAIN_LINES = (
    b"The above exception was the direct cause of the following exception:",
    b"During handling of the above exception, another exception occurred:",
)
#: torchrun's failure report after ``ChildFailedError:`` is framed by lines of "=" (60 of them in
#: torch.distributed.elastic.multiprocessing.errors); a line of at least this many opens/closes it.
FRAME_MIN = 20
_PREFIX_RE = re.compile(rb"^\[[\w-]+\]: ?")


class _Tb(enum.Enum):
    """Where :class:`TracebackFilter` is in a traceback."""

    OUT = 0
    """Not in one: lines are shown."""
    FRAMES = 1
    """After ``Traceback (most recent call last):``: the indented frame lines, until the
    exception's own line (the first one not indented)."""
    AFTER = 2
    """Just after the exception's line: blank lines, a chained exception or torchrun's framed
    report still belong to it."""
    FRAME = 3
    """Inside torchrun's framed report, until its closing line of "="."""


class TracebackFilter:
    """Leaves Python tracebacks out of the terminal, whole: from ``Traceback (most recent call
    last):`` through the indented frames to the exception's line, with the chained ones after it
    and torchrun's framed failure report (its ``ChildFailedError``'s message). Every other line
    passes (the summary at the end says where the log is).

    A rank's traceback written while another rank prints an unindented line ends early (the
    rest of its frames are shown): the ranks write to one pipe, line by line.
    """

    def __init__(self) -> None:
        self._state = _Tb.OUT

    def __call__(self, line: bytes) -> bool:
        """Whether ``line`` belongs to a traceback (and is left out)."""
        body = _PREFIX_RE.sub(b"", line, count=1).rstrip(b"\r\n")
        if self._state == _Tb.FRAME:
            # the report holds the failed ranks' tracebacks (chained ones too): only its
            # closing line of "=" ends it
            stripped = body.strip()
            if len(stripped) >= FRAME_MIN and set(stripped) == {ord("=")}:
                self._state = _Tb.AFTER
            return True
        if TRACEBACK_START_RE.match(line):
            self._state = _Tb.FRAMES
            return True
        if self._state == _Tb.FRAMES:
            if body[:1] in (b" ", b"\t", b"|", b"+") or not body:
                return True
            self._state = _Tb.AFTER  # the exception's own line
            return True
        if self._state == _Tb.AFTER:
            stripped = body.strip()
            if not stripped or stripped in CHAIN_LINES:
                return True
            if len(stripped) >= FRAME_MIN and set(stripped) == {ord("=")}:
                self._state = _Tb.FRAME
                return True
            self._state = _Tb.OUT
            return False
        return False


class ConsoleFilter:
    """Drops Kineto's trace markers (:data:`KINETO_MARKER_RE`) from the lines shown in the terminal.

    Kineto writes a marker and its newline in two writes, so the markers of several ranks run
    together on one line ("…profiler_startUSDT:…profiler_start") and their newlines follow as
    empty lines: each line that held N markers owes N-1 newlines, and that many of the following
    empty lines are dropped too. Whatever else a line holds is kept.
    """

    def __init__(self) -> None:
        self._owed_newlines = 0
        self.tracebacks = TracebackFilter()
        """The tracebacks left out of the terminal (they stay in the log)."""
        self.muted = False
        """Show nothing more (the job is being ended after a hang: its teardown noise — the
        ranks' tracebacks — stays in the log, the terminal keeps rankscope's paragraph)."""

    def mute(self) -> None:
        """From now on, nothing reaches the terminal (the log still gets every byte)."""
        self.muted = True

    def __call__(self, line: bytes) -> bytes | None:
        """The line to show, or None to show nothing."""
        if self.muted or self.tracebacks(line):
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
