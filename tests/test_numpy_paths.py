"""The per-rank analyses' numpy forms (issue 31: a small job's analysis without a pandas frame per
step) against the pandas formulations they replaced, on hand-built ranks whose awkward cases the
real sets seldom hold: repeated keys out of order, a correlation id with two GPU events, launches
and GPU starts at the same instant on two streams, rows before the profiled steps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest
from analysis_frames import GPU_LANES, events, lanes
from rankscope.analysis.compute import breakdown as bd
from rankscope.analysis.compute import exact_reductions as X
from rankscope.analysis.compute import kernel_launches as kl
from rankscope.analysis.compute import stragglers as S
from rankscope.analysis.compute.ops import OP_KINDS, _first_seen_groups, op_stats, op_table
from rankscope.analysis.store.frames import rows, typed
from rankscope.analysis.store.schema import EventKind as K

US = 1000


def test_first_seen_groups_number_groups_as_pandas_groupby_does() -> None:
    gen = np.random.default_rng(7)
    a, b, c = (gen.integers(0, n, 500) for n in (9, 4, 3))
    group, first = _first_seen_groups(a, b, c)
    frame = pd.DataFrame({"a": a, "b": b, "c": c})
    want = frame.groupby(["a", "b", "c"], sort=False).ngroup().to_numpy()
    np.testing.assert_array_equal(group, want)
    np.testing.assert_array_equal(first, frame.drop_duplicates(["a", "b", "c"]).index)


def test_first_seen_groups_of_small_and_huge_ranges() -> None:
    """Random keys whose ranges' product fits (one combined key made directly) or would pass
    2**62 (renumbered first): the same groups as pandas either way."""
    gen = np.random.default_rng(31)
    for _ in range(500):
        n, k = int(gen.integers(1, 60)), int(gen.integers(1, 4))
        keys = [gen.integers(0, int(gen.choice([2, 13, 1000, 2**40])), n) for _ in range(k)]
        group, first = _first_seen_groups(*keys)
        frame = pd.DataFrame({f"k{i}": key for i, key in enumerate(keys)})
        cols = list(frame.columns)
        np.testing.assert_array_equal(group, frame.groupby(cols, sort=False).ngroup().to_numpy())
        np.testing.assert_array_equal(first, frame.drop_duplicates(cols).index)


def busy_rank() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A host thread (lane 0) launching on streams 7 and 20 (lanes 1, 2): correlation 2 has two GPU
    events, 5 none, launches and GPU starts share instants, names repeat out of order."""
    rows_ = [
        (-10 * US, 300 * US, "aten::mm", K.CPU_OP, 0),
        (0, 3 * US, "cudaLaunchKernel", K.RUNTIME, 0, -1, 1),
        (3 * US, 3 * US, "cudaMemcpyAsync", K.RUNTIME, 0, -1, 2),
        (6 * US, 3 * US, "cudaLaunchKernel", K.RUNTIME, 0, -1, 3),
        (6 * US, 2 * US, "aten::add", K.CPU_OP, 0),
        (9 * US, 3 * US, "cudaLaunchKernel", K.RUNTIME, 0, -1, 4),
        (12 * US, 3 * US, "cudaLaunchKernel", K.RUNTIME, 0, -1, 5),
        (20 * US, 2 * US, "aten::mm", K.CPU_OP, 0),
        (3 * US, 10 * US, "kA", K.KERNEL_COMPUTE, 1, -1, 1),
        (9 * US, 4 * US, "Memcpy HtoD", K.MEMCPY, 2, -1, 2),
        (14 * US, 4 * US, "kB", K.KERNEL_COMPUTE, 2, -1, 2),
        (9 * US, 5 * US, "kA", K.KERNEL_COMPUTE, 1, -1, 3),
        (12 * US, 1 * US, "kC", K.KERNEL_COMPUTE, 2, -1, 4),
    ]
    return events(rows_), lanes(GPU_LANES)


def test_launches_are_the_calls_merged_with_their_gpu_events() -> None:
    ev, ln = busy_rank()
    got = kl.launches(ev, ln, rank=2, drop_last_step=False)
    ts, end, kept = bd.hta_view(ev, ln, 0, False)
    names = ev["name"].astype(str).to_numpy(object)
    corr = ev["corr"].to_numpy()
    stream = kl.lane_streams(ln)[ev["lane"].to_numpy()]
    call = kept & (stream < 0) & np.isin(names, list(kl.LAUNCH_STAT_CALLS)) & (corr >= 0)
    gpu = kept & (stream >= 0) & np.isin(corr, corr[call])
    cpu = pd.DataFrame({"corr": corr[call], "cpu_ts": ts[call], "cpu_ns": end[call] - ts[call]})
    dev = pd.DataFrame(
        {"corr": corr[gpu], "kernel": names[gpu], "gpu_ts": ts[gpu], "gpu_ns": end[gpu] - ts[gpu]}
    )
    j = cpu.merge(dev, on="corr", how="inner")
    j["delay_ns"] = (j["gpu_ts"] - j["cpu_ts"] - j["cpu_ns"]).clip(lower=0)
    j["rank"] = 2
    pdt.assert_frame_equal(got, typed(j, kl.LAUNCH_COLUMNS), check_exact=True)
    assert got["corr"].tolist() == [1, 2, 2, 3, 4]


