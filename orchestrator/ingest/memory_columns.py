"""The ``[memory]`` events of a trace reduced to columns, block by block (``profile_memory``).

:class:`MemoryColumns` is the memory part of ``event_columns.EventColumns`` (which inherits it):
each block's memory events are checked (well-formed ones in bulk, the others one by one to name
what is wrong), reduced to columns before the next block is decoded, and at the end given their
op, scope and step from the file's own ranges (``analysis.store.memory_table.attribute``: the
rule of ``memory_rows``). A trace can hold 10^5 memory events: this is a hot path of the reader.
"""

from __future__ import annotations

from decimal import Decimal
from itertools import pairwise
from operator import attrgetter
from typing import Any

import numpy as np
from rankscope.analysis.store.memory_table import memory_field_limits
from rankscope.orchestrator.ingest.kineto_json import KEvent
from rankscope.orchestrator.ingest.kineto_scan import ScannedMemory
from rankscope.orchestrator.ingest.stamps import TS_LIMIT_US, decimal_to_ns, us_to_ns
from rankscope.orchestrator.ingest.string_codes import codes_in, pair_codes

#: Memory columns from ``KArgs``: (column, attribute, dtype); values checked by bad_memory_field.
_MEMORY_ARGS = (
    ("device_type", "device_type", np.int8),
    ("device_id", "device_id", np.int16),
    ("addr", "addr", np.uint64),
    ("bytes", "nbytes", np.int64),
    ("total_allocated", "total_allocated", np.int64),
    ("total_reserved", "total_reserved", np.int64),
)


_LIMITS = memory_field_limits()
#: The bounds of each ``KArgs`` field of a kept memory event, as plain ints: (attribute, lo, hi).
_MEMORY_LIMITS = (
    ("device_type", *_LIMITS["device_type"]),
    ("device_id", *_LIMITS["device_id"]),
    ("addr", 0, _LIMITS["addr"][1]),
    ("nbytes", *_LIMITS["bytes"]),
    ("total_allocated", 0, _LIMITS["bytes"][1]),
    ("total_reserved", 0, _LIMITS["bytes"][1]),
)

#: The same bounds as (low, high) pairs in the order of ``_MEMORY_ARGS`` (the compiled scanner's).
MEMORY_LIMITS = tuple((lo, hi) for _, lo, hi in _MEMORY_LIMITS)


_TS, _PID, _TID, _ARGS = (attrgetter(a) for a in ("ts", "pid", "tid", "args"))


