"""The merged HDF5 store: the writer the merge uses and the reader every analysis uses.

One self-contained ``trace.h5`` per run (layout in ``docs/format.md``, contract in
:mod:`rankscope.analysis.schema`). Tables are stored *columnar*: a group with one 1-D dataset per
column (chunked and compressed), so a reader loads only the columns it asks for. Strings that repeat
(event names, categories) are interned once in ``/strings`` and stored as int32 codes; they come
back as pandas categoricals whose categories are the whole string table (the same categories on
every rank, so per-rank frames concatenate cheaply; use ``observed=True`` when grouping).

Every time is int64 ns on the aligned clock (see ``/clock`` for how to recover a rank's raw clock).

Why one module of ~700 lines: the writer and the reader of one format (docs/format.md) change
together.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from rankscope.analysis import schema
from rankscope.atomic import output_error
from rankscope.errors import InputFileError, OutputError

if TYPE_CHECKING:
    import dask.dataframe as dd
    import h5py
    import numpy as np
    import pandas as pd

P = ParamSpec("P")
R = TypeVar("R")

#: File name of the store inside a run directory.
STORE_NAME = "trace.h5"
#: Group names of the layout (docs/format.md).
STRINGS = "strings"
RANKS = "ranks"
EVENTS = "events"
LANES = "lanes"
COLLECTIVES = "collectives"
STEPS = "steps"
CLOCK = "clock"
PROBLEMS = "problems"
MEMORY = "memory"
#: Memory columns whose values are codes into ``/strings``.
MEMORY_STRING_CODED = ("op", "scope")
#: Name of one rank's group under ``/ranks``.
RANK_GROUP_FORMAT = "{rank:05d}"
#: Event columns whose values are codes into ``/strings``.
STRING_CODED = ("name", "cat")
#: Rows per HDF5 chunk of an event column (64 Ki rows = 512 KiB of int64 before compression).
EVENT_CHUNK_ROWS = 1 << 16
#: Compression of every chunked dataset: gzip level 1 + shuffle (chosen by measurement:
#: docs/performance.md, "Merge"; gzip is readable by every HDF5 tool, lzf only by h5py).
COMPRESSION = "gzip"
COMPRESSION_LEVEL = 1


def _rank_group(rank: int) -> str:
    return f"{RANKS}/{RANK_GROUP_FORMAT.format(rank=rank)}"


def _dataset_kwargs(n: int) -> dict[str, Any]:
    """Chunking/compression for a 1-D dataset of ``n`` rows (tiny ones stay contiguous)."""
    if n < 1024:
        return {}
    return {
        "chunks": (min(n, EVENT_CHUNK_ROWS),),
        "compression": COMPRESSION,
        "compression_opts": COMPRESSION_LEVEL,
        "shuffle": True,
    }


def _write_column(group: h5py.Group, name: str, values: Any) -> None:
    import h5py
    import numpy as np

    arr = np.asarray(values)
    if arr.dtype.kind in "OUS":
        data = np.array([str(v) for v in arr.tolist()], dtype=object)
        group.create_dataset(
            name, data=data, dtype=h5py.string_dtype("utf-8"), **_dataset_kwargs(len(data))
        )
    else:
        group.create_dataset(name, data=arr, **_dataset_kwargs(len(arr)))


def write_table(
    parent: h5py.Group, name: str, frame: pd.DataFrame, columns: Mapping[str, str]
) -> None:
    """Write ``frame`` as a columnar table group ``parent/name`` with the schema ``columns``.

    Missing columns are an error (a writer bug), extra columns are dropped. String columns become
    variable-length UTF-8 datasets; the column order is kept in the group attribute ``columns``.
    """
    import numpy as np

    if name in parent:
        del parent[name]
    group = parent.create_group(name)
    group.attrs["columns"] = list(columns)
    for col, dtype in columns.items():
        if col not in frame.columns:
            raise KeyError(f"table {name!r} lacks column {col!r}")
        values = frame[col].to_numpy()
        if dtype == "str":
            _write_column(group, col, np.asarray(values, dtype=object).astype(str))
        else:
            _write_column(group, col, values.astype(dtype))


def read_table(
    parent: h5py.Group, name: str, columns: Mapping[str, str], *, rows: slice | None = None
) -> pd.DataFrame:
    """Read a table written by :func:`write_table` (empty frame with the schema if absent)."""
    import numpy as np
    import pandas as pd

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


class _GuardedFile:
    """The store's file as HDF5 sees it (h5py's ``fileobj`` driver): a write that fails is
    recorded, never reported to HDF5.

    Why: HDF5 surfaces a failed write (a full disk) late and repeatedly — on flushes, on every
    object's release, at close — and h5py 3.x can crash (SIGSEGV) closing a file whose writes
    failed. Here the first ``OSError`` is kept in :attr:`error` and every later write is
    dropped while HDF5 is told it succeeded, so HDF5 stays consistent, closes cleanly, and the
    writer raises one :class:`~rankscope.errors.OutputError` (the file is then deleted).
    """

    def __init__(self, path: Path) -> None:
        self._raw = open(path, "w+b", buffering=0)  # noqa: SIM115 (closed by :meth:`close`)
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self.error is None:
            try:
                done = 0
                while done < len(view):
                    done += self._raw.write(view[done:]) or 0
            except OSError as exc:
                self.error = exc
        return len(view)

    def readinto(self, buffer: Any) -> int:
        return self._raw.readinto(buffer) or 0

    def read(self, size: int = -1) -> bytes:
        return self._raw.read(size) or b""

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        try:
            return self._raw.seek(offset, whence)
        except (OverflowError, ValueError) as exc:
            # After a dropped write HDF5 may read its own metadata back as garbage and seek to
            # an undefined address (2**64 - 1: seen in a CI run when the disk filled mid-rank).
            # An I/O error to HDF5, so the writer reports the first failure, kept in ``error``.
            raise OSError(errno.EIO, f"seek to {offset}: {exc}") from exc

    def tell(self) -> int:
        return self._raw.tell()

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self._raw.truncate(size)
            except OSError as exc:
                self.error = exc
        return self._raw.tell() if size is None else size

    def flush(self) -> None:
        """Nothing is buffered here (the file is unbuffered); :meth:`sync` makes it durable."""

    def sync(self) -> None:
        """fsync the file (a late ENOSPC/EIO of a network file system shows here)."""
        if self.error is None:
            try:
                os.fsync(self._raw.fileno())
            except OSError as exc:
                self.error = exc

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.close()


class StoreWriter:
    """Writes a store file; used by the merge (``rankscope.orchestrator.merge``).

    Usage: create, :meth:`intern` strings, :meth:`write_rank` one rank at a time, complete and
    final (so only one rank's arrays are ever in memory, and no space is written twice: HDF5
    does not give back the space of deleted or rewritten compressed data), :meth:`write_tables`,
    then :meth:`close` (writes ``/strings``).
    The caller writes to a temporary name and renames (the merge does this).

    A write that fails (full disk, quota, read-only file system, no permission) raises ONE
    :class:`~rankscope.errors.OutputError` naming ``target`` (the file the user asked for;
    default ``path``) and its cause, from the method that met it or at the latest from
    :meth:`close`; the HDF5 file is then closed quietly and the caller removes ``path``.
    """

    def __init__(self, path: Path, *, attrs: Mapping[str, Any], target: Path | None = None) -> None:
        import h5py

        self.path = Path(path)
        self.target = Path(target) if target is not None else self.path
        try:
            self._io = _GuardedFile(self.path)
        except OSError as exc:
            raise output_error(self.target, exc) from exc
        self._failure: OutputError | None = None
        try:
            self._file = h5py.File(self._io, "w", libver="latest")
        except BaseException:
            self._io.close()
            raise
        self._strings: dict[str, int] = {}
        with self._guarded():
            self._file.attrs["schema_name"] = schema.SCHEMA_NAME
            self._file.attrs["schema_version"] = schema.SCHEMA_VERSION
            self._file.attrs["created"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
            for key, value in attrs.items():
                self._file.attrs[key] = _attr_value(value)
            self._file.require_group(RANKS)

    @contextlib.contextmanager
    def _guarded(self) -> Iterator[None]:
        """Raise :class:`OutputError` once a write has failed (at once on the next call too)."""
        if self._failure is not None:
            raise self._failure
        try:
            yield
        except (OSError, RuntimeError) as exc:
            if self._io.error is None:
                raise
            self._failure = output_error(self.target, self._io.error)
            raise self._failure from exc
        if self._io.error is not None:
            self._failure = output_error(self.target, self._io.error)
            raise self._failure

    def set_attr(self, key: str, value: Any) -> None:
        """Set a root attribute (dicts and lists are stored as JSON text)."""
        with self._guarded():
            self._file.attrs[key] = _attr_value(value)

    def intern(self, strings: Iterable[str]) -> np.ndarray:
        """Codes (int32) of ``strings`` in ``/strings``, adding the new ones."""
        import numpy as np

        table = self._strings
        codes = [table.setdefault(s, len(table)) for s in strings]
        return np.asarray(codes, dtype=np.int32)

    def write_rank(
        self,
        rank: int,
        events: Mapping[str, np.ndarray],
        lanes: pd.DataFrame,
        attrs: Mapping[str, Any],
    ) -> None:
        """Write one rank: ``events`` columns (schema.EVENT_COLUMNS, name/cat as string codes,
        sorted by ts; optional schema.SHAPE_COLUMNS as string codes, -1 for none, written only
        when some event has one), its lanes and group attributes (meta)."""
        with self._guarded():
            self._write_rank(rank, events, lanes, attrs)

    def _write_rank(
        self,
        rank: int,
        events: Mapping[str, np.ndarray],
        lanes: pd.DataFrame,
        attrs: Mapping[str, Any],
    ) -> None:
        group = self._file.require_group(_rank_group(rank))
        ev = group.require_group(EVENTS)
        for col, dtype in schema.EVENT_COLUMNS.items():
            if col in ev:
                del ev[col]
            want = "int32" if col in STRING_CODED else dtype
            _write_column(ev, col, events[col].astype(want, copy=False))
        for col in schema.SHAPE_COLUMNS:  # optional: only when the trace recorded shapes
            if col in ev:
                del ev[col]
            values = events.get(col)
            if values is not None and len(values) and bool((values >= 0).any()):
                _write_column(ev, col, values.astype("int32", copy=False))
        ts = events["ts"]
        dur = events["dur"]
        group.attrs["rank"] = rank
        group.attrs["events"] = len(ts)
        group.attrs["max_dur_ns"] = int(dur.max()) if len(dur) else 0
        for key, value in attrs.items():
            group.attrs[key] = _attr_value(value)
        write_table(group, LANES, lanes, schema.LANE_COLUMNS)

    def write_memory(self, rank: int, columns: Mapping[str, np.ndarray]) -> None:
        """Write one rank's memory table ``/ranks/NNNNN/memory`` (after :meth:`write_rank`):
        the columns of ``memory.MEMORY_COLUMNS`` but ``rank``, ``ts`` aligned and sorted, op and
        scope as codes into ``/strings``. Written only for ranks with memory events."""
        from rankscope.analysis.memory import MEMORY_COLUMNS

        with self._guarded():
            group = self._file[_rank_group(rank)].require_group(MEMORY)
            group.attrs["columns"] = [c for c in MEMORY_COLUMNS if c != "rank"]
            for col, dtype in MEMORY_COLUMNS.items():
                if col == "rank":
                    continue
                if col in group:
                    del group[col]
                want = "int32" if col in MEMORY_STRING_CODED else dtype
                _write_column(group, col, columns[col].astype(want, copy=False))
            self._file[_rank_group(rank)].attrs["memory_events"] = len(columns["ts"])

    def set_rank_attrs(self, rank: int, attrs: Mapping[str, Any]) -> None:
        """Set attributes of ``/ranks/NNNNN``."""
        with self._guarded():
            group = self._file[_rank_group(rank)]
            for key, value in attrs.items():
                group.attrs[key] = _attr_value(value)

    def write_tables(self, tables: Mapping[str, pd.DataFrame]) -> None:
        """Write the run-wide tables (collectives, steps, clock, problems) at the root."""
        specs = {
            COLLECTIVES: schema.COLLECTIVE_COLUMNS,
            STEPS: schema.STEP_COLUMNS,
            CLOCK: schema.CLOCK_COLUMNS,
            PROBLEMS: schema.PROBLEM_COLUMNS,
        }
        with self._guarded():
            for name, frame in tables.items():
                write_table(self._file, name, frame, specs[name])

    def close(self) -> None:
        """Write ``/strings`` and the rank list, close the file and sync it to disk.

        Raises :class:`OutputError` when any write failed (the file is then incomplete).
        """
        import h5py
        import numpy as np

        if not self._file.id.valid:
            return
        try:
            with self._guarded():
                if STRINGS in self._file:
                    del self._file[STRINGS]
                strings = np.array(list(self._strings), dtype=object)
                self._file.create_dataset(
                    STRINGS,
                    data=strings,
                    dtype=h5py.string_dtype("utf-8"),
                    **_dataset_kwargs(len(strings)),
                )
                ranks = sorted(int(g.attrs["rank"]) for g in self._file[RANKS].values())
                self._file.attrs["ranks"] = np.asarray(ranks, dtype=np.int32)
                self._file.close()
                self._io.sync()
        finally:
            self._abandon()

    def _abandon(self) -> None:
        """Close the HDF5 file (failed writes were never reported to HDF5, so it closes
        cleanly) and the file under it; errors here no longer matter."""
        with contextlib.suppress(Exception):
            if self._file.id.valid:
                self._file.close()
        self._io.close()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self._abandon()


def _attr_value(value: Any) -> Any:
    """HDF5 attributes hold scalars, strings and arrays; dicts/lists/None go as JSON text."""
    if value is None or isinstance(value, dict | list | tuple):
        return json.dumps(value, default=str)
    return value


def _attr_python(value: Any) -> Any:
    """Inverse of :func:`_attr_value` for reading (JSON text back to dict/list)."""
    import numpy as np

    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str) and (value[:1] in "{[" or value == "null"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


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
#: Deepest group nesting a store may have (its own layout is 3 deep: /ranks/NNNNN/events).
MAX_GROUP_DEPTH = 8


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


def _refuse_outside_references(path: Path, root: h5py.Group) -> None:
    """Refuse a store whose links or datasets point outside it, without following any.

    rankscope writes hard links and plain datasets only. External links, virtual datasets and
    datasets with external raw storage would make HDF5 read other files; soft links and
    user-defined links are refused as well (the layout has none), and so is nesting deeper
    than :data:`MAX_GROUP_DEPTH`. Each link is read with ``getlink=True`` (nothing resolved).
    """
    import h5py

    stack: list[tuple[h5py.Group, str, int]] = [(root, "", 0)]
    while stack:
        group, prefix, depth = stack.pop()
        if depth > MAX_GROUP_DEPTH:
            raise InputFileError(f"{path}: not a rankscope store (groups nested too deep)")
        for name in group:
            where = f"{prefix}/{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                raise InputFileError(
                    f"{path}: refused: {where} is an external link to "
                    f"{link.filename}:{link.path} (a store never points outside itself)"
                )
            if not isinstance(link, h5py.HardLink):
                raise InputFileError(
                    f"{path}: refused: {where} is a {type(link).__name__} "
                    "(a rankscope store holds hard links only)"
                )
            obj = group[name]
            if isinstance(obj, h5py.Group):
                stack.append((obj, where, depth + 1))
            elif isinstance(obj, h5py.Dataset):
                if obj.is_virtual:
                    raise InputFileError(
                        f"{path}: refused: {where} is a virtual dataset "
                        "(a store never points outside itself)"
                    )
                if obj.external:
                    raise InputFileError(
                        f"{path}: refused: {where} keeps its data in external file(s) "
                        f"{[str(e[0]) for e in obj.external]} (a store never points outside itself)"
                    )


#: Store files (device, inode, size, mtime) already walked by this process and found clean: the
#: analysis opens the store once per rank task, and the walk costs ~20 ms per open.
_CHECKED_FILES: set[tuple[int, int, int, int]] = set()


def _refuse_outside_references_once(path: Path, root: h5py.Group) -> None:
    """:func:`_refuse_outside_references`, skipped for a file version already found clean."""
    try:
        st = os.stat(path)
    except OSError:
        _refuse_outside_references(path, root)
        return
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _CHECKED_FILES:
        return
    _refuse_outside_references(path, root)
    _CHECKED_FILES.add(key)


class Store:
    """A merged store opened for reading (``rankscope.open``). Also a context manager.

    Reads are lazy: each call loads only the datasets (and rows) it needs.
    """

    def __init__(self, path: Path) -> None:
        import h5py

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
        self._strings: Any = None
        self._categories: Any = None

    def _check(self) -> None:
        """Refuse a foreign store, a newer schema, and links or data that point outside."""
        path = self.path
        with _reading(path):
            attrs = self._file.attrs
            name = _attr_python(attrs.get("schema_name", ""))
            raw_version = _attr_python(attrs.get("schema_version", -1))
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
            _refuse_outside_references_once(path, self._file)

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
        return {k: _attr_python(v) for k, v in self._file.attrs.items()}

    @property
    @_reads
    def strings(self) -> np.ndarray:
        """The interned string table (object array; codes index into it)."""
        import numpy as np

        if self._strings is None:
            ds = self._file.get(STRINGS)
            self._strings = (
                np.asarray(ds.asstr()[()], dtype=object) if ds is not None else np.array([], object)
            )
        return self._strings

    def _category_dtype(self) -> Any:
        import pandas as pd

        if self._categories is None:
            self._categories = pd.CategoricalDtype(pd.Index(self.strings, dtype=object))
        return self._categories

    def _rank(self, rank: int) -> h5py.Group:
        key = _rank_group(int(rank))
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
        import numpy as np
        import pandas as pd

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
        return {k: _attr_python(v) for k, v in group.attrs.items()}

    @_reads
    def memory(self, rank: int | None = None) -> pd.DataFrame:
        """The ``[memory]`` events of ``rank`` (all ranks when None) as rows of
        ``rankscope.analysis.memory.MEMORY_COLUMNS``, sorted by (rank, ts), ``ts`` on the aligned
        clock. Empty with those columns when the store has none (older stores, runs without
        ``--profile-memory``)."""
        import numpy as np
        import pandas as pd
        from rankscope.analysis.memory import MEMORY_COLUMNS, empty_memory

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
        raw = _attr_python(self._rank(rank).attrs.get("device_memory", "{}"))
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
    import numpy as np

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
    import numpy as np

    with Store(Path(path)) as store:
        if meta_only:
            frame = (
                store.events(store.ranks[0], columns=event_columns, window=(0, 0))
                if store.ranks
                else None
            )
            if frame is None:
                import pandas as pd

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
