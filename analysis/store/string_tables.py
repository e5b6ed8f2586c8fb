"""The string tables of the stores read in this process, by file version.

A rank task opens the store itself (it may run on a worker), so an analysis in one process (an
in-process analysis, a forked worker's tasks) opened the same file once per rank and read its
string table and built the text columns' pandas dtype (which hashes every string) each time:
~1.3 ms per rank task on an 8-rank job. They are read once per file *version*: (device, inode,
size, mtime ns) of the open file, so a store merged again over the same path (the merge renames
a new file over the old one) is read afresh.
"""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

#: A store file's version: (device, inode, size, mtime in ns).
Version = tuple[int, int, int, int]
#: Versions whose tables are kept (the oldest goes first).
TABLES_KEPT = 4
#: Version → (string table, its pandas CategoricalDtype).
_TABLES: dict[Version, tuple[np.ndarray, Any]] = {}


def version_of(st: os.stat_result) -> Version:
    """The version of the file ``st`` describes (also the key of ``hdf5_links``' walked files)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def file_version(file: h5py.File) -> Version | None:
    """The version of the open ``file`` (whatever its path names now); None where its HDF5
    driver gives no file descriptor (nothing is then shared)."""
    try:
        return version_of(os.fstat(file.id.get_vfd_handle()))
    except (OSError, TypeError, ValueError, NotImplementedError, RuntimeError):
        return None


def known(version: Version | None) -> tuple[np.ndarray, Any] | None:
    """The (string table, dtype) kept for ``version``; None when not kept."""
    return _TABLES.get(version) if version is not None else None


def keep(version: Version | None, strings: np.ndarray, dtype: Any) -> None:
    """Keep ``version``'s string table (read-only, as the reader reads it: every Store of the
    version shares it) and its dtype."""
    if version is None:
        return
    while len(_TABLES) >= TABLES_KEPT:
        del _TABLES[next(iter(_TABLES))]
    _TABLES[version] = (strings, dtype)
