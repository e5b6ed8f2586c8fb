"""Every step of every rank, for the whole run: the step log (``ranks/NNNNN/steps.bin``).

A profiler window covers a few steps of a long run; slow-downs arrive in between. Each rank
therefore keeps the end time of EVERY step, outside the windows too, at the cost of one list
append per step (the probe's thread writes them out in blocks, so the training thread never
waits on the disk).

Format: an append-only file of fixed-size little-endian records, :data:`RECORD` =
``(steps, end_ns, wait_ns)`` as three int64:

* ``steps`` — steps done when this one ended (1 for the first step), the same count as
  ``progress.json``'s ``steps`` and the profiler's step number + 1;
* ``end_ns`` — when it ended, ns since the epoch on the rank's own clock (``time.time_ns``;
  the merge aligns it with the clock offsets it aligns the traces with);
* ``wait_ns`` — ns the step spent waiting in collectives where the backend makes that cheap to
  know, else :data:`UNKNOWN` (-1).

Records are only ever appended whole by one writer (one ``write`` of whole records), so a
reader sees a prefix of the series; a record cut by a crash or a full disk (a file length that
is not a multiple of :data:`RECORD_SIZE`) is ignored by :func:`read_steps`, never mistaken.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

#: The step log's file name in a rank's folder (``RUN/ranks/NNNNN/steps.bin``).
STEP_LOG_FILE = "steps.bin"
#: One record: steps done, end time (ns since the epoch, rank clock), collective wait (ns or -1).
RECORD = struct.Struct("<qqq")
#: Bytes per record.
RECORD_SIZE = RECORD.size
#: ``wait_ns`` when the backend does not tell it cheaply.
UNKNOWN = -1
#: The records as numpy structured dtype fields (what :func:`read_steps` returns). numpy is
#: imported by the reader only: the rank's writer stays light.
STEP_FIELDS = [("steps", "<i8"), ("end_ns", "<i8"), ("wait_ns", "<i8")]


def encode(records: list[tuple[int, int, int]]) -> bytes:
    """Records to bytes, in order (one ``write`` of the result appends them whole)."""
    return b"".join(RECORD.pack(*r) for r in records)


def append(path: Path, records: list[tuple[int, int, int]]) -> None:
    """Append ``records`` to the step log at ``path`` (created when absent) in one write."""
    if not records:
        return
    with path.open("ab") as f:
        f.write(encode(records))


def decode(data: bytes) -> np.ndarray:
    """The whole records in ``data`` (a structured array of :data:`STEP_FIELDS`); a trailing
    partial record is left out (``len(result) * RECORD_SIZE`` bytes were used)."""
    import numpy as np

    whole = len(data) - len(data) % RECORD_SIZE
    return np.frombuffer(data[:whole], dtype=np.dtype(STEP_FIELDS)).copy()


def read_steps(path: Path) -> np.ndarray:
    """The whole records of the step log at ``path`` (:func:`decode`), oldest first; a
    trailing partial record is ignored. Missing file: an empty array."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    return decode(data)
