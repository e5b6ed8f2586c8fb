"""The Kineto trace reader: one torch.profiler JSON trace file to compact columns.

:func:`read_trace` streams first: the JSON text (``kineto_json.text_pieces``) is cut into blocks
of whole events at Kineto's event separator, each block is decoded (``kineto_json``) and reduced
to columns (``event_columns.EventColumns``) at once, so the decoded objects of the whole file
never exist together (the memory high-water mark stays near the size of one block, not of the
file). Files not laid out like Kineto's writer (one line, other indentation) or whose blocks fail
to decode are read whole instead, which also produces the precise error message for bad input.

Strings (event names, categories) are interned as they are decoded, into a table the caller may
share across files: the merge passes one table per rank, so a rank's windows share their codes
and nothing is interned again before the store translates the rank's table to its own.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
from rankscope.orchestrator.ingest.comm_kernels import DEFAULT_VOCABULARY, CommVocabulary
from rankscope.orchestrator.ingest.event_columns import EventColumns, FileTrace, StringTable
from rankscope.orchestrator.ingest.kineto_json import (
    BLOCK_DECODER,
    BLOCK_DECODER_EXACT,
    FILE_DECODER,
    FILE_DECODER_EXACT,
    KEvent,
    KFile,
    decode,
    decode_json,
    needs_exact,
    read_bytes,
    text_pieces,
)


def read_trace(
    path: Path,
    *,
    strings: StringTable | None = None,
    sort: bool = True,
    comm: CommVocabulary = DEFAULT_VOCABULARY,
) -> FileTrace:
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
    ``comm``: the communication kernels in force (``comm_kernels.py``).
    """
    table: StringTable = {} if strings is None else strings
    known = len(table)
    try:
        acc = EventColumns(table, comm)
        try:
            top = _stream_events(path, acc)
        except _NotStreamable:
            _forget_since(table, known)
            acc = EventColumns(table, comm)
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
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


def _stream_events(path: Path, acc: EventColumns, block_bytes: int = BLOCK_BYTES) -> KFile:
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
        top = decode_json(FILE_DECODER, head + b'"traceEvents": []}')
        tail = decode_json(FILE_DECODER, rest)
        if tail.traceEvents and needs_exact(tail.traceEvents):
            tail = decode_json(FILE_DECODER_EXACT, rest)
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
        events = decode_json(BLOCK_DECODER, block)
        if needs_exact(events):
            return decode_json(BLOCK_DECODER_EXACT, block)  # type: ignore[arg-type]
    except msgspec.MsgspecError:
        raise _NotStreamable from None
    return events


def _read_whole(path: Path, acc: EventColumns) -> KFile:
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
