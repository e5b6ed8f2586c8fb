"""Fast reader for Kineto (torch.profiler) JSON traces: one rank's files to compact numpy columns.

Why typed msgspec decoding: Kineto traces are large (tens of MB per rank) and mostly made of
complete events (``ph: X``); decoding straight into :class:`KEvent` structs skips every field we
do not use (msgspec does this in C) and is ~6x faster than ``json`` + dicts. Of the ``args`` we
decode only the few keys we use, also typed, so the rest is skipped without building objects.

Timestamps (the part that must be exact):
``ts``/``dur`` are µs with up to 3 decimals (ns resolution). Absolute ns =
``baseTimeNanoseconds`` + ts·1000 (``baseTimeNanoseconds`` absent in older traces, whose ``ts`` is
absolute epoch µs). We never add the base in float: ts is split into its integer µs and the
fractional part, ``ns = int(floor(ts))*1000 + rint(frac*1000)``, in int64. This is exact when the
decoded double is within 0.5 ns of the decimal text, i.e. when ``|ts| < 2**43`` µs (ulp ≤ 1/1024
µs): relative stamps up to ~100 days, and absolute integer epoch µs (exact below 2**53).
A file with fractional stamps at or above 2**43 µs is decoded again with ``decimal.Decimal``
timestamps (exact, slower) — see :func:`_needs_exact`.
"""

from __future__ import annotations

import enum
import gzip
import re
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec
import numpy as np
from rankscope.analysis.perfetto import GENERATOR as PERFETTO_GENERATOR
from rankscope.analysis.schema import EventKind, LaneKind

if TYPE_CHECKING:
    import pandas as pd

#: Trace files found in a folder (torch.profiler / tensorboard_trace_handler / rankscope names).
TRACE_SUFFIXES = (".json", ".json.gz")
#: Names of JSON files beside traces that are not traces (skipped without a problem).
NOT_TRACE_PATTERNS = (re.compile(r"(^|\.)meta\.json$"), re.compile(r"^run\.json$"))
#: Names that are traces whatever their content, so a broken one is reported, never skipped:
#: torch.profiler's ``tensorboard_trace_handler`` (``*.pt.trace.json[.gz]``) and rankscope's
#: windows (names carrying a rank count too, see :func:`is_trace_file_name`).
TRACE_NAME_PATTERNS = (
    re.compile(r"\.pt\.trace\.json(\.gz)?$"),
    re.compile(r"^window-\d+\.json\.gz$"),
)
#: JSON text read from the start of a file to tell a Kineto trace from other JSON. Kineto writes
#: ``traceEvents`` after a small header (schemaVersion, deviceProperties, distributedInfo).
SNIFF_BYTES = 1 << 18
_TRACE_KEY = re.compile(rb'"traceEvents"\s*:')
#: rankscope's own Perfetto export: ``{"otherData": {"generator": "rankscope export …"`` first.
_EXPORT_HEAD = re.compile(
    rb'^\s*\{\s*"otherData"\s*:\s*\{\s*"generator"\s*:\s*"' + re.escape(PERFETTO_GENERATOR.encode())
)
#: Rank in a file or folder name: rank-3, rank3, rank_3, worker3, ranks/00003/.
RANK_NAME_PATTERNS = (
    re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:^|[^a-z])worker[-_]?(\d+)", re.IGNORECASE),
)
RANK_DIR_PATTERN = re.compile(r"^\d{5}$")
#: NCCL kernels: ncclKernel_* (older) and ncclDevKernel_* (newer).
NCCL_KERNEL = re.compile(r"^nccl.*Kernel", re.IGNORECASE)
#: |ts| (µs) above which a fractional float timestamp may be off by 1 ns (see module docstring).
EXACT_FLOAT_LIMIT_US = float(2**43)
#: Kineto categories of events that run on a GPU stream.
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})
#: Collective op names from NCCL kernel names / gloo ops / c10d names, normalised.
_OP_ALIASES = {
    "all_reduce": "allreduce",
    "allreduce": "allreduce",
    "all_gather": "allgather",
    "allgather": "allgather",
    "all_gather_into_tensor": "allgather",
    "_allgather_base": "allgather",
    "reduce_scatter": "reducescatter",
    "reducescatter": "reducescatter",
    "_reduce_scatter_base": "reducescatter",
    "reduce_scatter_tensor": "reducescatter",
    "all_to_all": "alltoall",
    "alltoall": "alltoall",
    "alltoall_base": "alltoall",
    "all_to_allv": "alltoall",
    "sendrecv": "sendrecv",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
}
#: bytes per element of record_param_comms ``dtype``.
_DTYPE_BYTES = {
    "Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8,
    "Byte": 1, "Char": 1, "Short": 2, "Bool": 1,
}  # fmt: skip


