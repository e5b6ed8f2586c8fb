"""The Kineto decoder: one torch.profiler JSON trace file to compact numpy columns.

Why typed msgspec decoding: Kineto traces are large (tens of MB per rank) and mostly made of
complete events (``ph: X``); decoding straight into :class:`KEvent` structs skips every field we
do not use (msgspec does this in C) and is ~6x faster than ``json`` + dicts. Of the ``args`` we
decode only the few keys we use, also typed, so the rest is skipped without building objects.

One way to each thing: the JSON text comes from :func:`text_pieces` only (plain or gzip,
multi-member gzip, bounded pieces; the whole-file read joins them), every decode goes through
:func:`_decode_json` (the one place that retries text holding Python's ``NaN``), and events are
reduced to columns by :class:`_Accumulator` block by block, whichever path decoded them. The
decoder and that reduction stay one module (~590 lines) because they are one streaming loop:
each decoded block is reduced before the next is decoded, so its objects never pile up.

Strings (event names, categories) are interned as they are decoded, into a table the caller may
share across files: the merge passes one table per rank, so a rank's windows share their codes
and nothing is interned again before the store translates the rank's table to its own.

Timestamps (the part that must be exact):
``ts``/``dur`` are µs with up to 3 decimals (ns resolution). Absolute ns =
``baseTimeNanoseconds`` + ts·1000 (``baseTimeNanoseconds`` absent in older traces, whose ``ts`` is
absolute epoch µs). We never add the base in float: ts is split into its integer µs and the
fractional part, ``ns = int(floor(ts))*1000 + rint(frac*1000)``, in int64. This is exact when the
decoded double is within 0.5 ns of the decimal text, i.e. when ``|ts| < 2**43`` µs (ulp ≤ 1/1024
µs): relative stamps up to ~100 days, and absolute integer epoch µs (exact below 2**53).
A file with fractional stamps at or above 2**43 µs is decoded again with ``decimal.Decimal``
timestamps (exact, slower) — see :func:`needs_exact`.

Why one module of ~740 lines: the decoder and its reduction to columns are one streaming loop
(each block is reduced before the next is decoded).
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import numpy as np
from rankscope.analysis.memory import memory_field_limits
from rankscope.analysis.schema import EventKind, LaneKind
from rankscope.orchestrator.vocabulary import (
    GPU_CATS,
    GPU_KINDS,
    RECORD_PARAM_COMMS,
    classify,
    collective_op,
    message_bytes,
    p2p_peer,
)

if TYPE_CHECKING:
    import pandas as pd

#: |ts| (µs) above which a fractional float timestamp may be off by 1 ns (see module docstring).
EXACT_FLOAT_LIMIT_US = float(2**43)
#: Events whose |ts| or dur (µs) reach this are dropped and counted (their ns would overflow
#: int64; ~146 years), and a ``baseTimeNanoseconds`` of |base| ≥ 2**62 makes the file a problem.
TS_LIMIT_US = 2**62 // 1000
BASE_LIMIT_NS = 2**62
#: A bare ``NaN`` value (Python's json writes it for float('nan'); JSON has none).
NAN_VALUE = re.compile(rb"(?<=[:\[,])\s*-?NaN\b")
#: The first two bytes of a gzip stream.
GZIP_MAGIC = b"\x1f\x8b"
#: ``wbits`` for zlib to read a gzip header and trailer.
GZIP_WBITS = 16 + zlib.MAX_WBITS
#: A gzip trace may expand to at most this many times its size (Kineto's JSON: ~10x) ...
GZIP_MAX_RATIO = 100
#: ... or to this many bytes, whichever is more; beyond, it is refused as a gzip bomb
#: (TraceReadError; docs/reliability.md) before more than that is ever decompressed.
GZIP_FREE_BYTES = 64 << 20
#: One rank's (or one file's) string table: string -> code, in first-seen order.
StringTable = dict[str, int]
#: What a decoder returns.
Decoded = TypeVar("Decoded")


class TraceReadError(Exception):
    """A trace file cannot be read at all (the message is one line, without the file name)."""


class KArgs(msgspec.Struct, gc=False):
    """The few ``args`` keys we use (everything else is skipped by the decoder)."""

    correlation: Any = None
    name: Any = None  # metadata events: process / thread name
    collective: Any = msgspec.field(default=None, name="Collective name")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    seq: Any = msgspec.field(default=None, name="Seq")
    # send / recv: the peer's global rank (vocabulary.p2p_peer)
    dst_rank: Any = msgspec.field(default=None, name="Dst Rank")
    src_rank: Any = msgspec.field(default=None, name="Src Rank")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    # [memory] instant events (profile_memory): kept as memory rows (rankscope.analysis.memory)
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    addr: Any = msgspec.field(default=None, name="Addr")
    nbytes: Any = msgspec.field(default=None, name="Bytes")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    # record_shapes=True: an op's input shapes and dtypes (kept as text, see _shape_codes)
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")


class KEvent(msgspec.Struct, gc=False):
    """One trace event; absent fields take defaults.

    ``gc=False``: decoded JSON cannot form reference cycles, and keeping 10^5-10^6 structs out of
    the cycle collector's lists makes decoding ~2x faster (measured).
    """

    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: int | float = 0
    """µs; JSON integers stay int (exact), decimals become float (see needs_exact)"""
    dur: int | float | None = 0
    args: KArgs | None = None


class KEventExact(KEvent):
    """Same with exact decimal timestamps (files with fractional stamps >= 2**43 µs)."""

    ts: Decimal = Decimal(0)  # type: ignore[assignment]
    dur: Decimal | None = Decimal(0)  # type: ignore[assignment]


class KFile(msgspec.Struct):
    """A Kineto trace file: ``traceEvents`` is required (it is what makes JSON a trace)."""

    traceEvents: list[KEvent]
    baseTimeNanoseconds: int | None = None
    distributedInfo: dict[str, Any] | None = None
    trace_id: str | None = None
    host_name: str | None = None
    deviceProperties: Any = None


class KFileExact(KFile):
    traceEvents: list[KEventExact]  # type: ignore[assignment]


_DECODER = msgspec.json.Decoder(KFile)
_DECODER_EXACT = msgspec.json.Decoder(KFileExact)


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
    lanes: pd.DataFrame
    comm: pd.DataFrame
    """communication events: event (row), op, group, seq (-1 unknown), bytes (-1 unknown),
    peer (global rank from ``Dst Rank`` / ``Src Rank``, -1 unknown), lane"""
    dropped: dict[str, int] = field(default_factory=dict)
    """events left out and why (negative / missing duration ...)"""
    memory: dict[str, np.ndarray] | None = None
    """the ``[memory]`` events (None when there are none): the columns of
    ``analysis.memory.MEMORY_COLUMNS`` but rank and window, ts raw ns, op and scope as codes
    into ``strings``, in file order"""
    memory_skipped: dict[str, int] = field(default_factory=dict)
    """memory events left out and why (``memory.skip_reason``)"""
    device_memory: dict[int, int] = field(default_factory=dict)
    """GPU index → total bytes (``deviceProperties``)"""
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    """the groups the rank is in (``distributedInfo.pg_config``): ``name``, ``desc`` and global
    ``ranks`` of each, as :func:`process_groups` reads them"""
    enqueue: pd.DataFrame | None = None
    """the ``record_param_comms`` ops that name a collective, columns as :attr:`comm`: the
    metadata of the NCCL kernels they launch (``rank_columns``; Seq is not copied to kernels)"""


def text_pieces(path: Path) -> Iterator[bytes]:
    """The file's JSON text in pieces (gunzipped on the fly); TraceReadError when unreadable.

    The only reader of trace bytes: the streaming decoder, :func:`read_bytes` and
    ``discovery.sniff`` all take their text from here, so gzip is handled in one place.
    """
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise TraceReadError(f"cannot read ({exc.strerror or exc})") from None
    with fh:
        first = fh.read(READ_BYTES)
        if not (path.name.endswith(".gz") or first[:2] == GZIP_MAGIC):
            while first:
                yield first
                first = fh.read(READ_BYTES)
            return
        dec = zlib.decompressobj(wbits=GZIP_WBITS)
        limit = max(GZIP_FREE_BYTES, GZIP_MAX_RATIO * os.fstat(fh.fileno()).st_size)
        produced = 0
        piece = first
        while piece:
            try:
                # Bounded output per call: a 1 MiB compressed piece can hold ~20 MiB of JSON.
                data = piece
                while data:
                    out = dec.decompress(data, TEXT_PIECE_BYTES)
                    data = dec.unconsumed_tail
                    if dec.eof and dec.unused_data:  # multi-member gzip
                        data = dec.unused_data
                        dec = zlib.decompressobj(wbits=GZIP_WBITS)
                    if out:
                        produced += len(out)
                        if produced > limit:
                            raise TraceReadError(
                                f"refused: the gzip expands to over {limit} bytes, more than "
                                f"{GZIP_MAX_RATIO}x its size (a gzip bomb?)"
                            )
                        yield out
            except zlib.error as exc:
                raise TraceReadError(f"truncated or corrupt gzip ({exc})") from None
            piece = fh.read(READ_BYTES)
        if not dec.eof:
            raise TraceReadError("truncated or corrupt gzip (file ends inside the stream)")


def read_bytes(path: Path) -> bytes:
    """The whole JSON text of ``path`` (gunzipped for .gz); TraceReadError when unreadable."""
    raw = b"".join(text_pieces(path))
    if not raw[:4096].strip() and not raw.strip():
        raise TraceReadError("empty file")
    return raw


def _decode_json(decoder: msgspec.json.Decoder[Decoded], data: Any) -> Decoded:
    """``decoder.decode(data)``; text holding ``NaN`` is decoded again with ``null`` instead.

    The one NaN rule of every path (whole file, streamed block, tail): the retry decodes a copy
    (the input file is never touched), and the events whose duration was NaN are then dropped
    and counted. A ValidationError is about content, not NaN, and is raised as is; when the
    retry fails too, the first error is raised (it names the real position).
    """
    try:
        return decoder.decode(data)
    except RecursionError:  # deeply nested JSON (found by tests/test_fuzz.py)
        raise msgspec.DecodeError("JSON nested too deeply") from None
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError as exc:
        if NAN_VALUE.search(data) is None:
            raise
        try:
            return decoder.decode(NAN_VALUE.sub(b"null", data))
        except (msgspec.MsgspecError, RecursionError):
            raise exc from None


def decode(data: bytes, *, exact: bool = False) -> KFile:
    """Decode JSON text into a :class:`KFile`; ``exact``: Decimal timestamps (:func:`needs_exact`)."""
    if exact:
        return _decode_json(_DECODER_EXACT, data)
    try:
        trace = _decode_json(_DECODER, data)
    except msgspec.ValidationError as exc:
        if "traceEvents" in str(exc) and "missing required field" in str(exc):
            raise TraceReadError("not a Kineto trace (no traceEvents)") from None
        if str(exc).startswith("Expected `object`") and " - at " not in str(exc):
            raise TraceReadError("not a Kineto trace (JSON is not an object)") from None
        raise TraceReadError(f"unexpected trace content: {exc}") from None
    except msgspec.DecodeError as exc:
        raise TraceReadError(f"invalid JSON ({exc})") from None
    return trace


def needs_exact(events: list[KEvent]) -> bool:
    """True when a timestamp written with decimals is ≥ 2**43 µs (module docstring).

    msgspec decodes JSON integers to ``int`` and decimals to ``float``, so the type tells what
    the text was: at 1.7e15 µs the double nearest to ``...255.123`` is ``...255.0``, but it is
    a float. Integers below 2**53 µs convert to float64 exactly.
    """
    return any(type(ev.ts) is float and abs(ev.ts) >= EXACT_FLOAT_LIMIT_US for ev in events)


def us_to_ns(values: Any) -> np.ndarray:
    """µs (float array, ≤ 3 decimals) → int64 ns, exact for |µs| < 2**43 (module docstring)."""
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    whole = np.floor(arr)
    frac = arr - whole  # exact (Sterbenz)
    return whole.astype(np.int64) * 1000 + np.rint(frac * 1000.0).astype(np.int64)


def _decimal_to_ns(values: list[Any]) -> np.ndarray:
    import numpy as np

    return np.fromiter(
        (int((Decimal(v) * 1000).to_integral_value()) for v in values),
        dtype=np.int64,
        count=len(values),
    )


def read_trace(path: Path, *, strings: StringTable | None = None, sort: bool = True) -> FileTrace:
    """Parse one trace file into compact columns (raises TraceReadError when unusable).

    Streaming first (:func:`_stream_events`): the JSON text is decompressed piece by piece and
    cut into blocks of whole events at Kineto's event separator, each block is decoded and
    reduced to compact columns at once, so the decoded objects of the whole file never exist
    together (the memory high-water mark stays near the size of one block, not of the file).
    Files that are not laid out like Kineto's writer (one line, other indentation) or whose
    blocks fail to decode are read whole instead (:func:`_read_whole`), which also produces the
    precise error message for bad input.

    ``strings``: a table to intern names and categories into, shared with other files (the
    strings a failed read added are taken out again, so the table only ever holds strings of
    events that were kept). ``sort=False`` leaves the events in file order (the caller sorts).
    """
    table: StringTable = {} if strings is None else strings
    known = len(table)
    try:
        acc = _Accumulator(table)
        try:
            top = _stream_events(path, acc)
        except _NotStreamable:
            _forget_since(table, known)
            acc = _Accumulator(table)
            top = _read_whole(path, acc)
        return acc.finish(path, top, sort=sort)
    except BaseException:
        _forget_since(table, known)
        raise


def _forget_since(table: StringTable, size: int) -> None:
    """Take out the strings added to ``table`` after it held ``size`` (dicts keep order)."""
    for key in list(table)[size:]:
        del table[key]


class _NotStreamable(Exception):
    """The streaming reader cannot handle this file's layout; read it whole."""


