"""Kineto's JSON text, decoded into typed structs: the one way trace bytes are read.

Why typed msgspec decoding: Kineto traces are large (tens of MB per rank) and mostly made of
complete events (``ph: X``); decoding straight into :class:`KEvent` structs skips every field we
do not use (msgspec does this in C) and is ~6x faster than ``json`` + dicts. Of the ``args`` we
decode only the few keys we use, also typed, so the rest is skipped without building objects.

One way to each thing: the JSON text comes from :func:`text_pieces` only (plain or gzip,
multi-member gzip, bounded pieces; the whole-file read joins them), and every decode goes
through :func:`decode_json` (the one place that retries text holding Python's ``NaN``). The
streaming reader (``decode.py``) cuts the text into blocks; ``event_columns.py`` reduces the
decoded events to columns.

Timestamps: ``ts``/``dur`` are µs with up to 3 decimals (ns resolution). A double is within
0.5 ns of the decimal text when ``|ts| < 2**43`` µs; a file with fractional stamps at or above
that is decoded again with ``decimal.Decimal`` stamps (:func:`needs_exact`; the conversion to
ns is ``event_columns.us_to_ns``).
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import msgspec

#: |ts| (µs) above which a fractional float timestamp may be off by 1 ns (see module docstring).
EXACT_FLOAT_LIMIT_US = float(2**43)
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
#: What a decoder returns.
Decoded = TypeVar("Decoded")
#: Compressed bytes read per step.
READ_BYTES = 1 << 18
#: Most JSON text produced per decompression call.
TEXT_PIECE_BYTES = 1 << 20


class TraceReadError(Exception):
    """A trace file cannot be read at all (the message is one line, without the file name)."""


class KArgs(msgspec.Struct, gc=False):
    """The few ``args`` keys we use (everything else is skipped by the decoder)."""

    correlation: Any = None
    name: Any = None  # metadata events: process / thread name
    rank: Any = None  # a merged file's rank (TraceLens): a sign it holds several (multirank.py)
    collective: Any = msgspec.field(default=None, name="Collective name")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    seq: Any = msgspec.field(default=None, name="Seq")
    # send / recv: the peer's global rank (vocabulary.p2p_peer)
    dst_rank: Any = msgspec.field(default=None, name="Dst Rank")
    src_rank: Any = msgspec.field(default=None, name="Src Rank")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    # [memory] instant events (profile_memory): kept as memory rows
    # (rankscope.analysis.store.memory_table)
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


FILE_DECODER = msgspec.json.Decoder(KFile)
FILE_DECODER_EXACT = msgspec.json.Decoder(KFileExact)


BLOCK_DECODER = msgspec.json.Decoder(list[KEvent])
BLOCK_DECODER_EXACT = msgspec.json.Decoder(list[KEventExact])


def inflater() -> ModuleType:
    """The inflater of gzip traces: ISA-L's (``isal.isal_zlib``, zlib's interface at ~2.2x its
    speed on Kineto's JSON: 0.072 s vs 0.158 s of CPU for the 54 MB ``df_index_resolver``,
    measured), or the standard library's ``zlib`` where isal is not installed (same output)."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib
    return isal_zlib


def text_pieces(
    path: Path, inflate: ModuleType | None = None, *, piece_bytes: int = TEXT_PIECE_BYTES
) -> Iterator[bytes]:
    """The file's JSON text in pieces (gunzipped on the fly); TraceReadError when unreadable.

    The only reader of trace bytes: the streaming decoder, :func:`read_bytes` and
    ``discovery.sniff`` all take their text from here, so gzip is handled in one place.
    ``inflate``: a module with zlib's ``decompressobj`` and ``error`` (None: :func:`inflater`).
    ``piece_bytes``: most text gunzipped per piece (the sniff of a file's head asks for little).
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
        lib = inflater() if inflate is None else inflate
        dec = lib.decompressobj(wbits=GZIP_WBITS)
        limit = max(GZIP_FREE_BYTES, GZIP_MAX_RATIO * os.fstat(fh.fileno()).st_size)
        produced = 0
        piece = first
        while piece:
            try:
                # Bounded output per call: a 1 MiB compressed piece can hold ~20 MiB of JSON.
                data = piece
                while data:
                    out = dec.decompress(data, piece_bytes)
                    data = dec.unconsumed_tail
                    if dec.eof and dec.unused_data:  # multi-member gzip
                        data = dec.unused_data
                        dec = lib.decompressobj(wbits=GZIP_WBITS)
                    if out:
                        produced += len(out)
                        if produced > limit:
                            raise TraceReadError(
                                f"refused: the gzip expands to over {limit} bytes, more than "
                                f"{GZIP_MAX_RATIO}x its size (a gzip bomb?)"
                            )
                        yield out
            except (zlib.error, lib.error) as exc:
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


def decode_json(decoder: msgspec.json.Decoder[Decoded], data: Any) -> Decoded:
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
        return decode_json(FILE_DECODER_EXACT, data)
    try:
        trace = decode_json(FILE_DECODER, data)
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
