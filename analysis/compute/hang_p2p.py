"""Point-to-point waits in a hung job: which rank waits in a send or receive, for which peer, and
why that peer never posted the matching op (a pipeline stage blocked in ``recv`` whose previous
stage hangs elsewhere is the commonest pipeline-parallel hang).

Where a rank's pending point-to-point op comes from, in this order:

* **its Flight Recorder's p2p entries** (``is_p2p``; NCCL records them: ``profiling_name``
  ``nccl:send 1->2`` / ``nccl:recv 3<-0`` with the ranks *in the group*, translated to global
  ranks by the group's ``pg_config`` ``ranks``, ``p2p_seq_id``, ``input_sizes``, ``state``,
  ``retired``): its newest p2p entry that did not complete (:func:`entry_done`), as PyTorch's ``fr_trace`` analyzer reads them
  (``torch/distributed/flight_recorder/components/types.py``, ``Op``);
* **else the call its main thread is blocked in** (``p2p_call`` in its answer, read by the
  rank's probe from the frame of torch.distributed's ``send``/``recv``): gloo's Flight Recorder
  records no point-to-point op at all (PyTorch 2.13, measured: ``tests/data/hang_p2p``).

The rule, from first principles (a send completes only with its receive, and on one pair of
ranks in one group they match in order): a rank R waiting in an op toward peer P is stuck on P
unless P's own pending op is the complement (P sends to R while R receives from P, the same
sizes): then they are matched and in flight. Otherwise P is:

* waiting in a point-to-point op itself, toward another rank or of the same kind (both
  receive): R is **behind** P; P's own wait is followed, to the rank the chain ends at — or a
  **cycle** (ranks receiving from each other: a deadlock, every rank of it named);
* posting the complement with **other sizes**: a mismatch, both named;
* not in any point-to-point op (in user code, a data loader, a collective): P **never posted**
  it — P is the rank the chain waits for, placed where its main thread is.

Pure functions of the ranks' answers; no I/O.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class P2PKind(enum.StrEnum):
    """A point-to-point op's direction."""

    SEND = "send"
    RECV = "recv"

    @property
    def other(self) -> P2PKind:
        """The op that matches this one on the peer."""
        return P2PKind.RECV if self is P2PKind.SEND else P2PKind.SEND


class P2PSource(enum.StrEnum):
    """What told a rank's pending point-to-point op."""

    FLIGHT_RECORDER = "flight recorder"
    STACK = "stack"
    """The arguments of the ``send``/``recv`` call its main thread is blocked in."""


@dataclass(frozen=True)
class P2POp:
    """A rank's pending point-to-point op."""

    kind: P2PKind
    peer: int
    """The peer's global rank."""
    group: str
    """The group's name as PyTorch writes it ("0" is the default group)."""
    group_desc: str
    """Its description ("default_pg", "undefined", …; "" when not known)."""
    sizes: tuple[tuple[int, ...], ...] | None
    """The tensor's sizes (None: not recorded)."""
    seq: int | None
    """Its ``p2p_seq_id`` in the group (Flight Recorder only; None from a stack)."""
    source: P2PSource

    def label(self) -> str:
        """``recv from rank 2 (p2p #4 of the default group, [[4]])``."""
        towards = "from" if self.kind is P2PKind.RECV else "to"
        group = "the default group" if self.group_desc == "default_pg" else f"group {self.group}"
        if self.group_desc and self.group_desc not in ("default_pg", "undefined"):
            group += f" ({self.group_desc})"
        detail = f"p2p #{self.seq} of {group}" if self.seq is not None else group
        if self.sizes is not None:
            detail += f", sizes {[list(s) for s in self.sizes]}"
        return f"{self.kind} {towards} rank {self.peer} ({detail})"


class P2PVerdict(enum.StrEnum):
    """Why a waiting rank's peer did not complete the pair."""

    NOT_POSTED = "not posted"
    """The peer is in no point-to-point op: it never posted the matching one."""
    MISMATCH = "mismatch"
    """The peer posts the complement with other sizes."""
    BEHIND = "behind"
    """The peer waits in a point-to-point op of its own (to another rank, or the same kind)."""
    CYCLE = "cycle"
    """The peers wait for each other round a cycle: a deadlock."""


@dataclass(frozen=True)
class P2PWait:
    """One rank stuck in a point-to-point op, and why."""

    rank: int
    op: P2POp
    verdict: P2PVerdict
    root: int
    """The rank the chain of waits ends at (the peer for NOT_POSTED and MISMATCH; the rank
    whose wait closes the cycle for CYCLE: itself)."""


def _sizes(value: Any) -> tuple[tuple[int, ...], ...] | None:
    if not isinstance(value, list):
        return None
    try:
        return tuple(tuple(int(d) for d in s) for s in value)
    except (TypeError, ValueError):
        return None


def _group_ranks(fr: Mapping[str, Any], group: str) -> list[int] | None:
    """The global ranks of ``group`` (sorted), from the dump's ``pg_config`` (its ``ranks``: a
    list, or the list as text, as PyTorch writes it)."""
    config = fr.get("pg_config") or {}
    entry = config.get(group)
    if not isinstance(entry, Mapping):
        entry = next((c for c in config.values() if str(c.get("name")) == group), None)
    if not isinstance(entry, Mapping):
        return None
    ranks = entry.get("ranks")
    if isinstance(ranks, str):
        try:
            ranks = json.loads(ranks)
        except ValueError:
            return None
    if not isinstance(ranks, list):
        return None
    return sorted(int(r) for r in ranks)


