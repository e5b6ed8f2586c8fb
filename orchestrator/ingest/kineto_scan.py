"""The reader's fast path: a sub-block of Kineto's JSON events reduced to columns in C.

Why: after msgspec's decode, the reader's Python reduction of the decoded events (an attribute
read per field per event, string interning, per-event generators) was ~60 % of its time on the
54 MB ``df_index_resolver`` rank. The compiled scanner (``_kineto_scan.c``, built by ``pip
install`` where a C compiler is present) reads the text once and emits the complete events'
columns: stamps and durations (float64 µs), first-seen codes of names, categories, pids and
tids with their distinct values, correlation ids, each event's byte span, and the text of the
few other events the reduction reads (``M`` metadata, ``i`` instant events such as
``[memory]``), which the caller decodes with msgspec.

Exact by refusal: the scanner returns nothing for any text it does not reduce exactly as
msgspec's decode followed by ``EventColumns.extract`` would (the list is in the C source's
header: escapes of surrogates, repeated or escaped keys, wrong field types, stamps needing
``Decimal``, invalid JSON, ...), and the caller takes that path for the sub-block. The tests
(``tests/test_kineto_scan.py``) compare both paths on every trace in ``tests/data`` and on
generated hostile text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    from rankscope.orchestrator.ingest import _kineto_scan
except ImportError:  # no C compiler at install: the msgspec path alone (setup.py)
    _kineto_scan = None  # type: ignore[assignment]

#: Whether the compiled scanner is installed (False: every sub-block takes msgspec's path).
AVAILABLE = _kineto_scan is not None


#: The most an int64 holds (the scanner's integers; a larger value is left to msgspec's path).
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class ScanRules:
    """The reduction's limits the scanner applies (the same values its Python path uses)."""

    pid_block: int
    """an int pid at or above it is a sign of several ranks (``multirank.PID_BLOCK``)"""
    ts_limit_us: float
    """|ts| or dur (µs) at or beyond it: the event is out of range (``stamps.TS_LIMIT_US``)"""
    exact_limit_us: float
    """a fractional ts at or beyond it needs Decimal stamps (``kineto_json.needs_exact``)"""
    memory_limits: tuple[tuple[int, int], ...]
    """inclusive (low, high) of the six ``[memory]`` args, in the order of the scanned memory
    columns (``memory_columns._MEMORY_LIMITS``)"""

    def args(self) -> tuple[Any, ...]:
        flat = tuple(min(v, INT64_MAX) for pair in self.memory_limits for v in pair)
        return (self.pid_block, self.ts_limit_us, self.exact_limit_us, flat)


@dataclass(frozen=True)
class ScannedMemory:
    """A sub-block's ``[memory]`` events as columns (all of them well-formed, in order)."""

    ts_us: np.ndarray
    """float64 µs, as msgspec decodes them"""
    values: tuple[np.ndarray, ...]
    """int64: Device Type, Device Id, Addr, Bytes, Total Allocated, Total Reserved"""
    pid: tuple[np.ndarray, list[Any]]
    """int64 first-seen codes and the distinct pids (int or str)"""
    tid: tuple[np.ndarray, list[Any]]
    """likewise for tids"""


@dataclass(frozen=True)
class Scanned:
    """One sub-block's complete events as columns (over the kept events, in file order)."""

    complete: int
    """complete (``X``) events in the sub-block, kept or not"""
    out_of_range: int
    """of those, dropped: |ts| or dur (µs) at or beyond ``stamps.TS_LIMIT_US``"""
    bad_duration: int
    """of those, dropped: a duration missing, null or negative (and in range)"""
    ts_us: np.ndarray
    """float64 µs: the value msgspec decodes (an int stamp as ``float(int)``)"""
    dur_us: np.ndarray
    """float64 µs, likewise"""
    name: tuple[np.ndarray, list[str]]
    """int32 first-seen codes (own to the sub-block) and the distinct names"""
    cat: tuple[np.ndarray, list[str]]
    """likewise for categories"""
    pid: tuple[np.ndarray, list[Any]]
    """int64 first-seen codes and the distinct pids (int or str)"""
    tid: tuple[np.ndarray, list[Any]]
    """likewise for tids"""
    corr: np.ndarray
    """int64 ``args.correlation`` where it is an int64, else -1"""
    starts: np.ndarray
    """int64: each kept event's first byte in the text (to decode it alone)"""
    ends: np.ndarray
    """int64: the byte after each kept event's last"""
    dims: np.ndarray
    """bool: ``args["Input Dims"]`` present and not null"""
    shape_spans: np.ndarray
    """int64 (number of events flagged in :attr:`dims`, 4): the [start, end) bytes of their
    ``Input Dims`` value and of their ``Input type`` value (-1, -1: absent), in order"""
    others: bytes
    """the ``M`` and ``i`` events' text, one JSON array (in order; empty when there are none),
    but the ``[memory]`` events when :attr:`memory` holds them"""
    memory: ScannedMemory | None
    """the ``[memory]`` events, when every one of them is well-formed (``_memory_event``'s
    test); None when there are none or one is not (they are then in :attr:`others`)"""
    sign: bool
    """an event with a non-null ``args.rank`` or an int pid ≥ the pid block (``block_signs``)"""


