"""What a JSON file's head says it is (``discovery.sniff``), read a little at a time.

The sniff reads small pieces and stops as soon as its head decides; its answer must be the one
the whole head (the first ``SNIFF_BYTES`` of text) gives by the rule below, whatever the
layout: the key before, across or after a piece's end or the head's limit, plain or gzip, one
gzip member or several. Real files on disk, read by the real reader.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
from pathlib import Path

import pytest
from rankscope.orchestrator.ingest import discovery
from rankscope.orchestrator.ingest.discovery import SNIFF_BYTES, SNIFF_PIECE_BYTES, TraceHead

EXPORT_HEAD = re.compile(
    rb'^\s*\{\s*"otherData"\s*:\s*\{\s*"generator"\s*:\s*"rankscope export --perfetto'
)
ARRAY_HEAD = re.compile(rb'^\s*\[\s*\{[^{}]*"ph"\s*:')
TRACE_KEY = re.compile(rb'"traceEvents"\s*:')


def whole_head_rule(text: bytes) -> TraceHead:
    """The rule on the first SNIFF_BYTES of text, read at once (the reference)."""
    head = text[:SNIFF_BYTES]
    events = TRACE_KEY.search(head)
    if EXPORT_HEAD.match(head[: events.start()] if events else head):
        return TraceHead.EXPORT
    if events or ARRAY_HEAD.match(head):
        return TraceHead.TRACE
    return TraceHead.OTHER


def kineto_text(key_at: int) -> bytes:
    """A Kineto-like trace whose ``"traceEvents"`` key starts at byte ``key_at``."""
    start = b'{"schemaVersion": 1, "distributedInfo": {"pg_config": "'
    tail = b'"},\n  "traceEvents": [\n  {"ph": "X", "name": "a", "ts": 1, "dur": 2}\n]}'
    pad = key_at - len(start) - 5  # `"},\n  ` precedes the key
    assert pad >= 0
    return start + b"x" * pad + tail


def heads() -> dict[str, bytes]:
    """Heads of every kind, with the deciding text at awkward places."""
    out: dict[str, bytes] = {}
    for at in (
        100,
        SNIFF_PIECE_BYTES - 8,  # the key across the first piece's end
        SNIFF_PIECE_BYTES - 13,
        SNIFF_PIECE_BYTES,
        5 * SNIFF_PIECE_BYTES + 3,
        SNIFF_BYTES - 20,  # the key across the head's limit: not in the head
        SNIFF_BYTES - 10,
        SNIFF_BYTES + 100,
    ):
        out[f"kineto key at {at}"] = kineto_text(at)
    export = json.dumps(
        {"otherData": {"generator": "rankscope export --perfetto 0.1"}, "traceEvents": []}
    ).encode()
    out["export"] = export
    out["export, key far"] = (
        b'{"otherData": {"generator": "rankscope export --perfetto", "pad": "'
        + b"y" * (3 * SNIFF_PIECE_BYTES)
        + b'"}, "traceEvents": []}'
    )
    out["key, then an export marker"] = b'{"traceEvents": [], "otherData": {"generator": ' + (
        b'"rankscope export --perfetto"}}'
    )
    out["array"] = b'  [ {"ph": "X", "name": "a", "ts": 1, "dur": 2} ]'
    out["array, first event long"] = (
        b'[{"name": "' + b"z" * (2 * SNIFF_PIECE_BYTES) + b'", "ph": "X", "ts": 1}]'
    )
    out["other json"] = json.dumps({"a": "b" * 40000}).encode()
    out["other json, long"] = json.dumps({"a": "b" * (SNIFF_BYTES * 2)}).encode()
    out["empty"] = b""
    out["blank"] = b"   \n"
    return out


def write(path: Path, text: bytes, how: str) -> Path:
    """``text`` as a plain file, one gzip member, or gzip members of odd sizes."""
    if how == "plain":
        path.write_bytes(text)
    elif how == "gzip":
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(text, compresslevel=1))
    else:
        path = path.with_name(path.name + ".gz")
        cuts = [0, 7, 9000, SNIFF_PIECE_BYTES + 1, 70000, len(text)]
        cuts = sorted({min(c, len(text)) for c in cuts})
        path.write_bytes(
            b"".join(gzip.compress(text[a:b]) for a, b in itertools.pairwise(cuts))
            or gzip.compress(b"")
        )
    return path


@pytest.mark.parametrize("how", ["plain", "gzip", "members"])
def test_sniff_answers_as_the_whole_head(tmp_path: Path, how: str) -> None:
    for i, (name, text) in enumerate(heads().items()):
        path = write(tmp_path / f"f{i}.json", text, how)
        assert discovery.sniff(path) is whole_head_rule(text), (name, how)


def corrupt_trailer(text: bytes) -> bytes:
    """One gzip member of ``text`` whose CRC is wrong: zlib fails only at the stream's end."""
    data = bytearray(gzip.compress(text, compresslevel=1))
    data[-8] ^= 0xFF
    return bytes(data)


def test_sniff_stops_once_the_head_decides(tmp_path: Path) -> None:
    """A trace whose key is in its first piece is a TRACE without gunzipping the rest: here
    the rest would fail its check (gunzipped in one piece, the head was lost to that error)."""
    path = tmp_path / "t.json.gz"
    path.write_bytes(corrupt_trailer(kineto_text(200) + b" " * 200_000))
    assert discovery.sniff(path) is TraceHead.TRACE


def test_unreadable_before_the_head_decides_is_taken(tmp_path: Path) -> None:
    """A file that fails before its head says what it is: UNREADABLE, so a folder's merge takes
    it and reports it, even when a first gzip member read well (that head alone said OTHER,
    and the file was skipped without a word)."""
    first = gzip.compress(b'{"schemaVersion": 1, "deviceProperties": [' + b" " * 20000)
    path = tmp_path / "job.json.gz"  # not a trace's name: taken only for what it holds
    path.write_bytes(first + b"\x1f\x8b\x08\x00garbage that is no deflate stream")
    assert discovery.sniff(path) is TraceHead.UNREADABLE
    assert discovery.is_folder_trace(path)

    whole = tmp_path / "other.json.gz"
    whole.write_bytes(corrupt_trailer(b'{"a": "' + b"b" * 30000 + b'"}'))
    assert discovery.sniff(whole) is TraceHead.UNREADABLE
