"""Holds the findings model: what an :class:`~rankscope.analysis.engine.driver.Analysis` concluded, as data.

Every renderer — the terminal summary, summary.json, the HTML report, the Panel app — shows the
same conclusions (a straggler and its evidence, a pipeline bottleneck, the lack of either, send/recv
ops that could not be paired, input problems). They used to be written as rich markup once per
renderer and regex-stripped for the others, so the same sentence lived in three places and drifted.
Now :func:`findings` builds each conclusion ONCE, as a :class:`Finding` of plain text and figures;
renderers only choose how to show it (colour by :class:`Severity`, escaping for their medium).

The sentences are worded here and nowhere else; their figures come from the same rows as
summary.json's ``stragglers[]`` and ``pipeline`` (rounded the same way), so a reader can check one
against the other. This module imports nothing heavy at module level.

Why one module of ~540 lines: the :class:`Finding` model every renderer reads, and the timing
findings (stragglers, bottlenecks, send/recv pairing, input, what-if) that share its phrasing
helpers. The memory findings are worded in ``memory_findings.py``, the layered root cause's in
``rootcause_findings.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.analysis.engine.driver import Analysis

from rankscope.analysis.compute.finding import (
    CAUSE_ARROW as CAUSE_ARROW,
)
from rankscope.analysis.compute.finding import (  # the model, re-exported: readers import it from here too
    HEADLINE_SEPARATOR as HEADLINE_SEPARATOR,
)
from rankscope.analysis.compute.finding import (
    MEMORY_KINDS as MEMORY_KINDS,
)
from rankscope.analysis.compute.finding import (
    MINUS as MINUS,
)
from rankscope.analysis.compute.finding import (
    NAMED_SEPARATOR as NAMED_SEPARATOR,
)
from rankscope.analysis.compute.finding import (
    PIPELINE_KINDS as PIPELINE_KINDS,
)
from rankscope.analysis.compute.finding import (
    WHAT_IF_ERROR_PCT as WHAT_IF_ERROR_PCT,
)
from rankscope.analysis.compute.finding import Cause
from rankscope.analysis.compute.finding import (
    Finding as Finding,
)
from rankscope.analysis.compute.finding import (
    FindingKind as FindingKind,
)
from rankscope.analysis.compute.finding import (
    Severity as Severity,
)
from rankscope.rank_ranges import rank_list

# -- the sentences ---------------------------------------------------------------------------


def extra_parts(row: Mapping[str, Any]) -> str:
    """'compute +a, input +b, host +c ms' from a row with ``*_extra_s`` (seconds)."""
    return (
        f"compute +{row['compute_extra_s'] * 1e3:.1f}, input +{row['input_extra_s'] * 1e3:.1f}, "
        f"host +{row['host_extra_s'] * 1e3:.1f} ms"
    )


def straggler_evidence(row: Mapping[str, Any]) -> str:
    """The evidence sentence of one straggler (a row of ``Analysis.stragglers``), in ms.

    Lateness and own extra work are each counted once per delay (docs/analysis.md): a rank late
    at two DDP buckets in flight together fell behind once, so both stay within its own time.
    """
    masked = int(row.get("masked_by", -1))
    hidden = (
        f"masked by rank {masked} (found once rank {masked} is set aside: the numbers are those "
        "of that second look); "
        if masked >= 0
        else ""
    )
    said = hidden + (
        f"last at {row['times_last']} of {row['collectives']} collectives "
        f"({row['expected_last']:.1f} expected by chance); fell {row['late_s'] * 1e3:.1f} ms "
        f"behind the median rank (each delay counted once); its own extra work before arriving: "
        f"{row['own_extra_s'] * 1e3:.1f} ms ({extra_parts(row)} vs the median rank)"
    )
    if str(row.get("cause")) == Cause.CPU_CONTENTION:
        # the cause's own evidence: own extra work alone would read as the rank's fault, and it
        # holds the stolen time too (a rank that loses its core inside an op runs that op longer)
        said += (
            f"; its main thread waited {row['contention_s'] * 1e3:.1f} ms more than the median "
            f"rank's for a core (run-queue delay, summed over its {row['units']} profiled steps: "
            f"{row['contention_share']:.0%} of its lateness there), which also lengthens its "
            "own work: other processes on the node took its CPU"
        )
    return said


#: Why the closest rank is not named, per ``stragglers.Verdict`` value (a rank that was never
#: last, or not more often than chance, needs no sentence beyond the general one).
_NOT_NAMED: dict[str, str] = {
    "too small a share of the waiting": "it caused {wait_share:.0%} of the waiting, too small a share",
    "propagated": (
        "its lateness was propagated: it left the previous sync point late and its own work "
        "did not add to that (look at what held it there)"
    ),
    "cause not measured": "its own extra work explains too little of its lateness",
    "immaterial": "its typical lateness, {typical_ms:.2f} ms per step, is too small to matter",
    "within the noise": (
        "its typical lateness, {typical_ms:.2f} ms per step, is within the step-to-step noise "
        "of the other ranks ({noise_ms:.2f} ms s.d.)"
    ),
}


def no_straggler_evidence(collectives: int, closest: Mapping[str, Any] | None = None) -> str:
    """Why "no straggler" is a finding, not a lack of one: a balanced run always has a last rank.

    ``closest``: the row of ``Analysis.stragglers`` that came closest (most significant); when it
    was last significantly often but failed a later test, the sentence says which one, in ms."""
    text = (
        "no rank was last significantly more often than chance and caused a material share of "
        f"the wait ({collectives} collective(s))"
    )
    why = _NOT_NAMED.get(str(closest.get("verdict", ""))) if closest is not None else None
    if closest is None or why is None:
        return text + "."
    return (
        f"{text}; rank {int(closest['rank'])} was last in {int(closest['units_last'])} of "
        f"{int(closest['units'])} steps (p = {float(closest['p_value']):.2g}) but is not named: "
        + why.format(
            wait_share=float(closest["wait_share"]),
            typical_ms=float(closest["typical_s"]) * 1e3,
            noise_ms=float(closest["noise_s"]) * 1e3,
        )
        + "."
    )


def bottleneck_evidence(figures: Mapping[str, float]) -> str:
    """The evidence sentence of one pipeline bottleneck, from its :attr:`Finding.figures`."""
    return (
        f"{int(figures['root_pairs'])} receivers' waits ({figures['wait_traced_s'] * 1e3:.1f} ms, "
        f"{figures['wait_share']:.0%} of the waiting in recvs, {int(figures['pairs'])} pairs) "
        "trace back to it; its own extra work before sending explains "
        f"{figures['wait_caused_s'] * 1e3:.1f} ms ({extra_parts(figures)} vs the typical stage)"
    )


def no_bottleneck_evidence(pairs: int) -> str:
    """Why no stage is blamed: the recv waits are the schedule's bubble, not a stage's work."""
    return (
        f"the waiting in recvs ({pairs} send/recv pair(s)) traces back to no stage's own extra "
        "work."
    )


def unpaired_evidence(unmatched: int, without_peer: int | None = None, pairs: int = 0) -> str:
    """Which send/recv ops were not paired and why, never guessed (docs/analysis.md,
    "Point-to-point pairs"): ``without_peer`` of the ``unmatched`` ones had no peer named by the
    trace (``Dst Rank`` / ``Src Rank``) or by ``rankscope run``'s annotation; the others named a
    peer whose side is in no trace. ``without_peer`` None (a store older than the count): all
    are said to be without a known peer. ``pairs``: 0 means there is no pipeline analysis."""
    no_peer = unmatched if without_peer is None else min(without_peer, unmatched)
    other = unmatched - no_peer
    parts = []
    if no_peer:
        parts.append(
            f"{no_peer} send/recv op(s) without a known peer (no Dst/Src Rank in the trace, no "
            "`rankscope run` peer annotation)"
        )
    if other:
        what = "whose peer's side is in no trace (not traced, or outside the profiled window)"
        parts.append(f"{other} {what}" if no_peer else f"{other} send/recv op(s) {what}")
    tail = "not paired, no pipeline analysis." if not pairs else "not paired."
    return f"{' and '.join(parts)}: {tail}"


def input_problems_evidence(count: int, first: str) -> str:
    """How many inputs the merge could not ingest, and the first of them."""
    return f"{count} input problem(s) recorded by the merge (first: {first})."


def what_if_headline(scenario: str, rank: int) -> str:
    """'if rank 2 ran like the median rank' for a scenario that fixes one rank; else the
    scenario's name ('all ranks like the median rank', 'no input stall')."""
    from rankscope.analysis.engine.whatif import PEER_LIKE, RANK_SCENARIOS

    if scenario == PEER_LIKE and rank >= 0:
        return f"if rank {rank} ran like its peers"
    if scenario in RANK_SCENARIOS and rank >= 0:
        return f"if rank {rank} ran like the median rank"
    return scenario


