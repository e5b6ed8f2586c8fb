"""The HDF5 store (analysis/store/reader.py): what the merge writes is what readers get back."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import rankscope
from rankscope.analysis.store import schema
from rankscope.analysis.store.reader import open_store
from rankscope.errors import InputFileError
from rankscope.orchestrator.ingest.merge import merge_run_dir

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def gloo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("store") / "trace.h5"
    return merge_run_dir(
        DATA / "cpu_gloo_4rank_straggler", output=out, scheduler="synchronous", quiet=True
    )


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """123k events in one rank: more than one HDF5 chunk per column."""
    out = tmp_path_factory.mktemp("big") / "trace.h5"
    return merge_run_dir(
        DATA / "hta" / "df_index_resolver", output=out, scheduler="synchronous", quiet=True
    )


def test_open_file_or_run_directory(gloo_store: Path) -> None:
    with open_store(gloo_store) as a, rankscope.open(gloo_store.parent) as b:
        assert a.ranks == b.ranks == [0, 1, 2, 3]
        assert a.world_size == 4
        assert a.path == b.path


def test_meta_has_schema_and_versions(gloo_store: Path) -> None:
    with open_store(gloo_store) as s:
        meta = s.meta
    assert meta["schema_name"] == schema.SCHEMA_NAME
    assert meta["schema_version"] == schema.SCHEMA_VERSION
    assert meta["run_id"]
    assert meta["rankscope_version"] == rankscope.__version__
    assert "h5py" in meta["tool_versions"]


def test_event_columns_follow_the_schema(gloo_store: Path) -> None:
    with open_store(gloo_store) as s:
        ev = s.events(2)
        assert list(ev.columns) == list(schema.EVENT_COLUMNS)
        for col, dtype in schema.EVENT_COLUMNS.items():
            assert str(ev[col].dtype) == dtype, col
        assert ev["ts"].is_monotonic_increasing
        assert (ev["dur"] >= 0).all()
        assert "straggler_sleep" in set(ev["name"].astype(str))
        assert set(ev["kind"].unique()) <= {int(k) for k in schema.EventKind}
        lanes = s.lanes(2)
        assert list(lanes.columns) == list(schema.LANE_COLUMNS)
        assert ev["lane"].max() < len(lanes)
        sub = s.events(2, columns=["ts", "name"])
        assert list(sub.columns) == ["ts", "name"]
        assert sub["ts"].equals(ev["ts"])


def test_collective_rows_point_back_to_events(gloo_store: Path) -> None:
    with open_store(gloo_store) as s:
        colls = s.collectives()
        assert list(colls.columns) == list(schema.COLLECTIVE_COLUMNS)
        assert len(colls) == 12  # 3 allreduce x 4 ranks
        for rank in s.ranks:
            ev = s.events(rank)
            mine = colls[colls["rank"] == rank]
            rows = ev.iloc[mine["event"].to_numpy()]
            assert (rows["coll"].to_numpy() == mine["coll"].to_numpy()).all()
            assert (rows["ts"].to_numpy() == mine["start"].to_numpy()).all()
            assert ((rows["ts"] + rows["dur"]).to_numpy() == mine["end"].to_numpy()).all()
            assert (ev["coll"] >= 0).sum() == 3


def test_steps_clock_problems_tables(gloo_store: Path) -> None:
    with open_store(gloo_store) as s:
        steps = s.steps()
        assert list(steps.columns) == list(schema.STEP_COLUMNS)
        assert sorted(steps["step"].unique()) == [2, 3, 4]
        clock = s.clock()
        assert list(clock.columns) == list(schema.CLOCK_COLUMNS)
        assert sorted(clock["rank"]) == [0, 1, 2, 3]
        assert set(clock["method"]) <= {str(m) for m in schema.ClockMethod}
        assert list(s.problems().columns) == list(schema.PROBLEM_COLUMNS)
        ev = s.events(0)
        assert set(ev["step"].unique()) <= {-1, 2, 3, 4}


def test_rank_meta(gloo_store: Path) -> None:
    with open_store(gloo_store) as s:
        meta = s.rank_meta(2)
    assert meta["rank"] == 2
    assert meta["backend"] == "gloo"
    assert meta["host"] == "vm"
    assert meta["files"][0].endswith("rank2.step5.pt.trace.json")


def test_rank_attr_is_rank_meta_one_value(gloo_store: Path) -> None:
    with open_store(gloo_store) as s:
        for rank in s.ranks:
            meta = s.rank_meta(rank)
            for name, value in meta.items():
                assert s.rank_attr(rank, name) == value, name
            assert s.rank_attr(rank, "no such attribute") is None
            assert s.rank_attr(rank, "no such attribute", "x") == "x"


def test_string_table_is_read_once_per_store_version(tmp_path: Path) -> None:
    """Stores of one file share its string table and text dtype (a rank task opens the store
    itself); a store merged again over the same path is a new version, read afresh."""
    out = tmp_path / "trace.h5"
    merge_run_dir(
        DATA / "cpu_gloo_4rank_straggler", output=out, scheduler="synchronous", quiet=True
    )
    with open_store(out) as a, open_store(out) as b:
        first = a.events(0)["name"]
        assert b.events(1)["name"].dtype is first.dtype
        assert b.strings is a.strings and not a.strings.flags.writeable
        names = set(first.astype(str))
    merge_run_dir(DATA / "cpu_gloo_4rank_pipeline", output=out, scheduler="synchronous", quiet=True)
    with open_store(out) as c:
        again = c.events(0)["name"]
        assert again.dtype is not first.dtype
        assert set(again.astype(str)) != names
        with h5py.File(out) as raw:  # the table the new file holds, read past any cache
            table = raw["strings"].asstr()[()].tolist()
        assert list(c.strings) == table
        codes = again.cat.codes.to_numpy()
        assert [table[k] for k in codes] == list(again.astype(str))


def _brute_window(ev: pd.DataFrame, start: int, end: int) -> pd.DataFrame:
    keep = (ev["ts"] < end) & (
        (ev["ts"] + ev["dur"] > start) | ((ev["dur"] == 0) & (ev["ts"] >= start))
    )
    return ev[keep].reset_index(drop=True)


@pytest.mark.parametrize("which", ["gloo_store", "big_store"])
def test_window_selects_overlapping_events(which: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(which)
    rng = np.random.default_rng(7)
    with open_store(path) as s:
        rank = s.ranks[0]
        ev = s.events(rank)
        lo, hi = int(ev["ts"].iloc[0]), int((ev["ts"] + ev["dur"]).max())
        for _ in range(6):
            a = int(rng.integers(lo, hi))
            b = a + int(rng.integers(1, max(2, (hi - lo) // 5)))
            got = s.events(rank, window=(a, b))
            want = _brute_window(ev, a, b)
            assert len(got) == len(want)
            assert got["ts"].tolist() == want["ts"].tolist()
            assert got["name"].astype(str).tolist() == want["name"].astype(str).tolist()


def test_events_dask_one_partition_per_rank(gloo_store: Path) -> None:
    with open_store(gloo_store) as s:
        ddf = s.events_dask(columns=["ts", "dur", "kind"])
        assert ddf.npartitions == 4
        assert list(ddf.columns) == ["rank", "ts", "dur", "kind"]
        counts = ddf.groupby("rank").size().compute()
        for rank in s.ranks:
            assert counts[rank] == len(s.events(rank, columns=["ts"]))


def test_events_dask_on_a_distributed_cluster(gloo_store: Path) -> None:
    """Partitions load in worker processes (the task opens the file by path)."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        open_store(gloo_store) as s,
    ):
        total = client.compute(s.events_dask(columns=["dur"])["dur"].sum()).result()
        assert total == sum(int(s.events(r, columns=["dur"])["dur"].sum()) for r in s.ranks)


