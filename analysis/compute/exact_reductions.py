"""Pandas' reductions on numpy arrays, bit for bit, for analyses that loop over groups.

Selecting a group's rows of a pandas frame and reducing a column costs ~0.1-0.5 ms a call
(``frame[mask]``, ``Series.sum``); a per-rank loop of a dozen such calls is tens of ms a rank.
These functions take the columns once as numpy arrays and each group's rows as positions, and
give what pandas gives: the same sum (numpy's pairwise sum over the values in row order, a
missing value counted as 0, as pandas fills it), the same mean (that sum over the count of
values present), the same median and maximum and the same ``clip(lower=0)`` (-0.0 and NaN kept). Tested
against pandas on NaN, -0.0, integers, booleans and sums longer than numpy's 128-value block
(``tests/test_numpy_paths.py``).
"""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any

import numpy as np
import pandas as pd


def columns_of(frame: pd.DataFrame, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``frame``'s columns ``names`` (those it has) as numpy arrays, in row order."""
    return {c: frame[c].to_numpy() for c in names if c in frame.columns}


def group_positions(keys: np.ndarray) -> dict[Any, np.ndarray]:
    """Row positions of each key of ``keys``, keys ascending, positions in row order: the groups
    and the rows of each of pandas' ``groupby(key, sort=True)`` (a missing key is no group)."""
    if len(keys) == 0:
        return {}
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    valid = ~pd.isna(ordered)
    order, ordered = order[valid], ordered[valid]
    if len(ordered) == 0:
        return {}
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    bounds = [*starts.tolist(), len(ordered)]
    return {ordered[a]: order[a:b] for a, b in itertools.pairwise(bounds)}


def pandas_sum(values: np.ndarray) -> Any:
    """``pd.Series(values).sum()`` bit for bit: missing values skipped (summed as 0, as pandas
    fills them), the rest summed by numpy's pairwise sum in row order."""
    if values.dtype.kind == "f":
        missing = np.isnan(values)
        if missing.any():
            values = np.where(missing, 0.0, values)
    return values.sum()


def pandas_mean(values: np.ndarray) -> float:
    """``pd.Series(values).mean()`` bit for bit: :func:`pandas_sum` in float64 over the count of
    values present (NaN when none is)."""
    values = values.astype(np.float64, copy=False)
    missing = np.isnan(values)
    count = len(values) - int(missing.sum())
    if count == 0:
        return math.nan
    return float(pandas_sum(values) / np.float64(count))


def pandas_median(values: np.ndarray) -> float:
    """``pd.Series(values).median()`` bit for bit: numpy's median of the values present; NaN
    when none is (numpy's NaN of an empty median, as pandas gives, when all are missing)."""
    if len(values) == 0:
        return math.nan
    values = values.astype(np.float64, copy=False)
    present = values[~np.isnan(values)]
    if len(present):
        return float(np.median(present))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy: "Mean of empty slice"
        return float(np.median(present))


def pandas_max(values: np.ndarray) -> Any:
    """``pd.Series(values).max()``: missing values skipped (NaN when none is present)."""
    if values.dtype.kind == "f":
        values = values[~np.isnan(values)]
        if len(values) == 0:
            return math.nan
    return values.max()


def clip_low0(values: np.ndarray) -> np.ndarray:
    """``pd.Series(values).clip(lower=0)``: below 0 becomes 0; NaN, 0.0 and -0.0 stay as they
    are (pandas keeps a value where ``value >= 0`` or where it is missing)."""
    return np.where(values < 0, values.dtype.type(0), values)