def what_if_evidence(figures: Mapping[str, float], per_step: bool = False) -> str:
    """'42.1 → 30.9 ms (−26.6 %)' (``per_step``: 'step 42.1 → …') from a what-if finding's
    figures; the replay error when the unmodified replay missed the measured steps by more
    than :data:`WHAT_IF_ERROR_PCT`."""
    saving = figures["saving_share"] * 100.0
    sign = MINUS if saving >= 0 else "+"
    text = (
        f"{'step ' if per_step else ''}{figures['step_s'] * 1e3:.1f} → "
        f"{figures['predicted_step_s'] * 1e3:.1f} ms ({sign}{abs(saving):.1f} %)"
    )
    error = figures.get("replay_error_share", 0.0) * 100.0
    if error > WHAT_IF_ERROR_PCT:
        text += f"; the replay of the measured steps is off by up to {error:.1f} %"
    return text


def what_if_findings(table: Any) -> list[Finding]:
    """One finding per row of a what-if table (whatif.SCENARIO_COLUMNS), in its order: the
    ranks fixed (stragglers, bottlenecks: rank set, 'step A → B ms'), then the job-wide
    scenarios (rank None). Figures: the statistic over the profiled steps (``step_s`` the
    measured step, ``predicted_step_s`` the replay with the fix, ``saving_s`` = replayed −
    predicted, ``saving_share`` of the replayed step, ``replay_error_share``). Pure."""
    import math

    out: list[Finding] = []
    if table is None or not len(table):
        return out
    for row in table.itertuples(index=False):
        rank = int(row.rank)
        error = float(row.replay_error_pct)
        figures: dict[str, float] = {
            "step_s": round(float(row.measured_step_ns) / 1e9, 6),
            "replayed_step_s": round(float(row.replayed_step_ns) / 1e9, 6),
            "predicted_step_s": round(float(row.predicted_step_ns) / 1e9, 6),
            "saving_s": round(float(row.saving_ns) / 1e9, 6),
            "saving_share": round(float(row.saving_pct) / 100.0, 4)
            if math.isfinite(float(row.saving_pct))
            else 0.0,
            "replay_error_share": round(error / 100.0, 4) if math.isfinite(error) else 0.0,
        }
        out.append(
            Finding(
                kind=FindingKind.WHAT_IF,
                severity=Severity.NOTE,
                rank=rank if rank >= 0 else None,
                headline=what_if_headline(str(row.scenario), rank),
                evidence=what_if_evidence(figures, per_step=rank >= 0),
                figures=figures,
            )
        )
    return out


