"""Atomic file output, shared by every floor (launchers and analysis may not import each other).

A file is written to a temporary name in its own folder, synced, then renamed over the target:
a reader never sees a half-written file, and a crash or Ctrl-C leaves the old file (or none).

Permissions follow the umask, as ``open()`` would give them: ``mkstemp`` creates its file 0600
whatever the umask, and a result that kept that mode could not be read by a teammate on a shared
cluster (umask 022), although the same user's ``trace.h5`` could.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

#: Mode a new file asks for before the umask, as ``open()`` asks for it.
DEFAULT_FILE_MODE = 0o666
#: Linux's per-process status file; its ``Umask:`` line reads the umask without changing it.
PROC_STATUS = Path("/proc/self/status")
#: Prefix of the umask line in :data:`PROC_STATUS` (octal value after it; Linux 4.7+).
UMASK_FIELD = "Umask:"

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


@contextmanager
def atomic_output(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """Yield a binary file that becomes ``path`` only when the block ends without an error.

    ``mode``: requested permissions, masked by the umask like ``open()``'s (None: 0666, so
    0644 under umask 022 and 0600 under 077): a user who chose a private umask keeps private
    results, everyone else gets results their group can read. The folder must exist.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), file_mode(DEFAULT_FILE_MODE if mode is None else mode))
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
