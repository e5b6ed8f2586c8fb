"""``rankscope merge``: per-rank Kineto traces → one HDF5 store (``trace.h5``) with aligned clocks.

Pipeline (docs/format.md, "How the merge works"):

1. **Discover** the inputs: a run directory (``ranks/NNNNN/window-*.json.gz`` + ``meta.json``),
   any folder of Kineto traces (searched recursively; rankscope's own outputs there, such as
   ``report/`` and Perfetto exports, are never inputs: :func:`folder_traces`), or trace files.
2. **Parse** one task per rank source on Dask (a LocalCluster by default, one process per core,
   one thread each): the task reads the rank's files one after the other and returns compact
   numpy columns (a few tens of bytes per event instead of the JSON text). At most
   ``2 × workers`` tasks are in flight, and the parent writes each finished rank to the store
   at once and drops it, so memory holds a few ranks, never all.
3. **Match** collectives across ranks, **align** clocks (orchestrator/clock.py), then rewrite
   each rank's ``ts`` on the aligned clock, its ``coll`` column, and the run-wide tables.
4. The store is written to a temporary name in the output folder and renamed; a lock file
   (``.trace.h5.lock``, removed when the merge ends) keeps two merges of one output apart.

Bad input never costs the other ranks: every problem is recorded in ``/problems`` and printed
with its file; the exit status is non-zero only when no rank could be merged (or ``--strict``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.analysis.schema import EventKind
from rankscope.errors import InputFileError, UsageError
from rankscope.launchers import rundir

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from rankscope.orchestrator.kineto import FileTrace

#: Lock file beside the output, held (fcntl) while a merge writes it.
LOCK_FORMAT = ".{name}.lock"
#: Temporary output name (same folder, renamed over the output when complete).
TMP_FORMAT = ".{name}.{pid}.tmp"
#: A rank whose trace starts this far (ns) from the others' median start is from another job.
FOREIGN_TIME_NS = 24 * 3600 * 10**9
#: Window index in a run directory's window file name.
WINDOW_INDEX = re.compile(r"window-(\d+)")
#: Scheduler value that runs the parse tasks in this process (no Dask cluster): the analysis
#: driver's, so that one word means the same for merge and analyze.
SYNCHRONOUS = "synchronous"  # == rankscope.analysis.pipeline.SYNCHRONOUS (test_layering checks)


@dataclass
class RankSource:
    """The files of one rank (several profiler windows in a run directory, else one file)."""

    files: list[tuple[int, Path]]
    """(window index, path) in window order"""
    rank_hint: int | None
    """rank from the run-directory layout or the file name (None when unknown)"""
    from_run_dir: bool = False
    """True when the rank comes from ``ranks/NNNNN`` (authoritative)"""
    meta: dict[str, Any] = field(default_factory=dict)
    """the rank's meta.json (run directories), else empty"""

    @property
    def label(self) -> str:
        """The file name to print (the first file, or the rank folder)."""
        if len(self.files) == 1:
            return str(self.files[0][1])
        return str(self.files[0][1].parent) if self.files else "?"


@dataclass
class Problem:
    """One thing that could not be ingested."""

    file: str
    rank: int
    problem: str


@dataclass
class RankResult:
    """What a parse task returns: one rank's compact columns and small tables."""

    source: RankSource
    rank: int | None
    world_size: int | None
    backend: str | None
    host: str | None
    trace_ids: list[str]
    nbytes: int
    columns: dict[str, np.ndarray] | None
    """ts (raw ns), dur, name, cat (codes into strings), kind, lane, corr, step, window"""
    strings: list[str]
    lanes: pd.DataFrame | None
    comm: pd.DataFrame | None
    steps: pd.DataFrame | None
    problems: list[Problem]
    t_first: int = 0
    """first event start (ns, the rank's raw clock)"""


