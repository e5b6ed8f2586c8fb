"""``column_tables.distinct`` and ``column_tables.median``: numpy's ``unique`` and ``median``
restated so that the merge never imports ``numpy.ma`` (their first call does), giving exactly
numpy's answers: the same values and dtype, the same float to the last bit, NaN alike."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from rankscope.orchestrator.ingest.column_tables import distinct, median


def _columns() -> list[np.ndarray]:
    """Random columns of every size from 0 to 9 and some long ones, ints with repeats, floats
    with ties, large magnitudes and NaN."""
    rng = np.random.default_rng(11)
    out: list[np.ndarray] = []
    for n in [*range(10), 101, 1000, 4096]:
        out.append(rng.integers(-5, 5, n))
        out.append(rng.integers(-(2**62), 2**62, n))
        out.append(rng.integers(0, 3, n).astype(np.int32))
        floats = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 15, n)
        out.append(floats)
        out.append(np.round(floats, 0))  # ties
        if n:
            with_nan = floats.copy()
            with_nan[rng.integers(0, n)] = np.nan
            out.append(with_nan)
    return out


@pytest.mark.parametrize("values", _columns(), ids=lambda v: f"{v.dtype}x{len(v)}")
def test_distinct_and_median_are_numpys_answers(values: np.ndarray) -> None:
    if values.dtype.kind in "iu":
        want = np.unique(values)
        got = distinct(values)
        assert got.dtype == want.dtype and np.array_equal(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's median of nothing warns
        want_m = float(np.median(values))
    got_m = median(values)
    assert isinstance(got_m, float)
    assert (np.isnan(want_m) and np.isnan(got_m)) or got_m == want_m
    assert median(values.tolist()) == got_m or np.isnan(got_m)  # a list, as rank_selection has
