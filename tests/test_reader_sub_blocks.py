"""The streaming reader's sub-blocks (decode._Block): any sub-block size reads exactly what
one decode per block reads (``sub_bytes=0``, the reader before sub-blocks), real and edge files.

Compared: every field of the FileTrace (columns with dtypes, the string table in order, lanes,
comm and enqueue rows, memory columns, skip counts, flags), or the error raised.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rankscope.orchestrator.ingest import decode, event_columns
from rankscope.orchestrator.ingest.kineto_json import TraceReadError

DATA = Path(__file__).parent / "data"
REAL = [
    DATA / "param_dlrm_8rank" / "worker0_step_12.1694128201545.pt.trace.json",
    DATA / "hta" / "nccl_parser_config" / "nccl_data.json.gz",
    DATA / "cpu_gloo_4rank_pipeline" / "ranks" / "00000" / "window-000.json.gz",
    DATA / "hta" / "trace_filter_2rank" / "sampled_rank-0.json.gz",  # one line: no separators
]
#: Sub-block sizes: one event per sub-block, a few, many; block sizes small enough that the
#: test files hold several blocks.
SUB_SIZES = (1, 700, 5000)
BLOCK_BYTES = (16 << 10, 128 << 10)


def _plain(value: Any) -> Any:
    """A value comparable with ``==``, exact (arrays: dtype and bytes; frames: dtypes too)."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return ("object", [(type(v).__name__, repr(v)) for v in value.tolist()])
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, pd.DataFrame):
        return (
            list(value.columns),
            [str(d) for d in value.dtypes],
            {c: _plain(value[c].to_numpy()) for c in value.columns},
        )
    if isinstance(value, dict):
        return [(repr(k), _plain(v)) for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return (type(value).__name__, repr(value))


def read(path: Path, block_bytes: int, sub_bytes: int) -> Any:
    """Every field of the streamed read (the whole-file fallback included), or the error."""
    acc = event_columns.EventColumns()
    try:
        try:
            top = decode._stream_events(path, acc, block_bytes, sub_bytes=sub_bytes)
        except decode._NotStreamable:
            acc = event_columns.EventColumns()
            top = decode._read_whole(path, acc)
        trace = acc.finish(path, top)
    except TraceReadError as exc:
        return ("error", str(exc))
    return {f.name: _plain(getattr(trace, f.name)) for f in dataclasses.fields(trace)}


class Rollbacks(event_columns.EventColumns):
    """Counts the blocks re-read whole after a sub-block of theirs failed or needed exact stamps."""

    count = 0

    def rollback(self, mark: tuple[Any, ...]) -> None:
        Rollbacks.count += 1
        super().rollback(mark)


def kineto_file(path: Path, events: list[dict[str, Any]], **top: Any) -> Path:
    """``events`` in Kineto's layout (one event per ``{ ... }`` at two spaces, separators)."""
    body = ",\n".join("  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in events)
    head = json.dumps(top)[1:-1]
    path.write_text("{" + head + (", " if top else "") + '"traceEvents": [\n' + body + "\n]}\n")
    return path


def edge_events() -> list[dict[str, Any]]:
    """Events of every kind the reduction reads: ops with shapes, kernels (compute and NCCL),
    record_param_comms, flows, thread names, memory events (one malformed), bad durations."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "main"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": "2", "args": {"name": "bwd"}},
    ]
    for i in range(600):
        t = 1000 + 10 * i
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 13}", "pid": 7, "tid": 1 + i % 2,
             "ts": t, "dur": 5, "args": {"Input Dims": [[i % 3, 4]], "Input type": ["float"]}}
        )  # fmt: skip
        events.append(
            {"ph": "X", "cat": "kernel", "name": f"kern{i % 5}", "pid": 0, "tid": f"stream {i % 3}",
             "ts": t + 2, "dur": 1.5, "args": {"correlation": i}}
        )  # fmt: skip
        events.append(
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": i, "pid": 7, "tid": 1, "ts": t}
        )
        if i % 50 == 0:
            events.append(
                {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 7, "tid": 1,
                 "ts": t + 1, "dur": 3, "args": {"Collective name": "allreduce", "Seq": i // 50,
                 "Process Group Name": "0", "In msg nelems": 1024, "dtype": "Float"}}
            )  # fmt: skip
            events.append(
                {"ph": "X", "cat": "kernel", "pid": 0, "tid": 9, "ts": t + 3, "dur": 2,
                 "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                 "args": {"correlation": 10**6 + i, "Collective name": "allreduce", "Seq": i // 50,
                          "Process Group Name": "0", "In msg nelems": 1024, "dtype": "Float"}}
            )  # fmt: skip
        if i % 7 == 0:
            events.append(
                {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 7, "tid": 1,
                 "ts": t + 1, "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096 + i,
                 "Bytes": 512 if i % 2 else -512, "Total Allocated": 1 << 20,
                 "Total Reserved": 1 << 21}}
            )  # fmt: skip
    events[900]["args"] = {"Device Type": "gpu"}  # a malformed memory event: skipped, counted
    events[1200]["dur"] = -1  # dropped, counted
    return events


def test_the_edge_file_has_what_it_tests() -> None:
    """The edge events hold each kind the sub-block reduction handles."""
    events = edge_events()
    assert {e["ph"] for e in events} == {"M", "X", "s", "i"}
    assert sum(e.get("name") == "[memory]" for e in events) > 50
    assert sum(e.get("name") == "record_param_comms" for e in events) > 5


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
@pytest.mark.parametrize("block_bytes", BLOCK_BYTES)
def test_sub_blocks_read_what_one_decode_per_block_reads(path: Path, block_bytes: int) -> None:
    """Real traces: every sub-block size gives the fields ``sub_bytes=0`` gives, bit for bit."""
    want = read(path, block_bytes, 0)
    for sub in SUB_SIZES:
        assert read(path, block_bytes, sub) == want, sub


@pytest.mark.parametrize("block_bytes", BLOCK_BYTES)
def test_sub_blocks_on_edge_events(tmp_path: Path, block_bytes: int) -> None:
    """Every kind of event the reduction reads, plain and gzip, with a time base."""
    path = kineto_file(
        tmp_path / "rank0.json", edge_events(), baseTimeNanoseconds=1_700_000_000_000_000_000
    )
    gz = tmp_path / "rank0.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    for p in (path, gz):
        want = read(p, block_bytes, 0)
        assert isinstance(want, dict)  # read, not refused
        for sub in SUB_SIZES:
            assert read(p, block_bytes, sub) == want, (p.name, sub)


def test_a_sub_block_needing_exact_stamps_rereads_its_block_whole(tmp_path: Path) -> None:
    """Fractional stamps ≥ 2**43 µs in the second half only: a block whose later sub-block
    needs exact stamps is read again whole (all its events exact, as one decode per block
    reads them), so stamps with more than 3 decimals round alike."""
    events = edge_events()
    for e in events[len(events) // 2 :]:
        if "ts" in e:
            e["ts"] = f"@{Decimal(e['ts']) + Decimal('1800000000000000.0005')}@"
    for e in events[: len(events) // 2 : 3]:
        if "ts" in e:
            e["ts"] = f"@{Decimal(e['ts']) + Decimal('0.0025')}@"  # > 3 decimals, small
    path = kineto_file(tmp_path / "exact.json", events)
    path.write_text(re.sub(r'"@([0-9.]+)@"', r"\1", path.read_text()))  # stamps as numbers
    Rollbacks.count = 0
    for sub in (0, *SUB_SIZES):
        acc = Rollbacks()
        got = acc.finish(path, decode._stream_events(path, acc, 16 << 10, sub_bytes=sub))
        if sub == 0:
            want = got
            assert Rollbacks.count == 0
        assert _plain(got.columns) == _plain(want.columns), sub
        assert got.strings == want.strings
    assert Rollbacks.count > 0  # the re-read path ran


def test_a_nested_separator_rereads_its_block_whole(tmp_path: Path) -> None:
    """A separator inside an event (an args list of objects at Kineto's indentation) cuts a
    sub-block where no event ends: that sub-block fails to decode and its block is read whole,
    with what one decode per block reads."""
    events = edge_events()
    for e in events[::40]:
        e.setdefault("args", {})["nested"] = ["X"]
    path = kineto_file(tmp_path / "nested.json", events)
    nested = '"nested": [\n  {"a": 1\n  },\n  {"b": 2\n  }]'
    path.write_text(path.read_text().replace('"nested": ["X"]', nested))
    Rollbacks.count = 0
    want = read(path, 16 << 10, 0)
    for sub in SUB_SIZES:
        acc = Rollbacks()
        got = acc.finish(path, decode._stream_events(path, acc, 16 << 10, sub_bytes=sub))
        assert {f.name: _plain(getattr(got, f.name)) for f in dataclasses.fields(got)} == want
    assert Rollbacks.count > 0


def test_nan_text_in_sub_blocks(tmp_path: Path) -> None:
    """Python's ``NaN`` in a sub-block: retried as null there, the event dropped and counted."""
    events = edge_events()
    for e in events[5::97]:
        if e.get("ph") == "X":
            e["dur"] = float("nan")
    path = kineto_file(tmp_path / "nan.json", events)
    want = read(path, 16 << 10, 0)
    for sub in SUB_SIZES:
        assert read(path, 16 << 10, sub) == want


@pytest.mark.parametrize("sub", (0, *SUB_SIZES))
def test_codes_are_first_seen_over_the_block(tmp_path: Path, sub: int) -> None:
    """One block in sub-blocks: the string table grows as one pass over the block's kept
    complete events grows it (its names, then categories, shapes, dtypes, in first-seen
    order), and the lanes are numbered by (pid, tid) in the pids' and tids' first-seen order
    (a plain reference, written from the JSON, not from the reader)."""
    events = edge_events()
    path = kineto_file(tmp_path / "rank0.json", events)
    acc = event_columns.EventColumns()
    ft = acc.finish(path, decode._stream_events(path, acc, 1 << 30, sub_bytes=sub), sort=False)
    xs = [e for e in events if e["ph"] == "X" and e["dur"] >= 0]
    shaped = [e["args"] for e in xs if "Input Dims" in e["args"]]
    want = dict.fromkeys(
        [e["name"] for e in xs]
        + [e["cat"] for e in xs]
        + [str(a["Input Dims"]) for a in shaped]
        + [str(a["Input type"]) for a in shaped]
    )
    assert ft.strings[: len(want)] == list(want)
    assert [ft.strings[c] for c in ft.columns["name"].tolist()] == [e["name"] for e in xs]
    pids = list(dict.fromkeys(e["pid"] for e in xs))
    tids = list(dict.fromkeys(e["tid"] for e in xs))
    pairs = sorted({(pids.index(e["pid"]), tids.index(e["tid"])) for e in xs})
    lanes = [(str(pids[p]), str(tids[t])) for p, t in pairs]
    assert list(zip(ft.lanes["pid"], ft.lanes["tid"], strict=True)) == lanes
    lane_of = {key: i for i, key in enumerate(lanes)}
    assert ft.columns["lane"].tolist() == [lane_of[str(e["pid"]), str(e["tid"])] for e in xs]