# ---------------------------------------------------------------------------------- discovery
def discover(paths: list[Path]) -> tuple[list[RankSource], dict[str, Any], list[Problem]]:
    """Rank sources from the given paths; returns (sources, run.json or {}, problems)."""
    from rankscope.orchestrator.kineto import rank_from_path

    sources: list[RankSource] = []
    run: dict[str, Any] = {}
    problems: list[Problem] = []
    for path in paths:
        if path.is_dir() and (path / rundir.RANKS_DIR).is_dir():
            run_json = path / rundir.RUN_JSON
            if run_json.is_file():
                try:
                    run = rundir.read_json(run_json)
                except (OSError, ValueError) as exc:
                    problems.append(Problem(str(run_json), -1, f"unreadable run.json ({exc})"))
            for rdir in sorted((path / rundir.RANKS_DIR).iterdir()):
                if not rdir.is_dir() or not rdir.name.isdigit():
                    continue
                rank = int(rdir.name)
                meta: dict[str, Any] = {}
                meta_path = rdir / rundir.META_JSON
                if meta_path.is_file():
                    try:
                        meta = rundir.read_json(meta_path)
                    except (OSError, ValueError) as exc:
                        problems.append(
                            Problem(str(meta_path), rank, f"unreadable meta.json ({exc})")
                        )
                files: list[tuple[int, Path]] = []
                for f in sorted(rdir.glob(rundir.WINDOW_GLOB)):
                    m = WINDOW_INDEX.search(f.name)
                    files.append((int(m.group(1)) if m else len(files), f))
                if not files:
                    problems.append(Problem(str(rdir), rank, "no trace windows (rank wrote none)"))
                    continue
                sources.append(RankSource(files, rank, from_run_dir=True, meta=meta))
        elif path.is_dir():
            found = folder_traces(path)
            if not found:
                problems.append(Problem(str(path), -1, "no Kineto trace files (*.json, *.json.gz)"))
            sources.extend(RankSource([(0, p)], rank_from_path(p)) for p in found)
        else:
            sources.append(RankSource([(0, path)], rank_from_path(path)))
    return sources, run, problems


def folder_traces(folder: Path) -> list[Path]:
    """The trace files of a folder searched recursively, in name order.

    rankscope writes its own files into the folders it merges (``report/`` with summary.json
    and report.html, Perfetto exports, the store, its lock and temporaries): none of them is an
    input, so re-merging after ``analyze`` / ``export`` finds the same traces and no problem.
    The report folder is left out whole; every other file must look like a trace
    (:func:`rankscope.orchestrator.kineto.is_folder_trace`).
    """
    from rankscope.orchestrator.kineto import is_folder_trace

    skipped = [d for d in (folder / rundir.REPORT_DIR,) if is_report_dir(d)]
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(p.is_relative_to(d) for d in skipped) and is_folder_trace(p)
    )


def is_report_dir(path: Path) -> bool:
    """True for a report folder written by ``rankscope analyze`` (summary.json / report.html)."""
    return path.is_dir() and any(
        (path / name).is_file() for name in (rundir.SUMMARY_JSON, rundir.REPORT_HTML)
    )


def nothing_to_merge(first_input: Path, problems: list[Problem]) -> str:
    """The one-line error when discovery found no trace at all (its problems say why)."""
    if not problems:
        return f"{first_input}: no trace files to merge"
    first = problems[0]
    text = f"{first.file}: {first.problem}"
    if first.file != str(first_input):
        text = f"{first_input}: no trace files to merge ({text}"
        text += f"; {len(problems) - 1} more problem(s))" if len(problems) > 1 else ")"
    elif len(problems) > 1:
        text += f" ({len(problems) - 1} more problem(s))"
    return text


