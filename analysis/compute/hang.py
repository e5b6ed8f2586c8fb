"""Who stopped a hung job, and where: the diagnosis of every rank's answer when the job hung.

Input: each rank's answer (``ranks/NNNNN/hang.json``, written by the rank's hang probe: every
thread's Python stack with user frames marked, and PyTorch's Flight Recorder as JSON), the world
size, and the ranks that died (with the user frame their error came from). Output: one
:class:`HangDiagnosis` — a pure function, no I/O.

The rule, from the collectives (Flight Recorder: per process group, the sequence number of the
last collective each rank *enqueued* and *completed*; on gloo, no "started"):

* In each group, the collective the job is stuck in is the highest sequence number some member
  enqueued and did not complete. Members that enqueued it **wait** in it; members whose last
  enqueued number is lower **never arrived** (the "wavefront of missing ranks" of Flight
  Recorder's analyzer). Of several groups, the one whose waiting collective was created first
  is named: the others wait behind it.
* Members that enqueued the same sequence number with **different ops** (all_gather where the
  others call all_reduce) are a **desync**: both call sites are named.
* A rank blocked in a point-to-point **send or receive** waits for its peer; the peer that
  never posted the matching op (it is elsewhere, or posts another op, peer or size) is the one
  the chain of waits ends at (:mod:`rankscope.analysis.compute.hang_p2p`): it is named
  (UNMATCHED), and ranks waiting in a collective for a rank that itself waits in a receive wait
  behind that chain.
* Without a Flight Recorder (not distributed, an old torch), the ranks are grouped by where their
  main thread is (its innermost user frame); the smallest group is the odd one out, as
  production tools do with stack traces (ByteRobust): a suspicion, said as one.

Where a rank is: the innermost frame of its main thread that is the user's code (``file:line``
and function), and the innermost frame of all (what it is inside: a DataLoader's ``__next__``,
a queue's ``get``). Ranks at the same place in the same state are grouped. Times are seconds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.analysis.compute.hang_p2p import (
    P2POp,
    P2PSource,
    P2PWait,
    entry_done,
    p2p_waits,
    pending_p2p,
)
from rankscope.analysis.compute.hang_p2p import culprits as p2p_culprits


class RankState(enum.StrEnum):
    """What a rank was doing when the job hung."""

    WAITING = "waiting"
    """In the stuck collective, waiting for the others."""
    MISSING = "missing"
    """Never entered the stuck collective."""
    DESYNC = "desync"
    """Entered a different collective at the same sequence number."""
    DEAD = "dead"
    """Its process had ended."""
    SILENT = "silent"
    """Did not answer (its stacks, if any, are in stacks.txt and native-stacks.txt)."""
    ELSEWHERE = "elsewhere"
    """Answered; no collective to place it by (no Flight Recorder)."""
    UNMATCHED = "unmatched"
    """A peer waits in a send or receive toward it that it never posted (it is elsewhere), or
    posted with other sizes, or it waits round a cycle of point-to-point ops."""


@dataclass(frozen=True)
class Frame:
    """One place in the code: file, line, function."""

    file: str
    line: int
    function: str

    def where(self) -> str:
        """``train.py:41 (main)``: the file's name, not its path."""
        return f"{Path(self.file).name}:{self.line} ({self.function})"


@dataclass(frozen=True)
class Collective:
    """A collective of one process group, by its sequence number in that group."""

    group: str
    """The group's name as PyTorch writes it ("0" is the default group)."""
    group_desc: str
    """Its description ("default_pg", "undefined", Megatron's names …)."""
    seq: int
    """Its sequence number in the group (1 = the group's first collective)."""
    op: str
    """all_reduce, all_gather, … (the backend prefix dropped)."""

    def label(self) -> str:
        """``all_reduce #4 of the default group``."""
        group = "the default group" if self.group_desc == "default_pg" else f"group {self.group}"
        if self.group_desc and self.group_desc not in ("default_pg", "undefined"):
            group += f" ({self.group_desc})"
        return f"{self.op} #{self.seq} of {group}"


@dataclass
class RankPlace:
    """Where one rank was."""

    rank: int
    state: RankState
    user_frame: Frame | None = None
    """Its main thread's innermost user frame (or where its error came from, when dead)."""
    inside: str = ""
    """The innermost frame of its main thread when not the user's (``dataloader.py:__next__``)."""
    op: str = ""
    """The collective it entered at the stuck sequence number (desync), else ""."""
    steps: int | None = None
    """Steps it had finished."""
    since_s: float | None = None
    """Seconds since its last step when the hang was noticed."""
    error: str = ""
    """How it died (dead ranks)."""
    p2p: P2POp | None = None
    """The point-to-point op it waits in (its peer: ``p2p.peer``), None when none."""
    stacks_from: str = ""
    """What placed a rank that did not answer: the text its faulthandler or py-spy wrote
    (``"py-spy stacks, native-stacks.txt"``); "" otherwise."""