#: Separator between two events in Kineto's own JSON layout (strings cannot hold a raw newline,
#: and nested args objects are indented deeper, so this only occurs between events).
EVENT_SEPARATOR = b"\n  },\n  {"
#: Bytes of JSON text decoded per block by the streaming reader.
BLOCK_BYTES = 4 << 20
#: Compressed bytes read per step.
READ_BYTES = 1 << 18
#: Most JSON text produced per decompression call.
TEXT_PIECE_BYTES = 1 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BLOCK_DECODER = msgspec.json.Decoder(list[KEvent])
_BLOCK_DECODER_EXACT = msgspec.json.Decoder(list[KEventExact])


def _stream_events(path: Path, acc: _Accumulator, block_bytes: int = BLOCK_BYTES) -> KFile:
    """Stream the events of ``path`` into ``acc``; returns the top-level fields (no events).

    The text after ``"traceEvents": [`` accumulates in a bytearray that starts with ``[``; once
    it holds ``block_bytes``, the ``,`` after the last complete event becomes ``]`` and that
    prefix is decoded in place (no copy of the block), the rest starts the next block.
    """
    buf = bytearray()
    head: bytes | None = None
    total = 0
    for piece in text_pieces(path):
        total += len(piece)
        buf += piece
        if head is None:
            m = _EVENTS_KEY.search(buf)
            if m is None:
                if len(buf) > block_bytes:
                    raise _NotStreamable
                continue
            head = bytes(buf[: m.start()])
            buf = bytearray(b"[") + buf[m.end() :]
        if len(buf) >= block_bytes:
            cut = buf.rfind(EVENT_SEPARATOR)
            if cut < 0:
                if len(buf) > 4 * max(block_bytes, BLOCK_BYTES):
                    raise _NotStreamable  # not Kineto's layout
                continue
            buf[cut + 4] = ord("]")  # the separator's comma closes the block's array
            with memoryview(buf) as view:
                acc.add(_decode_block(view[: cut + 5]))
            buf = bytearray(b"[") + buf[cut + 5 :]
    if head is None:
        raise _NotStreamable
    acc.nbytes = total
    rest = b'{"traceEvents": ' + bytes(buf)
    try:
        top = _decode_json(_DECODER, head + b'"traceEvents": []}')
        tail = _decode_json(_DECODER, rest)
        if tail.traceEvents and needs_exact(tail.traceEvents):
            tail = _decode_json(_DECODER_EXACT, rest)
    except msgspec.MsgspecError:
        raise _NotStreamable from None
    if tail.traceEvents:
        acc.add(tail.traceEvents)
    for key in (
        "baseTimeNanoseconds",
        "distributedInfo",
        "trace_id",
        "host_name",
        "deviceProperties",
    ):
        if getattr(top, key) is None:
            setattr(top, key, getattr(tail, key))
    return top


