"""Fuzzing the readers (hypothesis): every input merges or is a recorded problem, never a crash.

Mutated real traces (tests/data) go through the public paths: the trace reader
(``decode.read_trace``: a :class:`TraceReadError` is the recorded problem), the merge
(``merge_run_dir`` on a folder of mutated files: a row of ``/problems`` or one
:class:`InputFileError` line), and the store reader (``open_store`` and its tables on a
merged store with bytes flipped or cut: one :class:`InputFileError`). Any other exception is a
bug; the inputs that found one are kept below as regression tests (``test_regression_*``).

Budget: ``RANKSCOPE_FUZZ_EXAMPLES`` examples per property (default 60, CI: the whole file runs
in well under a minute on 2 cores). For a longer manual run (docs/reliability.md, "Fuzzing"):

    RANKSCOPE_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz.py -p no:cacheprovider --timeout 0
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rankscope.analysis.store.reader import open_store
from rankscope.errors import InputFileError
from rankscope.orchestrator.ingest import decode, event_columns
from rankscope.orchestrator.ingest.decode import read_trace
from rankscope.orchestrator.ingest.kineto_json import TraceReadError
from rankscope.orchestrator.ingest.merge import merge_run_dir

DATA = Path(__file__).parent / "data"
WINDOW = DATA / "cpu_gloo_4rank_pipeline" / "ranks" / "00000" / "window-000.json.gz"
STRAGGLER = DATA / "cpu_gloo_4rank_straggler"

#: Examples per property: small in CI, larger by hand (module docstring).
EXAMPLES = int(os.environ.get("RANKSCOPE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("RANKSCOPE_FUZZ_RANDOM") is None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

_TEXT = gzip.decompress(WINDOW.read_bytes())
_DOC: dict[str, Any] = json.loads(_TEXT)
#: Fields of an event and of its args that the decoder reads.
EVENT_FIELDS = ["ph", "name", "cat", "pid", "tid", "ts", "dur", "args"]
ARG_FIELDS = [
    "correlation", "name", "Collective name", "Process Group Name", "Seq", "In msg nelems",
    "Out msg nelems", "dtype", "Device Type", "Device Id", "Addr", "Bytes", "Total Allocated",
    "Total Reserved",
]  # fmt: skip
TOP_FIELDS = [
    "traceEvents", "baseTimeNanoseconds", "distributedInfo", "trace_id", "host_name",
    "deviceProperties",
]  # fmt: skip
INFO_FIELDS = ["rank", "world_size", "backend"]

FLOATS = st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 1e308, -1e308, 5e-324])
INTS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, 0, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, 2**64, 10**30]),
)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, st.floats(), st.text(max_size=20))
#: Wrong types for any field: scalars, huge strings, containers.
VALUES = st.one_of(
    SCALARS,
    st.integers(1, 1 << 20).map(lambda n: "x" * n),  # huge strings (up to 1 MiB)
    st.lists(SCALARS, max_size=4),
    st.dictionaries(st.text(max_size=8), SCALARS, max_size=4),
)


def _dumps(doc: Any) -> bytes:
    """JSON the way Python writes it (NaN, Infinity included), in Kineto's layout (indent 2)."""
    return json.dumps(doc, indent=2).encode()


@contextlib.contextmanager
def _folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rankscope-fuzz-") as tmp:
        yield Path(tmp)


def _read(path: Path) -> event_columns.FileTrace | None:
    """The oracle: a FileTrace or a TraceReadError (a recorded problem); anything else fails."""
    try:
        return read_trace(path)
    except TraceReadError as exc:
        assert "\n" not in str(exc), "problems are one line"
        return None


@contextlib.contextmanager
def _small_blocks(block_bytes: int) -> Iterator[None]:
    """The streaming reader with tiny blocks, so small files go through the block path too."""
    saved = decode._stream_events.__defaults__
    decode._stream_events.__defaults__ = (block_bytes,)
    try:
        yield
    finally:
        decode._stream_events.__defaults__ = saved


