"""The rendezvous engine of the parallel jobs and the pipeline schedules.

Each rank's program is a generator that yields :class:`Post` (it arrives at a collective or one
side of a send/recv, at a time in ns) and :class:`Wait` (it needs that op's end); :func:`run`
drives them round-robin, resolving a rendezvous when its last member posts (end = last arrival
+ transfer) and resuming the ranks that wait for it. Deterministic: the result does not depend
on the order the ranks are driven in, only on what they post.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rankscope.orchestrator.synth.comm import CollOp
from rankscope.orchestrator.synth.config import Schedule


@dataclass
class Rendezvous:
    """A collective (or a send/recv pair) its members post to; resolved when all have."""

    key: tuple[Any, ...]
    members: int
    transfer: int
    info: dict[str, Any]
    ready: dict[int, int] = field(default_factory=dict)
    end: int = -1
    waiters: list[int] = field(default_factory=list)


class Post(NamedTuple):
    """A rank's request: it arrives at ``key`` at ``ready`` (ns)."""

    key: tuple[Any, ...]
    members: int
    transfer: int
    rank: int
    ready: int
    info: dict[str, Any]


class Wait(NamedTuple):
    """A rank's request: resume it with the end of ``rdv``."""

    rdv: Rendezvous


Program = Generator[Post | Wait, Any, None]


def schedule(kind: Schedule, pp: int, stage: int, m: int) -> list[tuple[str, Any]]:
    """The actions of ``stage``: ``("F"|"B", mb)`` or ``("X", [(op, peer_stage, mb), ...])`` (one
    p2p exchange). 1F1B is Megatron's ``forward_backward_pipelining_without_interleaving``."""
    out: list[tuple[str, Any]] = []

    def x(*ops: tuple[CollOp, int, int]) -> None:
        keep = [o for o in ops if 0 <= o[1] < pp]
        if keep:
            out.append(("X", keep))

    prev, nxt = stage - 1, stage + 1
    if kind is Schedule.GPIPE:
        for mb in range(m):
            x((CollOp.RECV, prev, mb))
            out.append(("F", mb))
            x((CollOp.SEND, nxt, mb))
        for mb in range(m):
            x((CollOp.RECV, nxt, mb))
            out.append(("B", mb))
            x((CollOp.SEND, prev, mb))
        return out
    warmup = min(pp - stage - 1, m)
    for mb in range(warmup):
        x((CollOp.RECV, prev, mb))
        out.append(("F", mb))
        x((CollOp.SEND, nxt, mb))
    rest = m - warmup
    if rest > 0:
        x((CollOp.RECV, prev, warmup))
    for i in range(rest):
        out.append(("F", warmup + i))
        x((CollOp.SEND, nxt, warmup + i), (CollOp.RECV, nxt, i))
        out.append(("B", i))
        if i == rest - 1:
            x((CollOp.SEND, prev, i))
        else:
            x((CollOp.SEND, prev, i), (CollOp.RECV, prev, warmup + i + 1))
    for i in range(rest, m):
        x((CollOp.RECV, nxt, i))
        out.append(("B", i))
        x((CollOp.SEND, prev, i))
    return out


def run(programs: dict[int, Program]) -> list[Rendezvous]:
    """Run the ranks' programs to the end, resolving rendezvous (module docstring); the resolved
    rendezvous in order. A program waiting forever is a bug of the schedule: RuntimeError."""
    table: dict[tuple[Any, ...], Rendezvous] = {}
    resolved: list[Rendezvous] = []
    queue: deque[tuple[int, Any]] = deque((r, None) for r in programs)
    done: set[int] = set()
    while queue:
        rank, value = queue.popleft()
        gen = programs[rank]
        while True:
            try:
                req = gen.send(value)
            except StopIteration:
                done.add(rank)
                break
            if isinstance(req, Post):
                rdv = table.get(req.key)
                if rdv is None:
                    rdv = table[req.key] = Rendezvous(req.key, req.members, req.transfer, req.info)
                rdv.ready[req.rank] = req.ready
                if len(rdv.ready) == rdv.members:
                    rdv.end = max(rdv.ready.values()) + rdv.transfer
                    del table[req.key]
                    resolved.append(rdv)
                    queue.extend((w, rdv.end) for w in rdv.waiters)
                    rdv.waiters.clear()
                value = rdv
            elif req.rdv.end >= 0:
                value = req.rdv.end
            else:
                req.rdv.waiters.append(rank)
                break
    if len(done) != len(programs):
        stuck = sorted(set(programs) - done)[:8]
        raise RuntimeError(
            f"synthetic job deadlocked: ranks {stuck} wait forever ({list(table)[:4]})"
        )
    return resolved