def _decode_block(block: memoryview) -> list[KEvent]:
    """Decode a JSON array of whole events (exactly, when its stamps need it)."""
    try:
        events = _decode_json(_BLOCK_DECODER, block)
        if needs_exact(events):
            return _decode_json(_BLOCK_DECODER_EXACT, block)  # type: ignore[arg-type]
    except msgspec.MsgspecError:
        raise _NotStreamable from None
    return events


def _read_whole(path: Path, acc: _Accumulator) -> KFile:
    """Read and decode the whole file at once (any layout; precise errors)."""
    data = read_bytes(path)
    acc.nbytes = len(data)
    trace = decode(data)
    if needs_exact(trace.traceEvents):
        trace = decode(data, exact=True)
    del data
    events = trace.traceEvents
    trace.traceEvents = []
    acc.add(events)
    return trace


#: Memory columns from ``KArgs``: (column, attribute, dtype); values checked by bad_memory_field.
_MEMORY_ARGS = (
    ("device_type", "device_type", np.int8),
    ("device_id", "device_id", np.int16),
    ("addr", "addr", np.uint64),
    ("bytes", "nbytes", np.int64),
    ("total_allocated", "total_allocated", np.int64),
    ("total_reserved", "total_reserved", np.int64),
)


# The ranges of memory_field_limits(), as plain ints for the reader's inline test.
_DEVICE_TYPE_LO, _DEVICE_TYPE_HI = memory_field_limits()["device_type"]
_DEVICE_ID_LO, _DEVICE_ID_HI = memory_field_limits()["device_id"]
_ADDR_HI = memory_field_limits()["addr"][1]
_INT64_LO, _INT64_HI = memory_field_limits()["bytes"]


