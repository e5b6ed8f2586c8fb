"""``rankscope merge``, the driver: per-rank Kineto traces → one HDF5 store with aligned clocks.

Pipeline (docs/format.md, "How the merge works"; docs/architecture.md, "The path of one trace"):

1. **Discover** the inputs (:mod:`~rankscope.orchestrator.ingest.discovery`): a run directory, any
   folder of Kineto traces (searched recursively; rankscope's own outputs there are never
   inputs), or trace files.
2. **Parse** one task per rank source (:func:`~rankscope.orchestrator.ingest.rank_columns.parse_source`,
   which decodes with :mod:`~rankscope.orchestrator.ingest.decode` in the words of
   :mod:`~rankscope.orchestrator.ingest.vocabulary`) where :mod:`rankscope.analysis.engine.scheduler` says:
   the analysis' scheduler, chosen the same way (in-process until worker processes pay for their
   start-up, on the events :func:`estimate_events` expects), with the same one line on stderr
   saying where and why. At most ``2 × workers`` tasks are in flight, and the parent parks each
   finished rank's columns on disk at once (:class:`Spill`) and drops them, so memory holds a
   few ranks, never all.
3. **Decide** which ranks belong (:mod:`~rankscope.orchestrator.ingest.rank_selection`) — of two files
   claiming a rank the first by name wins; ranks from another job (world size, or a clock
   :data:`~rankscope.orchestrator.ingest.rank_selection.FOREIGN_TIME_NS` away from the others) are left
   out — before anything is written.
4. **Match** collectives across ranks, **align** clocks (orchestrator/ingest/clock.py), then write each
   kept rank ONCE: ``ts`` already on the aligned clock, its ``coll`` column, its names and
   categories translated to the store's string table; then the run-wide tables.
5. The store is written to a temporary name in the output folder and renamed; a lock file
   (``.trace.h5.lock``, removed when the merge ends) keeps two merges of one output apart.
   A write that fails (full disk, quota, read-only: in the spill, the store, the rename) ends
   the merge with ONE :class:`~rankscope.errors.OutputError` line naming the output; the
   temporary store and the spill are removed, a previous store is untouched
   (docs/reliability.md).

Why the columns are parked rather than written as they arrive: whether a rank is kept and how its
clock is shifted are known only once every rank is parsed, and HDF5 neither gives back the space
of a deleted rank nor rewrites compressed chunks cheaply. A raw ``.npy`` per column (~43 bytes
per event, beside the output, gone when the merge ends) costs one plain write and one read,
where writing at once cost a compressed write, a read-back of ``ts`` and a compressed rewrite.

Bad input never costs the other ranks: every problem is recorded in ``/problems`` and printed
with its file; the exit status is non-zero only when no rank could be merged (or ``--strict``).

Why one module of ~580 lines: the decisions between parsing and writing (split a merged file,
keep, leave out, align, write once) read best in one place. Beside it: which ranks are kept and how rank-less traces are
ranked in ``rank_selection.py``, the problem lines and progress bar in ``merge_progress.py``, the
command's arguments in ``merge_cli.py``, the files beside the output in ``staging.py``, the
per-rank work in ``rank_columns.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import sys
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import msgspec
import numpy as np
from rankscope.analysis.engine.scheduler import (
    SYNCHRONOUS as SYNCHRONOUS,  # the one word, for callers
)
from rankscope.analysis.store.devices import CAPABILITY_ATTR, capability_attr
from rankscope.analysis.store.hdf5_links import written_here
from rankscope.atomic import translate_write_errors
from rankscope.errors import InputFileError, UsageError
from rankscope.launchers import rundir
from rankscope.orchestrator.ingest import step_logs
from rankscope.orchestrator.ingest.column_tables import distinct
from rankscope.orchestrator.ingest.comm_kernels import (
    COMM_KERNELS_ATTR,
    DEFAULT_VOCABULARY,
    CommVocabulary,
    vocabulary,
)
from rankscope.orchestrator.ingest.discovery import Problem, RankSource, discover, nothing_to_merge
from rankscope.orchestrator.ingest.merge_progress import _Progress, _say
from rankscope.orchestrator.ingest.rank_selection import FOREIGN_TIME_NS as FOREIGN_TIME_NS
from rankscope.orchestrator.ingest.rank_selection import MAX_RANKS as MAX_RANKS
from rankscope.orchestrator.ingest.rank_selection import (
    _accept,
    _common,
    _reject_foreign,
    _world_claim,
    duplicate_claims,
    hint_ranks,
)
from rankscope.orchestrator.ingest.rank_selection import rank_in_name as rank_in_name
from rankscope.orchestrator.ingest.rank_selection import rank_pattern as rank_pattern
from rankscope.orchestrator.ingest.rank_selection import rank_rankless as rank_rankless
from rankscope.orchestrator.ingest.rank_selection import rankless_note as rankless_note
from rankscope.orchestrator.ingest.source_reads import parse_choice
from rankscope.orchestrator.ingest.staging import (
    SPILL_FORMAT,
    SPLIT_FORMAT,
    TMP_FORMAT,
    WORKERS_FORMAT,
    Spill,
    output_lock,
    remove_stale,
)
from rankscope.orchestrator.ingest.store_names import store_for
from rankscope.rank_ranges import rank_ranges

if TYPE_CHECKING:
    from rankscope.analysis.engine.scheduler import ClusterSpec
    from rankscope.orchestrator.ingest.rank_columns import RankResult
    from rankscope.orchestrator.ingest.source_reads import ReadAhead

#: Slurm job name of the merge's ``--slurm-workers`` (what squeue and sacct show).
MERGE_JOB_NAME = "rankscope-merge"


def merge_run_dir(
    run_dir: Path,
    *,
    output: Path | None = None,
    scheduler: str | None = None,
    cluster: ClusterSpec | None = None,
    quiet: bool = False,
    strict: bool = False,
    extra_inputs: list[Path] | None = None,
    main_is_guarded: bool = False,
    rank_from: str | None = None,
    comm: CommVocabulary | None = None,
    read_ahead: ReadAhead | None = None,
) -> Path:
    """Merge the traces under ``run_dir`` (a run directory or any folder of traces) into a store.

    Returns the store path (unless ``output``: ``run_dir/trace.h5`` for a folder, the trace's
    own store for one trace file, :func:`~rankscope.orchestrator.ingest.store_names.store_for`;
    ``trace.h5`` beside the first of several files). ``scheduler`` takes the
    analysis' words (:class:`rankscope.analysis.engine.scheduler.ClusterSpec`): None or ``"auto"``
    parses in-process unless worker processes pay for their start-up, ``"processes"`` forks
    them (Linux), ``"local"`` starts a LocalCluster (one single-threaded worker process per core, at most one per rank),
    ``"threads"`` and ``"synchronous"`` stay in this process, anything else is the address of a
    running Dask scheduler. ``cluster``: the whole :class:`ClusterSpec` instead (Slurm workers:
    ``slurm_workers``, ``slurm_partition`` …; ``rankscope merge --slurm-workers N``), not with
    ``scheduler``; its Slurm jobs are named :data:`MERGE_JOB_NAME` and write beside the output
    (:data:`~rankscope.orchestrator.ingest.staging.WORKERS_FORMAT`) unless it says otherwise.
    ``main_is_guarded``: the caller's ``__main__`` is safe to re-import
    in worker processes (rankscope's CLI; see ``scheduler.processes_are_safe``). Raises
    :class:`InputFileError` when no rank could be merged (or, with ``strict``, when any problem
    was found — the store is still written). ``rank_from``: a regular expression whose first
    group (or whole match) in a file's name is its rank, for traces without ``distributedInfo``
    (:func:`~rankscope.orchestrator.ingest.rank_selection.rank_rankless`). ``comm``: the
    communication kernels in force (None: the built-in ones and the config file's,
    :func:`~rankscope.orchestrator.ingest.comm_kernels.vocabulary`); the store records the
    user's patterns (:data:`COMM_KERNELS_ATTR`) so that a store merged with others is merged again.
    ``read_ahead``: reads begun in a forked process before this process' imports
    (:class:`~rankscope.orchestrator.ingest.source_reads.ReadAhead`, which the caller owns; the
    merge closes it once its parse is over), taken where the merge parses in-process.
    """
    if cluster is not None and scheduler is not None:
        raise ValueError("give merge_run_dir scheduler= or cluster=, not both")
    inputs = [Path(run_dir), *(extra_inputs or [])]
    rank_rx = rank_pattern(rank_from)
    base = inputs[0] if inputs[0].is_dir() else inputs[0].parent
    if output is not None:
        out = Path(output)
    elif len(inputs) == 1:
        out = store_for(inputs[0])  # a folder's trace.h5, or one trace's own store
    else:
        out = base / rundir.STORE_NAME
    if out.is_dir():
        out = out / rundir.STORE_NAME
    with translate_write_errors(out):
        out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        problems = _merge_locked(
            inputs,
            out,
            scheduler=scheduler,
            cluster=cluster,
            quiet=quiet,
            main_is_guarded=main_is_guarded,
            rank_from=rank_rx,
            comm=comm if comm is not None else vocabulary(),
            ahead=read_ahead,
        )
    if strict and problems:
        raise InputFileError(f"{out}: {len(problems)} input problem(s) (--strict)", exit_code=1)
    return out


def _merge_locked(
    inputs: list[Path],
    out: Path,
    *,
    scheduler: str | None,
    quiet: bool,
    main_is_guarded: bool,
    rank_from: re.Pattern[str] | None = None,
    cluster: ClusterSpec | None = None,
    comm: CommVocabulary = DEFAULT_VOCABULARY,
    ahead: ReadAhead | None = None,
) -> list[Problem]:
    """The merge proper, under the output lock; returns the problems found."""
    from rankscope import __version__
    from rankscope.analysis.engine.scheduler import AUTO, SYNCHRONOUS, ClusterSpec, run_each
    from rankscope.analysis.store.schema import P2P_WITHOUT_PEER_ATTR
    from rankscope.analysis.store.writer import StoreWriter
    from rankscope.orchestrator.ingest import clock as clk
    from rankscope.orchestrator.ingest.column_tables import concat_rows
    from rankscope.orchestrator.ingest.matching import (
        match,
        renumber,
        rows_by_rank,
        without_peer,
    )
    from rankscope.orchestrator.ingest.rank_columns import parse_source

    sources, run, problems = discover(inputs)
    hint_ranks(sources, rank_from)
    rankless: list[RankResult] = []
    if not sources:
        # One line, not the problems and then an error: ``analyze`` relays it under its name.
        raise InputFileError(nothing_to_merge(inputs[0], problems))
    for p in problems:
        _say(p, quiet)
    try:
        spec = (
            cluster
            if cluster is not None
            else ClusterSpec(scheduler=scheduler or AUTO, main_is_guarded=main_is_guarded)
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    remove_stale(out)
    split_dir = out.parent / SPLIT_FORMAT.format(name=out.name, pid=os.getpid())
    workers_dir = out.parent / WORKERS_FORMAT.format(name=out.name, pid=os.getpid())
    asked = spec

    def plan(sources: list[RankSource]) -> tuple[Any, ClusterSpec]:
        """Where ``sources`` are parsed: the choice and the spec that carries it out."""
        choice = parse_choice(asked, sources)
        return choice, dataclasses.replace(
            asked,
            scheduler=choice.scheduler,
            main_is_guarded=asked.main_is_guarded or main_is_guarded,
            slurm_job_name=asked.slurm_job_name or MERGE_JOB_NAME,
            # What Slurm workers write goes beside the output (shared, removed with the spill).
            slurm_work_dir=asked.slurm_work_dir or workers_dir,
        )

    def calls(source: RankSource) -> tuple[Any, ...]:
        """parse_source's arguments for ``source``: the reads begun ahead, and a second core
        for the scanner (``beside``), where it runs here."""
        here = spec.scheduler == SYNCHRONOUS
        return (source, comm, ahead if reading_ahead() else None, here)

    def reading_ahead() -> bool:
        return ahead is not None and spec.scheduler == SYNCHRONOUS

    choice, spec = plan(sources)
    # before the parses: the versions are looked up (~0.01 s) while a read-ahead still parses
    versions = _tool_versions()
    first: RankResult | None = None  # the one file's parse, when it stands as one rank
    if _may_be_merged(sources):
        # Parsed once as one rank; split (and parsed again, by part) only on a sign of several
        # ranks (multirank.py): the common one-rank file is never decoded twice.
        try:
            with contextlib.closing(run_each(parse_source, [calls(sources[0])], spec, 1)) as one:
                first = next(iter(one))
        except BaseException:
            shutil.rmtree(workers_dir, ignore_errors=True)
            raise
        if first.rank_signs:
            try:
                split = _split_merged(sources, split_dir, quiet)
            except BaseException:
                shutil.rmtree(split_dir, ignore_errors=True)
                raise
            if split != sources:
                first, sources = None, split
                choice, spec = plan(sources)
    order = {src.label: i for i, src in enumerate(sources)}
    if not quiet:
        note = ahead.note if ahead is not None and reading_ahead() else ""
        print(f"merge: {choice.reason}{note}", file=sys.stderr)  # analyze prints it too
    tmp = out.parent / TMP_FORMAT.format(name=out.name, pid=os.getpid())
    spill_dir = out.parent / SPILL_FORMAT.format(name=out.name, pid=os.getpid())
    total_bytes = sum(p.stat().st_size for s in sources for _, p in s.files if p.exists())
    parked: dict[int, RankResult] = {}  # their columns wait in the spill
    try:
        spill = Spill(spill_dir, out, in_memory=len(sources) == 1)
        writer = StoreWriter(
            tmp,
            target=out,
            attrs={
                "run_id": str(run.get("run_id") or inputs[0].resolve().name),
                "source": str(inputs[0].resolve()),
                "rankscope_version": __version__,
                "tool_versions": versions,
                "run": run or None,
                COMM_KERNELS_ATTR: list(comm.user_patterns),
            },
        )
        # closing(): a failure in the loop's body (a full disk in the spill) stops the workers
        # now, before the folders beside the output are removed, not when the runner is collected.
        with (
            writer,
            _Progress(quiet, len(sources), total_bytes) as progress,
            contextlib.closing(
                run_each(parse_source, [calls(s) for s in sources], spec, len(sources))
                if first is None
                else _parsed(first)
            ) as results,
        ):
            claims: dict[int, list[str]] = {}
            found: list[tuple[int, list[Problem]]] = []  # each source's, by its position
            for result in results:
                mine = list(result.problems)
                found.append((order.get(result.source.label, len(order)), mine))
                for p in mine:
                    _say(p, quiet, progress)
                progress.advance(result)
                if result.columns is None:
                    continue
                if result.rank is None:
                    rankless.append(result)  # ranked once every rank is known
                    continue
                _accept(result, parked, spill, mine, quiet, progress, claims)
            # workers hand results over as they finish: the store keeps the sources' order
            for _, mine in sorted(found, key=lambda f: f[0]):
                problems.extend(mine)
            rankless.sort(key=lambda r: order.get(r.source.label, len(order)))
            for res, why in rank_rankless(rankless, set(parked), rank_from):
                if res.rank is None:
                    p = Problem(res.source.label, -1, why)
                    problems.append(p)
                    _say(p, quiet, progress)
                else:
                    _accept(res, parked, spill, problems, quiet, progress, claims)
            duplicate_claims(claims, parked, problems, quiet, progress)
            if rankless and rank_from is None and any(r.rank is not None for r in rankless):
                note = rankless_note([r for r in rankless if r.rank is not None])
                if progress.console is not None:
                    progress.console.print(f"merge: {note}", markup=False, highlight=False)
            _reject_foreign(run, parked, spill, problems, quiet)
            if not parked:
                raise InputFileError(
                    f"{inputs[0]}: no rank could be merged ({len(problems)} problem(s), see above)"
                )
            world = _world_claim(
                run.get("world_size") or _common(r.world_size for r in parked.values())
            )
            world = max(world, max(parked) + 1)
            missing = [r for r in range(world) if r not in parked]
            if missing:
                # One line for all of them (a 2-of-128 sample would otherwise print 126 lines).
                p = Problem(
                    str(inputs[0]),
                    missing[0] if len(missing) == 1 else -1,
                    f"{len(missing)} of {world} rank(s) missing (no trace): {rank_ranges(missing)}",
                )
                problems.append(p)
                _say(p, quiet)
            # Collectives + clocks.
            colls = match({r: res.comm for r, res in parked.items() if res.comm is not None})
            inputs_clock = _share_domain_fits(
                [_clock_input(r, res) for r, res in sorted(parked.items())]
            )
            ref = 0 if 0 in parked else min(parked)
            clock_table, colls_aligned = clk.align_columns(colls, inputs_clock, ref)
            colls_aligned = renumber(colls_aligned)
            clock_row = {r: i for i, r in enumerate(clock_table["rank"].tolist())}
            coll_of = rows_by_rank(colls_aligned, parked, ["event", "coll"])
            steps_parts = []
            for r in sorted(parked):
                i = clock_row[r]
                args = (
                    int(clock_table["offset_ns"][i]),
                    float(clock_table["drift_ppb"][i]),
                    int(clock_table["t_ref_ns"][i]),
                )
                events = spill.take(r)
                events["ts"] = clk.apply_transform(events["ts"], *args)
                events["coll"] = np.full(len(events["ts"]), -1, dtype=np.int64)
                in_colls = coll_of[r]
                events["coll"][in_colls["event"].astype(np.int64)] = in_colls["coll"].astype(
                    np.int64
                )
                _write_rank(writer, r, parked[r], events)
                del events
                memory = spill.take(r, part="memory")
                if memory:  # the same clock as the rank's events
                    memory["ts"] = clk.apply_transform(memory["ts"], *args)
                    _write_memory(writer, r, parked[r], memory)
                step_logs.write_aligned(writer, spill, r, *args)  # the same clock again
                spill.drop(r)
                steps = parked[r].steps
                if steps is not None and len(steps["step"]):
                    steps_parts.append(
                        {
                            "rank": np.full(len(steps["step"]), r, dtype=np.int32),
                            "step": steps["step"],
                            "start": clk.apply_transform(steps["start"], *args),
                            "end": clk.apply_transform(steps["end"], *args),
                        }
                    )
            changes, bad = (
                step_logs.read_changes(inputs[0]) if run and inputs[0].is_dir() else (None, None)
            )
            if bad is not None:
                problems.append(bad)
                _say(bad, quiet)
            writer.set_attr("world_size", world)
            writer.set_attr("reference_rank", ref)
            writer.set_attr(P2P_WITHOUT_PEER_ATTR, without_peer(colls))
            writer.write_tables(
                {
                    "collectives": colls_aligned,
                    "steps": concat_rows(steps_parts)
                    if steps_parts
                    else {c: np.zeros(0, np.int64) for c in ("rank", "step", "start", "end")},
                    "clock": clock_table,
                    **({"changes": changes} if changes is not None else {}),
                    "problems": {
                        "file": np.array([p.file for p in problems], dtype=object),
                        "rank": np.array([p.rank for p in problems], dtype=np.int64),
                        "problem": np.array([p.problem for p in problems], dtype=object),
                    },
                }
            )
        with translate_write_errors(out):
            os.replace(tmp, out)
        written_here(out)  # an analysis in this process need not walk its links
    finally:
        if ahead is not None:
            ahead.close()  # before anything forks again (an analysis in this process)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        shutil.rmtree(spill_dir, ignore_errors=True)
        shutil.rmtree(split_dir, ignore_errors=True)
        shutil.rmtree(workers_dir, ignore_errors=True)  # the runner removed it; in case
    if not quiet:
        n_coll = len(distinct(colls_aligned["coll"]))
        if len(parked) > 1:  # one rank: no clock to align (conclude/sections.py)
            print(clk.summary_line(clock_table))
        print(
            f"merged {len(parked)} of {world} rank(s), {n_coll} collective(s), "
            f"{len(problems)} problem(s) → {out}"
        )
    return problems


def _write_rank(writer: Any, rank: int, result: RankResult, events: dict[str, np.ndarray]) -> None:
    """Write one kept rank: ``events`` aligned, with ``coll``; name/cat become the store's codes."""
    codes = writer.intern(result.strings)
    events["name"] = codes[events["name"]] if len(codes) else events["name"]
    events["cat"] = codes[events["cat"]] if len(codes) else events["cat"]
    for col in ("shapes", "dtypes"):  # optional (record_shapes): -1 stays -1
        if col in events and len(codes):
            v = events[col]
            events[col] = np.where(v >= 0, codes[np.maximum(v, 0)], -1).astype(np.int32)
    meta = dict(result.source.meta)
    meta.pop("clock", None)
    src = result.source
    attrs = {
        "files": [src.origin] if src.origin is not None else [str(p) for _, p in src.files],
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
    if result.process_groups:
        attrs["process_groups"] = result.process_groups
    if result.device_memory:
        attrs["device_memory"] = {str(k): v for k, v in sorted(result.device_memory.items())}
    if result.device_capability:
        attrs[CAPABILITY_ATTR] = capability_attr(result.device_capability)
    writer.write_rank(rank, events, result.lanes, attrs)


def _write_memory(
    writer: Any, rank: int, result: RankResult, memory: dict[str, np.ndarray]
) -> None:
    """Write one kept rank's memory table (aligned ``ts``; op/scope become the store's codes)."""
    codes = writer.intern(result.strings)
    memory["op"] = codes[memory["op"]]
    memory["scope"] = codes[memory["scope"]]
    writer.write_memory(rank, memory)


def _may_be_merged(sources: list[RankSource]) -> bool:
    """One trace file given alone (not a run directory's window): it may hold several ranks.

    Several files are each one rank's: never read twice (a file may be a named pipe only one
    reader can drain, and a large job's traces would each be decoded once more)."""
    return len(sources) == 1 and not sources[0].from_run_dir and len(sources[0].files) == 1


def _parsed(result: RankResult) -> Generator[RankResult, None, None]:
    """A parse already done, handed over as :func:`run_each` hands its results."""
    yield result


def _split_merged(sources: list[RankSource], folder: Path, quiet: bool) -> list[RankSource]:
    """The one trace file of a merge, when it holds several ranks, as one source per rank
    (:mod:`~rankscope.orchestrator.ingest.multirank`; the parts are written into ``folder``),
    saying in one line per file how its ranks were told apart. Run-directory windows are one
    rank's by their folder and are left as they are."""
    from rankscope.orchestrator.ingest.multirank import split_file

    if not _may_be_merged(sources):
        return sources
    out: list[RankSource] = []
    for i, src in enumerate(sources):
        if src.from_run_dir or len(src.files) != 1:
            out.append(src)
            continue
        path = src.files[0][1]
        split = split_file(path, folder / f"{i:05d}")
        if split is None:
            out.append(src)
            continue
        if not quiet:
            print(f"merge: {split.line()}", file=sys.stderr)
        for rank, part in sorted(
            split.parts.items(), key=lambda kv: -1 if kv[0] is None else kv[0]
        ):
            shown = str(path) if rank is None else f"{path} [rank {rank}]"
            hint = src.rank_hint if rank is None else rank
            out.append(RankSource([(0, part)], hint, origin=shown))
    return out


def _clock_input(rank: int, res: RankResult) -> Any:
    """Clock facts of one rank from its meta.json (run directories) or nothing."""
    from rankscope.orchestrator.ingest.clock import ClockInput, fit_samples

    meta = res.source.meta
    cinfo = meta.get("clock") or {}
    host = str(meta.get("host") or res.host or "")
    domain = str(cinfo.get("domain") or "")
    fit = None
    samples = cinfo.get("samples") or []
    if samples:
        try:
            import pandas as pd

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


def _tool_versions() -> dict[str, str]:
    import platform

    return {
        "python": platform.python_version(),
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "msgspec": msgspec.__version__,
        "numpy": np.__version__,
        "pandas": _version_of("pandas"),
    }


def _version_of(package: str) -> str:
    """An installed package's version, without importing it where it is not imported yet (a
    merge whose clocks need no fit never imports pandas: ``clock.align_columns``)."""
    module = sys.modules.get(package)
    if module is not None:
        return str(module.__version__)
    from importlib.metadata import version

    return version(package)