def point_to_point(a: Analysis) -> tuple[int, int]:
    """(matched send/recv pairs, send/recv ops whose peer is unknown) in ``a.waits``."""
    from rankscope.analysis.store.schema import P2P_OPS

    if not len(a.waits):
        return 0, 0
    p2p = a.waits[a.waits["op"].isin(P2P_OPS)]
    return int(p2p.loc[p2p["n_ranks"] == 2, "coll"].nunique()), int((p2p["n_ranks"] == 1).sum())


def _straggler_findings(a: Analysis) -> list[Finding]:
    """One finding per straggler, most significant first (masked ones after: that is the order of
    ``a.stragglers``), or the one "no straggler" finding; for a layered job (``a.rootcause``)
    the slow workers, stage and data imbalances of :mod:`rankscope.analysis.compute.rootcause`."""
    if getattr(a, "rootcause", None) is not None:
        from rankscope.analysis.conclude.rootcause_findings import rootcause_findings

        return rootcause_findings(a.rootcause)
    s = a.stragglers
    rows = s[s["is_straggler"]] if len(s) else s
    out = []
    for _, row in rows.iterrows():
        rank = int(row["rank"])
        figures: dict[str, float] = {
            "times_last": int(row["times_last"]),
            "collectives": int(row["collectives"]),
            "expected_last": round(float(row["expected_last"]), 3),
            "p_value": float(row["p_value"]),
            "score": round(float(row["score"]), 3),
            "confidence": round(float(row["confidence"]), 6),
            "wait_caused_s": round(float(row["wait_caused_s"]), 6),
            "wait_share": round(float(row["wait_share"]), 4),
            "late_s": round(float(row["late_s"]), 6),
            "own_extra_s": round(float(row["own_extra_s"]), 6),
            "compute_extra_s": round(float(row["compute_extra_s"]), 6),
            "input_extra_s": round(float(row["input_extra_s"]), 6),
            "host_extra_s": round(float(row["host_extra_s"]), 6),
        }
        if str(row["cause"]) == Cause.CPU_CONTENTION:
            figures["contention_s"] = round(float(row["contention_s"]), 6)
            figures["contention_share"] = round(float(row["contention_share"]), 4)
        out.append(
            Finding(
                kind=FindingKind.STRAGGLER,
                severity=Severity.PROBLEM,
                rank=rank,
                masked_by=int(row["masked_by"]),
                headline=f"Straggler: rank {rank}",
                # from the unrounded row: the sentence as it has always read
                evidence=straggler_evidence(row),
                cause=str(row["cause"]),
                figures=figures,
            )
        )
    if out:
        return out
    collectives = int(a.waits["coll"].nunique()) if len(a.waits) else 0
    closest = s.iloc[0].to_dict() if len(s) and "verdict" in s.columns else None
    return [
        Finding(
            kind=FindingKind.NO_STRAGGLER,
            severity=Severity.OK,
            rank=None,
            headline="No straggler",
            evidence=no_straggler_evidence(collectives, closest),
            figures={"collectives": collectives},
        )
    ]


