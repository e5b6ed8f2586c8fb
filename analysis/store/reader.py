"""The merged HDF5 store: the reader every analysis uses (:class:`Store`, :func:`open_store`).

One self-contained ``trace.h5`` per run (layout in ``docs/format.md`` and ``store_layout.py``,
contract in :mod:`rankscope.analysis.store.schema`). Tables are stored *columnar*: a group with one 1-D
dataset per column (chunked and compressed), so a reader loads only the columns it asks for.
Strings that repeat (event names, categories) are interned once in ``/strings`` and stored as
int32 codes; they come back as pandas categoricals whose categories are the whole string table
(the same categories on every rank, so per-rank frames concatenate cheaply; use
``observed=True`` when grouping).

Every time is int64 ns on the aligned clock (see ``/clock`` for how to recover a rank's raw clock).

The writer the merge uses is :class:`StoreWriter` in ``store_writer.py``, the layout's names in
``store_layout.py``, the refusal of links that point outside a store in ``store_links.py``;
all of them can still be imported from here.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import h5py
import numpy as np
import pandas as pd
from rankscope.analysis.store import schema, string_tables
from rankscope.analysis.store.hdf5_links import MAX_GROUP_DEPTH as MAX_GROUP_DEPTH
from rankscope.analysis.store.hdf5_links import refuse_outside_references_once
from rankscope.analysis.store.layout import CHANGES as CHANGES
from rankscope.analysis.store.layout import CLOCK as CLOCK
from rankscope.analysis.store.layout import COLLECTIVES as COLLECTIVES
from rankscope.analysis.store.layout import COMPRESSION as COMPRESSION
from rankscope.analysis.store.layout import COMPRESSION_LEVEL as COMPRESSION_LEVEL
from rankscope.analysis.store.layout import EVENT_CHUNK_ROWS as EVENT_CHUNK_ROWS
from rankscope.analysis.store.layout import EVENTS as EVENTS
from rankscope.analysis.store.layout import LANES as LANES
from rankscope.analysis.store.layout import MEMORY as MEMORY
from rankscope.analysis.store.layout import MEMORY_STRING_CODED as MEMORY_STRING_CODED
from rankscope.analysis.store.layout import PROBLEMS as PROBLEMS
from rankscope.analysis.store.layout import RANK_GROUP_FORMAT as RANK_GROUP_FORMAT
from rankscope.analysis.store.layout import RANKS as RANKS
from rankscope.analysis.store.layout import STEP_LOG as STEP_LOG
from rankscope.analysis.store.layout import STEPS as STEPS
from rankscope.analysis.store.layout import STORE_NAME as STORE_NAME
from rankscope.analysis.store.layout import STRING_CODED as STRING_CODED
from rankscope.analysis.store.layout import STRINGS as STRINGS
from rankscope.analysis.store.layout import attr_python, rank_group
from rankscope.analysis.store.writer import StoreWriter as StoreWriter
from rankscope.analysis.store.writer import _GuardedFile as _GuardedFile
from rankscope.analysis.store.writer import write_table as write_table
from rankscope.errors import InputFileError

if TYPE_CHECKING:
    import dask.dataframe as dd

P = ParamSpec("P")
R = TypeVar("R")


def read_table(
    parent: h5py.Group, name: str, columns: Mapping[str, str], *, rows: slice | None = None
) -> pd.DataFrame:
    """Read a table written by :func:`write_table` (empty frame with the schema if absent)."""
    out: dict[str, Any] = {}
    group = parent.get(name)
    for col, dtype in columns.items():
        if group is None or col not in group:
            out[col] = np.array([], dtype=object if dtype == "str" else dtype)
            continue
        ds = group[col]
        if dtype == "str":
            raw = ds.asstr()[rows if rows is not None else ()]
            out[col] = np.asarray(raw, dtype=object)
        else:
            out[col] = ds[rows if rows is not None else ()].astype(dtype, copy=False)
    return pd.DataFrame(out)


def resolve_store_path(path: str | Path) -> Path:
    """``path`` itself when it is a file, else ``path/trace.h5`` (a run directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / STORE_NAME
    return p


#: What h5py and numpy raise on a damaged store: the reader turns each into one InputFileError
#: line (docs/reliability.md, "Foreign and hostile stores").
READ_ERRORS = (
    OSError,
    LookupError,
    ValueError,
    TypeError,
    AttributeError,
    RuntimeError,
    ArithmeticError,
    RecursionError,
)


class StoreKeyError(KeyError):
    """A rank or column the store does not hold: the caller's mistake, not damage (kept as is)."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn what a damaged store makes h5py raise into one :class:`InputFileError` line."""
    try:
        yield
    except (StoreKeyError, InputFileError):
        raise
    except FileNotFoundError:
        raise InputFileError(f"{path}: the store was removed while it was read") from None
    except READ_ERRORS as exc:
        raise InputFileError(
            f"{path}: damaged store ({type(exc).__name__}: {_one_line(exc)}); merge the run again"
        ) from None


def _reads(method: Callable[Concatenate[Store, P], R]) -> Callable[Concatenate[Store, P], R]:
    """Decorator: the reader method runs under :func:`_reading` (its store's path)."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: P.args, **kwargs: P.kwargs) -> R:
        with _reading(self.path):
            return method(self, *args, **kwargs)

    return wrapper


class Store:
    """A merged store opened for reading (``rankscope.open``). Also a context manager.

    Reads are lazy: each call loads only the datasets (and rows) it needs.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file = h5py.File(path, "r")
        except FileNotFoundError:
            raise InputFileError(f"{path}: no such store (run `rankscope merge` first)") from None
        except READ_ERRORS as exc:
            raise InputFileError(f"{path}: not a readable HDF5 store ({_one_line(exc)})") from None
        try:
            self._check()
        except BaseException:
            self._file.close()
            raise
        self._version = string_tables.file_version(self._file)
        self._strings: Any = None
        self._categories: Any = None

    def _check(self) -> None:
        """Refuse a foreign store, a newer schema, and links or data that point outside."""
        path = self.path
        with _reading(path):
            attrs = self._file.attrs
            name = attr_python(attrs.get("schema_name", ""))
            raw_version = attr_python(attrs.get("schema_version", -1))
        if name != schema.SCHEMA_NAME:
            raise InputFileError(f"{path}: not a rankscope store (schema {name!r})")
        if not isinstance(raw_version, int) or isinstance(raw_version, bool) or raw_version < 1:
            raise InputFileError(f"{path}: not a rankscope store (schema version {raw_version!r})")
        if raw_version > schema.SCHEMA_VERSION:
            raise InputFileError(
                f"{path}: written by a newer rankscope (store schema version {raw_version}; "
                f"this rankscope reads up to {schema.SCHEMA_VERSION}); upgrade rankscope"
            )
        with _reading(path):
            refuse_outside_references_once(path, self._file)

    # -- whole-store facts -------------------------------------------------------------------
    @property
    @_reads
    def ranks(self) -> list[int]:
        """Ranks present in the store (ascending)."""
        return [int(r) for r in self._file.attrs.get("ranks", [])]

    @property
    @_reads
    def world_size(self) -> int:
        """World size of the job (may exceed ``len(ranks)`` when ranks were missing)."""
        return int(self._file.attrs.get("world_size", len(self.ranks)))

    @property
    @_reads
    def meta(self) -> dict[str, Any]:
        """Root attributes: schema, run_id, world_size, tool versions, created, source."""
        return {k: attr_python(v) for k, v in self._file.attrs.items()}

    @property
    @_reads
    def strings(self) -> np.ndarray:
        """The interned string table (object array; codes index into it)."""
        if self._strings is None:
            known = string_tables.known(self._version)
            if known is not None:
                self._strings, self._categories = known
                return self._strings
            ds = self._file.get(STRINGS)
            strings = (
                np.asarray(ds.asstr()[()], dtype=object) if ds is not None else np.array([], object)
            )
            strings.flags.writeable = False  # shared by every Store of this file version
            self._strings = strings
        return self._strings

    def _category_dtype(self) -> Any:
        """The pandas dtype of the string-coded columns (categories: the string table), built
        once per file version in this process (:mod:`.string_tables`)."""
        if self._categories is None:
            strings = self.strings
            if self._categories is None:
                self._categories = pd.CategoricalDtype(pd.Index(strings, dtype=object))
                string_tables.keep(self._version, strings, self._categories)
        return self._categories

    def _rank(self, rank: int) -> h5py.Group:
        key = rank_group(int(rank))
        if key not in self._file:
            raise StoreKeyError(f"rank {rank} is not in {self.path} (ranks: {self.ranks})")
        return self._file[key]

    # -- per-rank tables ---------------------------------------------------------------------
    @_reads
    def events(
        self,
        rank: int,
        columns: Sequence[str] | None = None,
        window: tuple[int, int] | None = None,
    ) -> pd.DataFrame:
        """Events of ``rank`` sorted by ``ts`` (schema.EVENT_COLUMNS).

        ``window=(start_ns, end_ns)`` on the aligned clock selects the events overlapping it
        (``ts < end_ns`` and ``ts + dur > start_ns``; zero-length events at ``start_ns`` count).
        Only the rows that can overlap are read: ``ts`` is sorted and the rank's longest duration
        (attribute ``max_dur_ns``) bounds how early an overlapping event can start.
        """
        cols = list(schema.EVENT_COLUMNS) if columns is None else list(columns)
        known = {**schema.EVENT_COLUMNS, **schema.SHAPE_COLUMNS}
        unknown = [c for c in cols if c not in known]
        if unknown:
            raise StoreKeyError(f"unknown event columns {unknown}; known: {list(known)}")
        group = self._rank(rank)
        ev = group[EVENTS]
        rows: slice | np.ndarray = slice(None)
        keep: np.ndarray | None = None
        if window is not None:
            start, end = int(window[0]), int(window[1])
            ts_ds = ev["ts"]
            lo_bound = start - int(group.attrs.get("max_dur_ns", 0))
            ts_all = ts_ds[()] if ts_ds.shape[0] < EVENT_CHUNK_ROWS else None
            if ts_all is not None:
                lo = int(np.searchsorted(ts_all, lo_bound, side="left"))
                hi = int(np.searchsorted(ts_all, end, side="left"))
            else:
                lo, hi = _searchsorted_ds(ts_ds, lo_bound), _searchsorted_ds(ts_ds, end)
            rows = slice(lo, hi)
            ts = ev["ts"][rows]
            dur = ev["dur"][rows]
            keep = (ts + dur > start) | ((dur == 0) & (ts >= start))
        out: dict[str, Any] = {}
        for col in cols:
            if col in schema.SHAPE_COLUMNS and col not in ev:  # not recorded: all missing
                n = len(ev["ts"][rows]) if keep is None else int(keep.sum())
                out[col] = pd.Categorical.from_codes(
                    np.full(n, -1, np.int32), dtype=self._category_dtype()
                )
                continue
            values = ev[col][rows]
            if keep is not None:
                values = values[keep]
            dtype = known[col]
            if col in STRING_CODED or col in schema.SHAPE_COLUMNS:
                out[col] = pd.Categorical.from_codes(values, dtype=self._category_dtype())
            else:
                out[col] = values.astype(dtype, copy=False)
        return pd.DataFrame(out, columns=cols)

    @_reads
    def has_shapes(self, rank: int) -> bool:
        """The rank's events carry input shapes (recorded with ``record_shapes=True``)."""
        return "shapes" in self._rank(rank)[EVENTS]

    @_reads
    def lanes(self, rank: int) -> pd.DataFrame:
        """Lanes (host threads and GPU streams) of ``rank``; row index == lane id."""
        return read_table(self._rank(rank), LANES, schema.LANE_COLUMNS)

    @_reads
    def rank_meta(self, rank: int) -> dict[str, Any]:
        """What is known about ``rank``: host, device, backend, versions, files, windows."""
        group = self._rank(rank)
        return {k: attr_python(v) for k, v in group.attrs.items()}

    @_reads
    def rank_attr(self, rank: int, name: str, default: Any = None) -> Any:
        """One of :meth:`rank_meta`'s values (``default`` when absent), reading only that
        attribute: a rank task needs its host, and all of a rank's attributes (its windows, its
        process groups, its run's metadata) cost ~1 ms to read."""
        value = self._rank(rank).attrs.get(name)
        return default if value is None else attr_python(value)

    @_reads
    def memory(self, rank: int | None = None) -> pd.DataFrame:
        """The ``[memory]`` events of ``rank`` (all ranks when None) as rows of
        ``rankscope.analysis.store.memory_table.MEMORY_COLUMNS``, sorted by (rank, ts), ``ts`` on the
        aligned clock. Empty with those columns when the store has none (older stores, runs
        without ``--profile-memory``)."""
        from rankscope.analysis.store.memory_table import MEMORY_COLUMNS, empty_memory

        frames = []
        for r in self.ranks if rank is None else [int(rank)]:
            group = self._rank(r).get(MEMORY)
            if group is None:
                continue
            out: dict[str, Any] = {}
            n = group["ts"].shape[0]
            out["rank"] = np.full(n, r, dtype=np.int32)
            for col, dtype in MEMORY_COLUMNS.items():
                if col == "rank":
                    continue
                values = group[col][()]
                if col in MEMORY_STRING_CODED:
                    out[col] = pd.Series(self.strings[values] if n else [], dtype="str")
                else:
                    out[col] = values.astype(dtype, copy=False)
            frames.append(pd.DataFrame(out))
        if not frames:
            return empty_memory()
        return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]

    @_reads
    def has_memory(self) -> bool:
        """The store holds memory events (a rank has a ``memory`` table)."""
        return any(MEMORY in self._rank(r) for r in self.ranks)

    @_reads
    def device_memory(self, rank: int) -> dict[int, int]:
        """GPU index → total bytes of ``rank``'s GPUs (the traces' ``deviceProperties``; {} for
        CPU ranks and older stores)."""
        raw = attr_python(self._rank(rank).attrs.get("device_memory", "{}"))
        if not isinstance(raw, dict):
            return {}
        return {int(k): int(v) for k, v in raw.items()}

    # -- run-wide tables ---------------------------------------------------------------------
    @_reads
    def collectives(self) -> pd.DataFrame:
        """Matched collectives, long form: one row per (collective, rank)."""
        return read_table(self._file, COLLECTIVES, schema.COLLECTIVE_COLUMNS)

    @_reads
    def steps(self) -> pd.DataFrame:
        """ProfilerStep ranges per rank (aligned ns)."""
        return read_table(self._file, STEPS, schema.STEP_COLUMNS)

    @_reads
    def step_log_ranks(self) -> list[int]:
        """The ranks whose step log (every step of the whole run) the store holds; [] for
        stores of runs without one (older runs, other tools' traces)."""
        return [r for r in self.ranks if STEP_LOG in self._rank(r)]

    @_reads
    def step_log(self, rank: int) -> pd.DataFrame:
        """Every step ``rank`` recorded for the whole run (schema.STEP_LOG_COLUMNS, in step
        order, ``end`` on the aligned clock); empty with those columns when it has none."""
        return read_table(self._rank(rank), STEP_LOG, schema.STEP_LOG_COLUMNS)

    @_reads
    def changes(self) -> pd.DataFrame:
        """The changes of the step time the live monitor noticed (schema.CHANGE_COLUMNS, in the
        order noticed); empty for runs without any and older stores."""
        return read_table(self._file, CHANGES, schema.CHANGE_COLUMNS)

    @_reads
    def clock(self) -> pd.DataFrame:
        """Clock alignment per rank: offset, drift, uncertainty, method, violations."""
        return read_table(self._file, CLOCK, schema.CLOCK_COLUMNS)

    @_reads
    def problems(self) -> pd.DataFrame:
        """What the merge could not ingest, and why (one row per problem)."""
        return read_table(self._file, PROBLEMS, schema.PROBLEM_COLUMNS)

    # -- Dask ----------------------------------------------------------------------------------
    def events_dask(self, columns: Sequence[str] | None = None) -> dd.DataFrame:
        """All events as a Dask DataFrame with one partition per rank (plus a ``rank`` column).

        Each partition is loaded by a task that opens the file itself (h5py handles do not
        pickle), so the view works on any scheduler, including a distributed cluster.
        """
        import dask.dataframe as dd

        cols = list(schema.EVENT_COLUMNS) if columns is None else list(columns)
        meta = _load_rank_partition(-1, path=str(self.path), event_columns=cols, meta_only=True)
        return dd.from_map(
            _load_rank_partition,
            self.ranks,
            path=str(self.path),
            event_columns=cols,
            meta=meta,
            divisions=None,
            enforce_metadata=False,
        )

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the HDF5 file."""
        if self._file.id.valid:
            self._file.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}, ranks={self.ranks})"


def _searchsorted_ds(ds: h5py.Dataset, value: int) -> int:
    """``np.searchsorted(ds, value, 'left')`` on a sorted dataset, reading one chunk per probe."""
    n = ds.shape[0]
    # Binary search over chunk starts, then within one chunk.
    lo, hi = 0, (n + EVENT_CHUNK_ROWS - 1) // EVENT_CHUNK_ROWS
    while lo < hi:
        mid = (lo + hi) // 2
        if int(ds[mid * EVENT_CHUNK_ROWS]) < value:
            lo = mid + 1
        else:
            hi = mid
    chunk = max(lo - 1, 0)
    base = chunk * EVENT_CHUNK_ROWS
    block = ds[base : min(base + 2 * EVENT_CHUNK_ROWS, n)]
    return base + int(np.searchsorted(block, value, side="left"))


def _load_rank_partition(
    rank: int, *, path: str, event_columns: Sequence[str], meta_only: bool = False
) -> pd.DataFrame:
    """One Dask partition: the events of ``rank`` with a leading ``rank`` column."""
    with Store(Path(path)) as store:
        if meta_only:
            frame = (
                store.events(store.ranks[0], columns=event_columns, window=(0, 0))
                if store.ranks
                else None
            )
            if frame is None:
                frame = pd.DataFrame({c: np.array([], dtype="int64") for c in event_columns})
            frame = frame.iloc[:0]
        else:
            frame = store.events(rank, columns=event_columns)
    frame.insert(0, "rank", np.full(len(frame), rank, dtype=np.int32))
    return frame


def open_store(path: str | Path) -> Store:
    """Open a store for reading; ``path`` is a ``trace.h5`` or a run directory holding one.

    Raises :class:`~rankscope.errors.InputFileError` (naming the file) when the file is missing,
    is not a rankscope store, or was written by a newer schema version.
    """
    return Store(resolve_store_path(path))
