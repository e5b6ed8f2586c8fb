"""User-facing errors shared by every floor.

A :class:`RankscopeError` is a mistake the user can fix (bad flag, unreadable file, missing
cluster). The CLI prints its message on ONE line, without a traceback, and exits with
``exit_code``. Anything else escaping the CLI is a bug in rankscope and keeps its traceback.
"""

from __future__ import annotations

#: Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells do. Here, not in
#: ``launchers.base`` (which re-exports it), so that the CLI can name it without importing the
#: launchers (~0.03 s of CPU in every process).
EXIT_INTERRUPTED = 130


class RankscopeError(Exception):
    """A problem with the user's input or environment, reported in one line."""

    exit_code: int = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(RankscopeError):
    """Bad command-line values or arguments (exit status 2, nothing launched)."""

    exit_code = 2


class InputFileError(RankscopeError):
    """A file the user gave cannot be used; the message names the file and the problem."""

    exit_code = 1


class OutputError(RankscopeError, OSError):
    """A file rankscope writes could not be written (full disk, quota, read-only, permissions).

    One line naming the file and the cause (:func:`rankscope.atomic.output_error` words it). It
    is also an :class:`OSError` carrying the cause's ``errno``, so code that tolerates a failed
    write (the ranks' runtime, which must never harm the training job) keeps catching it.
    """

    exit_code = 1

    def __str__(self) -> str:
        # OSError's own text would become "[Errno 28] None: 'path'" once errno is set.
        return str(self.args[0]) if self.args else ""


class WorkersError(RankscopeError):
    """The workers of a merge or an analysis could not be started, or were lost before the
    tasks finished (``rankscope.analysis.engine.scheduler``, ``slurm_workers``, ``forked_workers``).

    One line saying what happened (sbatch's refusal, the jobs' queue state and reason, the last
    line of a job's log, a forked worker killed); the CLI prints it without a traceback.
    """

    exit_code = 1
