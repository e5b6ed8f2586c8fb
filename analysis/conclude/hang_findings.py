"""A hang, said once for the terminal, ``run.json`` and ``report/hang.json``: which collective
the job is stuck in, which ranks never arrived (or arrived at another one) and where each is.

Ranks at the same place in the same state are one group ("ranks 0, 2–7"), so a 1,024-rank job
reads as a few lines. The diagnosis is :func:`rankscope.analysis.compute.hang.diagnose`'s; this
module only words it. Seconds are rounded to whole seconds.
"""

from __future__ import annotations

from typing import Any

from rankscope.analysis.compute.hang import HangDiagnosis, RankPlace, RankState
from rankscope.analysis.compute.hang_p2p import P2PKind, P2PVerdict, P2PWait
from rankscope.rank_ranges import rank_list

#: Groups of ranks listed in the paragraph (the rest are counted).
MAX_GROUPS = 6


def _where(p: RankPlace) -> str:
    where = f"in {p.user_frame.where()}" if p.user_frame else "outside the user's code"
    if p.inside:
        where += f" inside {p.inside}"
    return where


def _what(p: RankPlace, diag: HangDiagnosis) -> str:
    """The state of a group of ranks, in words."""
    label = diag.collective.label() if diag.collective else ""
    if p.state == RankState.WAITING and p.p2p is not None:
        return f"waiting in {p.p2p.label()}"
    if p.state == RankState.UNMATCHED:
        return _unmatched(p.rank, diag)
    if p.state == RankState.WAITING:
        return f"waiting in {label}" if label else "waiting"
    if p.state == RankState.MISSING:
        return f"never entered {label}" if label else "somewhere else than the others"
    if p.state == RankState.DESYNC:
        return (
            f"called {p.op or '?'} as collective #{diag.collective.seq}" if diag.collective else ""
        )
    if p.state == RankState.DEAD:
        return f"had died ({p.error})" if p.error else "had died"
    if p.state == RankState.SILENT and p.stacks_from:
        return f"did not answer (placed by its {p.stacks_from})"
    if p.state == RankState.SILENT:
        return "did not answer (its stacks, if any: ranks/NNNNN/stacks.txt, native-stacks.txt)"
    return "running"


def _unmatched(rank: int, diag: HangDiagnosis) -> str:
    """What a rank the point-to-point waits end at did not do."""
    mine = next((w for w in diag.p2p if w.rank == rank), None)
    if mine is not None and mine.verdict is P2PVerdict.CYCLE:
        return f"waiting in {mine.op.label()}, round a cycle of point-to-point waits"
    if mine is not None and mine.verdict is P2PVerdict.MISMATCH:
        return f"posted {mine.op.label()}: its peer posted other sizes"
    waited = [w for w in diag.p2p if w.root == rank and w.op.peer == rank]
    if not waited:
        return "the point-to-point waits end at it"
    w = waited[0]
    if w.op.kind is P2PKind.RECV:
        return f"never sent to rank {w.rank}, which waits in recv from it"
    return f"never received from rank {w.rank}, which waits in send to it"


def p2p_sentence(diag: HangDiagnosis) -> str:
    """One sentence on the point-to-point wait the others end at ("" when none): who waits in
    which op and where, and what its peer is doing instead."""
    if not diag.p2p:
        return ""
    by_rank = {p.rank: p for p in diag.places}
    order = (P2PVerdict.NOT_POSTED, P2PVerdict.MISMATCH, P2PVerdict.CYCLE, P2PVerdict.BEHIND)
    w: P2PWait = min(diag.p2p, key=lambda w: (order.index(w.verdict), w.rank))
    me, peer = by_rank[w.rank], by_rank.get(w.op.peer)
    waits = f"rank {w.rank} waits in {w.op.label()}"
    if me.user_frame is not None:
        waits += f", {me.user_frame.where()}"
    there = f"{_where(peer)}" if peer is not None else "(not in this job)"
    if peer is not None and peer.state == RankState.DEAD:
        there = f"it had died ({peer.error})" if peer.error else "it had died"
    elif peer is not None and peer.state == RankState.SILENT:
        there = "it did not answer" + (f"; {_where(peer)}" if peer.user_frame else "")
    if w.verdict is P2PVerdict.NOT_POSTED:
        never = "sent it" if w.op.kind is P2PKind.RECV else "posted the receive"
        return f"The job hung in a point-to-point op: {waits}; rank {w.op.peer} never {never}: it is {there}."
    if w.verdict is P2PVerdict.MISMATCH:
        theirs = next((x for x in diag.p2p if x.rank == w.op.peer), None)
        other = theirs.op.label() if theirs else "the matching op"
        return (
            f"The job hung in a point-to-point op: {waits}; rank {w.op.peer} posted {other}: "
            "the sizes differ."
        )
    if w.verdict is P2PVerdict.CYCLE:
        cycle = rank_list(sorted(x.rank for x in diag.p2p if x.verdict is P2PVerdict.CYCLE))
        return f"The job hung in a cycle of point-to-point waits (a deadlock) of {cycle}: {waits}."
    return f"The job hung in a point-to-point op: {waits}, behind rank {w.root}."


