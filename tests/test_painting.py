"""paint: ns of boolean combinations of interval sets inside windows, against a count of every ns.

The truth is brute force: for each window, each integer ns ``t`` in ``[start, end)`` is tested
against every set (``s <= t < e`` for one of its intervals) and the category's boolean formula;
the covered ns are counted. Windows overlap, are empty, reversed, lie outside every set or
straddle its ends; categories include negations (``~S``: true outside every set) and constants.
"""

from __future__ import annotations

import numpy as np
from rankscope.analysis.compute.breakdown import interval_union
from rankscope.analysis.compute.painting import paint


def _categories(c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    a, b, s = c["A"], c["B"], c["S"]
    return {
        "a_in_s": s & a,
        "b_only": s & ~a & b,
        "outside_s": ~s,
        "never": s & False,
        "neither": ~(a | b),
    }


def _truth(sets: dict[str, tuple[np.ndarray, np.ndarray]], lo: int, hi: int) -> dict[str, int]:
    ts = np.arange(lo, hi, dtype=np.int64)
    inside = {
        k: np.zeros(len(ts), bool) | np.any((ts[:, None] >= s) & (ts[:, None] < e), axis=1)
        for k, (s, e) in sets.items()
    }
    return {k: int(np.count_nonzero(v)) for k, v in _categories(inside).items()}


def test_paint_counts_every_covered_ns() -> None:
    rng = np.random.default_rng(11)
    for _ in range(400):
        sets = {}
        for k in "ABS":
            n = int(rng.integers(0, 7))
            start = rng.integers(-40, 160, n)
            sets[k] = interval_union(start, start + rng.integers(-8, 50, n))
        m = int(rng.integers(0, 6))
        lo = rng.integers(-70, 220, m)
        hi = lo + rng.integers(-15, 100, m)
        got = paint(sets, _categories, lo, hi)
        if m == 0 and not any(len(s) for s, _ in sets.values()):
            assert got == {}
            continue
        for cat, ns in got.items():
            assert ns.dtype == np.int64 and len(ns) == m
            for w in range(m):
                assert ns[w] == _truth(sets, int(lo[w]), int(hi[w]))[cat], (cat, w)


def test_paint_outside_every_set_and_large_stamps() -> None:
    """A window beyond every set is all ``~S``; stamps near 2**62 ns stay exact (int64)."""
    base = 1 << 62
    sets = {
        "A": (np.array([base + 10]), np.array([base + 20])),
        "B": (np.empty(0, np.int64), np.empty(0, np.int64)),
        "S": (np.array([base]), np.array([base + 30])),
    }
    lo = np.array([base - 100, base + 5, base + 25, base + 1000], np.int64)
    hi = np.array([base - 50, base + 15, base + 60, base + 1000], np.int64)
    got = paint(sets, _categories, lo, hi)
    assert got["outside_s"].tolist() == [50, 0, 30, 0]
    assert got["a_in_s"].tolist() == [0, 5, 0, 0]
    assert got["neither"].tolist() == [50, 5, 35, 0]
    assert got["never"].tolist() == [0, 0, 0, 0]


def test_paint_regular_bins_sum_to_the_whole() -> None:
    """Bins that tile a span measure, summed, what one window over the span measures."""
    rng = np.random.default_rng(5)
    start = rng.integers(0, 10_000, 300)
    sets = {k: interval_union(start, start + rng.integers(1, 400, 300)) for k in "ABS"}
    edges = np.arange(-500, 11_001, 37, dtype=np.int64)
    bins = paint(sets, _categories, edges[:-1], edges[1:])
    whole = paint(sets, _categories, edges[:1], edges[-1:])
    for cat in whole:
        assert int(bins[cat].sum()) == int(whole[cat][0])
