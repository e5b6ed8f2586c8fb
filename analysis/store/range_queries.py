"""Nearest-index queries over an array, all queries at once, by binary lifting.

Two analyses ask, for each of many points, for the nearest index on one side whose value passes
a threshold: the what-if graph's late resumes (:func:`first_below`: the first arrival at or
after a point that comes before it) and the memory table's enclosing ops (:func:`last_at_least`:
the innermost open range, the last started at or before a stamp that ends at or after it). A
scan per query is quadratic when there are thousands of each; here a sparse table of range
minima (maxima) lets every query skip a block of ``2**k`` values at a time when none passes.

Pure numpy, no units: values and limits compare as given (ns in both callers). Lowest floor of
the analysis, so that the store's memory rule and the analyses share it.
"""

from __future__ import annotations

import numpy as np


def first_below(values: np.ndarray, starts: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """For each query q: the first index i >= ``starts[q]`` with ``values[i] < limits[q]``, -1
    where none. All queries at once, by binary lifting over a sparse table of range minima
    (skip a block of 2**k values when none is below the limit); a scan per query (what this
    replaced) is quadratic when a pipeline rank has thousands of blocked points."""
    n = len(values)
    starts = np.asarray(starts, np.int64)
    limits = np.asarray(limits)
    if n == 0 or len(starts) == 0:
        return np.full(len(starts), -1, np.int64)
    table = _sparse_table(np.asarray(values), np.minimum)
    pos = starts.copy()
    for k in range(len(table) - 1, -1, -1):
        size = 2**k
        can = pos + size <= n
        idx = np.flatnonzero(can)
        skip = np.zeros(len(pos), bool)
        skip[idx] = table[k][pos[idx]] >= limits[idx]
        pos = np.where(skip, pos + size, pos)
    inside = pos < n
    hit = np.zeros(len(pos), bool)
    hit[inside] = values[pos[inside]] < limits[inside]
    return np.where(hit, pos, -1).astype(np.int64)


def last_at_least(values: np.ndarray, stops: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """For each query q: the last index i <= ``stops[q]`` with ``values[i] >= limits[q]``, -1
    where none (``stops[q]`` may be -1: none). :func:`first_below`'s mirror, moving left over a
    sparse table of range maxima: a block of 2**k values ending at the current index is skipped
    when all of them are below the limit, so the skips add up to the distance to the answer."""
    n = len(values)
    pos = np.asarray(stops, np.int64)
    limits = np.asarray(limits)
    if n == 0 or len(pos) == 0:
        return np.full(len(pos), -1, np.int64)
    pos = np.minimum(pos, n - 1)
    values = np.asarray(values)
    table = _sparse_table(values, np.maximum)
    for k in range(len(table) - 1, -1, -1):
        size = 2**k
        low = pos - size + 1  # the block [low, pos]
        idx = np.flatnonzero(low >= 0)
        skip = np.zeros(len(pos), bool)
        skip[idx] = table[k][low[idx]] < limits[idx]
        pos = np.where(skip, pos - size, pos)
    inside = pos >= 0
    hit = np.zeros(len(pos), bool)
    hit[inside] = values[pos[inside]] >= limits[inside]
    return np.where(hit, pos, -1).astype(np.int64)


def _sparse_table(values: np.ndarray, combine: np.ufunc) -> list[np.ndarray]:
    """``table[k][i] = combine`` over ``values[i : i + 2**k]`` (``np.minimum``: range minima,
    ``np.maximum``: maxima), for every ``2**k`` up to ``len(values)``."""
    table = [values]
    while 2 ** len(table) <= len(values):
        prev, half = table[-1], 2 ** (len(table) - 1)
        table.append(combine(prev[:-half], prev[half:]))
    return table
