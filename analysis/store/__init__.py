"""The store: one HDF5 file per run, its table schemas and the memory table's rule.

The floor every other reads: :mod:`.schema` (the columns of every table), :mod:`.layout`
(group and dataset names), :mod:`.writer` (columnar, atomic writes), :mod:`.reader`
(:class:`Store`, :func:`open_store`), :mod:`.hdf5_links` (no link leaves the file) and
:mod:`.memory_table` (torch.profiler's ``[memory]`` events as rows). It imports no other floor.
"""

from __future__ import annotations

from typing import Any

#: Loaded on first use, so that reading :mod:`.schema` does not import h5py.
_READER_NAMES = ("Store", "open_store")


def __getattr__(name: str) -> Any:
    if name not in _READER_NAMES:
        raise AttributeError(f"module 'rankscope.analysis.store' has no attribute {name!r}")
    from rankscope.analysis.store import reader

    return getattr(reader, name)
