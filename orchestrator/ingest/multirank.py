"""Files that hold several ranks (merged traces): tell the ranks apart, split them into ranks.

Why: people arrive with one file made of all ranks' traces — TraceLens's merge tool, Composer's
trace merger, hand-merged chrome traces. Read as one rank, such a file gives one rank and no
straggler, silently. Each way of telling ranks apart is one small *splitter* (:data:`SPLITTERS`,
tried in order; the first that finds two or more ranks decides):

* ``args.rank`` on the events (:attr:`RankKey.ARGS_RANK`) — TraceLens's merge writes it on every
  event (and offsets pids, ids and correlation ids by rank × 10⁸);
* Composer's ``global_rank`` metadata event per pid (:attr:`RankKey.GLOBAL_RANK`) — Composer's
  merger (``composer.profiler.json_trace_merger``) sets every event's ``pid`` to its global rank
  and keeps each rank's ``global_rank`` / ``process_name`` ("Rank N training loop process") /
  ``process_sort_index`` / ``clock_sync_timestamp_us`` metadata; it writes a JSON *array*, the
  trace event format's other top-level form;
* process names such as "rank 3" / "Rank 3" (:attr:`RankKey.PROCESS_NAME`, ``process_name``
  metadata);
* pid blocks (:attr:`RankKey.PID_BLOCK`): a pid is an OS process id (Linux: below 2²² = 4194304)
  or a device index, so pids that fall in two or more blocks of :data:`PID_BLOCK` are the
  offsets of a merge (TraceLens's rank × 10⁸).

The shared logic runs once (:func:`split_file`): one light decode of the file, the splitters,
events a splitter leaves without a rank take their pid's rank when that pid belongs to one rank,
and each rank's events are written, byte for byte as they were, to a Kineto trace of its own in a
folder beside the merge's output (removed when the merge ends). The merge then reads those as if
they were per-rank files: clock alignment, collective matching, everything downstream unchanged.

When a file evidently holds several ranks (the same ``ProfilerStep#N`` recorded more than once)
and no splitter tells them apart, :func:`split_file` raises :class:`MergedTraceError`: one line
naming the file.

Cost: the one file of a merge is parsed first, as a rank; the parse notes the *signs* a splitter
or :func:`several_ranks` looks for (:func:`block_signs` on each decoded block, :func:`steps_repeat`
on the columns) and :func:`split_file` runs only when one is seen (or the parse failed: a JSON
array is not a Kineto trace). Each sign is implied by what makes a splitter or the evidence fire,
so a file without any is one :func:`split_file` would have returned None for; the common
one-rank file is decoded once. The light decode of :func:`split_file` cost 0.88 s beside the
parse's 1.12 s on tests/data/hta/df_index_resolver (54 MB of JSON, 216k events, gzip) when every
single file paid for it (issue 31).
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from rankscope.errors import InputFileError
from rankscope.orchestrator.ingest.column_tables import distinct
from rankscope.orchestrator.ingest.kineto_json import (
    KEvent,
    TraceReadError,
    decode_json,
    read_bytes,
)
from rankscope.orchestrator.ingest.rank_selection import MAX_RANKS

#: Pid offset per rank in a merged file (TraceLens's merge tool: pid += rank × 10⁸). Above any
#: OS pid (Linux's pid_max is at most 2²²), so a pid in block k ≥ 1 is not a process id.
PID_BLOCK = 10**8
#: A rank in a process name: "rank 3", "Rank 3 training loop process", "rank_3", "rank-3".
RANK_IN_PROCESS_NAME = re.compile(r"(?:^|[^a-z])rank[\s_-]*(\d+)(?!\d)", re.IGNORECASE)
#: A profiler step's range on the host: recorded once per step by one rank's profiler.
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
#: Its copy on a GPU stream (Kineto), which is not a second rank.
GPU_ANNOTATION_CAT = "gpu_user_annotation"
#: Name of one rank's part in the split folder (and of a one-rank array's rewrite).
PART_FORMAT = "rank{rank:05d}.json"
UNRANKED_PART = "events.json"
#: Top-level fields of a Kineto trace copied into every part (``distributedInfo`` is rewritten).
TOP_FIELDS = ("schemaVersion", "deviceProperties", "host_name", "baseTimeNanoseconds", "trace_id")


class RankKey(enum.Enum):
    """How the ranks of a merged file were told apart (the words of the one line printed)."""

    ARGS_RANK = "args.rank"
    GLOBAL_RANK = "Composer's global_rank metadata"
    PROCESS_NAME = "process names"
    PID_BLOCK = "pid blocks of 10^8"


class MergedTraceError(InputFileError):
    """A file holds several ranks that cannot be told apart (one line naming the file)."""


class _Args(msgspec.Struct, gc=False):
    rank: Any = None
    name: Any = None
    value: Any = None


class _Event(msgspec.Struct, gc=False):
    """What the splitters read of an event (msgspec skips the rest)."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str | None = None
    """typed as Kineto's: a file with other pids is not split (the parse reports it)"""
    args: _Args | None = None