@dataclass
class HangDiagnosis:
    """Who stopped the job and where (see the module docstring)."""

    collective: Collective | None
    """The collective the job is stuck in (None: no Flight Recorder, or nothing pending)."""
    desync: bool
    """Ranks entered different collectives at the same sequence number."""
    places: list[RankPlace] = field(default_factory=list)
    """Every rank's place, by rank."""
    basis: str = ""
    """What the diagnosis rests on ("flight recorder", "stacks")."""
    p2p: list[P2PWait] = field(default_factory=list)
    """The ranks stuck in a point-to-point op, each with why (empty: none)."""

    def ranks(self, state: RankState) -> list[int]:
        """The ranks in ``state``."""
        return [p.rank for p in self.places if p.state == state]

    @property
    def culprits(self) -> list[int]:
        """The ranks the others wait for: never arrived, at another collective, never posted the
        point-to-point op a peer waits in, dead, silent."""
        bad = (RankState.MISSING, RankState.DESYNC, RankState.DEAD, RankState.UNMATCHED)
        found = [p.rank for p in self.places if p.state in bad]
        return found or self.ranks(RankState.SILENT)


def _op(name: str) -> str:
    """``gloo:all_reduce`` → ``all_reduce``; ``nccl:all_reduce`` too."""
    return name.split(":", 1)[1] if ":" in name else name


