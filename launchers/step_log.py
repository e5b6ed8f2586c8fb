"""Every step of every rank, for the whole run: the step log (``ranks/NNNNN/steps.bin``).

A profiler window covers a few steps of a long run; slow-downs arrive in between. Each rank
therefore keeps the end time of EVERY step, outside the windows too, at the cost of one list
append per step (the probe's thread writes them out in blocks, so the training thread never
waits on the disk).

Format (version 2): the 8 bytes :data:`MAGIC`, then an append-only run of fixed-size
little-endian records, :data:`RECORD` = ``(steps, end_ns, wait_ns, cpu_ns, runq_ns)`` as five
int64:

* ``steps`` — steps done when this one ended (1 for the first step), the same count as
  ``progress.json``'s ``steps`` and the profiler's step number + 1;
* ``end_ns`` — when it ended, ns since the epoch on the rank's own clock (``time.time_ns``;
  the merge aligns it with the clock offsets it aligns the traces with);
* ``wait_ns`` — ns the step spent waiting in collectives where the backend makes that cheap to
  know, else :data:`UNKNOWN` (-1);
* ``cpu_ns`` / ``runq_ns`` — the training thread's scheduler counters when the step ended
  (Linux ``/proc/thread-self/schedstat`` fields 1 and 2, CUMULATIVE since the thread began: ns
  on a CPU, and ns it was runnable but another task held the core — the run-queue delay); a
  step's share is the difference from the record before (the kernel brings a running thread's
  CPU time up to date at its ticks and switches, so one step's CPU share is coarse: ms; the
  run-queue delay is added when the thread gets its CPU). :data:`UNKNOWN` where Linux does not
  say (another OS, a kernel without schedstats). The runtime reads them at every step end
  already (``stepping._thread_times``: one ``pread`` of an open file), so they cost the step
  log nothing more.

Version 1 (before the run-queue fields) had no header and three-field records; :func:`layout_of`
tells them apart by the first 8 bytes (a version-1 file begins with its first record's
``steps``, a small positive int64, never :data:`MAGIC`), and :func:`decode` reads both into the
same fields (``cpu_ns`` / ``runq_ns`` :data:`UNKNOWN` for version 1).

Records are only ever appended whole by one writer (one ``write`` of whole records, the header
with the first block), so a reader sees a prefix of the series; a record cut by a crash or a
full disk (a tail shorter than a record) is ignored by :func:`read_steps`, never mistaken.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

#: The step log's file name in a rank's folder (``RUN/ranks/NNNNN/steps.bin``).
STEP_LOG_FILE = "steps.bin"
#: The first 8 bytes of a version-2 step log.
MAGIC = b"rsstep2\n"
#: One record: steps done, end time (ns since the epoch, rank clock), collective wait (ns or
#: -1), the training thread's CPU ns and run-queue delay ns so far (or -1).
RECORD = struct.Struct("<qqqqq")
#: Bytes per record.
RECORD_SIZE = RECORD.size
#: ``wait_ns`` / ``cpu_ns`` / ``runq_ns`` when they are not told cheaply.
UNKNOWN = -1
#: The records as numpy structured dtype fields (what :func:`read_steps` returns). numpy is
#: imported by the reader only: the rank's writer stays light.
STEP_FIELDS = [
    ("steps", "<i8"),
    ("end_ns", "<i8"),
    ("wait_ns", "<i8"),
    ("cpu_ns", "<i8"),
    ("runq_ns", "<i8"),
]
#: Version 1's record fields (no header).
STEP_FIELDS_V1 = STEP_FIELDS[:3]


@dataclass(frozen=True)
class Layout:
    """Where the records of one version of the step log are: after ``header`` bytes, of
    ``fields`` each."""

    header: int
    """Bytes before the first record."""
    fields: tuple[tuple[str, str], ...]
    """The record's numpy fields."""

    @property
    def record_size(self) -> int:
        """Bytes per record."""
        return 8 * len(self.fields)


#: Today's step log.
CURRENT = Layout(header=len(MAGIC), fields=tuple(STEP_FIELDS))
#: Step logs written before the run-queue fields.
VERSION_1 = Layout(header=0, fields=tuple(STEP_FIELDS_V1))


def layout_of(head: bytes) -> Layout | None:
    """The layout of a step log from its first 8 bytes (or more); None when fewer than 8 bytes
    were written (no whole record of either version yet)."""
    if len(head) < len(MAGIC):
        return None
    return CURRENT if head[: len(MAGIC)] == MAGIC else VERSION_1


def encode(records: Sequence[tuple[int, ...]]) -> bytes:
    """Records to bytes, in order (one ``write`` of the result appends them whole); a record of
    three values (steps, end, wait) gets :data:`UNKNOWN` CPU and run-queue counters."""
    pad = (UNKNOWN, UNKNOWN)
    return b"".join(RECORD.pack(*(r + pad)[:5]) for r in records)


def append(path: Path, records: Sequence[tuple[int, ...]]) -> None:
    """Append ``records`` to the step log at ``path`` (created, with its header, when absent)
    in one write."""
    if not records:
        return
    with path.open("ab") as f:
        data = encode(records)
        f.write(data if f.tell() else MAGIC + data)


def decode(data: bytes, layout: Layout = CURRENT) -> np.ndarray:
    """The whole records in ``data`` (bytes of ``layout``'s records, its header left out: a
    structured array of :data:`STEP_FIELDS`); a trailing partial record is left out
    (``len(result) * layout.record_size`` bytes were used)."""
    import numpy as np

    size = layout.record_size
    whole = len(data) - len(data) % size
    raw = np.frombuffer(data[:whole], dtype=np.dtype(list(layout.fields)))
    if layout.fields == CURRENT.fields:
        return raw.copy()
    out = np.full(len(raw), UNKNOWN, dtype=np.dtype(STEP_FIELDS))
    for name, _ in layout.fields:
        out[name] = raw[name]
    return out


def read_steps(path: Path) -> np.ndarray:
    """The whole records of the step log at ``path`` (:func:`decode`, either version), oldest
    first; a trailing partial record is ignored. Missing file: an empty array."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    layout = layout_of(data) or CURRENT
    return decode(data[layout.header :], layout)


def to_bytes(records: np.ndarray) -> bytes:
    """A whole step log (header and records) from a structured array of :data:`STEP_FIELDS`."""
    import numpy as np

    return MAGIC + np.ascontiguousarray(records, dtype=np.dtype(STEP_FIELDS)).tobytes()