def groups(diag: HangDiagnosis) -> list[tuple[list[int], RankPlace]]:
    """(ranks, one of their places) for each group of ranks in the same state at the same place;
    the culprits first."""
    order = {
        s: i
        for i, s in enumerate(
            (
                RankState.DEAD,
                RankState.MISSING,
                RankState.DESYNC,
                RankState.UNMATCHED,
                RankState.SILENT,
                RankState.ELSEWHERE,
                RankState.WAITING,
            )
        )
    }
    found: dict[tuple[Any, ...], list[RankPlace]] = {}
    for p in diag.places:
        key = (p.state, p.user_frame, p.inside, p.op, p.error, p.stacks_from, p.p2p)
        found.setdefault(key, []).append(p)
    out = [([p.rank for p in ps], ps[0]) for ps in found.values()]
    out.sort(key=lambda g: (order[g[1].state], g[0][0]))
    return out


def headline(diag: HangDiagnosis) -> str:
    """One sentence: where the job is stuck and who the others wait for (and the point-to-point
    wait it ends at, when there is one)."""
    p2p = p2p_sentence(diag)
    if p2p and diag.collective is None:
        return p2p
    if p2p and diag.collective is not None and not diag.desync:
        # the ranks that wait in the collective, not in a point-to-point op, wait behind it
        behind = [p.rank for p in diag.places if p.state == RankState.WAITING and p.p2p is None]
        if not behind:
            return p2p
        verb = "waits" if len(behind) == 1 else "wait"
        return (
            f"{p2p} {rank_list(behind).capitalize()} {verb} in {diag.collective.label()} behind it."
        )
    return _collective_headline(diag)


def _collective_headline(diag: HangDiagnosis) -> str:
    culprits = diag.culprits
    who = rank_list(culprits) if culprits else "no rank in particular"
    if diag.collective is not None and diag.desync:
        c = diag.collective
        where = c.label().split(" of ", 1)[1]
        return (
            f"The job hung on a desync at collective #{c.seq} of {where}: the ranks called "
            f"different collectives ({c.op})."
        )
    if diag.collective is not None:
        return f"The job hung in {diag.collective.label()}: the others wait for {who}."
    if culprits:
        return (
            f"The job hung: {who} {'is' if len(culprits) == 1 else 'are'} not where the others are."
        )
    return "The job hung: every rank is at the same place (see each rank's stacks)."


def paragraph(diag: HangDiagnosis) -> str:
    """The terminal's short paragraph: the headline, then one line per group of ranks."""
    lines = [headline(diag)]
    gs = groups(diag)
    for ranks, p in gs[:MAX_GROUPS]:
        since = (
            f", {p.since_s:.0f} s after step {p.steps}" if p.since_s is not None and p.steps else ""
        )
        lines.append(f"  {rank_list(ranks)}: {_what(p, diag)}, {_where(p)}{since}")
    if len(gs) > MAX_GROUPS:
        lines.append(f"  … {len(gs) - MAX_GROUPS} more groups (report/hang.json)")
    return "\n".join(lines)


def hang_json(diag: HangDiagnosis, notice: dict[str, Any]) -> dict[str, Any]:
    """``report/hang.json``: the notice, the diagnosis, every rank's place, the words."""
    c = diag.collective
    return {
        "notice": notice,
        "basis": diag.basis,
        "collective": None
        if c is None
        else {"group": c.group, "group_desc": c.group_desc, "seq": c.seq, "op": c.op},
        "desync": diag.desync,
        "culprits": diag.culprits,
        "headline": headline(diag),
        "ranks": [
            {
                "rank": p.rank,
                "state": str(p.state),
                "file": p.user_frame.file if p.user_frame else None,
                "line": p.user_frame.line if p.user_frame else None,
                "function": p.user_frame.function if p.user_frame else None,
                "inside": p.inside,
                "op": p.op,
                "steps": p.steps,
                "since_last_step_s": None if p.since_s is None else round(p.since_s, 3),
                "error": p.error,
                "stacks_from": p.stacks_from,
                "p2p": None
                if p.p2p is None
                else {
                    "op": str(p.p2p.kind),
                    "peer": p.p2p.peer,
                    "group": p.p2p.group,
                    "seq": p.p2p.seq,
                    "sizes": None if p.p2p.sizes is None else [list(s) for s in p.p2p.sizes],
                    "from": str(p.p2p.source),
                },
            }
            for p in diag.places
        ],
        "p2p": [
            {
                "rank": w.rank,
                "peer": w.op.peer,
                "op": str(w.op.kind),
                "verdict": str(w.verdict),
                "root": w.root,
            }
            for w in diag.p2p
        ],
    }


def run_record(diag: HangDiagnosis) -> dict[str, Any]:
    """What ``run.json``'s ``hang`` object adds: the headline and the culprits' places."""
    culprit_places = [p for p in diag.places if p.rank in set(diag.culprits)]
    return {
        "headline": headline(diag),
        "collective": None if diag.collective is None else diag.collective.label(),
        "culprits": [
            {"rank": p.rank, "state": str(p.state), "where": _where(p)} for p in culprit_places[:16]
        ],
    }


def after_failure(diag: HangDiagnosis) -> str:
    """When a rank died: what the others were in when torchrun ended them (their own answers on
    SIGTERM), one line per group of them; "" when none answered."""
    others = [g for g in groups(diag) if g[1].state not in (RankState.DEAD, RankState.SILENT)]
    dead = diag.ranks(RankState.DEAD)
    if not others or not dead:
        return ""
    where = f"in {diag.collective.label()}" if diag.collective else "where they were"
    lines = [f"When {rank_list(dead)} died, the others were waiting {where}:"]
    for ranks, p in others[:MAX_GROUPS]:
        lines.append(f"  {rank_list(ranks)}: {_what(p, diag)}, {_where(p)}")
    return "\n".join(lines)