def scan(text: Any, rules: ScanRules) -> Scanned | None:
    """The columns of ``text`` (a JSON array of events), or None: the scanner is not installed,
    or it refuses the text (see the module docstring); the caller then decodes with msgspec."""
    if _kineto_scan is None:
        return None
    return _scanned(_kineto_scan.scan(text, *rules.args()))


class ScanBatch:
    """The sub-blocks of one block scanned in order by a thread of the compiled scanner, beside
    the caller, which takes each result as it reduces the sub-blocks (``decode._Block``).

    Why: the scan is C without Python objects, the reduction Python; on two cores the next
    sub-blocks are scanned while the caller reduces the last one (the thread never takes the
    GIL: its interned values become Python objects at the take). Each take gives what
    :func:`scan` gives for that sub-block; :meth:`finish` stops the thread after its current
    sub-block and waits for it: the text must not change until then (it is held, unresizable).
    """

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    @classmethod
    def start(cls, text: Any, spans: list[tuple[int, int]], rules: ScanRules) -> ScanBatch | None:
        """Begin scanning ``text[start:stop]`` of each span; None without the scanner."""
        if _kineto_scan is None:
            return None
        return cls(_kineto_scan.scan_start(text, spans, *rules.args()))

    def take(self, i: int) -> Scanned | None:
        """:func:`scan` of the ``i``-th span (waits for its scan; a span is taken once)."""
        return _scanned(_kineto_scan.scan_take(self._handle, i))

    def finish(self) -> None:
        """The thread stopped and waited for; the text no longer held."""
        _kineto_scan.scan_finish(self._handle)


def _scanned(got: Any) -> Scanned | None:
    """The scanner's raw tuple as :class:`Scanned` (None: refused)."""
    if got is None:
        return None
    (n_x, far, bad, ts, dur, name, names, cat, cats, pid, pids, tid, tids, corr, starts, ends,
     dims, shape_spans, others, memory, sign) = got  # fmt: skip
    mem = None
    if memory is not None:
        m_ts, *vals, m_pid, m_pids, m_tid, m_tids = memory
        mem = ScannedMemory(
            ts_us=np.frombuffer(m_ts, np.float64),
            values=tuple(np.frombuffer(v, np.int64) for v in vals),
            pid=(np.frombuffer(m_pid, np.int64), m_pids),
            tid=(np.frombuffer(m_tid, np.int64), m_tids),
        )
    return Scanned(
        complete=n_x,
        out_of_range=far,
        bad_duration=bad,
        ts_us=np.frombuffer(ts, np.float64),
        dur_us=np.frombuffer(dur, np.float64),
        name=(np.frombuffer(name, np.int32), names),
        cat=(np.frombuffer(cat, np.int32), cats),
        pid=(np.frombuffer(pid, np.int64), pids),
        tid=(np.frombuffer(tid, np.int64), tids),
        corr=np.frombuffer(corr, np.int64),
        starts=np.frombuffer(starts, np.int64),
        ends=np.frombuffer(ends, np.int64),
        dims=np.frombuffer(dims, np.int8).astype(bool),
        shape_spans=np.frombuffer(shape_spans, np.int64).reshape(-1, 4),
        others=others,
        memory=mem,
        sign=sign,
    )