class TraceReadError(Exception):
    """A trace file cannot be read at all (the message is one line, without the file name)."""


class KArgs(msgspec.Struct, gc=False):
    """The few ``args`` keys we use (everything else is skipped by the decoder)."""

    correlation: Any = None
    name: Any = None  # metadata events: process / thread name
    collective: Any = msgspec.field(default=None, name="Collective name")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    seq: Any = msgspec.field(default=None, name="Seq")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None


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


class KFileExact(KFile):
    traceEvents: list[KEventExact]  # type: ignore[assignment]


_DECODER = msgspec.json.Decoder(KFile)
_DECODER_EXACT = msgspec.json.Decoder(KFileExact)


@dataclass
class FileTrace:
    """One parsed trace file, as compact columns (events sorted by ts; raw clock of the rank)."""

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
    """ts (ns, raw clock), dur (ns), name/cat (int32 codes into ``strings``), kind, lane, corr"""
    strings: list[str]
    lanes: pd.DataFrame
    comm: pd.DataFrame
    """communication events: event (row), op, group, seq (-1 unknown), bytes (-1 unknown)"""
    dropped: dict[str, int] = field(default_factory=dict)
    """events left out and why (negative / missing duration ...)"""


def read_bytes(path: Path) -> bytes:
    """The JSON text of ``path`` (gunzipped for .gz); TraceReadError when unreadable."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceReadError(f"cannot read ({exc.strerror or exc})") from None
    if path.name.endswith(".gz") or raw[:2] == b"\x1f\x8b":
        try:
            # One-shot zlib (CRC checked inside inflate); multi-member files fall back to gzip.
            raw = zlib.decompress(raw, wbits=16 + zlib.MAX_WBITS)
        except zlib.error:
            try:
                raw = gzip.decompress(raw)
            except (EOFError, OSError, zlib.error) as exc:
                raise TraceReadError(f"truncated or corrupt gzip ({exc})") from None
    if not raw[:4096].strip() and not raw.strip():
        raise TraceReadError("empty file")
    return raw


def decode(data: bytes) -> KFile:
    """Decode JSON text into a :class:`KFile` (exact decimals where floats would round)."""
    try:
        trace = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        if "traceEvents" in str(exc) and "missing required field" in str(exc):
            raise TraceReadError("not a Kineto trace (no traceEvents)") from None
        if str(exc).startswith("Expected `object`") and " - at " not in str(exc):
            raise TraceReadError("not a Kineto trace (JSON is not an object)") from None
        raise TraceReadError(f"unexpected trace content: {exc}") from None
    except msgspec.DecodeError as exc:
        if b"NaN" in data:
            # Python's json writes NaN for float('nan'); JSON has no NaN. Retry on a copy with
            # null (the input file is never touched), the events concerned get dropped.
            try:
                trace = _DECODER.decode(re.sub(rb"(?<=[:\[,])\s*-?NaN\b", b"null", data))
            except msgspec.MsgspecError:
                raise TraceReadError(f"invalid JSON ({exc})") from None
        else:
            raise TraceReadError(f"invalid JSON ({exc})") from None
    return trace


def decode_exact(data: bytes) -> KFile:
    """Decode with exact :class:`~decimal.Decimal` timestamps (see :func:`needs_exact`)."""
    return _DECODER_EXACT.decode(re.sub(rb"(?<=[:\[,])\s*-?NaN\b", b"null", data))


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


def classify(cat: str, name: str) -> EventKind:
    """The :class:`EventKind` of an event from its Kineto category and name."""
    if cat == "kernel":
        return EventKind.KERNEL_COMM if NCCL_KERNEL.match(name) else EventKind.KERNEL_COMPUTE
    if cat == "gpu_memcpy":
        return EventKind.MEMCPY
    if cat == "gpu_memset":
        return EventKind.MEMSET
    if cat == "cuda_sync":
        return EventKind.SYNC
    if cat in ("cuda_runtime", "cuda_driver"):
        return EventKind.RUNTIME
    if name.startswith("ProfilerStep#"):
        return EventKind.PROFILER_STEP
    if name.startswith("gloo:"):
        return EventKind.COMM_CPU
    if name.startswith("c10d::") or name == "record_param_comms" or name.startswith("nccl:"):
        return EventKind.COMM_ENQUEUE
    if cat in ("user_annotation", "gpu_user_annotation"):
        return EventKind.USER_ANNOTATION
    if cat == "python_function":
        return EventKind.PYTHON
    if cat in ("cpu_op", "operator", "cpu_instant_event"):
        return EventKind.CPU_OP
    return EventKind.OTHER


def collective_op(name: str, collective_arg: Any = None) -> str:
    """Normalised op name (allreduce, allgather, alltoall, sendrecv, ...) of a comm event."""
    if isinstance(collective_arg, str) and collective_arg:
        key = collective_arg.lower()
        return _OP_ALIASES.get(key, key)
    if name.startswith("gloo:"):
        key = name[5:].lower()
        return _OP_ALIASES.get(key, key)
    m = re.match(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)", name)
    if m:
        key = m.group(1).lower()
        return _OP_ALIASES.get(key, key)
    return name.lower()


def rank_from_path(path: Path) -> int | None:
    """Rank from a file name (rank-3, rank3, worker3) or a run-dir folder (ranks/00003/)."""
    for pattern in RANK_NAME_PATTERNS:
        m = pattern.search(path.name)
        if m:
            return int(m.group(1))
    if RANK_DIR_PATTERN.match(path.parent.name) and path.parent.parent.name == "ranks":
        return int(path.parent.name)
    return None


def is_trace_name(path: Path) -> bool:
    """True for names that may hold a trace (.json / .json.gz, not meta.json / run.json)."""
    name = path.name
    if not name.endswith(TRACE_SUFFIXES):
        return False
    return not any(p.search(name) for p in NOT_TRACE_PATTERNS)


def is_trace_file_name(path: Path) -> bool:
    """True for names that say "trace" on their own: a rank in the name, a profiler trace name.

    Such a file found in a folder is always taken, so a broken one is reported as a problem.
    """
    if not is_trace_name(path):
        return False
    return rank_from_path(path) is not None or any(p.search(path.name) for p in TRACE_NAME_PATTERNS)


class TraceHead(enum.Enum):
    """What the first bytes of a JSON file say it is (:func:`sniff`)."""

    TRACE = "a Kineto trace (traceEvents)"
    EXPORT = "a Perfetto export written by rankscope"
    OTHER = "JSON that is not a trace"
    UNREADABLE = "unreadable"


def sniff(path: Path, limit: int = SNIFF_BYTES) -> TraceHead:
    """Tell what ``path`` holds from its first ``limit`` bytes of JSON text (gunzipped).

    Why: a folder is searched recursively, and beside the traces lie other JSON files —
    rankscope's own outputs (summary.json, a Perfetto export) and the user's. Reading the head
    of each is cheap and tells them apart without parsing the whole file.
    """
    head = bytearray()
    pieces = cast("Generator[bytes, None, None]", _text_pieces(path))  # a generator
    try:
        for piece in pieces:
            head += piece
            if len(head) >= limit:
                break
    except TraceReadError:
        if not head:
            return TraceHead.UNREADABLE
    finally:
        pieces.close()  # closes the file now, not when the generator is collected
    text = bytes(head[:limit])
    events = _TRACE_KEY.search(text)
    if _EXPORT_HEAD.match(text[: events.start()] if events else text):
        return TraceHead.EXPORT
    if events:
        return TraceHead.TRACE
    return TraceHead.OTHER


def is_folder_trace(path: Path) -> bool:
    """Whether a file found in a recursive folder search is merged (else skipped silently).

    Taken: files whose head shows ``traceEvents``, and files named like traces
    (:func:`is_trace_file_name`) whatever they hold — a truncated ``rank-3.json.gz`` must be
    reported, not lost. Skipped: hidden files (temporaries, lock files), meta.json / run.json,
    rankscope's own Perfetto exports (by their marker), and any other JSON (summary.json …).
    """
    if path.name.startswith(".") or not is_trace_name(path):
        return False
    head = sniff(path)
    if head is TraceHead.EXPORT:
        return False
    return head in (TraceHead.TRACE, TraceHead.UNREADABLE) or is_trace_file_name(path)


def read_trace(path: Path) -> FileTrace:
    """Parse one trace file into compact columns (raises TraceReadError when unusable).

    Streaming first (:func:`_stream_events`): the JSON text is decompressed piece by piece and
    cut into blocks of whole events at Kineto's event separator, each block is decoded and
    reduced to compact columns at once, so the decoded objects of the whole file never exist
    together (the memory high-water mark stays near the size of one block, not of the file).
    Files that are not laid out like Kineto's writer (one line, other indentation) or whose
    blocks fail to decode are read whole instead (:func:`_read_whole`), which also produces the
    precise error message for bad input.
    """
    acc = _Accumulator()
    try:
        top = _stream_events(path, acc)
    except _NotStreamable:
        acc = _Accumulator()
        top = _read_whole(path, acc)
    return acc.finish(path, top)


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


def _text_pieces(path: Path) -> Iterator[bytes]:
    """The file's JSON text in pieces (gunzipped on the fly); TraceReadError when unreadable."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise TraceReadError(f"cannot read ({exc.strerror or exc})") from None
    with fh:
        first = fh.read(READ_BYTES)
        if not (path.name.endswith(".gz") or first[:2] == b"\x1f\x8b"):
            while first:
                yield first
                first = fh.read(READ_BYTES)
            return
        dec = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
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
                        dec = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                    if out:
                        yield out
            except zlib.error as exc:
                raise TraceReadError(f"truncated or corrupt gzip ({exc})") from None
            piece = fh.read(READ_BYTES)
        if not dec.eof:
            raise TraceReadError("truncated or corrupt gzip (file ends inside the stream)")