@pytest.mark.parametrize("launch_first", [True, False])
def test_queue_length_is_the_running_sum_per_stream(launch_first: bool) -> None:
    ev, ln = busy_rank()
    got = kl.queue_length(ev, ln, rank=1, drop_last_step=False, launch_first=launch_first)
    ts, _, kept = bd.hta_view(ev, ln, 0, False)
    names = ev["name"].astype(str).to_numpy(object)
    corr = ev["corr"].to_numpy()
    stream = kl.lane_streams(ln)[ev["lane"].to_numpy()]
    call = kept & (stream < 0) & np.isin(names, list(kl.QUEUE_CALLS)) & (corr >= 0)
    gpu = kept & (stream >= 0) & (corr >= 0) & np.isin(corr, corr[call])
    call &= np.isin(corr, corr[gpu])
    g = pd.DataFrame({"corr": corr[gpu], "stream": stream[gpu]}).drop_duplicates("corr")
    c = pd.DataFrame({"corr": corr[call], "ts": ts[call], "delta": 1}).merge(g, on="corr")
    k = pd.DataFrame({"ts": ts[gpu], "delta": -1, "stream": stream[gpu]})
    both = pd.concat([c[["ts", "delta", "stream"]], k], ignore_index=True).sort_values(
        ["stream", "ts", "delta"], ascending=[True, True, not launch_first], kind="stable"
    )
    both["queue_length"] = both.groupby("stream")["delta"].cumsum()
    both["rank"] = 1
    pdt.assert_frame_equal(got, typed(both.reset_index(drop=True), kl.QUEUE_COLUMNS))
    assert set(got["stream"]) == {7, 20}


def test_op_stats_and_op_table_group_as_pandas_does() -> None:
    ev, ln = busy_rank()
    stats = op_stats(ev, rank=4)
    host = ev[ev["kind"].isin([int(k) for k in OP_KINDS])]
    want = (
        host.assign(name=host["name"].astype(str))
        .groupby(["name", "kind"], sort=False)["dur"]
        .agg(["size", "sum", "max"])
    )
    assert list(
        zip(stats["name"], stats["count"], stats["total_ns"], stats["max_ns"], strict=True)
    ) == [
        (n, c, s, m) for (n, _), (c, s, m) in zip(want.index, want.to_numpy().tolist(), strict=True)
    ]
    table = op_table(ev, rank=4, lanes=ln)
    assert table.groupby(["name", "kind"]).size().max() == 1
    assert table.loc[table["name"] == "kA", "device_total_ns"].tolist() == [15 * US]
    assert table.loc[table["name"] == "aten::mm", "count"].tolist() == [2]


