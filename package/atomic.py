"""Atomic file output, shared by every floor (launchers and analysis may not import each other).

A file is written to a temporary name in its own folder, synced, then renamed over the target:
a reader never sees a half-written file, and a crash or Ctrl-C leaves the old file (or none).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def atomic_output(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """Yield a binary file that becomes ``path`` only when the block ends without an error.

    ``mode``: permissions of the result; None keeps ``mkstemp``'s 0600. The folder must exist.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