def _stream_events(path: Path, acc: _Accumulator, block_bytes: int = BLOCK_BYTES) -> KFile:
    """Stream the events of ``path`` into ``acc``; returns the top-level fields (no events).

    The text after ``"traceEvents": [`` accumulates in a bytearray that starts with ``[``; once
    it holds ``block_bytes``, the ``,`` after the last complete event becomes ``]`` and that
    prefix is decoded in place (no copy of the block), the rest starts the next block.
    """
    buf = bytearray()
    head: bytes | None = None
    total = 0
    for piece in _text_pieces(path):
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
        top = _DECODER.decode(head + b'"traceEvents": []}')
        tail = _DECODER.decode(rest)
    except msgspec.MsgspecError:
        raise _NotStreamable from None
    if tail.traceEvents:
        if needs_exact(tail.traceEvents):
            tail = _DECODER_EXACT.decode(rest)
        acc.add(tail.traceEvents)
    for key in ("baseTimeNanoseconds", "distributedInfo", "trace_id", "host_name"):
        if getattr(top, key) is None:
            setattr(top, key, getattr(tail, key))
    return top


def _decode_block(block: memoryview) -> list[KEvent]:
    """Decode a JSON array of whole events (exactly, when its stamps need it)."""
    try:
        events = _BLOCK_DECODER.decode(block)
        if needs_exact(events):
            return _BLOCK_DECODER_EXACT.decode(block)  # type: ignore[return-value]
    except msgspec.MsgspecError:
        raise _NotStreamable from None
    return events


