"""One rank's columns: its trace files parsed, joined in time order, with steps, launches, peers.

:func:`parse_source` is the merge's per-rank task (it runs on a Dask worker, or in-process): it
decodes the rank's files one after the other into one string table (``decode.read_trace``),
joins the windows, sorts the events by ``ts`` once, and derives what only the rank's own events
tell — the ProfilerStep ranges, each event's step (GPU work takes its launch's), and the
communication table with normalised groups and point-to-point peers. What it returns is small
besides the columns (a few tens of bytes per event); all times are the rank's raw clock (ns).

Its tables are columns (``column_tables.Columns``), never DataFrames, and it imports no pandas
(``tests/test_reader_imports.py``): a small job's merge runs it in the process forked before
pandas' import (``source_reads.ReadAhead``), beside that import rather than after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from rankscope.analysis.compute.launch_match import launch_rows
from rankscope.analysis.store.schema import LANE_COLUMNS, EventKind
from rankscope.orchestrator.ingest.comm_kernels import DEFAULT_VOCABULARY, CommVocabulary
from rankscope.orchestrator.ingest.discovery import Problem, RankSource
from rankscope.orchestrator.ingest.step_logs import read_rank_step_log
from rankscope.orchestrator.ingest.vocabulary import GPU_KINDS

#: The lanes table's columns (``schema.LANE_COLUMNS``) as a rank's build makes them.
LANE_DTYPES = dict.fromkeys(LANE_COLUMNS, object) | {"lane": np.int64, "kind": np.int64}

if TYPE_CHECKING:
    from rankscope.orchestrator.ingest.column_tables import Columns
    from rankscope.orchestrator.ingest.comm_links import LinkCounts
    from rankscope.orchestrator.ingest.file_trace import FileTrace
    from rankscope.orchestrator.ingest.source_reads import ReadAhead


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
    lanes: Columns | None
    """schema.LANE_COLUMNS: lane, kind (int64), pid, tid, name (object: str)"""
    comm: Columns | None
    """comm_links.RANK_COMM_COLUMNS (``_comm_table``)"""
    steps: Columns | None
    """step, start, end (int64; raw ns): the ProfilerStep ranges (``_steps``)"""
    problems: list[Problem]
    t_first: int = 0
    """first event start (ns, the rank's raw clock)"""
    memory: dict[str, np.ndarray] | None = None
    """the ``[memory]`` events (None without any): ``analysis.memory_events.MEMORY_COLUMNS``
    but rank, ts raw ns, op/scope codes into ``strings``, sorted by ts"""
    device_memory: dict[int, int] | None = None
    """GPU index → total bytes, from the traces' ``deviceProperties``"""
    device_capability: dict[int, tuple[int, int]] | None = None
    """GPU index → (computeMajor, computeMinor), from the traces' ``deviceProperties``"""
    process_groups: list[dict[str, Any]] | None = None
    """the groups the rank is in (``decode.FileTrace.process_groups``; the first window's that
    lists any), None when no trace lists them"""
    step_log: dict[str, np.ndarray] | None = None
    """every step of the whole run (``ranks/NNNNN/steps.bin``: schema.STEP_LOG_COLUMNS, ``end``
    raw ns), None without one (``step_logs.read_rank_step_log``)"""
    rank_signs: bool = True
    """a file showed a sign of holding several ranks or could not be used as a rank's
    (``FileTrace.rank_signs``): a merge of this one file checks it whole (``multirank.py``)"""


def parse_source(
    source: RankSource,
    vocabulary: CommVocabulary = DEFAULT_VOCABULARY,
    ahead: ReadAhead | None = None,
    beside: bool = False,
) -> RankResult:
    """Parse all files of one rank (runs in a Dask worker): compact columns + small tables.

    ``vocabulary``: the communication kernels in force (``comm_kernels.py``). ``ahead``: parses
    begun in a forked process (``source_reads.ReadAhead``; in-process parses only), taken
    instead of parsing here when it has this source's. ``beside``: the reader's scanner may use
    a second core (``decode.read_trace``): True where this parse is the only one running (the
    merge in-process, its read-ahead), False in a pool of as many workers as cores."""
    from rankscope.orchestrator.ingest.column_tables import concat_rows, from_rows
    from rankscope.orchestrator.ingest.event_columns import sort_by_ts
    from rankscope.orchestrator.ingest.rank_reads import read_source

    if ahead is not None and (done := ahead.take(source, vocabulary)) is not None:
        return done
    reads = read_source(source, vocabulary, beside)
    parts: list[tuple[int, FileTrace]] = []
    problems: list[Problem] = []
    hint = source.rank_hint if source.rank_hint is not None else -1
    for window, path, ft in reads.outcomes:
        if isinstance(ft, str):
            problems.append(Problem(str(path), hint, ft))
            continue
        for why, count in ft.dropped.items():
            problems.append(Problem(str(path), hint, f"{count} {why} dropped"))
        for why, count in ft.memory_skipped.items():
            problems.append(Problem(str(path), hint, f"{why}: {count} skipped"))
        if len(ft.columns["ts"]) == 0:
            problems.append(Problem(str(path), hint, "trace holds no events with a duration"))
            continue
        parts.append((window, ft))
    if not parts:
        return RankResult(
            source, None, None, None, None, [], 0, None, [], None, None, None, problems
        )  # rank_signs: a file that is no rank's trace may be a merged one (a JSON array)
    ranks = {ft.rank for _, ft in parts if ft.rank is not None}
    rank = source.rank_hint if source.from_run_dir else None
    if rank is None:
        rank = min(ranks) if ranks else source.rank_hint
    if source.from_run_dir and ranks and ranks != {rank}:
        problems.append(
            Problem(source.label, hint, f"trace says rank {sorted(ranks)}, folder says {rank}")
        )
    # Concatenate windows: unify lanes, keep the window index per event.
    lane_keys: dict[tuple[int, str, str], int] = {}
    lane_rows: list[tuple[int, int, str, str, str]] = []
    cols: dict[str, list[np.ndarray]] = {}
    comms: list[Columns] = []
    enqueues: list[Columns] = []
    offset = 0
    mems: dict[str, list[np.ndarray]] = {}
    device_memory: dict[int, int] = {}
    capability: dict[int, tuple[int, int]] = {}
    for window, ft in parts:
        device_memory.update(ft.device_memory)
        capability.update(ft.device_capability)
        if ft.memory is not None:
            for k, v in ft.memory.items():
                mems.setdefault(k, []).append(v)
            n_mem = len(ft.memory["ts"])
            mems.setdefault("window", []).append(np.full(n_mem, window, dtype=np.int16))
        lmap = np.empty(len(ft.lane_rows), dtype=np.int32)
        for lane, kind, pid, tid, lane_name in ft.lane_rows:
            key = (int(kind), str(pid), str(tid))
            if key not in lane_keys:
                lane_keys[key] = len(lane_keys)
                lane_rows.append((lane_keys[key], kind, pid, tid, lane_name))
            lmap[int(lane)] = lane_keys[key]
        c = dict(ft.columns)
        c["lane"] = lmap[c["lane"]]
        c["window"] = np.full(len(c["ts"]), window, dtype=np.int16)
        for k, v in c.items():
            cols.setdefault(k, []).append(v)
        for table, into in zip(ft.comm_columns, (comms, enqueues), strict=True):
            if len(table["event"]) or into is comms:
                into.append(
                    {**table, "event": table["event"] + offset, "lane": lmap[table["lane"]]}
                )
        offset += len(c["ts"])
    # The one sort of the rank's events (files were read unsorted; stable, see sort_by_ts).
    columns, inverse = sort_by_ts({k: np.concatenate(v) for k, v in cols.items()})
    del cols
    strings_list = reads.strings
    comm_all = concat_rows(comms)
    comm_all["event"] = inverse[comm_all["event"]]
    enqueue_all = concat_rows(enqueues) if enqueues else None
    if enqueue_all is not None:
        enqueue_all["event"] = inverse[enqueue_all["event"]]
    steps = _steps(columns, strings_list)
    columns["step"] = _step_column(columns, steps)
    lanes = from_rows(lane_rows, LANE_DTYPES)
    comm_table, counts = _comm_table(comm_all, columns, strings_list, enqueue_all)
    problems.extend(Problem(source.label, hint, note) for note in counts.notes())
    memory = None
    if mems:
        memory, _ = sort_by_ts({k: np.concatenate(v) for k, v in mems.items()})
    first = parts[0][1]
    step_log, bad_log = read_rank_step_log(source, hint)
    if bad_log is not None:
        problems.append(bad_log)
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
        rank_signs=len(parts) < len(source.files) or any(ft.rank_signs for _, ft in parts),
        memory=memory,
        device_memory=device_memory,
        device_capability=capability,
        process_groups=next((ft.process_groups for _, ft in parts if ft.process_groups), None),
        step_log=step_log,
    )