_EVENTS = msgspec.json.Decoder(list[_Event])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])

#: A splitter: the events → each event's rank (None: unknown), or None when it does not apply.
Splitter = Callable[[list[_Event]], list[int | None] | None]


def _as_rank(value: Any) -> int | None:
    """A rank from a JSON value (int, or digits) in the merge's range (0..MAX_RANKS-1), else
    None: a hostile 2**70 never becomes a rank, nor a part file."""
    if isinstance(value, str) and value.isdigit() and len(value) < 10:
        value = int(value)
    return value if type(value) is int and 0 <= value < MAX_RANKS else None


def _by_pid(events: list[_Event], pid_rank: dict[Any, int]) -> list[int | None] | None:
    """Each event's rank through its pid, when ``pid_rank`` names two or more ranks."""
    if len(set(pid_rank.values())) < 2:
        return None
    return [pid_rank.get(ev.pid) for ev in events]


def by_args_rank(events: list[_Event]) -> list[int | None] | None:
    """``args.rank`` on the events (TraceLens)."""
    ranks = [_as_rank(ev.args.rank) if ev.args is not None else None for ev in events]
    return ranks if len({r for r in ranks if r is not None}) >= 2 else None


def by_global_rank(events: list[_Event]) -> list[int | None] | None:
    """Composer's ``global_rank`` metadata event (``args.value``), one per pid."""
    pid_rank = {
        ev.pid: r
        for ev in events
        if ev.ph == "M" and ev.name == "global_rank" and ev.args is not None
        if (r := _as_rank(ev.args.value)) is not None
    }
    return _by_pid(events, pid_rank)


def by_process_name(events: list[_Event]) -> list[int | None] | None:
    """``process_name`` metadata naming a rank ("rank 3", "Rank 3 training loop process")."""
    pid_rank: dict[Any, int] = {}
    for ev in events:
        if ev.ph == "M" and ev.name == "process_name" and ev.args is not None:
            m = RANK_IN_PROCESS_NAME.search(str(ev.args.name or ""))
            if m:
                pid_rank[ev.pid] = int(m.group(1))
    return _by_pid(events, pid_rank)


