"""The Kineto reader (orchestrator/ingest/decode.py, kineto_json.py, event_columns.py, discovery.py, vocabulary.py) on the real traces in tests/data."""

from __future__ import annotations

import gzip
import json
import shutil
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from rankscope.analysis.store.schema import EventKind, LaneKind
from rankscope.orchestrator.ingest import decode as kineto
from rankscope.orchestrator.ingest import discovery, event_columns, kineto_json, vocabulary

DATA = Path(__file__).parent / "data"
GLOO = DATA / "cpu_gloo_4rank_skew" / "rank2.step5.pt.trace.json"
DLRM = DATA / "param_dlrm_8rank"
ALL_FILES = [
    *sorted((DATA / "param_dlrm_8rank").glob("*.json")),
    *sorted((DATA / "cpu_gloo_4rank_straggler").glob("*.trace.json")),
    *sorted((DATA / "hta").rglob("*.json.gz")),
]


def _exact_ns(path: Path) -> np.ndarray:
    """Reference: absolute ns of every X event computed with exact decimals from the JSON text."""
    text = path.read_bytes()
    if path.name.endswith(".gz"):
        text = gzip.decompress(text)
    doc = json.loads(text, parse_float=Decimal)
    base = int(doc.get("baseTimeNanoseconds", 0))
    out = [
        base + int((Decimal(e["ts"]) * 1000).to_integral_value())
        for e in doc["traceEvents"]
        if e.get("ph") == "X"
    ]
    return np.sort(np.asarray(out, dtype=np.int64))


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_trace_reads_sorted(path: Path) -> None:
    ft = kineto.read_trace(path)
    ts = ft.columns["ts"]
    assert len(ts) > 0
    assert np.all(np.diff(ts) >= 0), "events are sorted by ts"
    assert np.all(ft.columns["dur"] >= 0)
    assert ft.rank is not None
    assert len(ft.lanes) == ft.columns["lane"].max() + 1


@pytest.mark.parametrize(
    "path",
    [
        GLOO,
        DLRM / "worker3_step_12.1694128201557.pt.trace.json",
        DATA / "hta/nccl_parser_config/nccl_data.json.gz",
    ],
    ids=["fractional+base", "absolute-int-us", "fractional+base-gz"],
)
def test_timestamps_are_exact_ns(path: Path) -> None:
    """No float rounding: every ts equals the decimal computation to the nanosecond."""
    ft = kineto.read_trace(path)
    assert np.array_equal(np.sort(ft.columns["ts"]), _exact_ns(path))


def test_large_fractional_stamps_take_the_exact_path(tmp_path: Path) -> None:
    """Absolute epoch µs with decimals (> 2**43 µs) cannot go through float: decoded as Decimal."""
    stamps = ["1694128201436255.123", "1694128201436255.999", "1694128201436256.001"]
    events = ",".join(
        f'{{"ph":"X","cat":"cpu_op","name":"op{i}","pid":1,"tid":1,"ts":{s},"dur":1.5}}'
        for i, s in enumerate(stamps)
    )
    path = tmp_path / "rank0.json"
    path.write_text(f'{{"traceEvents":[{events}]}}')
    ft = kineto.read_trace(path)
    assert ft.columns["ts"].tolist() == [
        1694128201436255123,
        1694128201436255999,
        1694128201436256001,
    ]
    assert ft.columns["dur"].tolist() == [1500, 1500, 1500]
    # The float path would have rounded these: prove the test exercises the difference.
    assert event_columns.us_to_ns(np.array([float(stamps[0])]))[0] != 1694128201436255123
    ints = kineto_json.KEvent(ts=1694128201436255)
    assert not kineto_json.needs_exact([ints]), "integer µs are exact in float64"


def _decoded(ft: event_columns.FileTrace) -> dict[str, list]:
    strings = np.array(ft.strings, dtype=object)
    coded = ("name", "cat", "shapes", "dtypes")  # codes into the strings, in interning order
    out = {k: v.tolist() for k, v in ft.columns.items() if k not in coded}
    out["name"] = strings[ft.columns["name"]].tolist()
    out["cat"] = strings[ft.columns["cat"]].tolist()
    for k in ("shapes", "dtypes"):  # -1: not recorded
        out[k] = [strings[c] if c >= 0 else None for c in ft.columns[k].tolist()]
    out["lanes"] = ft.lanes.drop(columns="lane").values.tolist()
    out["comm"] = ft.comm.values.tolist()
    return out


@pytest.mark.parametrize(
    "path", [GLOO, DATA / "hta/nccl_parser_config/nccl_data.json.gz"], ids=["json", "gz"]
)
def test_streaming_blocks_equal_whole_file(path: Path) -> None:
    """Many small blocks (the memory-bounded path) give exactly what one whole decode gives."""
    whole = event_columns.EventColumns()
    top = kineto._read_whole(path, whole)
    a = whole.finish(path, top)
    streamed = event_columns.EventColumns()
    top2 = kineto._stream_events(path, streamed, block_bytes=64 << 10)
    b = streamed.finish(path, top2)
    assert _decoded(a) == _decoded(b)
    assert (a.rank, a.world_size, a.nbytes) == (b.rank, b.world_size, b.nbytes)


