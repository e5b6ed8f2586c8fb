"""The Kineto trace reader: one torch.profiler JSON trace file to compact columns.

:func:`read_trace` streams first: the JSON text (``kineto_json.text_pieces``) is cut into blocks
of whole events at Kineto's event separator, each block is decoded (``kineto_json``) and reduced
to columns (``event_columns.EventColumns``) at once, in sub-blocks of ``SUB_BLOCK_BYTES`` (the
reduction reads events decoded moments before), so the decoded objects of the whole file
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
from typing import Any

import msgspec
from rankscope.orchestrator.ingest.comm_kernels import DEFAULT_VOCABULARY, CommVocabulary
from rankscope.orchestrator.ingest.event_columns import EventColumns, StringTable
from rankscope.orchestrator.ingest.file_trace import FileTrace
from rankscope.orchestrator.ingest.kineto_json import (
    BLOCK_DECODER,
    BLOCK_DECODER_EXACT,
    EXACT_FLOAT_LIMIT_US,
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
from rankscope.orchestrator.ingest.kineto_scan import ScanBatch, ScanRules, scan
from rankscope.orchestrator.ingest.memory_columns import MEMORY_LIMITS
from rankscope.orchestrator.ingest.multirank import PID_BLOCK
from rankscope.orchestrator.ingest.stamps import TS_LIMIT_US


def read_trace(
    path: Path,
    *,
    strings: StringTable | None = None,
    sort: bool = True,
    comm: CommVocabulary = DEFAULT_VOCABULARY,
    beside: bool = True,
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
    ``comm``: the communication kernels in force (``comm_kernels.py``). ``beside``: the
    compiled scanner may read ahead on a thread of its own (:class:`_Block`), which pays where
    a core would otherwise be idle: not where as many parses as cores run at once (the
    merge's worker processes say False; ``rank_columns.parse_source``).
    """
    table: StringTable = {} if strings is None else strings
    known = len(table)
    try:
        acc = EventColumns(table, comm)
        try:
            top = _stream_events(path, acc, beside=beside)
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
#: The reduction's limits, for the compiled scanner (``kineto_scan``).
SCAN_RULES = ScanRules(PID_BLOCK, float(TS_LIMIT_US), EXACT_FLOAT_LIMIT_US, MEMORY_LIMITS)
#: The end of the events array in Kineto's layout: the last event's ``}``, then the array's
#: ``]`` (where it is found, the text up to it is read as a block like the others; a text
#: up to it that is not an array of events reads the file whole, as any block that fails).
EVENTS_END = b"\n  }\n  ]"
#: Bytes of JSON text per block of the streaming reader (the unit of the string codes' order:
#: ``event_columns.EventColumns.end_block``).
BLOCK_BYTES = 4 << 20
#: Bytes of JSON text decoded and reduced at once inside a block: the reduction reads each
#: decoded event again a few tens of times, sooner after its decode the smaller the sub-block
#: (read_trace of the 54 MB ``df_index_resolver``, CPU, median of 18 alternating: 0.460 s at
#: 1 MiB, 0.482 s at 256 KiB, 0.493 s with 4 MiB blocks undivided; docs/performance.md).
SUB_BLOCK_BYTES = 1 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


def _stream_events(
    path: Path,
    acc: EventColumns,
    block_bytes: int = BLOCK_BYTES,
    *,
    sub_bytes: int = SUB_BLOCK_BYTES,
    beside: bool = True,
) -> KFile:
    """Stream the events of ``path`` into ``acc``; returns the top-level fields (no events).

    The text after ``"traceEvents": [`` accumulates in a bytearray that starts with ``[``; once
    it holds ``block_bytes``, the ``,`` after the last complete event becomes ``]`` and that
    prefix is a block (:class:`_Block`: cut into sub-blocks of ``sub_bytes``, scanned in place,
    no copy), the rest starts the next block. A block is reduced once the next one is cut and
    its scan begun (the last at the end).
    """
    buf = bytearray()
    head: bytes | None = None
    total = 0
    pending: _Block | None = None  # cut, scanned beside this thread, reduced after the next cut
    try:
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
                previous, pending = pending, _Block(buf, cut + 5, sub_bytes, beside=beside)
                if previous is not None:
                    previous.reduce(acc)
                buf = bytearray(b"[") + buf[cut + 5 :]
        if head is None:
            raise _NotStreamable
        acc.nbytes = total
        try:
            top = decode_json(FILE_DECODER, head + b'"traceEvents": []}')
        except msgspec.MsgspecError:
            raise _NotStreamable from None
        end = buf.rfind(EVENTS_END)
        last = None
        if end > 0:  # the last block of events, like the others, then the keys after it
            end += len(EVENTS_END)
            last = _Block(buf, end, sub_bytes, beside=beside)
            rest = b'{"traceEvents": []' + bytes(buf[end:])
        else:
            rest = b'{"traceEvents": ' + bytes(buf)
        previous, pending = pending, last
        if previous is not None:
            previous.reduce(acc)
        if last is not None:
            last.reduce(acc)
        pending = None
    finally:
        if pending is not None:
            pending.close()
    try:
        tail = decode_json(FILE_DECODER, rest)
        if end > 0 and tail.traceEvents:
            raise _NotStreamable  # a second "traceEvents" key: the whole file's decode decides
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