def test_unknown_rank_and_column(gloo_store: Path) -> None:
    with open_store(gloo_store) as s:
        with pytest.raises(KeyError, match="rank 9"):
            s.events(9)
        with pytest.raises(KeyError, match="unknown event columns"):
            s.events(0, columns=["nope"])


def test_missing_store_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no such store"):
        open_store(tmp_path)


def test_foreign_hdf5_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f["x"] = [1, 2, 3]
    with pytest.raises(InputFileError, match="not a rankscope store") as info:
        open_store(path)
    assert str(path) in str(info.value)


def test_not_hdf5_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "trace.h5"
    path.write_text("hello")
    with pytest.raises(InputFileError, match="not a readable HDF5 store"):
        open_store(path)


def test_newer_schema_version_is_refused(gloo_store: Path, tmp_path: Path) -> None:
    path = tmp_path / "newer.h5"
    path.write_bytes(gloo_store.read_bytes())
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = schema.SCHEMA_VERSION + 1
    with pytest.raises(InputFileError, match="newer") as info:
        open_store(path)
    assert str(path) in str(info.value)


def test_event_columns_are_chunked_and_compressed(big_store: Path) -> None:
    with h5py.File(big_store, "r") as f:
        (rank,) = list(f["ranks"])
        ts = f["ranks"][rank]["events"]["ts"]
        assert ts.chunks is not None and ts.compression is not None
        assert f["strings"].dtype.kind == "O"


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint64", "float64"])
def test_chunks_written_here_are_what_hdf5_writes_and_reads(tmp_path: Path, dtype: str) -> None:
    """A chunked column's chunks are filtered here (``chunk_filters.filtered_chunk``: shuffle, then a
    deflate stream by ISA-L): HDF5 reads back the same values through its own gzip + shuffle
    filters, every chunk unfiltered by hand is the values (an edge chunk padded with zeros, as
    HDF5 pads it), and the dataset declares the same filters as one HDF5 writes itself."""
    import zlib

    from rankscope.analysis.store.layout import EVENT_CHUNK_ROWS
    from rankscope.analysis.store.writer import _write_column

    rng = np.random.default_rng(7)
    n = 2 * EVENT_CHUNK_ROWS + 1234  # two full chunks and an edge one
    info = np.iinfo(dtype) if dtype != "float64" else None
    values = (
        rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        if info is not None
        else rng.standard_normal(n) * 1e9
    )
    values[:100] = 0  # runs, as real columns have
    path = tmp_path / "cols.h5"
    with h5py.File(path, "w") as f:
        _write_column(f, "here", values)
        f.create_dataset(
            "hdf5", data=values, chunks=(EVENT_CHUNK_ROWS,), compression="gzip",
            compression_opts=1, shuffle=True,
        )  # fmt: skip
    with h5py.File(path, "r") as f:
        here, own = f["here"], f["hdf5"]
        assert here.dtype == own.dtype == values.dtype and here.shape == own.shape == (n,)
        assert (here.chunks, here.compression, here.shuffle) == (own.chunks, "gzip", True)
        assert np.array_equal(here[()], values)
        item = values.itemsize
        for start in range(0, n, EVENT_CHUNK_ROWS):
            mask, raw = here.id.read_direct_chunk((start,))
            assert mask == 0
            plain = zlib.decompress(raw)
            assert len(plain) == EVENT_CHUNK_ROWS * item  # edge chunks too: full size
            chunk = np.frombuffer(plain, np.uint8).reshape(item, EVENT_CHUNK_ROWS).T.copy()
            got = chunk.view(values.dtype).reshape(-1)
            part = values[start : start + EVENT_CHUNK_ROWS]
            assert np.array_equal(got[: len(part)], part)
            assert not got[len(part) :].any()  # HDF5's fill value
            _, theirs = own.id.read_direct_chunk((start,))
            assert zlib.decompress(theirs) == plain  # HDF5's own chunk: the same bytes