def test_streaming_blocks_keep_large_fractional_stamps_exact(tmp_path: Path) -> None:
    """Kineto layout, absolute epoch µs with decimals, many blocks: every block decodes exactly."""
    stamps = [Decimal("1694128201436255.123") + Decimal(i) * Decimal("1.001") for i in range(3000)]
    body = ",".join(
        f'\n  {{\n    "ph": "X", "cat": "cpu_op", "name": "op{i % 7}", "pid": 1, "tid": 1,'
        f' "ts": {s}, "dur": 0.5\n  }}'
        for i, s in enumerate(stamps)
    )
    path = tmp_path / "rank0.json"
    path.write_text(f'{{\n  "schemaVersion": 1,\n  "traceEvents": [{body}\n  ]\n}}')
    acc = event_columns.EventColumns()
    ft = acc.finish(path, kineto._stream_events(path, acc, block_bytes=16 << 10))
    want = [int(s * 1000) for s in stamps]
    assert ft.columns["ts"].tolist() == want
    assert ft.columns["dur"].tolist() == [500] * len(stamps)


def test_one_line_json_still_reads() -> None:
    """No Kineto separators (one line): the text ends up decoded in one piece, same result."""
    path = DATA / "hta/trace_filter_2rank/sampled_rank-0.json.gz"
    streamed = event_columns.EventColumns()
    b = streamed.finish(path, kineto._stream_events(path, streamed, block_bytes=64 << 10))
    whole = event_columns.EventColumns()
    a = whole.finish(path, kineto._read_whole(path, whole))
    assert _decoded(a) == _decoded(b)


def test_gzip_and_plain_give_the_same_columns(tmp_path: Path) -> None:
    gz = tmp_path / "rank2.json.gz"
    gz.write_bytes(gzip.compress(GLOO.read_bytes()))
    a, b = kineto.read_trace(GLOO), kineto.read_trace(gz)
    for col in a.columns:
        assert np.array_equal(a.columns[col], b.columns[col]), col
    assert a.strings == b.strings


def test_rank_and_world_from_distributed_info() -> None:
    ft = kineto.read_trace(GLOO)
    assert (ft.rank, ft.world_size, ft.backend) == (2, 4, "gloo")


def test_rank_from_file_name() -> None:
    assert discovery.rank_from_path(Path("rank-3.json.gz")) == 3
    assert discovery.rank_from_path(Path("x/rank12.step5.pt.trace.json")) == 12
    assert discovery.rank_from_path(Path("worker7_step_12.169.pt.trace.json")) == 7
    assert discovery.rank_from_path(Path("RUN/ranks/00005/window-000.json.gz")) == 5
    assert discovery.rank_from_path(Path("trace.json")) is None


def test_trace_names_skip_meta_json() -> None:
    assert discovery.is_trace_name(Path("rank0.step5.pt.trace.json"))
    assert discovery.is_trace_name(Path("window-000.json.gz"))
    assert not discovery.is_trace_name(Path("rank0.meta.json"))
    assert not discovery.is_trace_name(Path("meta.json"))
    assert not discovery.is_trace_name(Path("run.json"))
    assert not discovery.is_trace_name(Path("torchrun.log"))


@pytest.mark.parametrize(
    ("cat", "name", "kind"),
    [
        (
            "kernel",
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            EventKind.KERNEL_COMM,
        ),
        (
            "kernel",
            "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            EventKind.KERNEL_COMM,
        ),
        ("kernel", "volta_sgemm_128x64_nn", EventKind.KERNEL_COMPUTE),
        ("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", EventKind.MEMCPY),
        ("gpu_memset", "Memset (Device)", EventKind.MEMSET),
        ("cuda_sync", "Stream Sync", EventKind.SYNC),
        ("cuda_runtime", "cudaLaunchKernel", EventKind.RUNTIME),
        ("cuda_driver", "cuLaunchKernel", EventKind.RUNTIME),
        ("user_annotation", "ProfilerStep#5", EventKind.PROFILER_STEP),
        ("cpu_op", "gloo:all_reduce", EventKind.COMM_CPU),
        ("cpu_op", "c10d::allreduce_", EventKind.COMM_ENQUEUE),
        ("cpu_op", "record_param_comms", EventKind.COMM_ENQUEUE),
        ("user_annotation", "straggler_sleep", EventKind.USER_ANNOTATION),
        ("gpu_user_annotation", "forward", EventKind.USER_ANNOTATION),
        ("python_function", "train.py(12): step", EventKind.PYTHON),
        ("cpu_op", "aten::mm", EventKind.CPU_OP),
        ("Trace", "PyTorch Profiler (0)", EventKind.OTHER),
    ],
)
def test_classify(cat: str, name: str, kind: EventKind) -> None:
    assert vocabulary.classify(cat, name) == kind


