"""Atomic file output, shared by every floor (launchers and analysis may not import each other).

A file is written to a temporary name in its own folder, synced, then renamed over the target:
a reader never sees a half-written file, and a crash or Ctrl-C leaves the old file (or none).

A write that fails because of where it goes (full disk, quota, read-only file system, no
permission: :data:`WRITE_ERRNOS`) removes its temporary file and raises an
:class:`~rankscope.errors.OutputError`: one line naming the file and the cause
(:func:`output_error`), the previous file untouched (docs/reliability.md).

Permissions follow the umask, as ``open()`` would give them: ``mkstemp`` creates its file 0600
whatever the umask, and a result that kept that mode could not be read by a teammate on a shared
cluster (umask 022), although the same user's ``trace.h5`` could.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from rankscope.errors import OutputError

#: Mode a new file asks for before the umask, as ``open()`` asks for it.
DEFAULT_FILE_MODE = 0o666
#: Linux's per-process status file; its ``Umask:`` line reads the umask without changing it.
PROC_STATUS = Path("/proc/self/status")
#: Prefix of the umask line in :data:`PROC_STATUS` (octal value after it; Linux 4.7+).
UMASK_FIELD = "Umask:"

#: The causes of a failed write that lie in where it goes, not in rankscope, in the user's words.
WRITE_CAUSES: dict[int, str] = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EFBIG: "file too large",
    errno.EIO: "input/output error",
}
#: errno values of :data:`WRITE_CAUSES`: an ``OSError`` with one of them is an output problem.
WRITE_ERRNOS = frozenset(WRITE_CAUSES)

#: Serialises the set-and-restore fallback of :func:`current_umask` between threads.
_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process's umask.

    Read from ``/proc/self/status`` where it exists: ``os.umask`` can only read the value by
    setting another one, and a thread creating a file in that instant would get wrong
    permissions. Elsewhere, set-and-restore under a lock (our own threads at least never race).
    """
    try:
        with PROC_STATUS.open() as fh:
            for line in fh:
                if line.startswith(UMASK_FIELD):
                    return int(line[len(UMASK_FIELD) :].strip(), 8)
    except (OSError, ValueError):
        pass
    with _umask_lock:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def file_mode(mode: int = DEFAULT_FILE_MODE) -> int:
    """``mode`` with the umask applied: the permissions ``open()`` would give a new file."""
    return mode & ~current_umask() & 0o7777


def write_cause(exc: BaseException) -> str:
    """The cause of a failed write in words: ``"no space left on device"``, …"""
    code = getattr(exc, "errno", None)
    if code in WRITE_CAUSES:
        return WRITE_CAUSES[code]
    strerror = getattr(exc, "strerror", None)
    if strerror:
        return str(strerror[:1].lower() + strerror[1:])
    return str(exc) or type(exc).__name__


def is_write_failure(exc: BaseException) -> bool:
    """True for an ``OSError`` whose cause is where the output goes (:data:`WRITE_ERRNOS`)."""
    return isinstance(exc, OSError) and getattr(exc, "errno", None) in WRITE_ERRNOS


def output_error(path: Path, exc: BaseException, *, detail: str = "") -> OutputError:
    """The one-line error for ``path`` that could not be written because of ``exc``.

    ``<path>: cannot write (<cause>[; <detail>]); the previous <name> is untouched`` (or
    ``nothing was written`` when there was none). An :class:`OutputError` is returned as is.
    """
    if isinstance(exc, OutputError):
        return exc
    path = Path(path)
    try:
        existed = path.exists()
    except OSError:
        existed = False
    keep = f"the previous {path.name} is untouched" if existed else "nothing was written"
    cause = write_cause(exc) + (f"; {detail}" if detail else "")
    error = OutputError(f"{path}: cannot write ({cause}); {keep}")
    error.errno = getattr(exc, "errno", None)
    error.filename = str(path)
    return error


@contextmanager
def translate_write_errors(
    path: Path, *, detail: str = "", every_oserror: bool = True
) -> Iterator[None]:
    """Turn an ``OSError`` raised in the block into :func:`output_error` for ``path``.

    ``every_oserror=False``: only those of :data:`WRITE_ERRNOS` (the block may also read).
    """
    try:
        yield
    except OSError as exc:
        if isinstance(exc, OutputError) or not (every_oserror or is_write_failure(exc)):
            raise
        raise output_error(path, exc, detail=detail) from exc


@contextmanager
def atomic_output(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """Yield a binary file that becomes ``path`` only when the block ends without an error.

    ``mode``: requested permissions, masked by the umask like ``open()``'s (None: 0666, so
    0644 under umask 022 and 0600 under 077): a user who chose a private umask keeps private
    results, everyone else gets results their group can read. The folder must exist.

    A write that fails for a cause of :data:`WRITE_ERRNOS` (in the block's writes, the flush,
    the sync or the rename) raises :func:`output_error`; the temporary file is always removed.
    """
    path = Path(path)
    with translate_write_errors(path):
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    fh = os.fdopen(fd, "wb")
    in_block = False
    try:
        os.fchmod(fh.fileno(), file_mode(DEFAULT_FILE_MODE if mode is None else mode))
        in_block = True
        yield fh
        in_block = False
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            fh.close()  # flushes what is buffered (may fail again), closes the fd regardless
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        ours = isinstance(exc, OSError) and not isinstance(exc, OutputError)
        if ours and (not in_block or is_write_failure(exc)):
            raise output_error(path, exc) from exc
        raise
