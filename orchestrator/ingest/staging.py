"""The merge's files beside its output: the lock, the temporary store, the parked ranks.

A merge writes ``trace.h5`` under a lock (:func:`output_lock`), to a temporary name renamed over
the output when complete (:data:`TMP_FORMAT`), and parks each parsed rank's columns in a spill
folder until it knows which ranks to keep and how to align them (:class:`Spill`, why in
``merge``'s docstring). Every temporary ends in ``.tmp``, so the next merge of the same output
removes what a killed one left (:func:`remove_stale`).

All of them live beside the output, never in a node-local temporary folder: with
``--slurm-workers`` the worker jobs write their logs and Dask's scratch space into
:data:`WORKERS_FORMAT` there too. The output's folder is one every node sees (the run directory
is on a shared filesystem for the ranks already), the merging process can remove it when the
merge ends however it ends, and the next merge removes what a killed one left. The spill itself
is written by the merging process only (the workers return each rank's columns to it).

A write that fails here (the lock file, the spill: a full disk, a quota, a read-only folder)
raises :class:`~rankscope.errors.OutputError` naming the OUTPUT the user asked for, with the
cause; the caller removes the spill folder and the temporary store (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
from rankscope.atomic import output_error, translate_write_errors
from rankscope.errors import InputFileError

#: Lock file beside the output, held (fcntl) while a merge writes it.
LOCK_FORMAT = ".{name}.lock"
#: Temporary output name (same folder, renamed over the output when complete).
TMP_FORMAT = ".{name}.{pid}.tmp"
#: Folder beside the output where parsed ranks wait to be written (:class:`_Spill`).
SPILL_FORMAT = ".{name}.{pid}.ranks.tmp"
#: One parked part of one rank inside the spill folder (``part``: "events", "memory", the step
#: log): its columns one after the other, each a ``.npy`` array. One file per part, not per
#: column: creating a file costs more than writing a small one (the 8-rank ``param_dlrm_8rank``
#: parked 88 files, ~35 ms of a ~400 ms merge; docs/performance.md, seventh pass).
SPILL_PART_FORMAT = "{rank:05d}.{part}.npy"
#: Folder beside the output for the per-rank parts of merged trace files (``multirank.py``).
SPLIT_FORMAT = ".{name}.{pid}.split.tmp"
#: Folder beside the output for what Slurm workers write (job logs, Dask's scratch space),
#: removed once their jobs are gone (``ClusterSpec.slurm_work_dir``).
WORKERS_FORMAT = ".{name}.{pid}.workers.tmp"
#: What a killed merge may have left beside the output (temporary store, spill and workers'
#: folders).
STALE_GLOB = ".{name}.*.tmp"


@contextlib.contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Hold ``.trace.h5.lock`` beside ``output`` (fcntl), or fail with a clear message.

    The lock file exists only while a merge holds it: it is removed, whether the merge succeeded
    or failed, while still locked, right before the release. A merge that opened the file just
    before that and then gets the lock holds an unlinked inode, which locks nothing: it sees that
    the path no longer names the inode it locked, and starts again on a fresh file.
    """
    import fcntl

    lock_path = output.parent / LOCK_FORMAT.format(name=output.name)
    while True:
        with translate_write_errors(output, detail=f"lock file {lock_path.name}"):
            fh = lock_path.open("a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise InputFileError(
                f"{output}: another merge is writing this store (lock {lock_path}); "
                "wait for it to finish and try again"
            ) from None
        if _same_file(lock_path, fh.fileno()):
            break
        fh.close()  # the previous holder removed it as it finished: lock the path's new file
    try:
        yield
    finally:
        try:
            lock_path.unlink(missing_ok=True)  # still held: a late waiter re-checks the inode
        finally:
            fh.close()  # releases the lock


def _same_file(path: Path, fd: int) -> bool:
    """True when ``path`` still names the open file ``fd`` (same device and inode)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def remove_stale(out: Path) -> None:
    """Remove what an interrupted merge left (we hold the lock: nobody else writes these)."""
    for stale in out.parent.glob(STALE_GLOB.format(name=out.name)):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


class Spill:
    """Parsed ranks' event columns, parked as raw ``.npy`` files until the merge writes them.

    Why (module docstring): which ranks are kept and how their clocks shift are known only once
    every rank is parsed; until then each rank's columns wait here, one file per part, so the
    parent holds one rank's arrays at a time. The folder is the caller's to remove. Each part of
    a rank is one file holding its columns in order (:data:`SPILL_PART_FORMAT`).

    ``output``: the store the columns are parked for, named by the :class:`OutputError` that a
    failed write raises (full disk…). Columns are written through Python's file objects, never
    ``ndarray.tofile``, whose failure carries no errno (``"2460 requested and 2032 written"``).

    ``in_memory``: the columns stay in this process instead (no folder): for a merge of one
    rank, which parses nothing else while they wait and writes them next, so that parking them
    would only write and read them back (~0.02 s of the 54 MB rank's merge).
    """

    def __init__(self, folder: Path, output: Path | None = None, in_memory: bool = False) -> None:
        self.folder = folder
        self.output = output if output is not None else folder
        self._columns: dict[int, dict[str, list[str]]] = {}
        #: rank → part → its columns (``in_memory`` only)
        self._held: dict[int, dict[str, dict[str, np.ndarray]]] | None = {} if in_memory else None
        if self._held is None:
            with self._writing():
                folder.mkdir()

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        return translate_write_errors(self.output, detail=self._detail())

    def _detail(self) -> str:
        return f"in {self.folder.parent}, while parking the parsed ranks"

    def _path(self, rank: int, part: str) -> Path:
        return self.folder / SPILL_PART_FORMAT.format(rank=rank, part=part)

    def put(self, rank: int, columns: Mapping[str, np.ndarray], part: str = "events") -> None:
        """Park the columns of one ``part`` of ``rank`` (the events, its memory table), replacing
        those parked for it before (putting ``"events"`` first forgets every part)."""
        if part == "events":
            self.drop(rank)
        if self._held is not None:
            self._held.setdefault(rank, {})[part] = dict(columns)
            return
        self._columns.setdefault(rank, {})[part] = list(columns)  # so drop() removes them all
        try:
            with self._path(rank, part).open("wb") as fh:
                sink = _Sink(fh)
                for values in columns.values():
                    np.lib.format.write_array(sink, values, allow_pickle=False)
        except OSError as exc:
            self.drop(rank)
            raise output_error(self.output, exc, detail=self._detail()) from exc

    def take(self, rank: int, part: str = "events") -> dict[str, np.ndarray]:
        """The columns of ``part`` parked for ``rank``, read back ({} when none were)."""
        if self._held is not None:
            return dict(self._held.get(rank, {}).get(part, {}))
        names = self._columns.get(rank, {}).get(part)
        if names is None:
            return {}
        with self._path(rank, part).open("rb") as fh:
            return {name: np.lib.format.read_array(fh, allow_pickle=False) for name in names}

    def drop(self, rank: int) -> None:
        """Forget ``rank`` and remove its files."""
        if self._held is not None:
            self._held.pop(rank, None)
        for part in self._columns.pop(rank, {}):
            self._path(rank, part).unlink(missing_ok=True)


class _Sink:
    """Only ``write`` of a file: numpy then writes an array in Python-level chunks, whose
    failure is an ``OSError`` with its errno (``ndarray.tofile``'s has none)."""

    def __init__(self, fh: BinaryIO) -> None:
        self.write = fh.write
