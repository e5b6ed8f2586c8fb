"""The store's chunks filtered here, as HDF5's gzip + shuffle filters would store them.

Why: HDF5 compresses with zlib's deflate, 22 ms of the 54 MB ``df_index_resolver`` rank's
merge (8 MB of columns; more than the rest of its writes). ISA-L's deflate (``isal``, already
the reader's inflater) at level :data:`ISAL_LEVEL` writes the same format in 4.5 ms, 0.6 %
larger (measured; docs/performance.md). The writer creates each chunked column with the usual
filters and writes the chunks made here with ``write_direct_chunk``: any HDF5 reader reads them
back through its own filters, the same values (``tests/test_store.py`` unfilters them by hand
too, and compares them with HDF5's own chunks).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from rankscope.analysis.store.layout import COMPRESSION_LEVEL

#: dtype kinds whose chunks are filtered here (:func:`filtered_chunk`): numbers. Text and the
#: rest go through HDF5's filters.
FILTERED_KINDS = "iuf"
#: ISA-L's compression level (0-3) of the store's chunks: 2 compresses the 54 MB rank's columns
#: to 0.6 % more than zlib's level 1, in a fifth of its time (1: 1.7 % more, 0: 25 % more).
ISAL_LEVEL = 2


def filtered_chunk(values: np.ndarray, rows: int) -> bytes:
    """One chunk of a 1-D column as HDF5 stores it: its ``rows`` values (an edge chunk padded
    with the fill value, 0, as HDF5 pads it) through the dataset's filters in order: shuffle
    (byte 0 of every value, then byte 1, ...) and deflate (a zlib stream, what HDF5's gzip
    filter writes and reads). ``values``: C-contiguous, at most ``rows``."""
    if len(values) < rows:
        values = np.concatenate((values, np.zeros(rows - len(values), dtype=values.dtype)))
    shuffled = values.view(np.uint8).reshape(rows, values.itemsize).T.tobytes()
    deflate, level = _deflater()
    return deflate.compress(shuffled, level)


@functools.cache
def _deflater() -> tuple[Any, int]:
    """ISA-L's zlib interface and :data:`ISAL_LEVEL`; zlib's own and the store's
    ``COMPRESSION_LEVEL`` where isal is not installed (the same format, slower). Looked up at
    the first chunk: ``rankscope analyze`` of a store imports the writer but writes none."""
    try:
        from isal import isal_zlib
    except ImportError:
        import zlib

        return zlib, COMPRESSION_LEVEL
    return isal_zlib, ISAL_LEVEL
