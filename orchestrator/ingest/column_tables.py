"""The merge's tables as columns: a dict of numpy arrays, one value per row in each.

Why not DataFrames: the merge runs where pandas is not imported yet (docs/architecture.md, "The
merge without pandas"), and its tables need only these few operations: rows by position, tables
one after the other, rows made columns, and a group's largest or smallest value (``groupby``'s
``max``/``min``, as ``ufunc.at`` over group numbers). Two of numpy's own, ``unique`` and
``median``, are restated (:func:`distinct`, :func:`median`) as their first call imports
``numpy.ma``, which nothing of the merge needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

#: A table as columns: name → one array, every array one value per row.
Columns = dict[str, np.ndarray]


def rows_of(table: Columns, rows: np.ndarray) -> Columns:
    """The rows ``rows`` (positions) of every column."""
    return {c: v[rows] for c, v in table.items()}


def concat_rows(tables: list[Columns]) -> Columns:
    """The tables' rows one after the other (each has the first's columns)."""
    return {c: np.concatenate([t[c] for t in tables]) for c in tables[0]}


def from_rows(rows: Sequence[Sequence[Any]], dtypes: Mapping[str, Any]) -> Columns:
    """Columns of ``rows`` (tuples in ``dtypes``' order), each in its dtype; empty columns of
    those dtypes without rows."""
    fields = list(zip(*rows, strict=True)) or [()] * len(dtypes)
    return {c: np.array(v, dtype=d) for (c, d), v in zip(dtypes.items(), fields, strict=True)}


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of an integer column, ascending (``np.unique``'s answer).

    Why not ``np.unique``: without ``return_index``/``_inverse``/``_counts`` it first asks
    whether the array is masked, and that first question imports ``numpy.ma`` (6-7 ms of a
    54 MB rank's merge, in each of its two processes; measured with ``-X importtime``)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def median(values: Any) -> float:
    """``np.median(values)`` of a 1-D column, the same float: the middle value, or the mean of
    the two middle ones, of the sorted values; NaN when one is NaN or there is none.

    Why not ``np.median``: for floats it asks whether the NaN it checks for is masked, and that
    first question imports ``numpy.ma`` (see :func:`distinct`)."""
    ordered = np.sort(np.asarray(values), axis=None)
    n = len(ordered)
    if n == 0 or (ordered.dtype.kind in "fc" and np.isnan(ordered[-1])):
        return float("nan")
    k = n // 2
    if n % 2:
        return float(ordered[k])
    return float(np.add(ordered[k - 1], ordered[k], dtype=np.float64) / 2)


def mapped(values: np.ndarray, mapping: Mapping[int, int], missing: int = -1) -> np.ndarray:
    """``mapping`` of each of ``values`` (int64; ``missing`` where it has none), looked up once
    per distinct value (pandas' ``Series.map`` of a dict, without a Python call per row)."""
    keys, at = np.unique(np.asarray(values).astype(np.int64), return_inverse=True)
    lookup = np.array([mapping.get(v, missing) for v in keys.tolist()], dtype=np.int64)
    return lookup[at.reshape(-1)]


def group_max(group: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """The largest of ``values`` per group number ``0..n-1`` (each number has a row); objects
    where ``values`` are (a trace's number beyond int64: ``file_trace._integers``)."""
    return _extreme(group, values, n, np.maximum, np.iinfo(np.int64).min, max)


def group_min(group: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """The smallest of ``values`` per group number ``0..n-1`` (each number has a row)."""
    return _extreme(group, values, n, np.minimum, np.iinfo(np.int64).max, min)


def _extreme(
    group: np.ndarray,
    values: np.ndarray,
    n: int,
    ufunc: np.ufunc,
    start: int,
    pick: Callable[[Any, Any], Any],
) -> np.ndarray:
    if values.dtype != object:
        out = np.full(n, start, dtype=np.int64)
        ufunc.at(out, group, values)
        return out
    best: list[Any] = [None] * n
    for g, v in zip(group.tolist(), values.tolist(), strict=True):
        best[g] = v if best[g] is None else pick(best[g], v)
    return np.array(best, dtype=object)