@st.composite
def mutated_docs(draw: st.DrawFn) -> dict[str, Any]:
    """The real trace with a few fields set to wrong values, events duplicated/reordered."""
    doc = copy.deepcopy(_DOC)
    events: list[Any] = doc["traceEvents"]
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(["event", "args", "top", "info", "events"]))
        if where == "event":
            ev = events[draw(st.integers(0, len(events) - 1))]
            if isinstance(ev, dict):
                key = draw(st.sampled_from(EVENT_FIELDS))
                if draw(st.booleans()):
                    ev[key] = draw(VALUES)
                else:
                    ev.pop(key, None)
        elif where == "args":
            ev = events[draw(st.integers(0, len(events) - 1))]
            if isinstance(ev, dict):
                args = ev.setdefault("args", {})
                if isinstance(args, dict):
                    args[draw(st.sampled_from(ARG_FIELDS))] = draw(VALUES)
        elif where == "top":
            doc[draw(st.sampled_from(TOP_FIELDS))] = draw(VALUES)
        elif where == "info":
            info = doc.get("distributedInfo")
            if isinstance(info, dict):
                info[draw(st.sampled_from(INFO_FIELDS))] = draw(VALUES)
        elif isinstance(events, list) and events:
            op = draw(st.sampled_from(["duplicate", "reverse", "shuffle", "drop", "negative_ts"]))
            if op == "duplicate":
                events.extend(copy.deepcopy(events[: draw(st.integers(1, len(events)))]))
            elif op == "reverse":
                events.reverse()
            elif op == "shuffle":
                draw(st.randoms(use_true_random=False)).shuffle(events)
            elif op == "drop":
                del events[draw(st.integers(0, len(events) - 1)) :]
            else:
                for ev in events:
                    if isinstance(ev, dict) and isinstance(ev.get("ts"), int | float):
                        ev["ts"] = -ev["ts"]
    return doc


@FUZZ
@given(doc=mutated_docs(), gz=st.booleans(), small_blocks=st.booleans())
def test_fuzz_trace_reader_wrong_values(doc: dict[str, Any], gz: bool, small_blocks: bool) -> None:
    """Wrong types in every field, NaN/inf/negative/unsorted stamps, duplicated events."""
    text = _dumps(doc)
    with _folder() as tmp, _small_blocks(4096 if small_blocks else decode.BLOCK_BYTES):
        path = tmp / ("w.json.gz" if gz else "w.json")
        path.write_bytes(gzip.compress(text, 1) if gz else text)
        trace = _read(path)
        if trace is not None:
            n = len(trace.columns["ts"])
            assert all(len(v) == n for v in trace.columns.values())


#: Offsets where a cut lands in a different part of the file.
def _offset_classes(data: bytes) -> list[int]:
    marks = [0, 1, 2, 9, 10, len(data) // 2, len(data) - 8, len(data) - 1]
    head = data.find(b'"traceEvents"')
    sep = data.find(decode.EVENT_SEPARATOR)
    marks += [head, head + 5, head + 17, sep, sep + 3, sep + 4, sep + 5, data.rfind(b"]")]
    return sorted({m for m in marks if 0 <= m < len(data)})


_GZ = WINDOW.read_bytes()


@FUZZ
@given(
    gz=st.booleans(),
    pick=st.integers(0, 10**6),
    jitter=st.integers(-64, 64),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3),
    truncate=st.booleans(),
)
def test_fuzz_trace_reader_bytes(
    gz: bool, pick: int, jitter: int, flips: list[tuple[int, int]], truncate: bool
) -> None:
    """Truncation at every class of offset (header, events, separator, trailer), flipped bytes."""
    data = bytearray(_GZ if gz else _TEXT)
    for pos, xor in flips:
        data[pos % len(data)] ^= xor
    if truncate:
        classes = _offset_classes(bytes(data))
        cut = min(max(classes[pick % len(classes)] + jitter, 0), len(data))
        del data[cut:]
    with _folder() as tmp, _small_blocks(4096):
        path = tmp / ("w.json.gz" if gz else "w.json")
        path.write_bytes(bytes(data))
        _read(path)


