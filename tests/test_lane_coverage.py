"""Lane coverage (what the timeline cannot draw event by event) and the time axis' units.

Pure functions, checked against brute force: the coverage of each bin is the union of the
events' intervals (overlaps counted once), split by category priority, and every event is counted
once; the unit of the axis, the hover and the status line fits the span, in Python and in the
browser's tick formatter (run in Node when there is one).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from rankscope.analysis.store.schema import EventKind
from rankscope.analysis.views.lane_coverage import (
    CATEGORY_COLUMNS,
    CATEGORY_OF_KIND,
    PRIORITY,
    LaneCategory,
    bin_edges,
    coverage_rects,
    covered_ns,
    lane_coverage,
)
from rankscope.analysis.views.time_axis import (
    UNITS,
    format_duration,
    format_range,
    format_short,
    format_time,
    tick_js,
    tick_labels,
    unit_for_span,
)

NS_PER_MS = 1_000_000


def _random_events(
    seed: int, n: int = 400, lanes: int = 3, span: int = 20_000, kinds: list[int] | None = None
) -> pd.DataFrame:
    """Events on a few lanes of two ranks: nested, overlapping, touching, zero-length, some
    starting before or ending after the window the tests use; of ``kinds`` (default: all)."""
    rng = np.random.default_rng(seed)
    ts = rng.integers(-500, span + 500, n)
    dur = np.where(rng.random(n) < 0.1, 0, rng.exponential(300, n).astype(np.int64))
    dur[rng.random(n) < 0.05] = 5_000  # long ranges that contain others
    kinds = rng.choice(kinds or [int(k) for k in EventKind], n)
    return pd.DataFrame(
        {
            "rank": rng.integers(0, 2, n),
            "lane": rng.integers(0, lanes, n),
            "ts": ts.astype(np.int64),
            "dur": dur.astype(np.int64),
            "kind": kinds.astype(np.int8),
        }
    )


def _brute(ev: pd.DataFrame, edges: np.ndarray) -> dict[str, np.ndarray]:
    """Per category and in all: covered ns per bin, instant by instant (one bool per ns)."""
    lo, hi = int(edges[0]), int(edges[-1])
    owner = np.full(hi - lo, -1)  # index into PRIORITY of the instant's owner, -1: idle
    rank_of = {c: i for i, c in enumerate(PRIORITY)}
    for t, d, k in zip(ev["ts"], ev["dur"], ev["kind"], strict=True):
        a, b = max(int(t), lo) - lo, min(int(t + d), hi) - lo
        if b <= a:
            continue
        p = rank_of[CATEGORY_OF_KIND[EventKind(int(k))]]
        seg = owner[a:b]
        owner[a:b] = np.where((seg < 0) | (seg > p), p, seg)
    bins = np.searchsorted(edges, np.arange(lo, hi), side="right") - 1
    out = {
        CATEGORY_COLUMNS[c]: np.bincount(bins[owner == i], minlength=len(edges) - 1)
        for i, c in enumerate(PRIORITY)
    }
    out["busy_ns"] = np.bincount(bins[owner >= 0], minlength=len(edges) - 1)
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("only", [None, EventKind.KERNEL_COMPUTE], ids=["mixed", "one-kind"])
def test_coverage_is_the_union_per_bin_and_counts_every_event(
    seed: int, only: EventKind | None
) -> None:
    ev = _random_events(seed, kinds=None if only is None else [int(only)])
    edges = bin_edges((0, 20_000), 37)  # 541 ns bins; the last edge past the window end
    cov = lane_coverage(ev, edges)
    assert int(cov["events"].sum()) == len(ev), "every event in exactly one bin"
    for (rank, lane), lane_ev in ev.groupby(["rank", "lane"]):
        mine = cov[(cov["rank"] == rank) & (cov["lane"] == lane)]
        want = _brute(lane_ev, edges)
        for col, ns in want.items():
            got = np.zeros(len(edges) - 1, np.int64)
            got[mine["bin"].to_numpy()] = mine[col].to_numpy()
            assert np.array_equal(got, ns), (rank, lane, col)
        assert int(mine["events"].sum()) == len(lane_ev)
    parts = cov[list(CATEGORY_COLUMNS.values())].sum(axis=1)
    assert (parts == cov["busy_ns"]).all(), "the categories partition the busy time"
    assert (cov["busy_ns"] <= cov["end_ns"] - cov["start_ns"]).all()


def test_overlapping_events_count_once_and_priority_decides() -> None:
    k = EventKind
    ev = pd.DataFrame(
        {
            "rank": 0,
            "lane": 0,
            "ts": [0, 100, 150, 600, 1000],
            "dur": [1000, 200, 100, 300, 0],
            "kind": [k.USER_ANNOTATION, k.COMM_CPU, k.RUNTIME, k.CPU_OP, k.SYNC],
        }
    )
    cov = lane_coverage(ev, np.array([0, 500, 1000, 1500]))
    assert cov["busy_ns"].tolist() == [500, 500, 0]  # nested ranges: the union, not the sum
    assert cov["communication_ns"].tolist() == [200, 0, 0]  # gloo inside the annotation
    assert cov["compute_ns"].tolist() == [300, 500, 0]
    assert cov["other_ns"].tolist() == [0, 0, 0]  # the runtime call is inside compute
    assert cov["events"].tolist() == [3, 1, 1]  # the zero-length sync at 1000 counts too
    assert covered_ns(
        np.array([0, 100]), np.array([300, 200]), np.array([0, 150, 300])
    ).tolist() == [
        150,
        150,
    ]


def test_a_stream_busy_97_percent_shows_as_97_percent_bars() -> None:
    """10,000 kernels of 97 µs every 100 µs, binned 50 per 1 s view: every bar is 97 % high."""
    ts = np.arange(10_000, dtype=np.int64) * 100_000
    ev = pd.DataFrame(
        {"rank": 0, "lane": 3, "ts": ts, "dur": 97_000, "kind": int(EventKind.KERNEL_COMPUTE)}
    )
    edges = bin_edges((0, 1_000_000_000), 50)
    cov = lane_coverage(ev, edges)
    share = cov["busy_ns"] / (cov["end_ns"] - cov["start_ns"])
    assert len(cov) == 50 and np.allclose(share, 0.97)
    assert (cov["compute_ns"] == cov["busy_ns"]).all()
    bars = coverage_rects(cov, {(0, 3): (2, "r0 stream 3")}, 0, 0.08, unit_for_span(1e9))
    compute = bars[LaneCategory.COMPUTE]
    assert len(compute) == 50 and not any(
        len(b) for c, b in bars.items() if c != LaneCategory.COMPUTE
    )
    height = compute["y1"] - compute["y0"]
    assert np.allclose(height, 0.97 * (1 - 2 * 0.08))
    assert np.allclose(compute["y1"], 3 - 0.08), "bottom-aligned in row 2"
    assert compute["busy"].iloc[0] == "97 %" and compute["lane_name"].iloc[0] == "r0 stream 3"
    assert compute["when"].iloc[0] == "0.0–20.0 ms"


@pytest.mark.parametrize(
    ("span_ns", "unit"),
    [
        (800, "ns"),
        (5_000, "µs"),
        (300_000, "µs"),
        (3 * NS_PER_MS, "ms"),
        (1_500 * NS_PER_MS, "ms"),
        (5 * 10**9, "s"),
        (9 * 60 * 10**9, "s"),
        (34 * 60 * 10**9, "min"),
        (5 * 3600 * 10**9, "h:mm:ss"),
        (3 * 86_400 * 10**9, "h:mm:ss"),
    ],
)
def test_unit_fits_the_span(span_ns: int, unit: str) -> None:
    assert unit_for_span(span_ns).name == unit
    assert unit_for_span(-span_ns).name == unit


def test_tick_labels_and_hover_text() -> None:
    minutes = [m * 60_000.0 for m in (0, 5, 10, 15, 20, 25, 30)]
    assert tick_labels(minutes, 34 * 60_000.0) == [f"{m} min" for m in range(0, 35, 5)]
    assert tick_labels([0.0, 3_600_000.0, 7_200_000.0], 5 * 3_600_000.0) == [
        "0:00:00",
        "1:00:00",
        "2:00:00",
    ]
    assert tick_labels([0.0, 0.05, 0.1], 0.3) == ["0 µs", "50 µs", "100 µs"]
    assert tick_labels([1000.0, 1500.0, 2000.0], 4000.0) == ["1.0 s", "1.5 s", "2.0 s"]
    assert tick_labels([0.0, 250.0, 500.0], 1200.0) == ["0 ms", "250 ms", "500 ms"]
    assert tick_labels([0.0, 0.0002], 0.001) == ["0 ns", "200 ns"]
    for labels in (tick_labels(minutes, 34 * 60_000.0), tick_labels([0.0, 1e6], 2e6)):
        assert not any("e+" in t for t in labels)
    s = 10**9
    assert format_time(754_123_456_789, unit_for_span(34 * 60 * s)) == "12.568724 min"
    assert format_time(1_234_567_891, unit_for_span(3 * NS_PER_MS)) == "1,234.568 ms"
    assert format_time(3723 * s + 500_000, unit_for_span(5 * 3600 * s)) == "1:02:03.000500"
    assert format_duration(12_345) == "12.345 µs" and format_duration(42) == "42 ns"
    assert format_duration(2 * s) == "2.000 s" and format_duration(125 * s) == "0:02:05.000"
    assert format_range(120 * s, 240 * s) == "120–240 s"
    assert format_range(0, 1_200_000) == "0–1,200 µs"
    assert [format_short(ns) for ns in (1_200_000, 144_400, 5_571_000_000, 150 * s, 42)] == [
        "1.2 ms",
        "144 µs",
        "5.57 s",
        "2.5 min",
        "42 ns",
    ]


def test_browser_formatter_writes_what_python_writes() -> None:
    """The axis' CustomJSTickFormatter (run in Node) gives :func:`tick_labels` for every unit."""
    node = shutil.which("node") or shutil.which("nodejs")
    # a failure, never a skip: the suite must test this everywhere (examples/setup.sh --dev
    # installs Debian's nodejs)
    assert node is not None, (
        "no Node.js on PATH: bash examples/setup.sh --dev (apt-get install nodejs)"
    )
    cases = [
        ([0.0, 0.0002, 0.0004], 0.001),
        ([0.0, 0.05, 0.1], 0.3),
        ([10.0, 10.5, 11.0], 3.0),
        ([-200.0, 0.0, 200.0, 400.0], 1200.0),
        ([800.0, 1000.0, 1200.0], 1500.0),
        ([0.0, 1000.0, 2000.0], 5_000.0),
        ([60_000.0, 120_000.0], 9 * 60_000.0),
        ([m * 60_000.0 for m in (0, 5, 10, 15)], 34 * 60_000.0),
        ([m * 30_000.0 for m in (0, 1, 2)], 12 * 60_000.0),
        ([0.0, 1_800_000.0, 3_600_000.0], 3 * 3_600_000.0),
        ([-3_600_000.0, 0.0], 5 * 3_600_000.0),
    ]
    fn = f"function fmt(tick, ticks, xr) {{ {tick_js()} }}"
    script = (
        f"{fn}\nconst cases = {json.dumps(cases)};\n"
        "console.log(JSON.stringify(cases.map(([ticks, span]) => "
        "ticks.map((t) => fmt(t, ticks, {start: 0, end: span})))));"
    )
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    want = [tick_labels(ticks, span) for ticks, span in cases]
    assert got == want
    suffixes = {t.split(" ")[-1] for row in got for t in row if " " in t}
    assert suffixes == {u.name for u in UNITS[:-1]}, "every unit is tried"
    assert "-1:00:00" in got[-1] and "0:30:00" in got[-2], "long spans read as h:mm:ss"
