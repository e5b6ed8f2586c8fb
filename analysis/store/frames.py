"""Typed result frames built in one step: :func:`from_rows` and :func:`typed`.

Why: the analyses' results are small frames (a row per step, per stream, per op) with a fixed
schema (``*_COLUMNS``: column → dtype, ``"str"`` for text). Built the plain way —
``pd.DataFrame(rows, columns=…).astype(COLUMNS)`` or ``frame[list(COLUMNS)].astype(COLUMNS)`` —
pandas converts column by column, making a new frame per column and joining them (~1–5 ms per
frame whatever its size; pandas 3 also builds each text column as an Arrow string array and
converts it again). A rank's analysis builds dozens of such frames, which made them a large
share of a small job's analysis (issue 31). Here each column is converted once, as a numpy or
pandas array, and the frame is made once from them.

The result is the plain way's, exactly (values, dtypes, index and column labels; checked
against it in ``tests/test_frames.py``): numeric columns go through numpy's ``astype`` where
it is pandas' own conversion (between bool, integer and float dtypes, except float → integer,
where pandas refuses missing values); every other column (``"str"``, object sources, other
dtypes) through pandas' ``Series.astype``, as before.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

#: numpy dtype kinds between which numpy's astype is pandas' (bool, signed, unsigned, float).
_NUMERIC_KINDS = "biuf"


def _converted(values: Any, dtype: str | None, index: pd.Index) -> Any:
    """One column as ``dtype`` (None: kept as it is), ready for ``pd.DataFrame``."""
    if isinstance(values, pd.Series):
        series = values
    else:
        arr = np.asarray(values)
        if arr.dtype == object:
            arr = arr.astype(object)  # a Series keeps object; a bare array would be inferred
        series = pd.Series(arr, index=index, copy=False)
    if dtype is not None and dtype != "str" and isinstance(series.dtype, np.dtype):
        src, want = series.dtype, np.dtype(dtype)
        if (
            src.kind in _NUMERIC_KINDS
            and want.kind in _NUMERIC_KINDS
            and not (src.kind == "f" and want.kind in "iu")
        ):
            return series.to_numpy().astype(want)
    if dtype is not None:
        series = series.astype(dtype)
    if series.dtype == object:
        return pd.Series(series.to_numpy(), index=index, dtype=object, copy=False)
    return series.array if not isinstance(series.dtype, np.dtype) else series.to_numpy()


def typed(frame: pd.DataFrame, columns: Mapping[str, str | None]) -> pd.DataFrame:
    """``frame[list(columns)].astype(…)``: ``frame``'s columns named in ``columns``, in its order,
    each as its dtype (None: as it is), ``frame``'s index kept."""
    data = {c: _converted(frame[c], d, frame.index) for c, d in columns.items()}
    return pd.DataFrame(data, index=frame.index, copy=False) if data else frame[[]].copy()


def from_rows(rows: Sequence[Sequence[Any]], columns: Mapping[str, str | None]) -> pd.DataFrame:
    """``pd.DataFrame(rows, columns=list(columns)).astype(…)``: one row per tuple (in
    ``columns``' order), each column as its dtype (None: as pandas infers it).

    No rows: a copy of the frame this function made the first time for the same columns and
    the same meaning of ``"str"`` (pandas' string setting, :data:`_NO_ROWS`): converting a dozen
    empty columns cost ~1 ms, and a rank's analyses make several such frames (no blocking
    copies, no fusion candidates)."""
    rows = list(rows)
    if not rows:
        return _made_once("from_rows", columns, lambda: _from_rows([], columns))
    return _from_rows(rows, columns)


#: Frames without rows made by :func:`from_rows` and :func:`empty`, by (function, columns, the
#: dtype ``"str"`` stands for).
_NO_ROWS: dict[tuple[Any, ...], pd.DataFrame] = {}


def _made_once(
    how: str, columns: Mapping[str, str | None], make: Callable[[], pd.DataFrame]
) -> pd.DataFrame:
    """A copy of the frame without rows ``make()`` returned the first time for ``how``, the same
    columns and the same meaning of ``"str"`` (pandas' string setting)."""
    key = (how, tuple(columns.items()), pd.api.types.pandas_dtype("str"))
    made = _NO_ROWS.get(key)
    if made is None:
        made = _NO_ROWS[key] = make()
    return made.copy(deep=True)


def _from_rows(rows: list[Sequence[Any]], columns: Mapping[str, str | None]) -> pd.DataFrame:
    """:func:`from_rows` proper."""
    index = pd.RangeIndex(len(rows))
    cells = list(zip(*rows, strict=True)) if rows else [()] * len(columns)
    data = {
        c: _converted(pd.Series(list(col), index=index, dtype=None if rows else object), d, index)
        for (c, d), col in zip(columns.items(), cells, strict=True)
    }
    return pd.DataFrame(data, index=index, copy=False)


def empty(columns: Mapping[str, str]) -> pd.DataFrame:
    """``pd.DataFrame({c: pd.Series([], dtype=d) for c, d in columns.items()})``: no rows, each
    column of its dtype (``"str"``, ``object`` and numpy dtypes); a copy of the frame made the
    first time for the same columns and meaning of ``"str"``, as :func:`from_rows` without rows."""
    return _made_once("empty", columns, lambda: _empty(columns))


def _empty(columns: Mapping[str, str]) -> pd.DataFrame:
    """:func:`empty` proper."""
    index = pd.RangeIndex(0)
    data: dict[str, Any] = {}
    for c, d in columns.items():
        if d == "str":
            data[c] = pd.array([], dtype="str")
        elif np.dtype(d) == object:
            data[c] = pd.Series([], index=index, dtype=object)
        else:
            data[c] = np.empty(0, np.dtype(d))
    return pd.DataFrame(data, index=index, copy=False)


@functools.lru_cache(maxsize=256)
def _row_type(columns: tuple[str, ...]) -> Any:
    return collections.namedtuple("Pandas", columns, rename=True)  # itertuples' own name


def rows(frame: pd.DataFrame) -> list[Any]:
    """``list(frame.itertuples(index=False))``: one named tuple per row, Python scalars.

    Why: pandas' ``itertuples`` takes every column as a Series (``iloc[:, k]``), ~0.5–1 ms a
    column on pandas 3, whose column labels are an Arrow string array: the summary iterates a
    dozen frames of ten to twenty columns. Here the frame is taken as one object array (its
    blocks converted once) and the tuple type made once per set of columns."""
    if len(frame.columns) > 254:  # beyond a named tuple's fields: pandas' own path
        return list(frame.itertuples(index=False))
    make = _row_type(tuple(str(c) for c in frame.columns))._make
    return [make(r) for r in frame.to_numpy(dtype=object).tolist()]


def per_rank(
    frame: pd.DataFrame, ranks: Iterable[int], columns: list[str]
) -> dict[int, pd.DataFrame]:
    """``{rank: frame[frame["rank"] == rank][columns]}`` for each of ``ranks`` (no rows for a rank
    the frame lacks): the same rows, index labels and order, from one grouping. Filtering the
    whole table once per rank grew with ranks × rows, and a job's collectives table holds every
    rank's rows (the merge's ``coll`` column, the analysis' rank tasks, the overview's)."""
    rows = frame.groupby("rank", sort=False).indices
    none = np.empty(0, np.intp)
    part = frame[columns]
    return {int(r): part.iloc[rows.get(r, none)] for r in ranks}
