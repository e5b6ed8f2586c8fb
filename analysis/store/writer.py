"""The store's writer: :class:`StoreWriter` (used by the merge) and the file object under it
that keeps a full disk from crashing HDF5.

One self-contained ``trace.h5`` per run (layout in ``docs/format.md`` and ``store_layout.py``,
contract in :mod:`rankscope.analysis.store.schema`). Tables are written *columnar*: a group with one
1-D dataset per column (chunked and compressed), so a reader loads only the columns it asks
for; repeated strings go as int32 codes into ``/strings``.

Why a module apart from ``store.py`` (the reader): writing needs its own machinery — the
guarded file object, the failure-once protocol, chunking and compression — that no reader
uses, and only the merge (and tests and benchmarks that build stores) writes. ``store.py``
re-exports :class:`StoreWriter` and :func:`write_table`.

Every time is int64 ns on the aligned clock; sizes in rows and bytes.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
from rankscope.analysis.store import schema
from rankscope.analysis.store.chunk_filters import FILTERED_KINDS, filtered_chunk
from rankscope.analysis.store.layout import (
    CHANGES,
    CLOCK,
    COLLECTIVES,
    COMPRESSION,
    COMPRESSION_LEVEL,
    EVENT_CHUNK_ROWS,
    EVENTS,
    LANES,
    MEMORY,
    MEMORY_STRING_CODED,
    PROBLEMS,
    RANKS,
    STEP_LOG,
    STEPS,
    STRING_CODED,
    STRINGS,
    attr_value,
    rank_group,
)
from rankscope.atomic import output_error
from rankscope.errors import OutputError

if TYPE_CHECKING:
    import pandas as pd

#: Bytes per page of what HDF5 writes after a failed write (``_GuardedFile``, kept in memory).
OVERLAY_PAGE = 1 << 16
#: The largest file offset (a seek past it is an I/O error to HDF5).
MAX_OFFSET = 2**63 - 1


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
    arr = np.asarray(values)
    if arr.dtype.kind in "OUS":
        data = np.array([str(v) for v in arr.tolist()], dtype=object)
        group.create_dataset(
            name, data=data, dtype=h5py.string_dtype("utf-8"), **_dataset_kwargs(len(data))
        )
        return
    kwargs = _dataset_kwargs(len(arr))
    if not kwargs or arr.dtype.kind not in FILTERED_KINDS or arr.ndim != 1:
        group.create_dataset(name, data=arr, **kwargs)
        return
    arr = np.ascontiguousarray(arr)
    dataset = group.create_dataset(name, shape=arr.shape, dtype=arr.dtype, **kwargs)
    rows = kwargs["chunks"][0]
    for start in range(0, len(arr), rows):
        dataset.id.write_direct_chunk((start,), filtered_chunk(arr[start : start + rows], rows))


def write_table(
    parent: h5py.Group,
    name: str,
    frame: pd.DataFrame | Mapping[str, np.ndarray],
    columns: Mapping[str, str],
) -> None:
    """Write ``frame`` (a DataFrame, or columns: name → array) as a columnar table group
    ``parent/name`` with the schema ``columns``.

    Missing columns are an error (a writer bug), extra columns are dropped. String columns become
    variable-length UTF-8 datasets; the column order is kept in the group attribute ``columns``.
    """
    if name in parent:
        del parent[name]
    group = parent.create_group(name)
    group.attrs["columns"] = list(columns)
    for col, dtype in columns.items():
        if col not in frame:
            raise KeyError(f"table {name!r} lacks column {col!r}")
        values = np.asarray(frame[col])
        if dtype == "str":
            _write_column(group, col, np.asarray(values, dtype=object).astype(str))
        else:
            _write_column(group, col, values.astype(dtype))


class _GuardedFile:
    """The store's file as HDF5 sees it (h5py's ``fileobj`` driver): a write that fails is
    recorded, never reported to HDF5, and HDF5 reads back what it wrote.

    Why: HDF5 surfaces a failed write (a full disk) late and repeatedly — on flushes, on every
    object's release, at close — and h5py 3.x can crash (SIGSEGV) closing a file whose writes
    failed. Here the first ``OSError`` is kept in :attr:`error` and from then on HDF5 is told
    every write succeeded, so HDF5 stays consistent, closes cleanly, and the writer raises one
    :class:`~rankscope.errors.OutputError` (the file is then deleted).

    What HDF5 writes after the failure is kept in memory (:attr:`_pages`, whole pages of
    :data:`OVERLAY_PAGE` bytes: the file's bytes with the writes applied) and read back from
    there. Dropping it instead left HDF5 reading its own later writes as the disk's stale or
    missing bytes: a string column's heap references read back that way made HDF5 free a
    garbage pointer (SIGSEGV in ``H5T__conv_vlen``, a merge on a nearly full disk; reproduced
    with this writer alone on a tmpfs, ``tests/test_disk_full.py``). The pages hold what HDF5
    writes between the failure and the writer's report of it: the rest of one rank's columns,
    then the metadata flushed at close.
    """

    def __init__(self, path: Path) -> None:
        self._raw = open(path, "w+b", buffering=0)  # noqa: SIM115 (closed by :meth:`close`)
        self.error: OSError | None = None
        #: after :attr:`error`: page number → the page as HDF5 last wrote it
        self._pages: dict[int, bytearray] = {}
        #: after :attr:`error`: the position and the end HDF5 believes the file has
        self._pos = 0
        self._end = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self.error is None:
            start = self._raw.tell()
            try:
                done = 0
                while done < len(view):
                    done += self._raw.write(view[done:]) or 0
                return len(view)
            except OSError as exc:
                # the whole write goes to the pages (its start may be on disk)
                self._fail(exc, start)
        self._keep(self._pos, view)
        self._pos += len(view)
        self._end = max(self._end, self._pos)
        return len(view)

    def _fail(self, exc: OSError, pos: int) -> None:
        """Keep the first failure; from now on HDF5's file is the disk's bytes and the pages,
        at ``pos`` (the position HDF5 believes in)."""
        self.error = exc
        self._pos = pos
        try:
            self._end = os.fstat(self._raw.fileno()).st_size
        except OSError:
            self._end = pos

    def _page(self, number: int) -> bytearray:
        """The page as HDF5 last wrote it: from the pages, else read from the disk."""
        page = self._pages.get(number)
        if page is None:
            page = bytearray(OVERLAY_PAGE)
            with contextlib.suppress(OSError):
                os.preadv(self._raw.fileno(), [page], number * OVERLAY_PAGE)
            self._pages[number] = page
        return page

    def _keep(self, offset: int, view: memoryview) -> None:
        """Apply a write HDF5 made after the failure to the pages."""
        done = 0
        while done < len(view):
            number, at = divmod(offset + done, OVERLAY_PAGE)
            n = min(OVERLAY_PAGE - at, len(view) - done)
            self._page(number)[at : at + n] = view[done : done + n]
            done += n

    def readinto(self, buffer: Any) -> int:
        if self.error is None:
            return self._raw.readinto(buffer) or 0
        out = memoryview(buffer).cast("B")
        done = 0
        while done < len(out):
            number, at = divmod(self._pos + done, OVERLAY_PAGE)
            n = min(OVERLAY_PAGE - at, len(out) - done)
            page = self._pages.get(number)
            if page is None:  # never written after the failure: the disk's bytes, else zeros
                got = 0
                with contextlib.suppress(OSError):
                    got = os.preadv(self._raw.fileno(), [out[done : done + n]], self._pos + done)
                out[done + got : done + n] = bytes(n - got)
            else:
                out[done : done + n] = page[at : at + n]
            done += n
        self._pos += len(out)
        return len(out)

    def read(self, size: int = -1) -> bytes:
        if self.error is None:
            return self._raw.read(size) or b""
        buffer = bytearray(max(size, 0))
        self.readinto(buffer)
        return bytes(buffer)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if self.error is not None:  # the position HDF5 believes in (its writes are in pages)
            base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._end}[whence]
            if not 0 <= base + offset < MAX_OFFSET:
                raise OSError(errno.EIO, f"seek to {offset} (whence {whence})")
            self._pos = base + offset
            return self._pos
        try:
            return self._raw.seek(offset, whence)
        except (OverflowError, ValueError) as exc:
            # HDF5 reading garbage may seek to an undefined address (2**64 - 1: seen in a CI
            # run when the disk filled mid-rank, before the pages kept HDF5's own writes). An
            # I/O error to HDF5, so the writer reports the first failure, kept in ``error``.
            raise OSError(errno.EIO, f"seek to {offset}: {exc}") from exc

    def tell(self) -> int:
        return self._raw.tell() if self.error is None else self._pos

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self._raw.truncate(size)
            except OSError as exc:
                self._fail(exc, self._raw.tell())
        self._end = self._pos if size is None else size
        return self._end

    def flush(self) -> None:
        """Nothing is buffered here (the file is unbuffered); :meth:`sync` makes it durable."""

    def sync(self) -> None:
        """fsync the file (a late ENOSPC/EIO of a network file system shows here)."""
        if self.error is None:
            try:
                os.fsync(self._raw.fileno())
            except OSError as exc:
                self._fail(exc, self._raw.tell())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.close()


class StoreWriter:
    """Writes a store file; used by the merge (``rankscope.orchestrator.ingest.merge``).

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
                self._file.attrs[key] = attr_value(value)
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
            self._file.attrs[key] = attr_value(value)

    def intern(self, strings: Iterable[str]) -> np.ndarray:
        """Codes (int32) of ``strings`` in ``/strings``, adding the new ones."""
        table = self._strings
        codes = [table.setdefault(s, len(table)) for s in strings]
        return np.asarray(codes, dtype=np.int32)

    def write_rank(
        self,
        rank: int,
        events: Mapping[str, np.ndarray],
        lanes: pd.DataFrame | Mapping[str, np.ndarray],
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
        lanes: pd.DataFrame | Mapping[str, np.ndarray],
        attrs: Mapping[str, Any],
    ) -> None:
        group = self._file.require_group(rank_group(rank))
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
            group.attrs[key] = attr_value(value)
        write_table(group, LANES, lanes, schema.LANE_COLUMNS)

    def write_memory(self, rank: int, columns: Mapping[str, np.ndarray]) -> None:
        """Write one rank's memory table ``/ranks/NNNNN/memory`` (after :meth:`write_rank`):
        the columns of ``memory_events.MEMORY_COLUMNS`` but ``rank``, ``ts`` aligned and sorted,
        op and scope as codes into ``/strings``. Written only for ranks with memory events."""
        from rankscope.analysis.store.memory_table import MEMORY_COLUMNS

        with self._guarded():
            group = self._file[rank_group(rank)].require_group(MEMORY)
            group.attrs["columns"] = [c for c in MEMORY_COLUMNS if c != "rank"]
            for col, dtype in MEMORY_COLUMNS.items():
                if col == "rank":
                    continue
                if col in group:
                    del group[col]
                want = "int32" if col in MEMORY_STRING_CODED else dtype
                _write_column(group, col, columns[col].astype(want, copy=False))
            self._file[rank_group(rank)].attrs["memory_events"] = len(columns["ts"])

    def write_step_log(self, rank: int, columns: Mapping[str, np.ndarray]) -> None:
        """Write one rank's step log ``/ranks/NNNNN/step_log`` (after :meth:`write_rank`):
        schema.STEP_LOG_COLUMNS, ``end`` aligned. Written only for ranks that kept one."""
        with self._guarded():
            group = self._file[rank_group(rank)].require_group(STEP_LOG)
            group.attrs["columns"] = list(schema.STEP_LOG_COLUMNS)
            for col, dtype in schema.STEP_LOG_COLUMNS.items():
                if col in group:
                    del group[col]
                _write_column(group, col, np.asarray(columns[col]).astype(dtype, copy=False))

    def set_rank_attrs(self, rank: int, attrs: Mapping[str, Any]) -> None:
        """Set attributes of ``/ranks/NNNNN``."""
        with self._guarded():
            group = self._file[rank_group(rank)]
            for key, value in attrs.items():
                group.attrs[key] = attr_value(value)

    def write_tables(self, tables: Mapping[str, pd.DataFrame | Mapping[str, np.ndarray]]) -> None:
        """Write the run-wide tables (collectives, steps, clock, problems, changes) at the root."""
        specs = {
            COLLECTIVES: schema.COLLECTIVE_COLUMNS,
            STEPS: schema.STEP_COLUMNS,
            CLOCK: schema.CLOCK_COLUMNS,
            PROBLEMS: schema.PROBLEM_COLUMNS,
            CHANGES: schema.CHANGE_COLUMNS,
        }
        with self._guarded():
            for name, frame in tables.items():
                write_table(self._file, name, frame, specs[name])

    def close(self) -> None:
        """Write ``/strings`` and the rank list, close the file and sync it to disk.

        Raises :class:`OutputError` when any write failed (the file is then incomplete).
        """
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