def _read_whole(path: Path, acc: _Accumulator) -> KFile:
    """Read and decode the whole file at once (any layout; precise errors)."""
    data = read_bytes(path)
    acc.nbytes = len(data)
    trace = decode(data)
    if needs_exact(trace.traceEvents):
        trace = decode_exact(data)
    del data
    events = trace.traceEvents
    trace.traceEvents = []
    acc.add(events)
    return trace


class _Accumulator:
    """Reduces decoded events, block by block, to compact columns (see :func:`read_trace`)."""

    def __init__(self) -> None:
        self.nbytes = 0
        self.strings: dict[str, int] = {}
        self.lanes: dict[tuple[str, str], int] = {}
        self.kinds: dict[int, int] = {}
        self.thread_names: dict[tuple[str, str], list[str]] = {}
        self.parts: dict[str, list[np.ndarray]] = {}
        self.comm_rows: list[tuple[int, str, str, int, int]] = []
        self.count = 0
        self.dropped = 0

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
            if ev.ph == "M" and ev.name == "thread_name" and ev.args is not None:
                names = self.thread_names.setdefault((str(ev.pid), str(ev.tid)), [])
                label = str(ev.args.name or "").strip()
                if label and label not in names:
                    names.append(label)
        xs = [ev for ev in events if ev.ph == "X"]
        durs = [ev.dur for ev in xs]
        bad = [d is None or d != d or d < 0 for d in durs]
        if any(bad):
            self.dropped += sum(bad)
            xs = [ev for ev, b in zip(xs, bad, strict=True) if not b]
            durs = [d for d, b in zip(durs, bad, strict=True) if not b]
        n = len(xs)
        if not n:
            return
        if isinstance(xs[0].ts, Decimal):
            ts = _decimal_to_ns([ev.ts for ev in xs])
            dur = _decimal_to_ns(durs)
        else:
            ts = us_to_ns(np.fromiter((ev.ts for ev in xs), np.float64, n))
            dur = us_to_ns(np.fromiter(durs, np.float64, n))
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
                if ev.args is not None and isinstance(ev.args.correlation, int)
                else -1
                for ev in xs
            ),
            np.int64,
            n,
        )
        for i in np.flatnonzero(
            (kind == EventKind.KERNEL_COMM) | (kind == EventKind.COMM_CPU)
        ).tolist():
            ev = xs[i]
            a = ev.args
            op = collective_op(ev.name, a.collective if a is not None else None)
            group = str(a.pg_name) if a is not None and a.pg_name is not None else ""
            seq = -1
            if a is not None and isinstance(a.seq, int | str) and str(a.seq).isdigit():
                seq = int(a.seq)
            size = -1
            if a is not None and isinstance(a.in_nelems, int):
                size = a.in_nelems * _DTYPE_BYTES.get(str(a.dtype), 1 if a.dtype is None else 4)
            self.comm_rows.append((self.count + i, op, group, seq, size))
        for key, arr in (("ts", ts), ("dur", dur), ("name", name), ("cat", cat), ("kind", kind),
                         ("lane", lane), ("corr", corr)):  # fmt: skip
            self.parts.setdefault(key, []).append(arr)
        self.count += n

    def finish(self, path: Path, top: KFile) -> FileTrace:
        """Concatenate, add the time base, sort by ts, and build the lane table."""
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
                )
            }
        base = top.baseTimeNanoseconds or 0
        cols["ts"] = cols["ts"] + np.int64(base)
        order = np.argsort(cols["ts"], kind="stable")
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        cols = {k: v[order] for k, v in cols.items()}
        strings = list(self.strings)
        gpu_kinds = [
            EventKind.KERNEL_COMPUTE,
            EventKind.KERNEL_COMM,
            EventKind.MEMCPY,
            EventKind.MEMSET,
        ]
        is_gpu = np.isin(cols["kind"], gpu_kinds)
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
        comm = pd.DataFrame(self.comm_rows, columns=["event", "op", "group", "seq", "bytes"])
        if len(comm):
            comm["event"] = inverse[comm["event"].to_numpy(np.int64)]
            comm["lane"] = cols["lane"][comm["event"].to_numpy(np.int64)]
        else:
            comm["lane"] = np.zeros(0, np.int32)
        info = top.distributedInfo or {}
        world = info.get("world_size")
        rank = info.get("rank")
        dropped = {}
        if self.dropped:
            dropped["events with negative, NaN or missing durations"] = self.dropped
        return FileTrace(
            path=path,
            rank=int(rank) if isinstance(rank, int) else None,
            world_size=int(world) if isinstance(world, int) else None,
            backend=str(info["backend"]) if "backend" in info else None,
            trace_id=top.trace_id,
            host=top.host_name,
            nbytes=self.nbytes,
            columns=cols,
            strings=strings,
            lanes=lanes,
            comm=comm,
            dropped=dropped,
        )
