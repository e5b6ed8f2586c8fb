"""Decoded Kineto events reduced to compact numpy columns, block by block.

:class:`EventColumns` takes each block of decoded events (``kineto_json.KEvent``) as the
streaming reader produces it and keeps only columns: ``ts``/``dur`` in int64 ns, interned
name/category codes, the event kind, lane, correlation id, input-shape codes, the communication
rows (collective, group, Seq, bytes, peer) and the ``[memory]`` events; :meth:`EventColumns.finish`
concatenates them into a :class:`~rankscope.orchestrator.ingest.file_trace.FileTrace` (numpy
and plain rows: the reader never imports pandas, ``file_trace.py``). Each block is reduced
before the next is decoded, so the decoded objects of a whole file never exist together.

Timestamps (the part that must be exact): absolute ns = ``baseTimeNanoseconds`` + ts·1000
(``baseTimeNanoseconds`` absent in older traces, whose ``ts`` is absolute epoch µs), converted in
int64, never in float (``stamps.py``). The ``[memory]`` events are ``memory_columns.py``'s part
of the reduction (:class:`EventColumns` inherits it).

Two ways in, one reduction: :meth:`EventColumns.extract` takes msgspec's decoded events,
:meth:`EventColumns.extract_scanned` the columns of the compiled scanner (``kineto_scan``), and
both end in :meth:`EventColumns._keep_complete`, so the kinds, communication rows and string
codes are made once. The interning (first-seen codes) is ``string_codes.py``.

Why one module of ~545 lines: one reduction, block by block, of the complete events, thread
names and communication args into one :class:`FileTrace`; its parts share the string table and
the row numbering.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
from rankscope.analysis.store.memory_table import memory_field_limits
from rankscope.analysis.store.schema import EventKind, LaneKind
from rankscope.orchestrator.ingest.comm_kernels import DEFAULT_VOCABULARY, CommVocabulary
from rankscope.orchestrator.ingest.file_trace import CommRecord, CommRecords, FileTrace, LaneRow
from rankscope.orchestrator.ingest.kineto_json import (
    BLOCK_DECODER,
    KEvent,
    KFile,
    TraceReadError,
    decode_json,
)
from rankscope.orchestrator.ingest.kineto_scan import Scanned
from rankscope.orchestrator.ingest.memory_columns import MemoryColumns
from rankscope.orchestrator.ingest.stamps import BASE_LIMIT_NS as BASE_LIMIT_NS
from rankscope.orchestrator.ingest.stamps import TS_LIMIT_US as TS_LIMIT_US
from rankscope.orchestrator.ingest.stamps import decimal_to_ns
from rankscope.orchestrator.ingest.stamps import us_to_ns as us_to_ns
from rankscope.orchestrator.ingest.string_codes import (
    ShapeCodes,
    codes_in,
    factorize,
    pair_codes,
    raw_shape_codes,
    shape_codes,
)
from rankscope.orchestrator.ingest.vocabulary import (
    GPU_CATS,
    GPU_KINDS,
    RECORD_PARAM_COMMS,
    classify,
    collective_op,
    message_bytes,
    p2p_peer,
)

#: One rank's (or one file's) string table: string -> code, in first-seen order.
StringTable = dict[str, int]


# The range of an int64 field, as plain ints for the reader's inline tests.
_INT64_LO, _INT64_HI = memory_field_limits()["bytes"]


#: Attribute readers of decoded events, mapped over a block (C loops, no Python frame per event).
_TS, _DUR, _NAME, _CAT, _PID, _TID, _ARGS = (
    attrgetter(a) for a in ("ts", "dur", "name", "cat", "pid", "tid", "args")
)


@dataclass
class _SubBlock:
    """One sub-block's columns (:meth:`EventColumns.extract`): ``arrays`` final (ts, dur, kind,
    corr); the others (codes own to the sub-block, distinct values in first-seen order) wait
    for the block's codes (:meth:`EventColumns.end_block`)."""

    arrays: dict[str, np.ndarray]
    name: tuple[np.ndarray, list[str]]
    cat: tuple[np.ndarray, list[str]]
    shapes: tuple[np.ndarray, list[str]]
    dtypes: tuple[np.ndarray, list[str]]
    pid: tuple[np.ndarray, list[Any]]
    tid: tuple[np.ndarray, list[Any]]


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """One array of ``arrays`` (the one itself when alone: no copy)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


class EventColumns(MemoryColumns):
    """Reduces decoded events, block by block, to compact columns (see :func:`read_trace`)."""

    def __init__(
        self, strings: StringTable | None = None, comm: CommVocabulary = DEFAULT_VOCABULARY
    ) -> None:
        super().__init__()
        self.nbytes = 0
        self.strings: StringTable = {} if strings is None else strings
        self.comm = comm
        self.lanes: dict[tuple[str, str], int] = {}
        #: (name, category) -> its kind (``vocabulary.classify``)
        self.kinds: dict[tuple[str, str], int] = {}
        #: (name, category) -> its kind is KERNEL_COMM and the merge cannot match it across
        #: ranks (``comm_kernels``: not a collective family): no comm row, counted by the analysis
        self.unmatchable: dict[tuple[str, str], bool] = {}
        self.thread_names: dict[tuple[str, str], list[str]] = {}
        self.parts: dict[str, list[np.ndarray]] = {}
        self.comm_rows: list[CommRecord] = []
        self.count = 0
        self.dropped = 0
        self.out_of_range = 0
        self.rank_signs = False  # multirank.block_signs of a block so far
        self.pending: list[_SubBlock] = []  # the block's sub-blocks, until end_block

    def _intern(self, values: list[str]) -> np.ndarray:
        """Codes (int32) of ``values`` in the string table, new strings appended in first-seen
        order (:func:`codes_in`; 19.5 vs 47.5 ms with ``pd.factorize`` for the 123k names of
        the 54 MB ``df_index_resolver``, measured), with the same codes."""
        return codes_in(self.strings, values, np.int32)

    def add(self, events: list[KEvent]) -> None:
        """Reduce one block of decoded events (one :meth:`extract` and its :meth:`end_block`)."""
        self.extract(events)
        self.end_block()

    def extract(self, events: list[KEvent]) -> None:
        """Reduce one sub-block of decoded events, short of the string codes.

        The streaming reader decodes each block of text in sub-blocks (``decode.SUB_BLOCK_BYTES``)
        and extracts each while its objects are still in the CPU's cache; everything but the
        codes into the string table is final here. Names, categories and shapes get codes into
        a table of the sub-block's own, and pids/tids first-seen codes of their own:
        :meth:`end_block` turns them into the block's codes in the order one whole-block pass
        gives (first-seen over the block: all names, then all categories, shapes, dtypes), so
        the table and the lanes do not depend on the sub-block size.
        :meth:`extract_scanned` is the same for a sub-block the compiled scanner read.
        """
        if not self.rank_signs:
            from rankscope.orchestrator.ingest.multirank import block_signs

            self.rank_signs = block_signs(events)
        self._other_events(events)
        xs = [ev for ev in events if ev.ph == "X"]
        n = len(xs)
        if not n:
            return
        durs = list(map(_DUR, xs))  # attribute reads in C (map + attrgetter): the hot path
        exact = isinstance(xs[0].ts, Decimal)
        # One float pass per column, checked with numpy: a stamp whose ns would overflow int64
        # (found by tests/test_fuzz.py) is out of range; a duration missing, NaN or negative is
        # dropped (``None`` becomes NaN here). Exact (Decimal) stamps convert the same way.
        if exact:
            ts_f = np.fromiter((float(ev.ts) for ev in xs), np.float64, n)
            dur_f = np.fromiter((np.nan if d is None else float(d) for d in durs), np.float64, n)
        else:
            ts_f = np.fromiter(map(_TS, xs), np.float64, n)
            dur_f = np.array(durs, dtype=np.float64)  # None → NaN
        lim = TS_LIMIT_US
        with np.errstate(invalid="ignore"):
            far = ~(np.abs(ts_f) < lim) | (dur_f >= lim)
            bad = ~far & ~(dur_f >= 0)
        if far.any() or bad.any():
            self.out_of_range += int(far.sum())
            self.dropped += int(bad.sum())
            keep = ~(far | bad)
            xs = [ev for ev, k in zip(xs, keep.tolist(), strict=True) if k]
            durs = [d for d, k in zip(durs, keep.tolist(), strict=True) if k]
            ts_f, dur_f = ts_f[keep], dur_f[keep]
        n = len(xs)
        if not n:
            return
        if exact:
            ts = decimal_to_ns([ev.ts for ev in xs])
            dur = decimal_to_ns(durs)
        else:
            ts = us_to_ns(ts_f)
            dur = us_to_ns(dur_f)
        name_seen: dict[str, int] = {}
        cat_seen: dict[str, int] = {}
        name = codes_in(name_seen, list(map(_NAME, xs)), np.int32)
        cat = codes_in(cat_seen, list(map(_CAT, xs)), np.int32)
        corr = np.fromiter(
            (
                ev.args.correlation
                if ev.args is not None
                and type(ev.args.correlation) is int
                and _INT64_LO <= ev.args.correlation <= _INT64_HI
                else -1
                for ev in xs
            ),
            np.int64,
            n,
        )
        have = [
            (i, a)
            for i, a in enumerate(map(_ARGS, xs))
            if a is not None and a.input_dims is not None
        ]
        self._keep_complete(
            {"ts": ts, "dur": dur, "corr": corr},
            (name, list(name_seen)),
            (cat, list(cat_seen)),
            factorize(list(map(_PID, xs))),
            factorize(list(map(_TID, xs))),
            lambda rows: [xs[i] for i in rows],
            shape_codes(n, have),
        )

    def extract_scanned(self, scanned: Scanned, text: Any) -> None:
        """:meth:`extract` of a sub-block the compiled scanner reduced (``kineto_scan``):
        ``text`` is the sub-block's JSON, of which only the few events the reduction reads
        whole are decoded (the ``M`` and ``i`` events, and the complete events whose ``args``
        it reads: communication ops, recorded shapes), by msgspec, as :meth:`extract` gets
        them. The same columns, codes and counts as :meth:`extract` of msgspec's decode of
        ``text`` (tests/test_kineto_scan.py)."""
        others = decode_json(BLOCK_DECODER, scanned.others) if scanned.others else []
        if not self.rank_signs:
            from rankscope.orchestrator.ingest.multirank import block_signs

            self.rank_signs = scanned.sign or block_signs(others)
        self._other_events(others)
        if scanned.memory is not None:
            self._keep_scanned_memory(scanned.memory)
        self.out_of_range += scanned.out_of_range
        self.dropped += scanned.bad_duration
        if not len(scanned.ts_us):
            return
        starts, ends = scanned.starts, scanned.ends
        dims = np.flatnonzero(scanned.dims).tolist()
        shapes = raw_shape_codes(len(starts), text, dims, scanned.shape_spans)
        self._keep_complete(
            {"ts": us_to_ns(scanned.ts_us), "dur": us_to_ns(scanned.dur_us), "corr": scanned.corr},
            scanned.name,
            scanned.cat,
            scanned.pid,
            scanned.tid,
            lambda rows: _decode_spans(text, starts[rows], ends[rows]),
            shapes,
        )

    def _other_events(self, events: list[KEvent]) -> None:
        """The thread names (``M``) and ``[memory]`` events (``i``) of a sub-block."""
        memory = []
        for ev in events:
            ph = ev.ph
            if ph == "X":
                continue
            if ph == "M" and ev.name == "thread_name" and ev.args is not None:
                names = self.thread_names.setdefault((str(ev.pid), str(ev.tid)), [])
                label = str(ev.args.name or "").strip()
                if label and label not in names:
                    names.append(label)
            elif ph == "i" and ev.name == "[memory]":
                memory.append(ev)
        if memory and not self._memory_block(memory):
            for ev in memory:
                self._memory_event(ev)
        self._flush_memory()

    def _keep_complete(
        self,
        arrays: dict[str, np.ndarray],
        name: tuple[np.ndarray, list[str]],
        cat: tuple[np.ndarray, list[str]],
        pid: tuple[np.ndarray, list[Any]],
        tid: tuple[np.ndarray, list[Any]],
        events_at: Callable[[list[int]], list[KEvent]],
        shapes: ShapeCodes,
    ) -> None:
        """A sub-block's kept complete events (both paths): their kinds and communication rows,
        then the sub-block waits for :meth:`end_block`. ``arrays``: ts, dur (int64 ns) and
        corr; ``events_at``: the decoded events of the given rows (read for the communication
        rows); ``shapes``: their shape and dtype codes with the texts (``string_codes``)."""
        n = len(arrays["ts"])
        name_codes, name_uniq = name
        cat_codes, cat_uniq = cat
        pair = name_codes.astype(np.int64) << 32 | cat_codes.astype(np.int64)
        uniq, inverse = np.unique(pair, return_inverse=True)
        kinds = np.empty(len(uniq), dtype=np.int8)
        unmatchable = np.zeros(len(uniq), dtype=bool)
        for i, p in enumerate(uniq.tolist()):
            key = (name_uniq[p >> 32], cat_uniq[p & 0xFFFFFFFF])
            k = self.kinds.get(key)
            if k is None:
                text = key[0]
                k = self.kinds[key] = int(classify(key[1], text, self.comm))
                self.unmatchable[key] = k == EventKind.KERNEL_COMM and not self.comm.is_collective(
                    text
                )
            kinds[i] = k
            unmatchable[i] = self.unmatchable[key]
        kind = kinds[inverse.reshape(-1)]
        is_enqueue = kind == EventKind.COMM_ENQUEUE
        matched = ~unmatchable[inverse.reshape(-1)]
        comm_kind = ((kind == EventKind.KERNEL_COMM) & matched) | (kind == EventKind.COMM_CPU)
        rows = np.flatnonzero(comm_kind | is_enqueue).tolist()
        for i, enqueue, ev in zip(rows, is_enqueue[rows].tolist(), events_at(rows), strict=True):
            a = ev.args
            if enqueue and (ev.name != RECORD_PARAM_COMMS or a is None or not a.collective):
                continue  # other enqueue ops (c10d::*, nccl:*) name nothing the kernel lacks
            op = collective_op(ev.name, a.collective if a is not None else None)
            peer = -1
            if a is not None:
                op, peer = p2p_peer(op, a.dst_rank, a.src_rank)
            group = str(a.pg_name) if a is not None and a.pg_name is not None else ""
            seq = -1
            if a is not None and isinstance(a.seq, int | str) and str(a.seq).isdigit():
                seq = int(a.seq)
            size = message_bytes(a.in_nelems, a.dtype) if a is not None else -1
            self.comm_rows.append((self.count + i, op, group, seq, size, peer, enqueue))
        shape, shape_uniq, dtypes, dtype_uniq = shapes
        self.pending.append(
            _SubBlock(
                {**arrays, "kind": kind},
                name, cat, (shape, shape_uniq), (dtypes, dtype_uniq), pid, tid,
            )
        )  # fmt: skip
        self.count += n

    def end_block(self) -> None:
        """The block's sub-blocks (:meth:`extract`) given the block's codes, then kept.

        A sub-block's own codes are first-seen codes over the sub-block; the block's first-seen
        order is the sub-blocks' distinct values in turn (a value is first seen in the first
        sub-block holding it, at its first place there), so the string table grows as one pass
        over the whole block grows it: its names, then its categories, shapes, dtypes."""
        subs, self.pending = self.pending, []
        if not subs:
            return
        cols: dict[str, list[np.ndarray]] = {}
        for field_ in ("name", "cat", "shapes", "dtypes"):
            for sub in subs:
                local, uniq = getattr(sub, field_)
                # -1 (no shapes recorded) indexes the appended -1
                remap = np.append(self._intern(uniq), np.int32(-1)) if uniq else None
                cols.setdefault(field_, []).append(local if remap is None else remap[local])
        pid_seen: dict[Any, int] = {}
        tid_seen: dict[Any, int] = {}
        pid_codes = np.concatenate([codes_in(pid_seen, s.pid[1])[s.pid[0]] for s in subs])
        tid_codes = np.concatenate([codes_in(tid_seen, s.tid[1])[s.tid[0]] for s in subs])
        lane = pair_codes(
            self.lanes, (pid_codes, list(pid_seen)), (tid_codes, list(tid_seen))
        ).astype(np.int32)
        for key in ("ts", "dur", "name", "cat", "kind", "lane", "corr", "shapes", "dtypes"):
            if key == "lane":
                arr = lane
            elif key in cols:
                arr = _joined(cols[key])
            else:
                arr = _joined([s.arrays[key] for s in subs])
            self.parts.setdefault(key, []).append(arr)

    def mark(self) -> tuple[Any, ...]:
        """What :meth:`rollback` needs to forget the sub-blocks extracted after this call (the
        streaming reader re-reads a block whole when a sub-block of it fails)."""
        return (
            self.count,
            self.dropped,
            self.out_of_range,
            self.rank_signs,
            len(self.comm_rows),
            {k: len(v) for k, v in self.memory_parts.items()},
            len(self.memory_thread_parts),
            len(self.memory_thread_keys),
            dict(self.memory_skipped),
            {k: list(v) for k, v in self.thread_names.items()},
        )

    def rollback(self, mark: tuple[Any, ...]) -> None:
        """Forget what was extracted since :meth:`mark` returned ``mark``."""
        (self.count, self.dropped, self.out_of_range, self.rank_signs, rows, memory_lens,
         threads, thread_keys, self.memory_skipped, self.thread_names) = mark  # fmt: skip
        del self.comm_rows[rows:]
        for k in list(self.memory_parts):
            del self.memory_parts[k][memory_lens.get(k, 0) :]
            if not self.memory_parts[k]:
                del self.memory_parts[k]
        del self.memory_thread_parts[threads:]
        for key in list(self.memory_thread_keys)[thread_keys:]:
            del self.memory_thread_keys[key]
        self.memory = []
        self.pending = []

    def finish(self, path: Path, top: KFile, *, sort: bool = True) -> FileTrace:
        """Concatenate, add the time base, sort by ts (unless ``sort`` is False), build lanes."""
        cols = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in self.parts.items()}
        if not cols:
            cols = {
                k: np.zeros(0, dtype=d)
                for k, d in (
                    ("ts", np.int64),
                    ("dur", np.int64),
                    ("name", np.int32),
                    ("cat", np.int32),
                    ("kind", np.int8),
                    ("lane", np.int32),
                    ("corr", np.int64),
                    ("shapes", np.int32),
                    ("dtypes", np.int32),
                )
            }
        base = top.baseTimeNanoseconds or 0
        if not -BASE_LIMIT_NS < base < BASE_LIMIT_NS:
            raise TraceReadError(f"baseTimeNanoseconds out of range ({base})")
        cols["ts"] = cols["ts"] + np.int64(base)
        memory = self._memory_columns(cols, base) if self.memory_thread_parts else None
        inverse = None
        if sort:
            cols, inverse = sort_by_ts(cols)
        strings = list(self.strings)
        is_gpu = np.isin(cols["kind"], GPU_KINDS)
        gpu_cat = np.array([s in GPU_CATS for s in strings], dtype=bool)
        if len(gpu_cat):
            is_gpu |= gpu_cat[cols["cat"]]
        lane_gpu = np.zeros(len(self.lanes), dtype=bool)
        np.logical_or.at(lane_gpu, cols["lane"], is_gpu)
        rows: list[LaneRow] = []
        for (pid, tid), i in self.lanes.items():
            if lane_gpu[i]:
                label = tid if tid.startswith("stream") else f"stream {tid}"
                rows.append((i, int(LaneKind.GPU_STREAM), pid, tid, label))
            else:
                label = " / ".join(self.thread_names.get((pid, tid), [])) or f"thread {tid}"
                rows.append((i, int(LaneKind.THREAD), pid, tid, label))
        event = np.fromiter((r[0] for r in self.comm_rows), np.int64, len(self.comm_rows))
        if inverse is not None:
            event = inverse[event]
        records = CommRecords(self.comm_rows, event, cols["lane"][event])
        info = top.distributedInfo or {}
        world = info.get("world_size")
        rank = info.get("rank")
        dropped = {}
        if self.dropped:
            dropped["events with negative, NaN or missing durations"] = self.dropped
        if self.out_of_range:
            dropped["events with timestamps out of range"] = self.out_of_range
        from rankscope.analysis.store.devices import device_capability
        from rankscope.analysis.store.memory_table import device_total_memory
        from rankscope.orchestrator.ingest.multirank import steps_repeat

        rank_signs = (
            self.rank_signs
            or bool(self.dropped or self.out_of_range)  # a dropped one may be a ProfilerStep
            or steps_repeat(cols["name"], cols["cat"], strings)
        )

        return FileTrace(
            path=path,
            rank=rank if type(rank) is int and 0 <= rank <= _INT64_HI else None,
            world_size=world if type(world) is int and 0 < world <= _INT64_HI else None,
            backend=str(info["backend"]) if "backend" in info else None,
            trace_id=top.trace_id,
            host=top.host_name,
            nbytes=self.nbytes,
            columns=cols,
            strings=strings,
            lane_rows=rows,
            comm_records=records,
            dropped=dropped,
            memory=memory,
            memory_skipped=dict(self.memory_skipped),
            device_memory=device_total_memory(top.deviceProperties),
            device_capability=device_capability(top.deviceProperties),
            process_groups=process_groups(info.get("pg_config")),
            rank_signs=rank_signs,
        )


def _decode_spans(text: Any, starts: np.ndarray, ends: np.ndarray) -> list[KEvent]:
    """The events at ``[starts, ends)`` (bytes) of ``text``, decoded by msgspec (one decode of
    their objects joined into an array: what the block's decode gives for them)."""
    if not len(starts):
        return []
    with memoryview(text) as view:
        joined = b",".join([view[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)])
    return decode_json(BLOCK_DECODER, b"[" + joined + b"]")


#: Most process groups kept per rank from ``pg_config`` (Megatron creates a few per rank; a
#: hostile trace could list millions).
MAX_PROCESS_GROUPS = 4096


def process_groups(pg_config: Any) -> list[dict[str, Any]]:
    """``distributedInfo.pg_config`` as ``[{"name", "desc", "ranks"}]``: entries without a name or
    with ranks that are not a list of non-negative ints are left out (never guessed)."""
    out: list[dict[str, Any]] = []
    if not isinstance(pg_config, list):
        return out
    for item in pg_config[:MAX_PROCESS_GROUPS]:
        if not isinstance(item, dict) or item.get("pg_name") is None:
            continue
        ranks = item.get("ranks")
        if not isinstance(ranks, list) or not all(
            type(r) is int and 0 <= r <= _INT64_HI for r in ranks
        ):
            continue
        desc = item.get("pg_desc")
        out.append(
            {
                "name": str(item["pg_name"]),
                "desc": "" if desc is None else str(desc),
                "ranks": ranks,
            }
        )
    return out


def sort_by_ts(columns: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``columns`` sorted by ``ts`` (stable: ties keep their order) and the new row of each old row.

    Stable, so sorting several files' events at once gives what sorting each file and then the
    concatenation gives: ties stay in file order, then in event order within the file.
    """
    order = np.argsort(columns["ts"], kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return {k: v[order] for k, v in columns.items()}, inverse