def _steps(columns: Columns, strings: list[str]) -> Columns:
    """ProfilerStep ranges of one rank (raw ns): step, start, end (int64), in start order, a
    number's first range kept."""
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
    # pandas' drop_duplicates("step") (first kept) then sort_values("start") (its quicksort)
    table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    table = table[np.sort(np.unique(table[:, 0], return_index=True)[1])]
    table = table[np.argsort(table[:, 1], kind="quicksort")]
    return {"step": table[:, 0], "start": table[:, 1], "end": table[:, 2]}


def _step_column(columns: Columns, steps: Columns) -> np.ndarray:
    """Step of each event: the ProfilerStep it starts in; GPU work takes its launch's step."""
    ts = columns["ts"]
    out = np.full(len(ts), -1, dtype=np.int32)
    if not len(steps["step"]):
        return out
    starts, ends = steps["start"], steps["end"]
    nums = steps["step"].astype(np.int32)
    pos = np.searchsorted(starts, ts, side="right") - 1
    inside = (pos >= 0) & (ts < ends[np.clip(pos, 0, None)])
    out[inside] = nums[pos[inside]]
    # GPU activity runs after its launch: take the step of the CPU runtime call with its corr.
    gidx = np.flatnonzero(np.isin(columns["kind"], GPU_KINDS))
    launch = launch_rows(columns["corr"], columns["kind"], gidx)
    found = launch >= 0
    out[gidx[found]] = out[launch[found]]
    return out