class MemoryColumns:
    """The memory events of one file, block by block (mixed into ``EventColumns``)."""

    strings: dict[str, int]
    """the file's (or rank's) string table, shared with the event columns"""
    lanes: dict[tuple[str, str], int]
    """(pid, tid) → lane of the event columns"""

    def __init__(self) -> None:
        self.memory: list[KEvent] = []  # this block's, until _flush_memory
        self.memory_parts: dict[str, list[np.ndarray]] = {}
        #: each kept memory event's thread, as a code into memory_thread_keys (one array per
        #: flush): 10^5 events need no 10^5 tuples
        self.memory_thread_parts: list[np.ndarray] = []
        #: the (pid, tid) of the kept memory events' threads -> code (in the order they came)
        self.memory_thread_keys: dict[tuple[str, str], int] = {}
        self.memory_skipped: dict[str, int] = {}

    def _or_empty(self, codes: np.ndarray) -> np.ndarray:
        """``codes`` (into the string table, int64) as int32, -1 (no range) made the code of
        ``""``: what interning each event's text would give, as every other text is a name in
        the table already ("" is added, at the end, the first time an event has none)."""
        none = codes < 0
        if none.any():
            codes = np.where(none, self.strings.setdefault("", len(self.strings)), codes)
        return codes.astype(np.int32)

    def _memory_block(self, mem: list[KEvent]) -> bool:
        """Keep a block's ``[memory]`` events at once when every one is well-formed (the test of
        :meth:`_memory_event`, made per field over the whole block: C passes of ``map``, ``min``
        and ``max`` instead of a Python call per event); False, keeping none, when one is not
        (the caller then judges each with :meth:`_memory_event`)."""
        args = list(map(_ARGS, mem))
        if None in args:
            return False
        ts = list(map(_TS, mem))
        kinds = set(map(type, ts))
        if not kinds <= {int, float}:
            return False
        if float in kinds and not all(t - t == 0 for t in ts if type(t) is float):
            return False  # NaN or infinite
        if not (min(ts) > -TS_LIMIT_US and max(ts) < TS_LIMIT_US):
            return False
        values: dict[str, list[Any]] = {}
        for attr, lo, hi in _MEMORY_LIMITS:
            got = values[attr] = list(map(attrgetter(attr), args))
            if set(map(type, got)) != {int} or not (lo <= min(got) and max(got) <= hi):
                return False
        self._keep_memory(mem, us_to_ns(np.fromiter(ts, np.float64, len(ts))), values)
        return True

    def _memory_event(self, ev: KEvent) -> None:
        """Keep one ``[memory]`` event (its values checked now; the rest waits for finish).

        Called for the events of a block :meth:`_memory_block` did not keep at once (one of
        them is not well-formed): well-formed ones (plain ints in range, a finite ts) pass the
        same test, event by event; :func:`rankscope.analysis.store.memory_table.bad_memory_field`
        only sees the others, to name what is wrong.
        """
        a = ev.args
        t = ev.ts
        if (
            a is not None
            and (type(t) is int or (type(t) is float and t - t == 0))
            and -TS_LIMIT_US < t < TS_LIMIT_US
            and all(
                type(v := getattr(a, attr)) is int and lo <= v <= hi
                for attr, lo, hi in _MEMORY_LIMITS
            )
        ):
            self.memory.append(ev)
            return
        from rankscope.analysis.store.memory_table import bad_memory_field, skip_reason

        values = None
        if a is not None:
            values = [a.device_type, a.device_id, a.addr, a.nbytes, a.total_allocated]
            values.append(a.total_reserved)
        bad = bad_memory_field(t, values)
        if not bad and not -TS_LIMIT_US < t < TS_LIMIT_US:
            bad = "ts"
        if bad:
            reason = skip_reason(bad)
            self.memory_skipped[reason] = self.memory_skipped.get(reason, 0) + 1
        else:
            self.memory.append(ev)

    def _flush_memory(self) -> None:
        """Reduce the block's kept memory events to columns (so their objects do not pile up)."""
        mem = self.memory
        n = len(mem)
        if not n:
            return
        if isinstance(mem[0].ts, Decimal):
            ts = decimal_to_ns([ev.ts for ev in mem])
        else:
            ts = us_to_ns(np.fromiter(map(_TS, mem), np.float64, n))
        args = list(map(_ARGS, mem))
        self._keep_memory(
            mem, ts, {attr: list(map(attrgetter(attr), args)) for _, attr, _ in _MEMORY_ARGS}
        )
        self.memory = []

    def _keep_memory(self, mem: list[KEvent], ts: np.ndarray, values: dict[str, list[Any]]) -> None:
        """Append kept memory events as columns: ``ts`` in ns (before the time base), ``values``
        the six ``KArgs`` fields of each event by attribute (read once, by the check or here)."""
        n = len(mem)
        part = self.memory_parts
        part.setdefault("ts", []).append(ts)
        for col, attr, dtype in _MEMORY_ARGS:
            part.setdefault(col, []).append(np.fromiter(values[attr], dtype, n))
        pairs = list(zip(map(str, map(_PID, mem)), map(str, map(_TID, mem)), strict=True))
        self.memory_thread_parts.append(codes_in(self.memory_thread_keys, pairs))

    def _keep_scanned_memory(self, mem: ScannedMemory) -> None:
        """:meth:`_keep_memory` of a sub-block's memory events as the compiled scanner read
        them (every one well-formed, ``kineto_scan.ScannedMemory``): the same columns and
        threads."""
        part = self.memory_parts
        part.setdefault("ts", []).append(us_to_ns(mem.ts_us))
        for (col, _, dtype), values in zip(_MEMORY_ARGS, mem.values, strict=True):
            part.setdefault(col, []).append(values.astype(dtype))
        # (the keys' order is only the codes': no output depends on it)
        self.memory_thread_parts.append(pair_codes(self.memory_thread_keys, mem.pid, mem.tid))

    @property
    def memory_threads(self) -> list[tuple[str, str]]:
        """Each kept memory event's (pid, tid), in order (a view for checks; the reduction keeps
        codes: :attr:`memory_thread_parts`)."""
        keys = list(self.memory_thread_keys)
        return [keys[c] for part in self.memory_thread_parts for c in part.tolist()]

    def _memory_columns(self, cols: dict[str, np.ndarray], base: int) -> dict[str, np.ndarray]:
        """The kept memory events as columns, with op, scope and step from the events' own
        ranges (``memory_table.innermost_open``: the rule of ``memory_rows``); ts raw ns.
        ``cols``: the events' columns, ``ts`` with the time base already added."""
        from rankscope.analysis.store.memory_table import (
            ALLOCATION_OPS,
            innermost_open,
            step_of,
        )

        out = {k: np.concatenate(v) for k, v in self.memory_parts.items()}
        out["ts"] = out["ts"] + np.int64(base)
        strings = list(self.strings)
        wanted = {"cpu_op", "operator", "user_annotation"}
        cat_ok = np.array([c in wanted for c in strings], dtype=bool)
        is_step = np.array([c.startswith("ProfilerStep#") for c in strings], dtype=bool)
        n_mem = len(out["ts"])
        # codes into the string table of each event's op and scope, -1 for none ("")
        ops = np.full(n_mem, -1, dtype=np.int64)
        scopes = np.full(n_mem, -1, dtype=np.int64)
        steps: list[tuple[int, int, int]] = []
        lane_key = {i: key for key, i in self.lanes.items()}
        c_ts, c_end = cols["ts"], cols["ts"] + cols["dur"]
        c_name, c_cat, c_lane = cols["name"], cols["cat"], cols["lane"]
        user = self.strings.get("user_annotation", -1)
        if len(c_ts):
            for i in np.flatnonzero(is_step[c_name]).tolist():
                number = strings[c_name[i]][len("ProfilerStep#") :]
                if number.isdigit():
                    steps.append((int(c_ts[i]), int(c_end[i]), int(number)))
            # only the ranges of threads that allocated
            threads = set(self.memory_thread_keys)
            lanes_wanted = np.array(
                [lane_key[k] in threads for k in range(len(lane_key))], dtype=bool
            )
            keep = np.flatnonzero(cat_ok[c_cat] & ~is_step[c_name] & lanes_wanted[c_lane])
            # grouped by lane in bulk (a stable sort keeps each lane's ranges in event order),
            # and only the ranges holding a memory event of their thread: the rule reads the
            # ranges open at each event (start <= ts <= end), so the others never name anything
            # (the 54 MB df_index_resolver: 58,710 ranges of allocating threads, of which
            # 22,275 hold an allocation)
            order = keep[np.argsort(c_lane[keep], kind="stable")]
            lane_of = c_lane[order]
            cuts = [0, *(np.flatnonzero(lane_of[1:] != lane_of[:-1]) + 1).tolist(), len(order)]
            key_lane = np.array(
                [self.lanes.get(t, -1) for t in self.memory_thread_keys], dtype=np.int64
            )
            lane_ids = key_lane[np.concatenate(self.memory_thread_parts)]
            named = np.array([bool(c) for c in strings], dtype=bool)
            plain = np.array([c not in ALLOCATION_OPS for c in strings], dtype=bool)
            for a, b in pairwise(cuts):
                if a == b:
                    continue
                lane_i = int(lane_of[a])
                at = np.flatnonzero(lane_ids == lane_i)
                rows = order[a:b]
                rows = rows[holding(c_ts[rows], c_end[rows], out["ts"][at])]
                if not len(rows):
                    continue
                rows = rows[np.lexsort((-c_end[rows], c_ts[rows]))]  # the rule's push order
                name = c_name[rows]
                op, scope = innermost_open(
                    out["ts"][at],
                    c_ts[rows],
                    c_end[rows],
                    named=named[name],
                    user=c_cat[rows] == user,
                    plain=plain[name],
                )
                ops[at] = np.where(op >= 0, name[op], -1)
                scopes[at] = np.where(scope >= 0, name[scope], -1)
        out["op"] = self._or_empty(ops)
        out["scope"] = self._or_empty(scopes)
        out["step"] = step_of(out["ts"], steps)
        return out


def holding(starts: np.ndarray, ends: np.ndarray, stamps: np.ndarray) -> np.ndarray:
    """Which ranges [start, end] (ns, both ends included) hold at least one of ``stamps``."""
    if not len(stamps):
        return np.zeros(len(starts), dtype=bool)
    stamps = np.sort(stamps)
    first = np.searchsorted(stamps, starts, side="left")  # the first stamp at or after start
    inside = first < len(stamps)
    inside[inside] = stamps[first[inside]] <= ends[inside]
    return inside