def test_nccl_lanes_and_comm_events() -> None:
    ft = kineto.read_trace(DLRM / "worker0_step_12.1694128201545.pt.trace.json")
    gpu = ft.lanes[ft.lanes["kind"] == LaneKind.GPU_STREAM]
    assert "stream 84" in set(gpu["name"])
    # DLRM: 5 SendRecv (alltoall) and 3 AllReduce kernels per rank on stream 84.
    assert sorted(ft.comm["op"].value_counts().items()) == [("allreduce", 3), ("sendrecv", 5)]
    kinds = ft.columns["kind"][ft.comm["event"].to_numpy()]
    assert np.all(kinds == EventKind.KERNEL_COMM)
    # GPU activity carries its correlation id (links back to the CPU launch).
    kernels = ft.columns["kind"] == EventKind.KERNEL_COMPUTE
    assert np.all(ft.columns["corr"][kernels] >= 0)


def test_gloo_runloop_threads_and_string_pids() -> None:
    ft = kineto.read_trace(GLOO)
    names = " ".join(ft.lanes["name"])
    assert "pt_gloo_runloop" in names
    # Kineto's "Spans" process has a string pid; it is kept as written.
    assert "Spans" in set(ft.lanes["pid"])
    assert set(ft.comm["op"]) == {"allreduce"}
    assert len(ft.comm) == 3


def test_collective_message_size_from_args() -> None:
    ft = kineto.read_trace(DATA / "hta/nccl_parser_config/nccl_data.json.gz")
    ar = ft.comm[ft.comm["op"] == "allreduce"]
    assert (ar["bytes"] > 0).all()
    assert set(ft.comm["group"]) == {"0"}


def test_bad_durations_are_dropped_and_counted(tmp_path: Path) -> None:
    doc = json.loads(GLOO.read_text())
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    xs[0]["dur"] = -5.0
    xs[1]["dur"] = float("nan")  # json.dumps writes NaN, which is not JSON
    path = tmp_path / "rank2.json"
    path.write_text(json.dumps(doc))
    ft = kineto.read_trace(path)
    assert ft.dropped == {"events with negative, NaN or missing durations": 2}
    assert len(ft.columns["ts"]) == len(xs) - 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b'{"traceEvents": [', "invalid JSON"),
        (b'{"schemaVersion": 1}', "not a Kineto trace"),
        (b"[1, 2, 3]", "not a Kineto trace"),
    ],
)
def test_unreadable_files_raise_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "rank0.json"
    path.write_bytes(content)
    with pytest.raises(kineto_json.TraceReadError, match=message) as info:
        kineto.read_trace(path)
    assert "\n" not in str(info.value)


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(GLOO.read_bytes())
    path = tmp_path / "rank2.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(kineto_json.TraceReadError, match="gzip"):
        kineto.read_trace(path)


def test_reader_does_not_touch_its_input(tmp_path: Path) -> None:
    copy = tmp_path / GLOO.name
    shutil.copy2(GLOO, copy)
    before = (copy.read_bytes(), copy.stat().st_mtime_ns)
    kineto.read_trace(copy)
    assert (copy.read_bytes(), copy.stat().st_mtime_ns) == before


def _inflaters() -> list[object]:
    import zlib

    from isal import isal_zlib

    return [zlib, isal_zlib]


def test_gzip_is_inflated_by_isal_where_installed() -> None:
    """ISA-L's inflate (~2x zlib's) reads gzip traces; zlib stays the path without it."""
    from isal import isal_zlib

    assert kineto_json.inflater() is isal_zlib


@pytest.mark.parametrize("lib", _inflaters(), ids=lambda m: m.__name__)
def test_both_inflaters_give_the_same_text_and_errors(tmp_path: Path, lib: object) -> None:
    """The pure-zlib path and isal's: the same text of a multi-member gzip read in bounded
    pieces, and the same one-line error for a cut or corrupt stream."""
    text = GLOO.read_bytes()
    two = tmp_path / "two.json.gz"  # two gzip members, as `cat a.gz b.gz` makes
    two.write_bytes(gzip.compress(text[:5000]) + gzip.compress(text[5000:]))
    pieces = list(kineto_json.text_pieces(two, lib))  # type: ignore[arg-type]
    assert b"".join(pieces) == text
    assert max(map(len, pieces)) <= kineto_json.TEXT_PIECE_BYTES
    data = gzip.compress(text)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(kineto_json.TraceReadError, match="truncated or corrupt gzip"):
        list(kineto_json.text_pieces(cut, lib))  # type: ignore[arg-type]
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(data[:20] + bytes(255 - b for b in data[20:200]) + data[200:])
    with pytest.raises(kineto_json.TraceReadError, match="truncated or corrupt gzip") as info:
        list(kineto_json.text_pieces(bad, lib))  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