# ------------------------------------------------------------------------------------- parse
def parse_source(source: RankSource) -> RankResult:
    """Parse all files of one rank (runs in a Dask worker): compact columns + small tables."""
    import numpy as np
    import pandas as pd
    from rankscope.orchestrator.kineto import TraceReadError, read_trace

    parts: list[tuple[int, FileTrace]] = []
    problems: list[Problem] = []
    hint = source.rank_hint if source.rank_hint is not None else -1
    for window, path in source.files:
        try:
            ft = read_trace(path)
        except TraceReadError as exc:
            problems.append(Problem(str(path), hint, str(exc)))
            continue
        except MemoryError:
            problems.append(Problem(str(path), hint, "out of memory while parsing"))
            continue
        for why, count in ft.dropped.items():
            problems.append(Problem(str(path), hint, f"{count} {why} dropped"))
        if len(ft.columns["ts"]) == 0:
            problems.append(Problem(str(path), hint, "trace holds no events with a duration"))
            continue
        parts.append((window, ft))
    if not parts:
        return RankResult(
            source, None, None, None, None, [], 0, None, [], None, None, None, problems
        )
    ranks = {ft.rank for _, ft in parts if ft.rank is not None}
    rank = source.rank_hint if source.from_run_dir else None
    if rank is None:
        rank = min(ranks) if ranks else source.rank_hint
    if source.from_run_dir and ranks and ranks != {rank}:
        problems.append(
            Problem(source.label, hint, f"trace says rank {sorted(ranks)}, folder says {rank}")
        )
    # Concatenate windows: unify strings and lanes, keep the window index per event.
    strings: dict[str, int] = {}
    lane_keys: dict[tuple[int, str, str], int] = {}
    lane_rows: list[dict[str, Any]] = []
    cols: dict[str, list[np.ndarray]] = {}
    comms = []
    offset = 0
    for window, ft in parts:
        smap = np.array([strings.setdefault(s, len(strings)) for s in ft.strings], dtype=np.int32)
        lmap = np.empty(len(ft.lanes), dtype=np.int32)
        for row in ft.lanes.itertuples(index=False):
            key = (int(row.kind), str(row.pid), str(row.tid))
            if key not in lane_keys:
                lane_keys[key] = len(lane_keys)
                lane_rows.append(
                    {
                        "lane": lane_keys[key],
                        "kind": row.kind,
                        "pid": row.pid,
                        "tid": row.tid,
                        "name": row.name,
                    }
                )
            lmap[int(row.lane)] = lane_keys[key]
        c = dict(ft.columns)
        c["name"] = smap[c["name"]]
        c["cat"] = smap[c["cat"]]
        c["lane"] = lmap[c["lane"]]
        c["window"] = np.full(len(c["ts"]), window, dtype=np.int16)
        for k, v in c.items():
            cols.setdefault(k, []).append(v)
        comm = ft.comm.copy()
        comm["event"] = comm["event"].to_numpy(np.int64) + offset
        comm["lane"] = lmap[comm["lane"].to_numpy(np.int64)] if len(comm) else comm["lane"]
        comms.append(comm)
        offset += len(c["ts"])
    columns = {k: np.concatenate(v) for k, v in cols.items()}
    del cols
    order = np.argsort(columns["ts"], kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    columns = {k: v[order] for k, v in columns.items()}
    strings_list = list(strings)
    comm_all = pd.concat(comms, ignore_index=True) if comms else pd.DataFrame()
    if len(comm_all):
        comm_all["event"] = inverse[comm_all["event"].to_numpy(np.int64)]
    steps = _steps(columns, strings_list)
    columns["step"] = _step_column(columns, steps)
    lanes = pd.DataFrame(lane_rows, columns=["lane", "kind", "pid", "tid", "name"])
    comm_table = _comm_table(comm_all, columns, strings_list)
    first = parts[0][1]
    return RankResult(
        source=source,
        rank=rank,
        world_size=next((ft.world_size for _, ft in parts if ft.world_size), None),
        backend=first.backend,
        host=next((ft.host for _, ft in parts if ft.host), None),
        trace_ids=sorted({ft.trace_id for _, ft in parts if ft.trace_id}),
        nbytes=sum(ft.nbytes for _, ft in parts),
        columns=columns,
        strings=strings_list,
        lanes=lanes,
        comm=comm_table,
        steps=steps,
        problems=problems,
        t_first=int(columns["ts"][0]),
    )


def _steps(columns: dict[str, np.ndarray], strings: list[str]) -> pd.DataFrame:
    """ProfilerStep ranges of one rank (raw ns): step, start, end."""
    import numpy as np
    import pandas as pd

    idx = np.flatnonzero(columns["kind"] == EventKind.PROFILER_STEP)
    rows = []
    for i in idx.tolist():
        name = strings[int(columns["name"][i])]
        try:
            step = int(name.split("#", 1)[1])
        except (IndexError, ValueError):
            continue
        start = int(columns["ts"][i])
        rows.append((step, start, start + int(columns["dur"][i])))
    frame = pd.DataFrame(rows, columns=["step", "start", "end"])
    return frame.drop_duplicates("step").sort_values("start").reset_index(drop=True)


def _step_column(columns: dict[str, np.ndarray], steps: pd.DataFrame) -> np.ndarray:
    """Step of each event: the ProfilerStep it starts in; GPU work takes its launch's step."""
    import numpy as np

    ts = columns["ts"]
    out = np.full(len(ts), -1, dtype=np.int32)
    if steps.empty:
        return out
    starts = steps["start"].to_numpy(np.int64)
    ends = steps["end"].to_numpy(np.int64)
    nums = steps["step"].to_numpy(np.int32)
    pos = np.searchsorted(starts, ts, side="right") - 1
    inside = (pos >= 0) & (ts < ends[np.clip(pos, 0, None)])
    out[inside] = nums[pos[inside]]
    # GPU activity runs after its launch: take the step of the CPU runtime call with its corr.
    gidx = np.flatnonzero(np.isin(columns["kind"], GPU_KINDS))
    launch = _launches(columns, gidx)
    found = launch >= 0
    out[gidx[found]] = out[launch[found]]
    return out


def _launches(columns: dict[str, np.ndarray], idx: np.ndarray) -> np.ndarray:
    """Row of the CPU runtime call (same correlation id) that launched each GPU event ``idx``.

    -1 where the event has no correlation id or its launch is not in the trace.
    """
    import numpy as np

    corr = columns["corr"]
    out = np.full(len(idx), -1, dtype=np.int64)
    runtime = np.flatnonzero((columns["kind"] == EventKind.RUNTIME) & (corr >= 0))
    if not len(runtime) or not len(idx):
        return out
    order = np.argsort(corr[runtime], kind="stable")
    rc, rows = corr[runtime][order], runtime[order]
    want = corr[idx]
    p = np.clip(np.searchsorted(rc, want), 0, len(rc) - 1)
    found = (want >= 0) & (rc[p] == want)
    out[found] = rows[p[found]]
    return out


def _comm_table(
    comm: pd.DataFrame, columns: dict[str, np.ndarray], strings: list[str]
) -> pd.DataFrame:
    """One rank's comm events with groups normalised, step, start and end (raw ns), and peer.

    ``peer``: global rank of the other side of a send / recv, from the rank runtime's
    annotation around the call (:func:`_p2p_peers`); -1 for collectives and unknown peers.
    """
    import numpy as np
    import pandas as pd
    from rankscope.orchestrator.collectives import RANK_COMM_COLUMNS, normalise_groups

    if comm.empty:
        empty = pd.DataFrame({c: np.array([], dtype=np.int64) for c in RANK_COMM_COLUMNS})
        empty["gpu"] = empty["gpu"].astype(bool)
        return empty
    ev = comm["event"].to_numpy(np.int64)
    comm = comm.copy()
    comm["step"] = columns["step"][ev]
    comm["start"] = columns["ts"][ev]
    comm["end"] = columns["ts"][ev] + columns["dur"][ev]
    is_cpu = pd.Series(columns["kind"][ev] == EventKind.COMM_CPU, index=comm.index)
    comm["group"] = normalise_groups(comm, is_cpu, comm["lane"])
    comm["gpu"] = ~is_cpu
    ops, peers = _p2p_peers(comm["op"].to_numpy(object), ev, columns, strings)
    comm["op"] = ops
    comm["peer"] = peers
    return comm.loc[:, list(RANK_COMM_COLUMNS)].reset_index(drop=True)


#: Event kinds that run on a GPU stream (their step and host time are their launch's).
GPU_KINDS = (EventKind.KERNEL_COMPUTE, EventKind.KERNEL_COMM, EventKind.MEMCPY, EventKind.MEMSET)
#: Annotations looked back through for one that is still open (p2p calls nest at most this deep).
MAX_P2P_NESTING = 4


def _p2p_peers(
    ops: np.ndarray, ev: np.ndarray, columns: dict[str, np.ndarray], strings: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """(op, peer) of each comm event: the p2p annotation (rundir.P2P_ANNOTATION_FORMAT) around it.

    The annotation wraps the host call, so a gloo op starts inside it, while a GPU kernel runs
    later: for kernels the host time is that of the runtime call that launched them (same
    correlation id). The latest annotation starting at or before the host time that is still open
    then gives the direction and the peer — a ``SendRecv`` kernel of NCCL becomes a send or recv.
    Events outside any annotation keep their op and peer -1.
    """
    import numpy as np
    from rankscope.analysis.schema import P2P_OPS
    from rankscope.launchers.rundir import P2P_ANNOTATION_PATTERN

    peers = np.full(len(ev), -1, dtype=np.int64)
    parsed = {
        i: m.groups() for i, s in enumerate(strings) if (m := P2P_ANNOTATION_PATTERN.fullmatch(s))
    }
    candidates = np.isin(ops, [*P2P_OPS, "sendrecv"])
    if not parsed or not candidates.any():
        return ops, peers
    name = columns["name"]
    ann = np.flatnonzero(np.isin(name, np.fromiter(parsed, np.int64, len(parsed))))
    a_start = columns["ts"][ann]  # sorted: columns are in ts order
    a_end = a_start + columns["dur"][ann]
    host = columns["ts"][ev].copy()
    gpu = columns["kind"][ev] == EventKind.KERNEL_COMM
    if gpu.any():
        launch = _launches(columns, ev[gpu])
        # a kernel without its launch in the trace has no host time (-1)
        host[gpu] = np.where(launch >= 0, columns["ts"][np.maximum(launch, 0)], -1)
    ops = ops.copy()
    for i in np.flatnonzero(candidates & (host >= 0)).tolist():
        k = int(np.searchsorted(a_start, host[i], side="right")) - 1
        stop = k - MAX_P2P_NESTING
        while k > stop and k >= 0 and a_end[k] < host[i]:
            k -= 1  # an earlier, longer annotation may still be open (nested calls)
        if k > stop and k >= 0:
            op, peer = parsed[int(name[ann[k]])]
            ops[i] = op
            peers[i] = int(peer)
    return ops, peers


# ------------------------------------------------------------------------------------- write
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


def _run_tasks(sources: list[RankSource], scheduler: str | None) -> Iterator[RankResult]:
    """Yield parse results as they finish, keeping at most 2 × workers tasks in flight."""
    if scheduler == SYNCHRONOUS or (len(sources) <= 1 and scheduler is None):
        # One rank has nothing to parallelise: a LocalCluster would only add ~2 s of start-up.
        for src in sources:
            yield parse_source(src)
        return
    import logging

    from distributed import Client, LocalCluster, as_completed

    cluster = None
    if scheduler is None:
        n = max(1, min(len(sources), os.cpu_count() or 1))
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",  # a free port: never collides with a running dashboard
            silence_logs=logging.ERROR,
        )
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout="20s")
        except OSError as exc:
            raise UsageError(f"--scheduler {scheduler}: cannot connect ({exc})") from None
    try:
        workers = max(1, len(client.scheduler_info().get("workers", {})) or 1)
        limit = 2 * workers
        pending = list(sources)
        first = [client.submit(parse_source, s, pure=False) for s in pending[:limit]]
        pending = pending[limit:]
        queue = as_completed(first)
        for fut in queue:
            result = fut.result()
            fut.release()
            if pending:
                queue.add(client.submit(parse_source, pending.pop(0), pure=False))
            yield result
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def merge_run_dir(
    run_dir: Path,
    *,
    output: Path | None = None,
    scheduler: str | None = None,
    quiet: bool = False,
    strict: bool = False,
    extra_inputs: list[Path] | None = None,
) -> Path:
    """Merge the traces under ``run_dir`` (a run directory or any folder of traces) into a store.

    Returns the store path (``run_dir/trace.h5`` unless ``output``). ``scheduler``: None starts a
    LocalCluster (one single-threaded worker process per core, at most one per rank; a single
    rank is parsed in-process); ``"synchronous"`` parses in this process; anything else is the
    address of a running Dask scheduler. Raises :class:`InputFileError` when no rank could be merged (or, with
    ``strict``, when any problem was found — the store is still written).
    """
    inputs = [Path(run_dir), *(extra_inputs or [])]
    base = inputs[0] if inputs[0].is_dir() else inputs[0].parent
    out = Path(output) if output is not None else base / rundir.STORE_NAME
    if out.is_dir():
        out = out / rundir.STORE_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        problems = _merge_locked(inputs, out, scheduler=scheduler, quiet=quiet)
    if strict and problems:
        raise InputFileError(f"{out}: {len(problems)} input problem(s) (--strict)", exit_code=1)
    return out