def _comm_table(
    comm: Columns, columns: Columns, strings: list[str], enqueue: Columns | None = None
) -> tuple[Columns, LinkCounts]:
    """One rank's comm events with groups normalised, step, start and end (raw ns), and peer,
    and what could not be settled (``comm_links``: counted, never guessed).

    ``enqueue``: the rank's ``record_param_comms`` ops (``decode.FileTrace.enqueue``): Seq, group
    and peer of the NCCL kernels they launch, and the send/recv ops of coalesced batches.
    ``peer``: global rank of the other side of a send / recv — the trace's ``Dst Rank`` /
    ``Src Rank`` where it has them, else the rank runtime's annotation around the call
    (:func:`_p2p_peers`); -1 for collectives and unknown peers.
    """
    from rankscope.orchestrator.ingest.comm_links import (
        RANK_COMM_COLUMNS,
        LinkCounts,
        expand_coalesced,
        fill_from_enqueue,
        link_enqueue,
        normalise_groups,
        prefer_trace,
    )

    counts = LinkCounts()
    if not len(comm["event"]):
        empty = {c: np.array([], dtype=np.int64) for c in RANK_COMM_COLUMNS}
        empty["gpu"] = empty["gpu"].astype(bool)
        return empty, counts
    comm = dict(comm)
    ev = comm["event"]
    ops, peers, disagree = prefer_trace(
        comm["op"], comm["peer"], *_p2p_peers(comm["op"], ev, columns, strings)
    )
    comm["op"], comm["peer"] = ops, peers
    counts.disagreements += int(disagree.sum())
    if enqueue is not None and len(enqueue["event"]):
        enqueue = dict(enqueue)
        e_ops, e_peers, e_disagree = prefer_trace(
            enqueue["op"],
            enqueue["peer"],
            *_p2p_peers(enqueue["op"], enqueue["event"], columns, strings),
        )
        enqueue["op"], enqueue["peer"] = e_ops, e_peers
        link = link_enqueue(comm, enqueue, columns)
        fill_from_enqueue(comm, enqueue, link)
        linked = np.zeros(len(e_ops), dtype=bool)
        linked[link[link >= 0]] = True
        counts.disagreements += int((e_disagree & ~linked).sum())  # linked: counted as kernels
        comm, counts.without_kernel = expand_coalesced(comm, enqueue, link, columns, strings)
        ev = comm["event"]
    comm["step"] = columns["step"][ev]
    comm["start"] = columns["ts"][ev]
    comm["end"] = columns["ts"][ev] + columns["dur"][ev]
    is_cpu = columns["kind"][ev] == EventKind.COMM_CPU
    comm["group"] = normalise_groups(comm["group"], is_cpu, comm["lane"])
    comm["gpu"] = ~is_cpu
    return {c: comm[c] for c in RANK_COMM_COLUMNS}, counts


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
    from rankscope.analysis.store.schema import P2P_OPS
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
        launch = launch_rows(columns["corr"], columns["kind"], ev[gpu])
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
