"""summary.json: :func:`summary` builds the document from an :class:`Analysis` and its findings,
:func:`render_json` writes it as text; :func:`summarise` builds the findings, the advice and the
document once for every rendering of one analysis (:class:`Summarised`).

The JSON contract is documented in ``docs/summary.md`` (``SUMMARY_SCHEMA`` / ``SUMMARY_VERSION``);
times are seconds (``*_s``), rounded to the µs unless said otherwise. Separate from the terminal
and HTML renderers because both of them start from this document (they import it; it imports
neither), and because it is the contract other tools read.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING, Any

from rankscope.analysis.conclude.findings import Finding, findings, point_to_point
from rankscope.analysis.store.frames import rows

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.conclude.advice import Advice
    from rankscope.analysis.engine.driver import Analysis

#: ``schema`` field of summary.json.
SUMMARY_SCHEMA = "rankscope-summary"
#: ``version`` field of summary.json; bump on any incompatible change (docs/summary.md).
SUMMARY_VERSION = 1


def _s(ns: Any) -> float:
    """ns → s, rounded to the µs."""
    return round(float(ns) / 1e9, 6)


def _finite(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def what_if_summary(table: Any) -> dict[str, Any] | None:
    """summary.json's ``what_if`` (docs/summary.md) from a what-if table
    (whatif.SCENARIO_COLUMNS); None when it is empty (the key is then left out)."""
    from rankscope.analysis.engine.whatif import SCENARIO_KEYS, STEP_STATISTIC

    if table is None or not len(table):
        return None
    first = table.iloc[0]
    error = float(first["replay_error_pct"])

    def share(pct: float) -> float:
        return round(pct / 100.0, 4) if math.isfinite(pct) else 0.0

    return {
        "statistic": STEP_STATISTIC,
        "step_s": _s(first["measured_step_ns"]),
        "replayed_step_s": _s(first["replayed_step_ns"]),
        "replay_error_share": share(error),
        "scenarios": [
            {
                "kind": SCENARIO_KEYS.get(str(r.scenario), "custom"),
                "scenario": str(r.scenario),
                "rank": int(r.rank) if int(r.rank) >= 0 else None,
                "predicted_step_s": _s(r.predicted_step_ns),
                "saving_s": _s(r.saving_ns),
                "saving_share": share(float(r.saving_pct)),
            }
            for r in rows(table)
        ],
    }


@dataclasses.dataclass(frozen=True)
class Summarised:
    """What the terminal summary, summary.json and report.html of one analysis start from, built
    once by :func:`summarise` and handed to each of them, so that the three show the same lists
    and the findings, advice and KPIs (the costly part of a report: ~11 % of a small
    ``analyze``) are computed once, not once per rendering. Read-only for the renderers."""

    found: list[Finding]
    """The findings (``findings.findings``), in the order every rendering shows them."""
    advised: list[Advice]
    """The advice (``advice.advice`` of those findings), most valuable first."""
    doc: dict[str, Any]
    """The summary.json document of them (docs/summary.md)."""


def summarise(a: Analysis) -> Summarised:
    """The findings, the advice and the summary.json document of ``a``, each built once."""
    from rankscope.analysis.conclude.advice import advice

    found = findings(a)
    advised = advice(a, found)
    return Summarised(found=found, advised=advised, doc=summary(a, found, advised))


def summary(
    a: Analysis, found: list[Finding] | None = None, advised: list[Advice] | None = None
) -> dict[str, Any]:
    """The summary.json document (contract: docs/summary.md).

    ``found``: :func:`findings` of ``a`` when the caller already has them (they are built once per
    rendering, so that every part of it shows the same list); ``advised``: likewise the advice
    (``advice.advice``), most valuable first.
    """
    from rankscope.analysis.conclude.advice import advice

    found = findings(a) if found is None else found
    from rankscope.analysis.compute.collectives import collective_summary

    totals = a.comm_totals.set_index("rank") if len(a.comm_totals) else None
    verdicts = a.verdicts.set_index("rank") if len(a.verdicts) else None
    ranks = []
    for r in rows(a.whole()):
        t = totals.loc[r.rank] if totals is not None and r.rank in totals.index else None
        v = verdicts.loc[r.rank] if verdicts is not None and r.rank in verdicts.index else None
        ranks.append(
            {
                "rank": int(r.rank),
                "host": a.hosts.get(int(r.rank), ""),
                "device": r.device,
                "total_s": _s(r.total_ns),
                "compute_s": _s(r.compute_ns),
                "comm_s": _s(r.comm_ns),
                "comm_exposed_s": _s(r.comm_exposed_ns),
                "comm_overlapped_s": _s(r.comm_overlapped_ns),
                "comm_wait_s": _s(t["comm_wait_ns"]) if t is not None else 0.0,
                "comm_transfer_s": _s(t["comm_transfer_ns"]) if t is not None else 0.0,
                "memory_s": _s(r.memory_ns),
                "input_s": _s(r.input_ns),
                "other_s": _s(r.other_ns),
                "idle_s": _s(r.idle_ns),
                "verdict": str(v["verdict"]) if v is not None else "",
                "verdict_reason": str(v["reason"]) if v is not None else "",
            }
        )
    steps = [
        {
            "rank": int(r.rank),
            "step": int(r.step),
            "total_s": _s(r.total_ns),
            "compute_s": _s(r.compute_ns),
            "comm_exposed_s": _s(r.comm_exposed_ns),
            "comm_overlapped_s": _s(r.comm_overlapped_ns),
            "memory_s": _s(r.memory_ns),
            "input_s": _s(r.input_ns),
            "idle_s": _s(r.idle_ns),
        }
        for r in rows(a.breakdown[a.breakdown["step"] >= 0])
    ]
    stragglers = [
        {
            "rank": int(s.rank),
            "score": round(float(s.score), 3),
            "confidence": round(float(s.confidence), 6),
            "p_value": float(s.p_value),
            "times_last": int(s.times_last),
            "collectives": int(s.collectives),
            "wait_caused_s": round(float(s.wait_caused_s), 6),
            "wait_share": round(float(s.wait_share), 4),
            "cause": s.cause,
            "masked_by": int(s.masked_by),
        }
        for s in rows(a.stragglers)
        if s.is_straggler
    ]
    clock = [
        {
            "rank": int(c.rank),
            "host": str(c.host),
            "offset_ns": int(c.offset_ns),
            "drift_ppb": float(c.drift_ppb),
            "uncertainty_ns": int(c.uncertainty_ns),
            "method": str(c.method),
        }
        for c in rows(a.clock)
    ]
    by_op = collective_summary(a.waits)
    pairs, unmatched = point_to_point(a)
    w = a.waits
    colls = {
        "count": int(w["coll"].nunique()) if len(w) else 0,
        "rank_rows": len(w),
        "total_s": _s(w["dur_ns"].sum()) if len(w) else 0.0,
        "wait_s": _s(w["wait_ns"].sum()) if len(w) else 0.0,
        "transfer_s": _s(w["transfer_ns"].sum()) if len(w) else 0.0,
        "clock_disagreements": int(w["clock_disagree"].sum()) if len(w) else 0,
        "by_op": [
            {
                "op": str(o.op),
                "count": int(o.count),
                "bytes": int(o.bytes),
                "total_s": _s(o.dur_ns),
                "wait_s": _s(o.wait_ns),
                "transfer_s": _s(o.transfer_ns),
            }
            for o in rows(by_op)
        ],
    }
    hta = [
        {
            "rank": int(h.rank),
            "idle_us": round(h.idle_ns / 1e3, 3),
            "compute_us": round(h.compute_ns / 1e3, 3),
            "non_compute_us": round(h.non_compute_ns / 1e3, 3),
            "kernel_time_us": round(h.kernel_time_ns / 1e3, 3),
            "overlap_pct": _finite(round(float(h.overlap_pct), 2)),
        }
        for h in rows(a.hta)
    ]
    from rankscope.analysis.render.memory_section import memory_summary

    doc: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA,
        "version": SUMMARY_VERSION,
        "store": str(a.path),
        "run_id": str(a.meta.get("run_id", "")),
        "world_size": int(a.world_size),
        "ranks_present": len(ranks),
        # what to do first: the reader's first question (docs/advice.md)
        "advice": [i.as_json() for i in (advice(a, found) if advised is None else advised)],
        "ranks": ranks,
        "steps": steps,
        "stragglers": stragglers,
        "pipeline": {
            "pairs": pairs,
            "unmatched": unmatched,
            "bottlenecks": [
                {
                    "rank": int(p.rank),
                    "root_pairs": int(p.root_pairs),
                    "wait_traced_s": round(float(p.wait_traced_s), 6),
                    "wait_share": round(float(p.wait_share), 4),
                    "wait_caused_s": round(float(p.wait_caused_s), 6),
                    "cause": p.cause,
                }
                for p in rows(a.pipeline)
                if p.is_bottleneck
            ],
        },
        "clock": clock,
        "collectives": colls,
        "hta": hta,
        "problems": [
            {"file": str(p.file), "rank": int(p.rank), "problem": str(p.problem)}
            for p in rows(a.problems)
        ],
        "findings": [f.as_json() for f in found],
    }
    from rankscope.analysis.conclude.sections import Section, applicable

    sections = applicable(a)
    # one rank: the sections comparing ranks are left out, and ``sections`` says which apply
    doc["sections"] = sorted(sections)
    for section in (Section.STRAGGLERS, Section.CLOCK, Section.COLLECTIVES):
        if section not in sections:
            del doc[section.value]
    memory = memory_summary(a.memory)
    if memory is not None:  # additive: absent without memory events (docs/summary.md)
        doc["memory"] = memory
    what_if = what_if_summary(getattr(a, "whatif", None))
    if what_if is not None:  # additive: absent when no replay could be built (docs/summary.md)
        doc["what_if"] = what_if
    from rankscope.analysis.conclude.kpis import kpis, to_json

    doc["kpis"] = to_json(kpis(a))  # additive: the figures `rankscope compare` compares
    from rankscope.analysis.conclude.run_steps import run_steps_summary

    run_steps = run_steps_summary(a)
    if run_steps is not None:  # additive: only where the ranks kept step logs (issue 30)
        doc["run_steps"] = run_steps
    op_rows = op_table_summary(getattr(a, "op_table_across", None))
    if op_rows:  # additive: the key_averages-grade table across ranks (docs/summary.md)
        doc["op_table"] = op_rows
    links = getattr(a, "links", None)
    if links is not None and len(links):  # additive: only where host pairs could be compared
        doc["links"] = [
            {
                "host_a": str(r.host_a),
                "host_b": str(r.host_b),
                "instances": int(r.instances),
                "transfer_ms": round(float(r.transfer_ms), 6),
                "typical_ms": round(float(r.typical_ms), 6),
                "slowdown": round(float(r.slowdown), 4),
                "extra_s": round(float(r.extra_s), 6),
                "group": int(r.group),
                "is_slow": bool(r.is_slow),
            }
            for r in rows(links)
        ]
    attention = attention_summary(getattr(a, "attention", None))
    if attention:  # additive: only when the run called scaled_dot_product_attention
        doc["attention"] = attention
    from rankscope.analysis.render.hta_section import critical_path_summary, hta_analyses_summary

    feed = hta_analyses_summary(getattr(a, "gpu_feed", None))
    if feed is not None:  # additive: only with GPU ranks (docs/summary.md)
        doc["hta_analyses"] = feed
    path = critical_path_summary(getattr(a, "critical_path", None))
    if path is not None:  # additive: only with a what-if graph (docs/summary.md)
        doc["critical_path"] = path
    return doc


def op_table_summary(table: pd.DataFrame | None) -> list[dict[str, Any]]:
    """summary.json ``op_table``: the across-ranks op table (ops.OP_TABLE_ACROSS_COLUMNS), times
    in seconds (mean per rank)."""
    if table is None or not len(table):
        return []
    out = []
    for r in rows(table):
        out.append(
            {
                "name": str(r.name),
                "kind": str(r.kind),
                "shapes": str(r.shapes) if isinstance(r.shapes, str) and r.shapes else None,
                "ranks": int(r.ranks),
                "calls_mean": round(float(r.count_mean), 3),
                "self_cpu_s": round(float(r.self_cpu_mean_ns) / 1e9, 9),
                "cpu_total_s": round(float(r.cpu_total_mean_ns) / 1e9, 9),
                "self_device_s": round(float(r.self_device_mean_ns) / 1e9, 9),
                "device_total_s": round(float(r.device_total_mean_ns) / 1e9, 9),
                "spread": round(float(r.spread), 4) if r.spread == r.spread else None,
                "slowest_rank": int(r.slowest_rank),
            }
        )
    return out


def attention_summary(table: pd.DataFrame | None) -> list[dict[str, Any]]:
    """summary.json ``attention``: SDPA time per rank and backend (attention.ATTENTION_BACKEND_COLUMNS),
    seconds."""
    if table is None or not len(table):
        return []
    return [
        {
            "rank": int(r.rank),
            "backend": str(r.backend),
            "backward": bool(r.backward),
            "calls": int(r.calls),
            "total_s": round(float(r.total_ns) / 1e9, 9),
            "mean_s": round(float(r.mean_ns) / 1e9, 9),
            "device_s": round(float(r.device_ns) / 1e9, 9),
            "share": round(float(r.share), 4),
        }
        for r in rows(table)
    ]


def render_json(a: Analysis, summarised: Summarised | None = None) -> str:
    """summary.json text (indented, UTF-8 safe); ``summarised``: :func:`summarise` of ``a`` when
    the caller renders it in other forms too (built here when None)."""
    doc = summary(a) if summarised is None else summarised.doc
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