def test_step_rows_then_the_whole_run_row_summing_them() -> None:
    windows = pd.DataFrame({"step": [5, -1, 4], "start": [100, 0, 50], "end": [160, 40, 100]})

    def measure(start: np.ndarray, end: np.ndarray) -> dict[str, np.ndarray]:
        return {"compute_ns": (end - start) // 2, "idle_ns": (end - start) - (end - start) // 2}

    got = bd.measure_windows(measure, bd.Device.GPU, windows, 3)
    assert got["step"].tolist() == [4, 5, bd.WHOLE_RUN_STEP]
    assert got["total_ns"].tolist() == [50, 60, 110]
    assert got["compute_ns"].tolist() == [25, 30, 55]
    assert (got["start"].iloc[-1], got["end"].iloc[-1]) == (50, 160)
    assert got["device"].tolist() == [str(bd.Device.GPU)] * 3
    assert dict(got.dtypes.astype(str)) == {
        c: ("str" if d == "str" else d) for c, d in bd.BREAKDOWN_COLUMNS.items()
    }
    only_before = bd.measure_windows(measure, bd.Device.GPU, windows[windows["step"] < 0], 3)
    assert only_before["step"].tolist() == [-1]


@pytest.mark.parametrize("width", [6, 300])
def test_rows_are_what_itertuples_gives(width: int) -> None:
    frame = pd.DataFrame(
        {
            "rank": np.array([0, 1, 2], np.int32),
            "name": pd.array(["a", None, "c"], dtype="str"),
            "obj": pd.Series(["x", 1, None], dtype=object),
            "ms": [1.5, float("nan"), 3.0],
            "ok": [True, False, True],
            "class": [1, 2, 3],  # a keyword: renamed by position, as pandas does
        }
    )
    more = pd.DataFrame({f"c{i}": [i] * 3 for i in range(width - frame.shape[1])})
    frame = pd.concat([frame, more], axis=1)
    got, want = rows(frame), list(frame.itertuples(index=False))
    assert [type(r).__name__ for r in got] == [type(r).__name__ for r in want]
    assert [getattr(r, "_fields", None) for r in got] == [getattr(r, "_fields", None) for r in want]
    for g, w in zip(got, want, strict=True):
        assert [type(v) for v in g] == [type(v) for v in w]
        assert [v if v == v else "nan" for v in g] == [v if v == v else "nan" for v in w]
    assert rows(frame.iloc[:0]) == []


# ------------------------------------------------------------------ stragglers' per-rank tests
EDGE_VALUES = [
    np.array([], np.float64),
    np.array([np.nan, np.nan]),
    np.array([-0.0, 0.0, -0.0]),
    np.array([-0.0]),
    np.array([1e18, 1.0, -1e18, 3.5, np.nan, -2.25, 1e-9]),
    np.random.default_rng(3).normal(0, 1e7, 777),  # more than numpy's pairwise block of 128
    np.array([3, -4, 0, 9], np.int64),
    np.array([2.5, np.nan, -1.0, 7.0]),  # an even count of values present: two middles averaged
    np.array([True, False, True]),
]


@pytest.mark.parametrize("values", EDGE_VALUES, ids=range(len(EDGE_VALUES)))
def test_straggler_reductions_are_pandas_bit_for_bit(values: np.ndarray) -> None:
    """``pandas_sum`` / ``pandas_mean`` / ``pandas_median`` / ``pandas_max`` / ``clip_low0`` give
    pandas' float bits
    (summation order, -0.0, NaN skipped) and types."""
    series = pd.Series(values)

    def same(mine: object, theirs: object) -> None:
        assert type(float(mine)) is type(float(theirs))  # type: ignore[arg-type]
        assert np.float64(mine).tobytes() == np.float64(theirs).tobytes()  # type: ignore[arg-type]

    same(X.pandas_sum(values), series.sum())
    if values.dtype.kind != "b":
        same(X.pandas_mean(values), series.mean())
        clipped = X.clip_low0(values)
        want = series.clip(lower=0).to_numpy()
        assert clipped.dtype == want.dtype
        assert clipped.tobytes() == want.tobytes()
        same(X.pandas_sum(clipped), series.clip(lower=0).sum())
        if len(values):
            same(X.pandas_max(values), series.max())
            same(X.pandas_median(values), series.median())


def test_rank_positions_are_pandas_groups() -> None:
    keys = np.random.default_rng(5).integers(0, 6, 300)
    mine = X.group_positions(keys)
    theirs = pd.Series(keys).groupby(keys, sort=True).indices
    assert list(mine) == sorted(theirs)
    for k, at in mine.items():
        np.testing.assert_array_equal(at, theirs[k])
    assert X.group_positions(np.array([], np.int64)) == {}


def _own_rows_pandas(extras: pd.DataFrame, rank: int, last_units: np.ndarray) -> pd.DataFrame:
    """The pandas formulation ``_own_rows`` replaced (``_rank_rows`` before issue 31's 5th pass)."""
    at_last = extras[(extras["rank"] == rank) & extras["unit"].isin(last_units)]
    has_last = at_last.groupby("unit")["is_last"].transform("any")
    at_last = at_last[at_last["is_last"] | ~has_last]
    span = at_last["window_end"] - at_last["window_start"]
    mine = at_last.assign(_span=span).sort_values("_span", kind="stable")
    return mine.groupby("unit").tail(1).drop(columns="_span")


@pytest.mark.parametrize("seed", range(6))
def test_own_rows_are_the_pandas_selection_in_its_order(seed: int) -> None:
    """Per unit where the rank was last: its largest window (ties: the later row, as pandas'
    stable sort + ``tail`` keeps), among its collectives where it was last when the unit has
    any; the rows in pandas' order, so that their sums match bit for bit."""
    gen = np.random.default_rng(seed)
    n = 120
    start = gen.integers(0, 50, n) * 1000
    extras = pd.DataFrame(
        {
            "rank": gen.integers(0, 3, n),
            "unit": gen.integers(0, 9, n),
            "is_last": gen.random(n) < 0.4,
            "window_start": start,
            "window_end": start + gen.integers(0, 4, n) * 1000,  # many equal spans
            **{c: gen.normal(0, 1e6, n) for c in ("late_ns", "own_ns", *S.CAUSE_COLUMNS.values())},
        }
    )
    ex = X.columns_of(extras, S.EXTRA_COLUMNS)
    for rank in range(3):
        last_units = np.unique(gen.integers(0, 9, 5))
        mine = S._own_rows(extras, ex, np.int64(rank), last_units)
        theirs = _own_rows_pandas(extras, rank, last_units)
        assert len(theirs) > 0
        for c in mine:
            assert mine[c].tobytes() == theirs[c].to_numpy().tobytes()
    empty = S._own_rows(extras.iloc[:0], {}, np.int64(0), np.array([1]))
    assert all(len(v) == 0 for v in empty.values())
