"""User-facing errors shared by every floor.

A :class:`RankscopeError` is a mistake the user can fix (bad flag, unreadable file, missing
cluster). The CLI prints its message on ONE line, without a traceback, and exits with
``exit_code``. Anything else escaping the CLI is a bug in rankscope and keeps its traceback.
"""

from __future__ import annotations


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