def _pipeline_findings(a: Analysis) -> list[Finding]:
    """The bottleneck stages, or why there is none, or why there is no pipeline analysis; nothing
    for a job without send/recv ops."""
    from rankscope.analysis.store.schema import P2P_WITHOUT_PEER_ATTR

    pairs, unmatched = point_to_point(a)
    recorded = a.meta.get(P2P_WITHOUT_PEER_ATTR)
    without_peer = int(recorded) if recorded is not None else None
    if not pairs:
        if not unmatched:
            return []
        return [
            Finding(
                kind=FindingKind.UNPAIRED_P2P,
                severity=Severity.NOTE,
                rank=None,
                headline="Point-to-point not paired",
                evidence=unpaired_evidence(unmatched, without_peer),
                figures={"unmatched": unmatched},
            )
        ]
    p = a.pipeline
    rows = p[p["is_bottleneck"]] if len(p) else p
    out = []
    for _, row in rows.iterrows():
        rank = int(row["rank"])
        # rounded as summary.json's pipeline.bottlenecks[], and the sentence is written from these
        figures: dict[str, float] = {
            "root_pairs": int(row["root_pairs"]),
            "pairs": pairs,
            "wait_traced_s": round(float(row["wait_traced_s"]), 6),
            "wait_share": round(float(row["wait_share"]), 4),
            "wait_caused_s": round(float(row["wait_caused_s"]), 6),
            "compute_extra_s": round(float(row["compute_extra_s"]), 6),
            "input_extra_s": round(float(row["input_extra_s"]), 6),
            "host_extra_s": round(float(row["host_extra_s"]), 6),
        }
        out.append(
            Finding(
                kind=FindingKind.PIPELINE_BOTTLENECK,
                severity=Severity.PROBLEM,
                rank=rank,
                headline=f"Pipeline bottleneck: rank {rank}",
                evidence=bottleneck_evidence(figures),
                cause=str(row["cause"]),
                figures=figures,
            )
        )
    if not out:
        out = [
            Finding(
                kind=FindingKind.NO_PIPELINE_BOTTLENECK,
                severity=Severity.OK,
                rank=None,
                headline="No pipeline bottleneck",
                evidence=no_bottleneck_evidence(pairs),
                figures={"pairs": pairs},
            )
        ]
    if unmatched:  # said once, after the verdict it qualifies (one pipeline finding per verdict)
        last = out[-1]
        evidence = f"{last.evidence} {unpaired_evidence(unmatched, without_peer, pairs)}"
        out[-1] = dataclasses.replace(last, evidence=evidence)
    return out