def by_pid_block(events: list[_Event]) -> list[int | None] | None:
    """Integer pids in two or more blocks of :data:`PID_BLOCK` (block k = rank k)."""
    ranks = [_as_rank(ev.pid // PID_BLOCK) if isinstance(ev.pid, int) else None for ev in events]
    return ranks if len({r for r in ranks if r is not None}) >= 2 else None


#: The splitters, tried in order (the most explicit first).
SPLITTERS: tuple[tuple[RankKey, Splitter], ...] = (
    (RankKey.ARGS_RANK, by_args_rank),
    (RankKey.GLOBAL_RANK, by_global_rank),
    (RankKey.PROCESS_NAME, by_process_name),
    (RankKey.PID_BLOCK, by_pid_block),
)


@dataclass
class Split:
    """A file split into ranks: one Kineto trace per rank (``parts``), and how."""

    path: Path
    how: RankKey | None
    """None: one rank only, rewritten because the file is a JSON array"""
    parts: dict[int | None, Path]
    """rank (None: unknown) → its part's file"""
    unranked: int
    """events left out: no rank of their own and a pid shared by several ranks (or none)"""

    def line(self) -> str:
        """The one line saying what was found (ranks told apart by what)."""
        if self.how is None:
            return f"{self.path.name}: a JSON array of events, read as one rank"
        text = f"{self.path.name} holds {len(self.parts)} ranks (told apart by {self.how.value})"
        if self.unranked:
            text += f"; {self.unranked} event(s) of no rank left out"
        return text


#: Metadata events that may name a rank (Composer's ``global_rank``; a ``process_name``, when its
#: text names one).
GLOBAL_RANK_EVENT = "global_rank"
PROCESS_NAME_EVENT = "process_name"


def block_signs(events: list[KEvent]) -> bool:
    """True when a block of the parse's decoded events shows a sign of several ranks: an
    ``args.rank`` (:func:`by_args_rank`), a pid of block 1 or above (:func:`by_pid_block`), a
    ``global_rank`` metadata event (:func:`by_global_rank`) or a ``process_name`` naming a rank
    (:func:`by_process_name`). Every splitter needs one of these to find two ranks.

    Runs on every block of every parse: one plain loop (measured faster than C passes of
    ``map``/``set`` per field, which each walk the whole block)."""
    for ev in events:
        a = ev.args
        if a is not None and a.rank is not None:
            return True
        pid = ev.pid
        if type(pid) is int and pid >= PID_BLOCK:
            return True
        if ev.ph == "M" and (
            ev.name == GLOBAL_RANK_EVENT
            or (
                ev.name == PROCESS_NAME_EVENT
                and a is not None
                and RANK_IN_PROCESS_NAME.search(str(a.name or "")) is not None
            )
        ):
            return True
    return False


def steps_repeat(name: np.ndarray, cat: np.ndarray, strings: list[str]) -> bool:
    """True when a host ``ProfilerStep#N`` occurs more than once among complete events (the
    evidence of :func:`several_ranks`); ``name``/``cat``: codes into ``strings``."""
    is_step = np.array([PROFILER_STEP.match(s) is not None for s in strings], dtype=bool)
    if not is_step.any() or not len(name):
        return False
    on_host = np.array([s != GPU_ANNOTATION_CAT for s in strings], dtype=bool)
    steps = name[is_step[name] & on_host[cat]]
    return len(steps) > len(distinct(steps))


def split_file(path: Path, folder: Path) -> Split | None:
    """Split ``path`` into per-rank traces under ``folder`` when it holds several ranks.

    Returns None for an ordinary one-rank Kineto trace (and for files that cannot be decoded:
    the parse reports those with its precise words). A JSON array of events (the trace event
    format's array form) is always rewritten, as one rank when it holds one. Raises
    :class:`MergedTraceError` when the file evidently holds several ranks (:func:`several_ranks`)
    that no splitter tells apart.
    """
    try:
        data = read_bytes(path)
        is_array = data.lstrip()[:1] == b"["
        top: dict[str, msgspec.Raw] = {} if is_array else decode_json(_TOP, data)
        events_text = data if is_array else top.pop("traceEvents", None)
        if events_text is None:
            return None
        del data
        events = decode_json(_EVENTS, events_text)
    except (TraceReadError, msgspec.MsgspecError, RecursionError):
        return None

    def raw_events() -> list[msgspec.Raw]:
        """Each event's JSON text, decoded only for a file that is split (the common one-rank
        file pays for the light decode alone)."""
        return decode_json(_RAW_LIST, events_text)

    for how, splitter in SPLITTERS:
        ranks = splitter(events)
        if ranks is not None:
            ranks, unranked = _fill_from_pids(events, ranks)
            return _write_parts(path, folder, how, top, raw_events(), ranks, unranked)
    evidence = several_ranks(events)
    if evidence:
        tried = ", ".join(how.value for how, _ in SPLITTERS)
        raise MergedTraceError(
            f"{path}: holds several ranks ({evidence}) but nothing tells them apart "
            f"(none of: {tried}); give one file per rank"
        )
    if is_array:
        return _write_parts(path, folder, None, top, raw_events(), [None] * len(events), 0)
    return None


def several_ranks(events: list[_Event]) -> str:
    """Why a file evidently holds several ranks ('' when it does not): a host-side
    ``ProfilerStep#N`` recorded more than once — one rank's profiler records each step once."""
    counts = Counter(
        ev.name
        for ev in events
        if ev.ph == "X" and ev.cat != GPU_ANNOTATION_CAT and PROFILER_STEP.match(ev.name)
    )
    if not counts:
        return ""
    name, n = counts.most_common(1)[0]
    return f"{name} recorded {n} times" if n > 1 else ""


def _fill_from_pids(events: list[_Event], ranks: list[int | None]) -> tuple[list[int | None], int]:
    """Events without a rank take their pid's, when every ranked event of that pid has one rank;
    returns (ranks, events still without one)."""
    seen: dict[Any, set[int]] = {}
    for ev, r in zip(events, ranks, strict=True):
        if r is not None:
            seen.setdefault(ev.pid, set()).add(r)
    pid_rank = {pid: next(iter(rs)) for pid, rs in seen.items() if len(rs) == 1}
    out = [
        r if r is not None else pid_rank.get(ev.pid) for ev, r in zip(events, ranks, strict=True)
    ]
    return out, sum(r is None for r in out)


def _write_parts(
    path: Path,
    folder: Path,
    how: RankKey | None,
    top: dict[str, msgspec.Raw],
    raw: list[msgspec.Raw],
    ranks: list[int | None],
    unranked: int,
) -> Split:
    """Write each rank's events (their JSON text unchanged) as a Kineto trace of its own."""
    per_rank: dict[int | None, list[msgspec.Raw]] = {}
    for ev, r in zip(raw, ranks, strict=True):
        if r is not None or how is None:
            per_rank.setdefault(r, []).append(ev)
    known = sorted(r for r in per_rank if r is not None)
    info: dict[str, Any] = {}
    if "distributedInfo" in top:
        try:
            info = dict(msgspec.json.decode(top["distributedInfo"]) or {})
        except (msgspec.MsgspecError, TypeError, ValueError):
            info = {}
    claimed = _as_rank(info.get("world_size")) or 0
    folder.mkdir(parents=True, exist_ok=True)
    parts: dict[int | None, Path] = {}
    for r, evs in per_rank.items():
        doc: dict[str, Any] = {k: top[k] for k in TOP_FIELDS if k in top}
        if r is not None:
            doc["distributedInfo"] = {
                **info,
                "rank": r,
                "world_size": max(claimed, known[-1] + 1),
            }
        doc["traceEvents"] = evs
        part = folder / (UNRANKED_PART if r is None else PART_FORMAT.format(rank=r))
        part.write_bytes(msgspec.json.encode(doc))
        parts[r] = part
    return Split(path, how, parts, unranked)
