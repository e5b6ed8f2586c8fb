"""What the reader makes of one trace file (:class:`FileTrace`), without pandas.

Why the reader never imports pandas (or h5py; ``tests/test_reader_imports.py``): so that traces
can be read where neither is imported yet. A command spends ~0.3 s importing them before its
first read; reading in a process forked before those imports overlaps the two (measured:
docs/performance.md, tenth pass of issue 31). The reader's product is therefore numpy columns
and plain rows; its small tables (lanes, communication rows) are rows and columns
(:attr:`FileTrace.lane_rows`, :attr:`FileTrace.comm_columns`), which the merge's per-rank task
uses as they are (``rank_columns.py``: so that it, too, runs where pandas is not imported yet),
and DataFrames where a caller wants one (:attr:`FileTrace.lanes`, :attr:`FileTrace.comm`,
:attr:`FileTrace.enqueue`, built once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rankscope.analysis.store.schema import LANE_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

#: Columns of a communication record (:class:`CommRecords`), in order: ``enqueue`` tells the
#: host's ``record_param_comms`` ops (:attr:`FileTrace.enqueue`) from the rest
#: (:attr:`FileTrace.comm`), which do not keep it.
COMM_RECORD_COLUMNS = ["event", "op", "group", "seq", "bytes", "peer", "enqueue"]

#: One lane, in ``schema.LANE_COLUMNS``' order: lane (its code), kind (``schema.LaneKind``), pid,
#: tid, name.
LaneRow = tuple[int, int, str, str, str]
#: One communication record, in :data:`COMM_RECORD_COLUMNS`' order (``event``: the row in file
#: order, before the sort; :attr:`CommRecords.event` has it after).
CommRecord = tuple[int, str, str, int, int, int, bool]


@dataclass
class CommRecords:
    """The file's communication records before they are a table (:attr:`FileTrace.comm`)."""

    records: list[CommRecord]
    event: np.ndarray
    """each record's event: its row in :attr:`FileTrace.columns` (int64)"""
    lane: np.ndarray
    """each record's event's lane (int32)"""


@dataclass
class FileTrace:
    """One parsed trace file, as compact columns (raw clock of the rank).

    Events are sorted by ts, unless read with ``sort=False`` (the merge reads a rank's windows
    that way and sorts them once, together: ``rank_columns.parse_source``).
    """

    path: Path
    rank: int | None
    """rank from ``distributedInfo`` (None when absent)"""
    world_size: int | None
    backend: str | None
    trace_id: str | None
    host: str | None
    nbytes: int
    """size of the JSON text in bytes (after gunzip)"""
    columns: dict[str, np.ndarray]
    """ts (ns, raw clock), dur (ns), name/cat (int32 codes into ``strings``), kind, lane, corr;
    shapes/dtypes (codes of ``Input Dims`` / ``Input type`` as text, -1 without record_shapes)"""
    strings: list[str]
    """the string table the name/cat codes index (the rank's so far when it was shared)"""
    lane_rows: list[LaneRow]
    """the lanes, one row each in lane order (:attr:`lanes` is their table)"""
    comm_records: CommRecords
    """the communication rows (:attr:`comm` and :attr:`enqueue` are their tables)"""
    dropped: dict[str, int] = field(default_factory=dict)
    """events left out and why (negative / missing duration ...)"""
    memory: dict[str, np.ndarray] | None = None
    """the ``[memory]`` events (None when there are none): the columns of
    ``analysis.memory_events.MEMORY_COLUMNS`` but rank and window, ts raw ns, op and scope as codes
    into ``strings``, in file order"""
    memory_skipped: dict[str, int] = field(default_factory=dict)
    """memory events left out and why (``memory_events.skip_reason``)"""
    device_memory: dict[int, int] = field(default_factory=dict)
    """GPU index → total bytes (``deviceProperties``)"""
    device_capability: dict[int, tuple[int, int]] = field(default_factory=dict)
    """GPU index → (computeMajor, computeMinor) (``deviceProperties``)"""
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    """the groups the rank is in (``distributedInfo.pg_config``): ``name``, ``desc`` and global
    ``ranks`` of each, as ``event_columns.process_groups`` reads them"""
    rank_signs: bool = False
    """the file shows a sign of holding several ranks (``multirank.block_signs``, a repeated
    ``ProfilerStep#N``, or complete events dropped unseen): the merge then checks it whole"""

    @cached_property
    def lanes(self) -> pd.DataFrame:
        """The lanes: lane, kind (``schema.LaneKind``), pid, tid, name (threads' own names)."""
        import pandas as pd

        return pd.DataFrame(self.lane_rows, columns=list(LANE_COLUMNS))

    @cached_property
    def comm(self) -> pd.DataFrame:
        """communication events: event (row), op, group, seq (-1 unknown), bytes (-1 unknown),
        peer (global rank from ``Dst Rank`` / ``Src Rank``, -1 unknown), lane"""
        return self._comm_tables[0]

    @cached_property
    def enqueue(self) -> pd.DataFrame:
        """the ``record_param_comms`` ops that name a collective, columns as :attr:`comm`: the
        metadata of the NCCL kernels they launch (``rank_columns``; Seq is not copied to
        kernels)"""
        return self._comm_tables[1]

    @cached_property
    def comm_columns(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(:attr:`comm`, :attr:`enqueue`) as columns, without pandas (the merge's per-rank task,
        ``rank_columns.py``): event (int64), op, group (object: str), seq, bytes, peer (int64),
        lane (int32); one table of :attr:`comm_records` split in two."""
        rec = self.comm_records
        n = len(rec.records)
        fields = list(zip(*rec.records, strict=True)) if n else [()] * len(COMM_RECORD_COLUMNS)
        by_name = dict(zip(COMM_RECORD_COLUMNS, fields, strict=True))
        table = {
            "event": rec.event,
            "op": np.array(by_name["op"], dtype=object),
            "group": np.array(by_name["group"], dtype=object),
            "seq": _integers(by_name["seq"]),
            "bytes": _integers(by_name["bytes"]),
            "peer": _integers(by_name["peer"]),
            "lane": rec.lane,
        }
        on_cpu = np.array(by_name["enqueue"], dtype=bool)
        return (
            {c: v[~on_cpu] for c, v in table.items()},
            {c: v[on_cpu] for c, v in table.items()},
        )

    @cached_property
    def _comm_tables(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(:attr:`comm`, :attr:`enqueue`): :attr:`comm_columns` as DataFrames."""
        import pandas as pd

        comm, enqueue = self.comm_columns
        return pd.DataFrame(comm), pd.DataFrame(enqueue)


def _integers(values: tuple[int, ...]) -> np.ndarray:
    """int64, or object where a trace's number lies beyond int64 (a ``Seq`` of 20 digits): kept
    as written, as a table of the records keeps it."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)