def _input_findings(a: Analysis) -> list[Finding]:
    """One finding for all of the merge's input problems (each was printed by the merge)."""
    n = len(a.problems)
    if not n:
        return []
    return [
        Finding(
            kind=FindingKind.INPUT_PROBLEMS,
            severity=Severity.NOTE,
            rank=None,
            headline="Input problems",
            evidence=input_problems_evidence(n, str(a.problems["problem"].iloc[0])),
            figures={"problems": n},
        )
    ]


def findings(a: Analysis) -> list[Finding]:
    """Every finding of ``a``, in reading order: stragglers (or "no straggler"), the pipeline
    finding when the job has send/recv ops, input problems. Pure: the same analysis gives the
    same list, so every renderer of one analysis shows the same findings. The memory findings
    come before the input problems, when the store has memory events or the run asked for them
    (``--profile-memory``; then "no memory events" is the finding). With a what-if table
    (``a.whatif``), each straggler and bottleneck is followed by what fixing it would save, and
    the job-wide scenarios follow the pipeline findings (kind ``what_if``)."""
    from rankscope.analysis.conclude.sections import Section, applicable

    # one rank: no rank to be late against, so no straggler finding, not even "no straggler"
    strag = _straggler_findings(a) if Section.STRAGGLERS in applicable(a) else []
    linked = _with_what_if(strag + _link_findings(a) + _pipeline_findings(a), a)
    return (
        linked
        + _unmatched_comm_findings(a)
        + _memory_findings(a)
        + _attention_findings(a)
        + _input_findings(a)
    )


def unmatched_comm_evidence(ms: float, kernels: int, ranks: list[int], example: str) -> str:
    """The sentence of :data:`FindingKind.UNMATCHED_COMM` (``ms``: summed kernel time)."""
    name = example.split("(", 1)[0].removeprefix("void ")
    return (
        f"{ms:.3f} ms of communication kernels on {rank_list(ranks)} ({kernels} kernels, summed "
        f"over ranks, e.g. {name}) are in no collective matched across ranks (no "
        "record_param_comms launches them): counted as communication, not split into waiting "
        "and transfer"
    )


