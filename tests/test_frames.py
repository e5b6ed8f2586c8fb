"""Typed result frames built in one step (``analysis/store/frames.py``, issue 31) are the plain
pandas ways' frames exactly — values, dtypes, index and column labels — on the project's own
result schemas; and a lane's stream number is read as pandas' ``str.extract`` read it."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal
from rankscope.analysis.compute import host_feed, kernel_launches, kernel_sequences
from rankscope.analysis.compute.arrivals import POINT_COLUMNS
from rankscope.analysis.compute.attention import ATTENTION_CALL_COLUMNS
from rankscope.analysis.compute.breakdown import gpu_lanes
from rankscope.analysis.compute.ops import OP_STAT_COLUMNS, OP_TABLE_COLUMNS
from rankscope.analysis.store.frames import empty, from_rows, typed
from rankscope.analysis.store.memory_table import MEMORY_COLUMNS
from rankscope.analysis.store.schema import LaneKind, tid_numbers

SCHEMAS = {
    "blocking copies": host_feed.BLOCKING_COPY_COLUMNS,
    "host wait": host_feed.HOST_WAIT_COLUMNS,
    "idle": kernel_launches.IDLE_COLUMNS,
    "launches": kernel_launches.LAUNCH_COLUMNS,
    "queue": kernel_launches.QUEUE_COLUMNS,
    "sequences": kernel_sequences.SEQUENCE_COLUMNS,
    "points": POINT_COLUMNS,
    "memory": MEMORY_COLUMNS,
}


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert_frame_equal(a, b, check_exact=True, check_index_type=True, check_column_type=True)


def _cell(dtype: str, i: int) -> Any:
    """A value of row ``i`` for a column of ``dtype`` (text, whole numbers, floats, flags)."""
    if dtype == "str":
        return f"name {i} <&>"
    kind = np.dtype(dtype).kind
    return {"b": i % 2 == 0, "f": i * 1.5, "O": f"o{i}"}.get(kind, i * 7 - 3)


@pytest.mark.parametrize("schema", list(SCHEMAS))
@pytest.mark.parametrize("n", [0, 1, 5])
def test_from_rows_and_typed_are_the_plain_frames(schema: str, n: int) -> None:
    columns = SCHEMAS[schema]
    rows = [tuple(_cell(d, i) for d in columns.values()) for i in range(n)]
    plain = pd.DataFrame(rows, columns=list(columns)).astype(columns)
    _same(from_rows(rows, columns), plain)
    # typed: a wider frame (other columns, another order, a filtered index) cut to the schema
    wide = pd.DataFrame(rows, columns=list(columns)).iloc[:, ::-1]
    wide["extra"] = np.arange(n)
    wide.index = pd.Index(np.arange(n) * 3 + 2)
    _same(typed(wide, columns), wide[list(columns)].astype(columns))
    kept = {c: (None if d == "str" else d) for c, d in columns.items()}
    raw = pd.DataFrame({c: pd.Series([str(_cell(d, i)) for i in range(n)], dtype=object)
                        if d == "str" else [_cell(d, i) for i in range(n)]
                        for c, d in columns.items()})  # fmt: skip
    _same(typed(raw, kept), raw[list(columns)].astype({c: d for c, d in kept.items() if d}))


@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_frames_without_rows_are_made_afresh_each_time(schema: str) -> None:
    """The kept frame without rows is handed out as a copy (what a caller does to it stays
    with it), and ``"str"`` columns follow pandas' string setting of the moment."""
    from rankscope.pandas_strings import object_strings

    columns = SCHEMAS[schema]
    for _ in range(2):
        for strings in (contextlib.nullcontext, object_strings):
            with strings():
                plain = pd.DataFrame([], columns=list(columns)).astype(columns)
                first = from_rows([], columns)
                _same(first, plain)
                head = next(iter(columns))
                first[head] = first[head].astype(object)
                first["added"] = []
                _same(from_rows([], columns), plain)
                assert from_rows([], columns) is not from_rows([], columns)


@pytest.mark.parametrize("columns", [MEMORY_COLUMNS, ATTENTION_CALL_COLUMNS, OP_STAT_COLUMNS,
                                     OP_TABLE_COLUMNS])  # fmt: skip
def test_empty_is_the_plain_empty_frame(columns: dict[str, str]) -> None:
    from rankscope.pandas_strings import object_strings

    as_object = {c: ("object" if d == "str" else d) for c, d in columns.items()}
    for strings in (contextlib.nullcontext, object_strings, contextlib.nullcontext):
        with strings():
            for schema in (columns, as_object):
                plain = pd.DataFrame({c: pd.Series([], dtype=d) for c, d in schema.items()})
                first = empty(schema)
                _same(first, plain)
                first["added"] = []  # a copy: the next one is made afresh
                _same(empty(schema), plain)


def test_conversions_pandas_refuses_are_refused_alike() -> None:
    """A missing value into an integer column: pandas' own error, not numpy's garbage."""
    frame = pd.DataFrame({"a": [1.0, np.nan]})
    with pytest.raises(ValueError) as plain:
        frame.astype({"a": "int64"})
    with pytest.raises(ValueError) as ours:
        typed(frame, {"a": "int64"})
    assert type(ours.value) is type(plain.value)
    with pytest.raises(ValueError):
        from_rows([(1.0,), (None,)], {"a": "int64"})


def test_stream_numbers_are_read_as_pandas_extract_read_them() -> None:
    tids = ["stream 7", "stream -3 ", "12", "stream", None, "thread 4 stream 15", "x٣"]
    lanes = pd.DataFrame(
        {
            "lane": np.arange(len(tids), dtype=np.int32),
            "kind": int(LaneKind.GPU_STREAM),
            "tid": pd.Series(tids, dtype="str"),
        }
    )
    extracted = lanes["tid"].astype(str).str.extract(r"(-?\d+)\s*$")[0]
    want = [None if pd.isna(v) else int(v) for v in extracted]
    assert tid_numbers(lanes) == want == [7, -3, 12, None, None, 15, 3]
    assert gpu_lanes(lanes).tolist() == [0, 2, 3, 4, 5, 6]  # every stream but the negative one
    assert kernel_launches.lane_streams(lanes).tolist() == [7, -1, 12, -1, -1, 15, 3]


def test_per_rank_is_the_rank_filter_in_row_order() -> None:
    """The merge writes each rank's ``coll`` column, and the analysis and the overview give each
    rank task its collectives, from ``per_rank``: the rows of that rank, in the table's order,
    index labels and dtypes kept (a repeated event keeps its last row's collective), no rows for
    a rank without any or an empty table."""
    from rankscope.analysis.store.frames import per_rank

    rng = np.random.default_rng(3)
    n = 500
    colls = pd.DataFrame(
        {
            "rank": rng.integers(0, 9, n).astype(np.int32),
            "event": rng.integers(0, 60, n),
            "coll": np.arange(n),
        },
        index=rng.permutation(n) + 1000,
    )
    parts = per_rank(colls, range(11), ["event", "coll"])
    assert sorted(parts) == list(range(11))
    for rank in range(11):
        mine = colls[colls["rank"] == rank][["event", "coll"]]
        assert_frame_equal(parts[rank], mine)
        want = np.full(60, -1)
        want[mine["event"].to_numpy()] = mine["coll"].to_numpy()
        got = np.full(60, -1)
        got[parts[rank]["event"].to_numpy()] = parts[rank]["coll"].to_numpy()
        assert np.array_equal(got, want)
    none = per_rank(colls.iloc[:0], [0], ["event", "coll"])[0]
    assert_frame_equal(none, colls.iloc[:0][["event", "coll"]])