class _Block:
    """A block ``buf[:end]`` (a JSON array of whole events) cut into sub-blocks, reduced into
    the columns by :meth:`reduce`; with ``beside``, all sub-blocks but the first are scanned by
    a thread of the compiled scanner from the cut on (``kineto_scan.ScanBatch``).

    Why begun at the cut and reduced later: the stream reduces a block after it has cut the next
    one, so the scanner's thread reads block k + 1 on one core while this thread scans the first
    sub-block of block k, reduces block k and gunzips the text of block k + 2 (the two cores
    about equally busy: the 54 MB ``df_index_resolver`` reads in ~0.075 s instead of ~0.097 s;
    with the first sub-block on the thread too, this thread waited ~20 ms for it). Each
    sub-block ends at the first event separator ``sub_bytes`` or more after its start: its ``,``
    becomes ``]`` and the newline after it ``[`` (in place, no copy; put back before the
    block's text is read whole).
    """

    def __init__(self, buf: bytearray, end: int, sub_bytes: int, *, beside: bool) -> None:
        self.buf = buf
        self.end = end
        self.view = memoryview(buf)
        self.patched: list[int] = []
        self.spans: list[tuple[int, int]] = []
        start = 0
        while start < end:
            cut = buf.find(EVENT_SEPARATOR, start + sub_bytes, end) if sub_bytes else -1
            stop = end if cut < 0 else cut + 5
            if cut >= 0:
                buf[cut + 4] = ord("]")
                buf[cut + 5] = ord("[")
                self.patched.append(cut)
            self.spans.append((start, stop))
            start = stop
        # all but the first: this thread scans it while the other core scans the rest
        self.batch: ScanBatch | None = None
        if beside and len(self.spans) > 1:
            try:
                self.batch = ScanBatch.start(self.view, self.spans[1:], SCAN_RULES)
            except OSError:  # no lock for its thread: every sub-block is scanned here
                self.batch = None

    def reduce(self, acc: EventColumns) -> None:
        """Reduce the block into ``acc``, sub-block by sub-block, as one decode of the block
        would: when one of its sub-blocks needs exact stamps, all of its events get them (what
        the earlier sub-blocks added is forgotten and they are read again, exactly); when a
        sub-block fails to decode, the block is decoded whole (:func:`_decode_block`: the same
        events, or the same error). So the result never depends on ``sub_bytes``."""
        mark = acc.mark()
        try:
            if not self._sub_blocks(acc, exact=False):
                acc.rollback(mark)
                self._stop_scans()
                self._sub_blocks(acc, exact=True)
        except msgspec.MsgspecError:
            self._unpatch()  # the block's own text, read whole
            acc.rollback(mark)
            acc.extract(_decode_block(self.view[: self.end]))
        finally:
            self.close()
        acc.end_block()

    def _sub_blocks(self, acc: EventColumns, *, exact: bool) -> bool:
        """Decode and extract the sub-blocks (exact stamps when ``exact``); False when a
        sub-block after the first needs exact stamps and ``exact`` is False (the caller reads
        the block again, exactly)."""
        for i, (start, stop) in enumerate(self.spans):
            text = self.view[start:stop]
            if not exact:  # the compiled scanner first (kineto_scan: exact, or it refuses)
                scanned = self.batch.take(i - 1) if i and self.batch else scan(text, SCAN_RULES)
                if scanned is not None:
                    acc.extract_scanned(scanned, text)
                    continue
            decoder: msgspec.json.Decoder[Any] = BLOCK_DECODER_EXACT if exact else BLOCK_DECODER
            events: list[KEvent] = decode_json(decoder, text)
            if not exact and needs_exact(events):
                if start:
                    return False
                exact = True  # the first sub-block: nothing to read again
                events = decode_json(BLOCK_DECODER_EXACT, text)  # type: ignore[arg-type]
            acc.extract(events)
        return True

    def _stop_scans(self) -> None:
        if self.batch is not None:
            batch, self.batch = self.batch, None
            batch.finish()

    def _unpatch(self) -> None:
        self._stop_scans()  # the scanner no longer reads the text
        for cut in self.patched:
            self.buf[cut + 4 : cut + 6] = EVENT_SEPARATOR[4:6]
        self.patched = []

    def close(self) -> None:
        """The scans stopped, the text as it was, the view released (the block not reduced)."""
        self._unpatch()
        self.view.release()


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