class _Accumulator:
    """Reduces decoded events, block by block, to compact columns (see :func:`read_trace`)."""

    def __init__(self, strings: StringTable | None = None) -> None:
        self.nbytes = 0
        self.strings: StringTable = {} if strings is None else strings
        self.lanes: dict[tuple[str, str], int] = {}
        self.kinds: dict[int, int] = {}
        self.thread_names: dict[tuple[str, str], list[str]] = {}
        self.parts: dict[str, list[np.ndarray]] = {}
        self.comm_rows: list[tuple[int, str, str, int, int, int, bool]] = []
        self.count = 0
        self.dropped = 0
        self.out_of_range = 0
        self.memory: list[KEvent] = []  # this block's, until _flush_memory
        self.memory_parts: dict[str, list[np.ndarray]] = {}
        self.memory_threads: list[tuple[str, str]] = []
        self.memory_skipped: dict[str, int] = {}

    def _intern(self, values: list[str]) -> np.ndarray:
        """Codes (int32) of ``values`` in the string table; only distinct values touch the dict."""
        import pandas as pd

        codes, uniq = pd.factorize(pd.Series(values, dtype=object))
        table = self.strings
        glob = np.array([table.setdefault(u, len(table)) for u in uniq.tolist()], dtype=np.int32)
        return glob[codes] if len(codes) else np.zeros(0, np.int32)

    def add(self, events: list[KEvent]) -> None:
        """Reduce one block of decoded events."""
        import pandas as pd

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
                self._memory_event(ev)
        self._flush_memory()
        xs = [ev for ev in events if ev.ph == "X"]
        n = len(xs)
        if not n:
            return
        durs = [ev.dur for ev in xs]
        exact = isinstance(xs[0].ts, Decimal)
        # One float pass per column, checked with numpy: a stamp whose ns would overflow int64
        # (found by tests/test_fuzz.py) is out of range; a duration missing, NaN or negative is
        # dropped (``None`` becomes NaN here). Exact (Decimal) stamps convert the same way.
        ts_f = np.fromiter((float(ev.ts) for ev in xs), np.float64, n)
        dur_f = np.fromiter((np.nan if d is None else float(d) for d in durs), np.float64, n)
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
            ts = _decimal_to_ns([ev.ts for ev in xs])
            dur = _decimal_to_ns(durs)
        else:
            ts = us_to_ns(ts_f)
            dur = us_to_ns(dur_f)
        name = self._intern([ev.name for ev in xs])
        cat = self._intern([ev.cat for ev in xs])
        pid_codes, pid_uniq = pd.factorize(pd.Series([ev.pid for ev in xs], dtype=object))
        tid_codes, tid_uniq = pd.factorize(pd.Series([ev.tid for ev in xs], dtype=object))
        lane_pair = pid_codes.astype(np.int64) * (len(tid_uniq) + 1) + tid_codes
        lane_uniq, lane_inv = np.unique(lane_pair, return_inverse=True)
        lanes = self.lanes
        lane_global = np.array(
            [
                lanes.setdefault(
                    (
                        str(pid_uniq[p // (len(tid_uniq) + 1)]),
                        str(tid_uniq[p % (len(tid_uniq) + 1)]),
                    ),
                    len(lanes),
                )
                for p in lane_uniq.tolist()
            ],
            dtype=np.int32,
        )
        lane = lane_global[lane_inv.reshape(-1)]
        table = self.strings
        pair = name.astype(np.int64) << 32 | cat.astype(np.int64)
        uniq, inverse = np.unique(pair, return_inverse=True)
        strings = None
        kinds = np.empty(len(uniq), dtype=np.int8)
        for i, p in enumerate(uniq.tolist()):
            k = self.kinds.get(p)
            if k is None:
                strings = strings or list(table)
                k = self.kinds[p] = int(classify(strings[p & 0xFFFFFFFF], strings[p >> 32]))
            kinds[i] = k
        kind = kinds[inverse.reshape(-1)]
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
        is_enqueue = kind == EventKind.COMM_ENQUEUE
        comm_kind = (kind == EventKind.KERNEL_COMM) | (kind == EventKind.COMM_CPU)
        for i, enqueue in zip(
            np.flatnonzero(comm_kind | is_enqueue).tolist(),
            is_enqueue[comm_kind | is_enqueue].tolist(),
            strict=True,
        ):
            ev = xs[i]
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
        shapes, dtypes = self._shape_codes(xs)
        for key, arr in (("ts", ts), ("dur", dur), ("name", name), ("cat", cat), ("kind", kind),
                         ("lane", lane), ("corr", corr), ("shapes", shapes),
                         ("dtypes", dtypes)):  # fmt: skip
            self.parts.setdefault(key, []).append(arr)
        self.count += n

    def _shape_codes(self, xs: list[KEvent]) -> tuple[np.ndarray, np.ndarray]:
        """Codes of each event's ``Input Dims`` and ``Input type`` as text (``str`` of the lists,
        the form of torch's ``str(evt.input_shapes)``), -1 where absent (no ``record_shapes``)."""
        n = len(xs)
        shapes = np.full(n, -1, np.int32)
        dtypes = np.full(n, -1, np.int32)
        args = [(i, ev.args) for i, ev in enumerate(xs) if ev.args is not None]
        have = [(i, a) for i, a in args if a.input_dims is not None]
        if have:
            idx = np.asarray([i for i, _ in have], dtype=np.int64)
            shapes[idx] = self._intern([str(a.input_dims) for _, a in have])
            dtypes[idx] = self._intern([str(a.input_type or []) for _, a in have])
        return shapes, dtypes

    def _memory_event(self, ev: KEvent) -> None:
        """Keep one ``[memory]`` event (its values checked now; the rest waits for finish).

        Well-formed events (plain ints in range, a finite ts) pass one inline test, 5x cheaper
        than :func:`rankscope.analysis.memory.bad_memory_field`, which only sees the others to
        name what is wrong (a trace can hold 10^5 memory events: this is the reader's hot path).
        """
        a = ev.args
        t = ev.ts
        if (
            a is not None
            and (type(t) is int or (type(t) is float and t - t == 0))
            and -TS_LIMIT_US < t < TS_LIMIT_US
            and type(a.device_type) is int
            and type(a.device_id) is int
            and type(a.addr) is int
            and type(a.nbytes) is int
            and type(a.total_allocated) is int
            and type(a.total_reserved) is int
            and _DEVICE_TYPE_LO <= a.device_type <= _DEVICE_TYPE_HI
            and _DEVICE_ID_LO <= a.device_id <= _DEVICE_ID_HI
            and 0 <= a.addr <= _ADDR_HI
            and _INT64_LO <= a.nbytes <= _INT64_HI
            and 0 <= a.total_allocated <= _INT64_HI
            and 0 <= a.total_reserved <= _INT64_HI
        ):
            self.memory.append(ev)
            return
        from rankscope.analysis.memory import bad_memory_field, skip_reason

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
            ts = _decimal_to_ns([ev.ts for ev in mem])
        else:
            ts = us_to_ns(np.fromiter((ev.ts for ev in mem), np.float64, n))
        args = [ev.args for ev in mem]
        part = self.memory_parts
        part.setdefault("ts", []).append(ts)
        for col, attr, dtype in _MEMORY_ARGS:
            part.setdefault(col, []).append(np.fromiter((getattr(a, attr) for a in args), dtype, n))
        self.memory_threads.extend((str(ev.pid), str(ev.tid)) for ev in mem)
        self.memory = []

    def _memory_columns(self, cols: dict[str, np.ndarray], base: int) -> dict[str, np.ndarray]:
        """The kept memory events as columns, with op, scope and step from the events' own
        ranges (``analysis.memory.attribute``: the rule of ``memory_rows``); ts raw ns.
        ``cols``: the events' columns, ``ts`` with the time base already added."""
        from rankscope.analysis.memory import attribute

        out = {k: np.concatenate(v) for k, v in self.memory_parts.items()}
        out["ts"] = out["ts"] + np.int64(base)
        strings = list(self.strings)
        wanted = {"cpu_op", "operator", "user_annotation"}
        cat_ok = np.array([c in wanted for c in strings], dtype=bool)
        is_step = np.array([c.startswith("ProfilerStep#") for c in strings], dtype=bool)
        ranges: dict[Any, list[tuple[int, int, str, bool]]] = {}
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
            # only the ranges of threads that allocated, as plain ints (one bulk conversion)
            threads = set(self.memory_threads)
            lanes_wanted = np.array(
                [lane_key[k] in threads for k in range(len(lane_key))], dtype=bool
            )
            keep = np.flatnonzero(cat_ok[c_cat] & ~is_step[c_name] & lanes_wanted[c_lane])
            for lane_i, start, end, code, is_user in zip(
                c_lane[keep].tolist(),
                c_ts[keep].tolist(),
                c_end[keep].tolist(),
                c_name[keep].tolist(),
                (c_cat[keep] == user).tolist(),
                strict=True,
            ):
                ranges.setdefault(lane_key[lane_i], []).append((start, end, strings[code], is_user))
        ops, scopes, step = attribute(out["ts"], self.memory_threads, ranges, steps)
        out["op"] = self._intern(ops)
        out["scope"] = self._intern(scopes)
        out["step"] = step
        return out

    def finish(self, path: Path, top: KFile, *, sort: bool = True) -> FileTrace:
        """Concatenate, add the time base, sort by ts (unless ``sort`` is False), build lanes."""
        import pandas as pd

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
        memory = self._memory_columns(cols, base) if self.memory_threads else None
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
        rows = []
        for (pid, tid), i in self.lanes.items():
            if lane_gpu[i]:
                label = tid if tid.startswith("stream") else f"stream {tid}"
                rows.append((i, int(LaneKind.GPU_STREAM), pid, tid, label))
            else:
                label = " / ".join(self.thread_names.get((pid, tid), [])) or f"thread {tid}"
                rows.append((i, int(LaneKind.THREAD), pid, tid, label))
        lanes = pd.DataFrame(rows, columns=["lane", "kind", "pid", "tid", "name"])
        rows = pd.DataFrame(
            self.comm_rows, columns=["event", "op", "group", "seq", "bytes", "peer", "enqueue"]
        )
        if len(rows):
            if inverse is not None:
                rows["event"] = inverse[rows["event"].to_numpy(np.int64)]
            rows["lane"] = cols["lane"][rows["event"].to_numpy(np.int64)]
        else:
            rows["lane"] = np.zeros(0, np.int32)
        on_cpu = rows.pop("enqueue").to_numpy(bool)
        comm = rows[~on_cpu].reset_index(drop=True)
        enqueue = rows[on_cpu].reset_index(drop=True)
        info = top.distributedInfo or {}
        world = info.get("world_size")
        rank = info.get("rank")
        dropped = {}
        if self.dropped:
            dropped["events with negative, NaN or missing durations"] = self.dropped
        if self.out_of_range:
            dropped["events with timestamps out of range"] = self.out_of_range
        from rankscope.analysis.memory import device_total_memory

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
            lanes=lanes,
            comm=comm,
            dropped=dropped,
            memory=memory,
            memory_skipped=dict(self.memory_skipped),
            device_memory=device_total_memory(top.deviceProperties),
            enqueue=enqueue,
            process_groups=process_groups(info.get("pg_config")),
        )


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