def _unmatched_comm_findings(a: Analysis) -> list[Finding]:
    """One line for the communication kernels in no collective (DeepEP, NVSHMEM, custom
    all-reduce, ``--comm-kernel``), so the waits and transfers are not read as all of it."""
    u = a.unmatched_comm
    if not len(u) or int(u["kernels"].sum()) == 0:
        return []
    some = u[u["kernels"] > 0]
    ms = float(some["dur_ns"].sum()) / 1e6
    kernels = int(some["kernels"].sum())
    ranks = [int(r) for r in some["rank"]]
    longest = str(some.loc[some["dur_ns"].idxmax(), "example"])
    return [
        Finding(
            kind=FindingKind.UNMATCHED_COMM,
            severity=Severity.NOTE,
            rank=None,
            headline="Communication not matched",
            evidence=unmatched_comm_evidence(ms, kernels, ranks, longest),
            figures={"unmatched_ms": round(ms, 6), "kernels": kernels, "ranks": len(ranks)},
        )
    ]


def _link_findings(a: Analysis) -> list[Finding]:
    """One finding per group of slow host pairs (analysis/compute/links.py), slowest first."""
    table = getattr(a, "links", None)
    if table is None or not len(table) or not table["is_slow"].any():
        return []
    from rankscope.analysis.compute.links import LINK_CAUSE, link_evidence, link_headline

    out = []
    for _, rows in table[table["is_slow"]].groupby("group", sort=False):
        row = rows.iloc[0]  # the slowest of the group (the table is sorted)
        out.append(
            Finding(
                kind=FindingKind.SLOW_LINK,
                severity=Severity.PROBLEM,
                rank=None,
                headline=link_headline(list(zip(rows["host_a"], rows["host_b"], strict=True))),
                evidence=link_evidence(row, len(rows)),
                cause=LINK_CAUSE,
                figures={
                    "pairs": len(rows),
                    "instances": int(row["instances"]),
                    "slowdown": round(float(row["slowdown"]), 3),
                    "transfer_ms": round(float(row["transfer_ms"]), 6),
                    "typical_ms": round(float(row["typical_ms"]), 6),
                    "extra_s": round(float(row["extra_s"]), 6),
                },
            )
        )
    return out


def _attention_findings(a: Analysis) -> list[Finding]:
    """The SDPA math fallback, per rank that ran it (analysis/compute/attention.py words it)."""
    calls = getattr(a, "attention_calls", None)
    if calls is None or not len(calls):
        return []
    from rankscope.analysis.compute.attention import math_fallback_findings

    return math_fallback_findings(calls)


def _with_what_if(items: list[Finding], a: Analysis) -> list[Finding]:
    """``items`` with each straggler's / bottleneck's what-if finding right after it, and the
    job-wide what-if findings at the end."""
    found = what_if_findings(getattr(a, "whatif", None))
    if not found:
        return items
    fixes = {f.rank: f for f in found if f.rank is not None}
    out: list[Finding] = []
    for f in items:
        out.append(f)
        if f.kind in (FindingKind.STRAGGLER, FindingKind.PIPELINE_BOTTLENECK) and f.rank in fixes:
            out.append(fixes.pop(f.rank))
    return out + list(fixes.values()) + [f for f in found if f.rank is None]


def rank_what_if(items: list[Finding]) -> list[Finding]:
    """The what-if findings that fix one rank (shown under its straggler / bottleneck)."""
    return [f for f in items if f.kind == FindingKind.WHAT_IF and f.rank is not None]


def job_what_if(items: list[Finding]) -> list[Finding]:
    """The job-wide what-if findings (the "What if" block)."""
    return [f for f in items if f.kind == FindingKind.WHAT_IF and f.rank is None]


def _memory_findings(a: Analysis) -> list[Finding]:
    m = getattr(a, "memory", None)
    if m is None or not (m.has_events or m.requested):
        return []
    from rankscope.analysis.conclude.memory_findings import memory_findings

    return memory_findings(m.peaks, m.leaks, m.imbalance, m.headroom, m.holders)


def pipeline_findings(items: list[Finding]) -> list[Finding]:
    """The pipeline findings among ``items`` (bottlenecks, no bottleneck, unpaired send/recv)."""
    return [f for f in items if f.kind in PIPELINE_KINDS]