def _parse_name(name: str) -> tuple[P2PKind, int] | None:
    """``nccl:send 1->2`` → (SEND, 2); ``nccl:recv 3<-0`` → (RECV, 0): the peer's rank in the
    group (``fr_trace``'s reading of ``profiling_name``)."""
    op = name.split(":", 1)[-1]
    parts = op.split(" ")
    if len(parts) != 2:
        return None
    try:
        if parts[0] == P2PKind.SEND and "->" in parts[1]:
            return P2PKind.SEND, int(parts[1].split("->")[1])
        if parts[0] == P2PKind.RECV and "<-" in parts[1]:
            return P2PKind.RECV, int(parts[1].split("<-")[1])
    except ValueError:
        return None
    return None


#: Backends whose Flight Recorder never moves an entry past ``scheduled`` (gloo, PyTorch 2.13,
#: measured: tests/data/hang_p2p): there ``retired`` means completed. Elsewhere (NCCL) an entry
#: is completed when its ``state`` says so, and "a retired but not completed event has timed
#: out" (torch's FlightRecorder ``Entry::retired_``).
STATELESS_BACKENDS = frozenset({"gloo"})


def entry_done(entry: Mapping[str, Any]) -> bool:
    """Whether a Flight Recorder entry completed (see :data:`STATELESS_BACKENDS`)."""
    if entry.get("state") == "completed":
        return True
    backend = str(entry.get("profiling_name", "")).split(":", 1)[0]
    return bool(entry.get("retired")) and backend in STATELESS_BACKENDS


def _from_flight_recorder(fr: Mapping[str, Any]) -> P2POp | None:
    """The newest p2p entry that did not complete (module docstring)."""
    pending = [e for e in fr.get("entries") or [] if e.get("is_p2p") and not entry_done(e)]
    for e in sorted(pending, key=lambda e: int(e.get("time_created_ns") or 0), reverse=True):
        parsed = _parse_name(str(e.get("profiling_name", "")))
        if parsed is None:
            continue
        kind, peer_in_group = parsed
        pg = e.get("process_group") or [str(e.get("pg_id")), ""]
        group = str(pg[0])
        ranks = _group_ranks(fr, group)
        peer = ranks[peer_in_group] if ranks and 0 <= peer_in_group < len(ranks) else peer_in_group
        sizes = _sizes(e.get("input_sizes" if kind is P2PKind.SEND else "output_sizes"))
        seq = e.get("p2p_seq_id")
        return P2POp(
            kind, peer, group, str(pg[1]) if len(pg) > 1 else "", sizes,
            None if seq is None else int(seq), P2PSource.FLIGHT_RECORDER,
        )  # fmt: skip
    return None


def pending_p2p(answer: Mapping[str, Any]) -> P2POp | None:
    """A rank's pending point-to-point op from its answer (module docstring), None if none."""
    fr = answer.get("flight_recorder")
    if isinstance(fr, Mapping):
        found = _from_flight_recorder(fr)
        if found is not None:
            return found
    call = answer.get("p2p_call")
    if not isinstance(call, Mapping) or call.get("peer") is None:
        return None
    try:
        kind = P2PKind(str(call.get("op")))
    except ValueError:
        return None
    group = str(call.get("group") or "0")
    return P2POp(
        kind, int(call["peer"]), group, "default_pg" if group == "0" else "",
        _sizes(call.get("sizes")), None, P2PSource.STACK,
    )  # fmt: skip


def _matches(mine: P2POp, theirs: P2POp, me: int) -> bool:
    """``theirs`` is the complement of ``mine`` toward me in the same group (sizes aside)."""
    return theirs.kind is mine.kind.other and theirs.peer == me and theirs.group == mine.group


def p2p_waits(pending: Mapping[int, P2POp]) -> list[P2PWait]:
    """Every rank stuck in a point-to-point op (``pending``: rank → its pending op), with why
    (module docstring). Matched pairs (in flight) are left out: no false culprit when every
    send has its receive."""
    blocked: dict[int, tuple[P2PVerdict, int]] = {}
    for rank, op in pending.items():
        theirs = pending.get(op.peer)
        if theirs is None:
            blocked[rank] = (P2PVerdict.NOT_POSTED, op.peer)
        elif _matches(op, theirs, rank):
            if op.sizes is not None and theirs.sizes is not None and op.sizes != theirs.sizes:
                blocked[rank] = (P2PVerdict.MISMATCH, op.peer)
        else:
            blocked[rank] = (P2PVerdict.BEHIND, op.peer)
    waits = []
    for rank, (verdict, peer) in sorted(blocked.items()):
        root = peer
        if verdict is P2PVerdict.BEHIND:
            chain = [rank]
            while root in blocked and blocked[root][0] is P2PVerdict.BEHIND and root not in chain:
                chain.append(root)
                root = blocked[root][1]
            if root == rank:
                verdict = P2PVerdict.CYCLE  # its chain comes back to it
            elif root in blocked and root not in chain:
                root = blocked[root][1]  # the chain's last wait (not posted, mismatch): its peer
        waits.append(P2PWait(rank, pending[rank], verdict, root))
    return waits


def culprits(waits: list[P2PWait]) -> list[int]:
    """The ranks the point-to-point waits end at: the peers that never posted the matching op,
    both ranks of a mismatch, every rank of a cycle. A chain that ends at a pair in flight (a
    rank whose own op is matched) names nobody: nothing there was left unposted."""
    found: set[int] = set()
    for w in waits:
        if w.verdict is P2PVerdict.NOT_POSTED:
            found.add(w.root)
        elif w.verdict is P2PVerdict.MISMATCH:
            found |= {w.rank, w.root}
        elif w.verdict is P2PVerdict.CYCLE:
            found.add(w.rank)
    return sorted(found)
