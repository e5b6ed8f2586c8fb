"""The store's layout (docs/format.md): file and group names, the columns kept as string
codes, chunking and compression, and how attributes are encoded.

Why a module apart: the writer (``store_writer.py``) and the reader (``store.py``) of the one
format both need these names and the attribute encoding, and neither should have to import the
other for them; a change of the format starts here.

Sizes: rows and bytes as stated on each constant.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

#: File name of the store inside a run directory.
STORE_NAME = "trace.h5"
#: Group names of the layout (docs/format.md).
STRINGS = "strings"
RANKS = "ranks"
EVENTS = "events"
LANES = "lanes"
COLLECTIVES = "collectives"
STEPS = "steps"
CLOCK = "clock"
PROBLEMS = "problems"
MEMORY = "memory"
#: Every step of one rank for the whole run (``/ranks/NNNNN/step_log``; issue 30).
STEP_LOG = "step_log"
#: The changes of the step time the live monitor noticed (``/changes``; issue 30).
CHANGES = "changes"
#: Memory columns whose values are codes into ``/strings``.
MEMORY_STRING_CODED = ("op", "scope")
#: Name of one rank's group under ``/ranks``.
RANK_GROUP_FORMAT = "{rank:05d}"
#: Event columns whose values are codes into ``/strings``.
STRING_CODED = ("name", "cat")
#: Rows per HDF5 chunk of an event column (64 Ki rows = 512 KiB of int64 before compression).
EVENT_CHUNK_ROWS = 1 << 16
#: Compression of every chunked dataset: gzip level 1 + shuffle (chosen by measurement:
#: docs/performance.md, "Merge"; gzip is readable by every HDF5 tool, lzf only by h5py).
COMPRESSION = "gzip"
COMPRESSION_LEVEL = 1


def rank_group(rank: int) -> str:
    """``ranks/NNNNN``: the path of one rank's group from the root."""
    return f"{RANKS}/{RANK_GROUP_FORMAT.format(rank=rank)}"


def attr_value(value: Any) -> Any:
    """HDF5 attributes hold scalars, strings and arrays; dicts/lists/None go as JSON text."""
    if value is None or isinstance(value, dict | list | tuple):
        return json.dumps(value, default=str)
    return value


def attr_python(value: Any) -> Any:
    """Inverse of :func:`attr_value` for reading (JSON text back to dict/list)."""
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str) and (value[:1] in "{[" or value == "null"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