def _merge_locked(
    inputs: list[Path], out: Path, *, scheduler: str | None, quiet: bool
) -> list[Problem]:
    """The merge proper, under the output lock; returns the problems found."""
    import numpy as np
    import pandas as pd
    from rankscope import __version__
    from rankscope.analysis.store import StoreWriter
    from rankscope.orchestrator import clock as clk
    from rankscope.orchestrator.collectives import match, renumber

    sources, run, problems = discover(inputs)
    if not sources:
        # One line, not the problems and then an error: ``analyze`` relays it under its name.
        raise InputFileError(nothing_to_merge(inputs[0], problems))
    for p in problems:
        _say(p, quiet)
    # Stale temporaries of an interrupted merge (we hold the lock: nobody else writes them).
    for stale in out.parent.glob(f".{out.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    tmp = out.parent / TMP_FORMAT.format(name=out.name, pid=os.getpid())
    total_bytes = sum(p.stat().st_size for s in sources for _, p in s.files if p.exists())
    written: dict[int, RankResult] = {}  # columns dropped after writing
    try:
        writer = StoreWriter(
            tmp,
            attrs={
                "run_id": str(run.get("run_id") or inputs[0].resolve().name),
                "source": str(inputs[0].resolve()),
                "rankscope_version": __version__,
                "tool_versions": _tool_versions(),
                "run": run or None,
            },
        )
        with writer, _Progress(quiet, len(sources), total_bytes) as progress:
            for result in _run_tasks(sources, scheduler):
                for p in result.problems:
                    problems.append(p)
                    _say(p, quiet, progress)
                progress.advance(result)
                if result.columns is None or result.rank is None:
                    if result.columns is not None:
                        p = Problem(
                            result.source.label,
                            -1,
                            "rank unknown (no distributedInfo, no rank in name)",
                        )
                        problems.append(p)
                        _say(p, quiet, progress)
                    continue
                _accept(result, written, writer, problems, quiet, progress)
            _reject_foreign(run, written, writer, problems, quiet)
            if not written:
                raise InputFileError(
                    f"{inputs[0]}: no rank could be merged ({len(problems)} problem(s), see above)"
                )
            world = int(
                run.get("world_size") or _common(r.world_size for r in written.values()) or 0
            )
            world = max(world, max(written) + 1)
            missing = [r for r in range(world) if r not in written]
            if missing:
                # One line for all of them (a 2-of-128 sample would otherwise print 126 lines).
                p = Problem(
                    str(inputs[0]),
                    missing[0] if len(missing) == 1 else -1,
                    f"{len(missing)} of {world} rank(s) missing (no trace): {_ranges(missing)}",
                )
                problems.append(p)
                _say(p, quiet)
            # Collectives + clocks.
            colls = match({r: res.comm for r, res in written.items() if res.comm is not None})
            inputs_clock = _share_domain_fits(
                [_clock_input(r, res) for r, res in sorted(written.items())]
            )
            ref = 0 if 0 in written else min(written)
            clock_table, colls_aligned = clk.align(colls, inputs_clock, ref)
            colls_aligned = renumber(colls_aligned) if not colls_aligned.empty else colls_aligned
            per_rank_clock = clock_table.set_index("rank")
            steps_frames = []
            for r in sorted(written):
                c = per_rank_clock.loc[r]
                args = (int(c["offset_ns"]), float(c["drift_ppb"]), int(c["t_ref_ns"]))
                ts = writer.read_events(r, ["ts"])["ts"]
                coll_col = np.full(len(ts), -1, dtype=np.int64)
                if not colls_aligned.empty:
                    mine = colls_aligned[colls_aligned["rank"] == r]
                    coll_col[mine["event"].to_numpy(np.int64)] = mine["coll"].to_numpy(np.int64)
                writer.update_events(r, {"ts": clk.apply_transform(ts, *args), "coll": coll_col})
                steps = written[r].steps
                if steps is not None and not steps.empty:
                    st = steps.copy()
                    st["start"] = clk.apply_transform(st["start"].to_numpy(np.int64), *args)
                    st["end"] = clk.apply_transform(st["end"].to_numpy(np.int64), *args)
                    st.insert(0, "rank", np.int32(r))
                    steps_frames.append(st)
            writer.set_attr("world_size", world)
            writer.set_attr("reference_rank", ref)
            writer.write_tables(
                {
                    "collectives": colls_aligned if not colls_aligned.empty else _empty_colls(),
                    "steps": pd.concat(steps_frames, ignore_index=True)
                    if steps_frames
                    else pd.DataFrame({"rank": [], "step": [], "start": [], "end": []}),
                    "clock": clock_table,
                    "problems": pd.DataFrame(
                        [(p.file, p.rank, p.problem) for p in problems],
                        columns=["file", "rank", "problem"],
                    ),
                }
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    if not quiet:
        n_coll = int(colls_aligned["coll"].nunique()) if not colls_aligned.empty else 0
        print(clk.summary_line(clock_table))
        print(
            f"merged {len(written)} of {world} rank(s), {n_coll} collective(s), "
            f"{len(problems)} problem(s) → {out}"
        )
    return problems


def _accept(
    result: RankResult,
    written: dict[int, RankResult],
    writer: Any,
    problems: list[Problem],
    quiet: bool,
    progress: Any,
) -> None:
    """Write one parsed rank (duplicates: the first file in name order wins, deterministically)."""
    import numpy as np

    rank = int(result.rank)  # type: ignore[arg-type]
    if rank in written:
        old = written[rank]
        keep_old = old.source.label <= result.source.label
        loser, winner = (result, old) if keep_old else (old, result)
        p = Problem(
            loser.source.label, rank, f"rank {rank} also claimed by {winner.source.label}; ignored"
        )
        problems.append(p)
        _say(p, quiet, progress)
        if keep_old:
            return
    assert result.columns is not None
    codes = writer.intern(result.strings)
    events = dict(result.columns)
    events["name"] = codes[events["name"]] if len(codes) else events["name"]
    events["cat"] = codes[events["cat"]] if len(codes) else events["cat"]
    events["coll"] = np.full(len(events["ts"]), -1, dtype=np.int64)
    meta = dict(result.source.meta)
    meta.pop("clock", None)
    attrs = {
        "files": [str(p) for _, p in result.source.files],
        "world_size_claimed": result.world_size if result.world_size is not None else -1,
        "backend": result.backend or meta.get("backend") or "",
        "host": meta.get("host") or result.host or "",
        "trace_ids": result.trace_ids,
        "json_bytes": result.nbytes,
        "meta": meta or None,
    }
    for key in ("device", "versions", "local_rank", "pid", "windows"):
        if key in meta:
            attrs[key] = meta[key]
    writer.write_rank(rank, events, result.lanes, attrs)
    result.columns = None  # only the small tables stay in memory
    written[rank] = result


def _reject_foreign(
    run: dict[str, Any],
    written: dict[int, RankResult],
    writer: Any,
    problems: list[Problem],
    quiet: bool,
) -> None:
    """Drop ranks from another job: world size disagreeing with the run, or far-apart times."""
    import numpy as np

    expected = run.get("world_size") or _common(r.world_size for r in written.values())
    first = {r: res.t_first for r, res in written.items()}
    known = list(first.values())
    median = float(np.median(known)) if known else None
    for r, res in sorted(written.items()):
        why = None
        if expected and res.world_size and res.world_size != expected:
            why = f"trace from another job: world size {res.world_size}, this run has {expected}"
        elif median is not None and abs(first[r] - median) > FOREIGN_TIME_NS:
            hours = abs(first[r] - median) / 3.6e12
            why = f"trace from another job: recorded {hours:.0f} h apart from the other ranks"
        if why:
            p = Problem(res.source.label, r, why + "; rank left out")
            problems.append(p)
            _say(p, quiet)
            writer.drop_rank(r)
            del written[r]


def _clock_input(rank: int, res: RankResult) -> Any:
    """Clock facts of one rank from its meta.json (run directories) or nothing."""
    import pandas as pd
    from rankscope.orchestrator.clock import ClockInput, fit_samples

    meta = res.source.meta
    cinfo = meta.get("clock") or {}
    host = str(meta.get("host") or res.host or "")
    domain = str(cinfo.get("domain") or "")
    fit = None
    samples = cinfo.get("samples") or []
    if samples:
        try:
            fit = fit_samples(pd.DataFrame(samples))
        except (KeyError, TypeError, ValueError):
            fit = None
    return ClockInput(rank=rank, host=host, domain=domain, fit=fit)


def _share_domain_fits(inputs: list[Any]) -> list[Any]:
    """Ranks of one clock domain share its leader's fit (only leaders record samples)."""
    import dataclasses

    fits = {ci.domain: ci.fit for ci in inputs if ci.domain and ci.fit is not None}
    return [
        dataclasses.replace(ci, fit=fits[ci.domain]) if ci.fit is None and ci.domain in fits else ci
        for ci in inputs
    ]


def _ranges(ranks: list[int]) -> str:
    """Compact text of sorted ranks: [0, 1, 2, 5] -> '0-2, 5'."""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


def _common(values: Any) -> Any:
    vals = [v for v in values if v]
    if not vals:
        return None
    from collections import Counter

    return Counter(vals).most_common(1)[0][0]


def _empty_colls() -> pd.DataFrame:
    import pandas as pd
    from rankscope.analysis.schema import COLLECTIVE_COLUMNS

    return pd.DataFrame({c: [] for c in COLLECTIVE_COLUMNS})


def _tool_versions() -> dict[str, str]:
    import platform

    import h5py
    import msgspec
    import numpy
    import pandas

    return {
        "python": platform.python_version(),
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "msgspec": msgspec.__version__,
        "numpy": numpy.__version__,
        "pandas": pandas.__version__,
    }


def _say(problem: Problem, quiet: bool, progress: Any = None) -> None:
    """Print one problem on one line (stderr), naming the file."""
    if quiet:
        return
    line = f"rankscope merge: {problem.file}: {problem.problem}"
    if progress is not None and getattr(progress, "console", None) is not None:
        progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
    else:
        print(line, file=sys.stderr)


class _Progress:
    """Rich progress bar: bytes of input parsed (files on disk) and ranks done, on stderr."""

    def __init__(self, quiet: bool, n: int, total_bytes: int) -> None:
        self.console: Any = None
        self._bar: Any = None
        self._n = n
        self._done = 0
        if quiet:
            return
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self._bar = Progress(
            TextColumn("merging {task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self._task = self._bar.add_task(f"0/{n} ranks", total=max(total_bytes, 1))

    def advance(self, result: RankResult) -> None:
        """One rank source finished (its files' sizes count as done)."""
        self._done += 1
        if self._bar is not None:
            size = sum(p.stat().st_size for _, p in result.source.files if p.exists())
            self._bar.update(self._task, advance=size, description=f"{self._done}/{self._n} ranks")

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


# --------------------------------------------------------------------------------------- CLI
def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope merge`` (import-light)."""
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="PATH",
        help="a run directory, a folder of Kineto traces (searched recursively), or trace files",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="store to write (default: trace.h5 in the run directory / folder, or beside the "
        "first trace file)",
    )
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="Dask scheduler address to use (default: a LocalCluster sized to this machine; "
        "'synchronous' parses in this process)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit non-zero when any input problem was found"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


@contextlib.contextmanager
def interrupt_wins() -> Iterator[None]:
    """Ctrl-C during the block is reported as an interrupt, whatever code it lands in.

    A ``KeyboardInterrupt`` raised while h5py runs Cython code can come out as another exception
    (seen in CI: a ``TypeError`` from h5py's type-conversion setup), which would print a traceback
    instead of "interrupted" (exit 130). The handler notes that SIGINT arrived; an exception that
    escapes after it becomes the ``KeyboardInterrupt`` it stands for. Only Python's default
    handler is replaced (a user who ignores SIGINT keeps that).
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        fired.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    except Exception as exc:
        if fired:
            raise KeyboardInterrupt from exc
        raise
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(args: argparse.Namespace) -> int:
    """Run ``rankscope merge``; returns the exit status."""
    paths = [Path(p) for p in args.inputs]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise UsageError(f"{missing[0]}: no such file or directory")
    with interrupt_wins():
        merge_run_dir(
            paths[0],
            output=args.output,
            scheduler=args.scheduler,
            quiet=args.quiet,
            strict=args.strict,
            extra_inputs=paths[1:],
        )
    return 0