def _frames(dump: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The main thread's frames, innermost last (the first thread when none is named so)."""
    threads = dump.get("threads") or []
    main = next((t for t in threads if t.get("name") == "MainThread"), None)
    main = main or (threads[0] if threads else None)
    return list(main.get("frames") or []) if main else []


def place_in_code(dump: Mapping[str, Any]) -> tuple[Frame | None, str]:
    """(innermost user frame, what it is inside when that is not the user's) of a rank's
    main thread."""
    frames = _frames(dump)
    user = next((f for f in reversed(frames) if f.get("user")), None)
    frame = Frame(str(user["file"]), int(user["line"]), str(user["function"])) if user else None
    inside = ""
    if frames and not frames[-1].get("user"):
        # what the user's code called (the first frame below it, looking through decorators'
        # wrappers: library closures that call on), and where that ended up
        i = next((k for k in range(len(frames) - 1, -1, -1) if frames[k].get("user")), -1)
        j = i + 1
        while j < len(frames) - 1 and frames[j].get("closure"):
            j += 1
        called, last = frames[j], frames[-1]
        inside = f"{Path(str(called['file'])).name}:{called['function']}"
        if last is not called:
            inside += f" … {Path(str(last['file'])).name}:{last['function']}"
    return frame, inside


@dataclass
class _GroupView:
    """One rank's view of one process group, from its Flight Recorder."""

    desc: str
    enqueued: int
    completed: int
    ops: dict[int, str]
    created: dict[int, int]


def _group_views(dump: Mapping[str, Any]) -> dict[str, _GroupView] | None:
    """Group name → this rank's view (None: no Flight Recorder in the answer).

    A rank whose collective timed out (``timed_out`` in its answer) counts it as enqueued and
    not completed: the backend marks a failed collective completed (gloo: its
    ``last_completed_collective`` is the one that timed out), but it never completed — the
    rank waited in it. That collective is the rank's most recently created one."""
    fr = dump.get("flight_recorder")
    if not isinstance(fr, Mapping):
        return None
    by_id: dict[str, _GroupView] = {}
    names: dict[str, tuple[str, str]] = {}
    done: dict[str, int] = {}
    for e in fr.get("entries") or []:
        if e.get("is_p2p"):
            continue  # point-to-point ops: hang_p2p's
        pg_id = str(e.get("pg_id"))
        pg = e.get("process_group") or [pg_id, ""]
        names[pg_id] = (str(pg[0]), str(pg[1]) if len(pg) > 1 else "")
        view = by_id.setdefault(pg_id, _GroupView(names[pg_id][1], 0, 0, {}, {}))
        seq = int(e.get("collective_seq_id") or 0)
        view.ops[seq] = _op(str(e.get("profiling_name", "")))
        view.created[seq] = int(e.get("time_created_ns") or 0)
        if entry_done(e):
            done[pg_id] = max(done.get(pg_id, 0), seq)
    for pg_id, status in (fr.get("pg_status") or {}).items():
        view = by_id.setdefault(str(pg_id), _GroupView("", 0, 0, {}, {}))
        view.enqueued = int(status.get("last_enqueued_collective", -1))
        view.completed = int(status.get("last_completed_collective", -1))
    for pg_id, view in by_id.items():
        if view.ops and any("retired" in e for e in fr.get("entries") or []):
            # the entries' own numbers: pg_status counts the group's sequence, which on gloo
            # counts point-to-point ops too (PyTorch 2.13, measured: a rank that received once
            # before its 2nd all_reduce says enqueued 3), while ``collective_seq_id`` counts
            # collectives only (completed: hang_p2p.entry_done)
            view.enqueued = max(view.ops)
            view.completed = done.get(pg_id, min(view.ops) - 1)
    if dump.get("timed_out") or _died_in_collective(dump):
        # the Flight Recorder counts a collective that failed (timed out, or a peer vanished) as
        # completed (gloo marks its work done on an error): the one this rank failed in is its
        # newest, and it never completed
        newest = max(
            (v for v in by_id.values() if v.created),
            key=lambda v: max(v.created.values()),
            default=None,
        )
        if newest is not None:
            newest.completed = min(newest.completed, max(newest.created) - 1)
    return {names.get(k, (k, ""))[0]: v for k, v in by_id.items()}


#: torch.distributed's module whose functions are the collectives a user calls.
COLLECTIVES_MODULE = "distributed_c10d.py"


def _died_in_collective(dump: Mapping[str, Any]) -> bool:
    """The answer a rank wrote as its own error ended it (``error`` set) says the error was
    raised inside a collective call (a frame of :data:`COLLECTIVES_MODULE` below the user's):
    a peer vanished while it waited there."""
    if not dump.get("error"):
        return False
    return any(Path(str(f.get("file"))).name == COLLECTIVES_MODULE for f in _frames(dump))


def diagnose(
    dumps: Mapping[int, Mapping[str, Any]],
    world_size: int,
    dead: Mapping[int, Mapping[str, Any]] | None = None,
    progress: Mapping[int, tuple[int | None, float | None]] | None = None,
    timed_out: Mapping[int, Mapping[str, Any]] | None = None,
    stacks: Mapping[int, Mapping[str, Any]] | None = None,
) -> HangDiagnosis:
    """The diagnosis of a hang from every rank's answer (``dumps``: rank → hang.json), the
    ranks that died (``dead``: rank → their failure record, with ``user_frame`` and ``error``),
    each rank's (steps, seconds since its last step) when it was noticed, and the ranks whose
    collective timed out without answering (``timed_out``: rank → failure record; NCCL's
    watchdog ends them), and the stacks of ranks that did not answer (``stacks``: rank → the
    threads read from the text their faulthandler or py-spy wrote, as an answer holds them, with
    ``stacks_from`` saying which: ``rankscope.analysis.compute.stack_text``).

    A collective times out only in the ranks that entered it: when some timed out and neither a
    Flight Recorder nor a point-to-point wait names where, the ranks that answered without a
    timeout never entered it (MISSING), and those that timed out waited (WAITING)."""
    dead = dead or {}
    progress = progress or {}
    timed_out = timed_out or {}
    stacks = stacks or {}
    views = {r: _group_views(d) for r, d in dumps.items()}
    stuck, desync = _stuck_collective({r: v for r, v in views.items() if v is not None}, world_size)
    places = []
    for rank in range(world_size):
        steps, since = progress.get(rank, (None, None))
        if rank in timed_out and rank not in dumps:
            record = timed_out[rank]
            uf = record.get("user_frame")
            frame = Frame(str(uf["file"]), int(uf["line"]), str(uf["function"])) if uf else None
            error = str(record.get("error") or "")
            places.append(RankPlace(rank, RankState.WAITING, frame, steps=steps, error=error))
            continue
        if rank in dead and rank not in dumps:
            record = dead[rank]
            uf = record.get("user_frame")
            frame = Frame(str(uf["file"]), int(uf["line"]), str(uf["function"])) if uf else None
            error = str(record.get("error") or record.get("message") or "")
            places.append(RankPlace(rank, RankState.DEAD, frame, steps=steps, error=error))
            continue
        if rank not in dumps:
            # silent: its Python threads could not answer; where its text stacks put it
            frame, inside = place_in_code(stacks[rank]) if rank in stacks else (None, "")
            source = str(stacks[rank].get("stacks_from") or "") if rank in stacks else ""
            places.append(
                RankPlace(
                    rank, RankState.SILENT, frame, inside, steps=steps, since_s=since,
                    stacks_from=source,
                )
            )  # fmt: skip
            continue
        frame, inside = place_in_code(dumps[rank])
        state, op = _state_of(views.get(rank), stuck, desync)
        if rank in dead and state != RankState.WAITING:
            # it died of its own error, and not while waiting for the others in the stuck
            # collective (where a peer's death ends it): a dead rank, placed where it raised
            error = str(dead[rank].get("error") or dead[rank].get("message") or "")
            places.append(RankPlace(rank, RankState.DEAD, frame, steps=steps, error=error))
            continue
        places.append(RankPlace(rank, state, frame, inside, op, steps, since))
    alive = {p.rank for p in places if p.state not in (RankState.DEAD, RankState.SILENT)}
    pending = {r: c for r in sorted(alive & set(dumps)) if (c := pending_p2p(dumps[r]))}
    waits = p2p_waits(pending)
    if (
        stuck is None
        and not waits
        and (timed_out or any(d.get("timed_out") for d in dumps.values()))
    ):
        for p in places:
            if p.state == RankState.ELSEWHERE and not pending.get(p.rank):
                waited = bool(dumps.get(p.rank, {}).get("timed_out"))
                p.state = RankState.WAITING if waited else RankState.MISSING
    elif stuck is None and not waits:
        # ranks in a point-to-point op (matched: in flight) are placed by it, not by where the
        # majority is
        _odd_ones_out([p for p in places if p.rank not in pending])
    _place_p2p(places, waits)
    from_fr = any(w.op.source is P2PSource.FLIGHT_RECORDER for w in waits)
    basis = "flight recorder" if stuck is not None or from_fr else "stacks"
    return HangDiagnosis(collective=stuck, desync=desync, places=places, basis=basis, p2p=waits)


def _place_p2p(places: list[RankPlace], waits: list[P2PWait]) -> None:
    """The ranks stuck in a point-to-point op wait (in it, for its peer: not the ones a
    collective waits for, even when they never entered it); the ranks their waits end at are
    UNMATCHED (unless dead or silent: said as such)."""
    by_rank = {p.rank: p for p in places}
    for w in waits:
        place = by_rank[w.rank]
        place.state, place.p2p, place.op = RankState.WAITING, w.op, str(w.op.kind)
    for rank in p2p_culprits(waits):
        peer = by_rank.get(rank)
        if peer is not None and peer.state not in (RankState.DEAD, RankState.SILENT):
            peer.state = RankState.UNMATCHED


def _stuck_collective(
    views: Mapping[int, dict[str, _GroupView]], world_size: int
) -> tuple[Collective | None, bool]:
    """The collective the job waits in (module docstring), and whether its members desync.
    The default group's members are every rank: one that did not answer (dead, silent) never
    arrived; other groups' members are the ranks whose recorder names them (gloo writes no
    member list)."""
    best: tuple[int, Collective, bool] | None = None
    groups = {g for v in views.values() for g in v}
    for g in sorted(groups):
        members = {r: v[g] for r, v in views.items() if g in v}
        top = max(m.enqueued for m in members.values())
        pending = [m for m in members.values() if m.enqueued == top and m.completed < top]
        if top <= 0 or not pending:
            continue
        ops = {m.ops.get(top, "") for m in members.values() if m.enqueued == top}
        behind = any(m.enqueued < top for m in members.values())
        if pending[0].desc == "default_pg" and len(members) < world_size:
            behind = True  # a rank of the world did not answer: it is not in it
        if not behind and len(ops) <= 1:
            continue  # every member entered it and agrees: it is moving (or waits on another)
        created = min(m.created.get(top, 0) for m in pending)
        op = sorted(ops)[0] if len(ops) == 1 else "/".join(sorted(ops))
        coll = Collective(g, pending[0].desc, top, op)
        if best is None or created < best[0]:
            best = (created, coll, len(ops) > 1)
    return (best[1], best[2]) if best else (None, False)


def _state_of(
    view: dict[str, _GroupView] | None, stuck: Collective | None, desync: bool
) -> tuple[RankState, str]:
    """A rank's state in the stuck collective (and the op it entered, when they differ)."""
    if stuck is None or view is None or stuck.group not in view:
        return RankState.ELSEWHERE, ""
    mine = view[stuck.group]
    if mine.enqueued < stuck.seq:
        return RankState.MISSING, ""
    op = mine.ops.get(stuck.seq, "")
    if desync:
        return RankState.DESYNC, op
    return RankState.WAITING, op


def _odd_ones_out(places: Sequence[RankPlace]) -> None:
    """Without collectives: the ranks whose main thread is where fewer ranks are (a minority
    place) are the suspects (MISSING); the rest wait (WAITING). One place for all: nothing."""
    answered = [p for p in places if p.state == RankState.ELSEWHERE]
    by_place: dict[tuple[Frame | None, str], list[RankPlace]] = {}
    for p in answered:
        by_place.setdefault((p.user_frame, p.inside), []).append(p)
    if len(by_place) < 2:
        return
    biggest = max(len(v) for v in by_place.values())
    if sum(1 for v in by_place.values() if len(v) == biggest) > 1:
        return  # no majority: nothing to tell apart
    for group in by_place.values():
        for p in group:
            p.state = RankState.WAITING if len(group) == biggest else RankState.MISSING