@FUZZ
@given(
    depth=st.integers(1, 200_000),
    where=st.sampled_from(["top", "args", "event", "events"]),
    opener=st.sampled_from(["[", '{"a":']),
)
def test_fuzz_trace_reader_deep_nesting(depth: int, where: str, opener: str) -> None:
    """Deeply nested JSON anywhere: a recorded problem (or skipped), never a RecursionError."""
    closer = "]" if opener == "[" else "}"
    deep = (opener * depth + "1" + closer * depth).encode()
    head = _TEXT[: _TEXT.find(b'"traceEvents"')]
    events = _TEXT[_TEXT.find(b'"traceEvents"') :]
    if where == "top":
        text = head + b'"junk": ' + deep + b",\n" + events
    elif where == "args":
        text = _TEXT.replace(b'"args": {', b'"args": {"deep": ' + deep + b", ", 1)
    elif where == "event":
        text = _TEXT.replace(b'"ph": "X"', b'"ph": ' + deep, 1)
    else:
        text = head + b'"traceEvents": [' + deep + b"]}"
    with _folder() as tmp:
        path = tmp / "w.json"
        path.write_bytes(text)
        _read(path)


def _merge_or_problem(folder: Path) -> Path | None:
    """The merge's oracle: a store whose problems are readable, or one InputFileError line."""
    try:
        out = merge_run_dir(folder, quiet=True, scheduler="synchronous")
    except InputFileError as exc:
        assert "\n" not in str(exc)
        return None
    with open_store(out) as store:
        store.problems()
        for r in store.ranks:
            store.events(r)
            store.lanes(r)
        store.collectives()
        store.steps()
        store.clock()
    return out


@settings(FUZZ, max_examples=max(EXAMPLES // 2, 1))  # a whole merge per example: 0.7 s
@given(docs=st.lists(mutated_docs(), min_size=1, max_size=2), rankless=st.booleans())
def test_fuzz_merge_mutated_traces(docs: list[dict[str, Any]], rankless: bool) -> None:
    """A folder of mutated traces (plus a good one): the store records each problem."""
    with _folder() as tmp:
        shutil.copy2(STRAGGLER / "rank3.step5.pt.trace.json", tmp / "rank3.step5.pt.trace.json")
        for i, doc in enumerate(docs):
            if rankless:
                doc.pop("distributedInfo", None)
            (tmp / f"rank{i}.step5.pt.trace.json").write_bytes(_dumps(doc))
        _merge_or_problem(tmp)


@pytest.fixture(scope="module")
def merged_store(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real merged store (4 ranks)."""
    folder = tmp_path_factory.mktemp("store")
    for r in range(2):
        shutil.copy2(STRAGGLER / f"rank{r}.step5.pt.trace.json", folder)
    out = merge_run_dir(folder, quiet=True, scheduler="synchronous")
    return out.read_bytes()


def _read_store(path: Path) -> None:
    """Every reader of the store: fine, or one InputFileError line (KeyError for an absent rank)."""
    try:
        with open_store(path) as store:
            store.meta  # noqa: B018
            for r in store.ranks:
                store.events(r)
                store.events(r, window=(0, 2**62))
                store.lanes(r)
                store.rank_meta(r)
                store.memory(r)
                store.device_memory(r)
            store.collectives()
            store.steps()
            store.clock()
            store.problems()
    except InputFileError as exc:
        assert "\n" not in str(exc)


@FUZZ
@given(
    flips=st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 255)), min_size=1, max_size=8),
    cut=st.one_of(st.none(), st.integers(0, 10**9)),
)
def test_fuzz_store_reader_flipped_bytes(
    merged_store: bytes, flips: list[tuple[int, int]], cut: int | None
) -> None:
    """Bytes flipped anywhere in a real store (inside datasets too), or the file cut short."""
    data = bytearray(merged_store)
    for pos, xor in flips:
        data[pos % len(data)] ^= xor
    if cut is not None:
        del data[cut % len(data) :]
    with _folder() as tmp:
        path = tmp / "trace.h5"
        path.write_bytes(bytes(data))
        _read_store(path)
