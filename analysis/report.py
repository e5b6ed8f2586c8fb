"""What a user reads: the terminal summary (rich), ``summary.json``, and an offline HTML report.

All three render an :class:`rankscope.analysis.pipeline.Analysis` and its findings
(:func:`rankscope.analysis.findings.findings`: the conclusions and their evidence sentences, worded
once there; here they are only styled and escaped). They return text (or print to a console);
writing files (atomically) is the caller's job. The HTML report is one self-contained
file: inline CSS and inline SVG charts, no script, no font, nothing fetched from the network.
The JSON contract is documented in ``docs/summary.md`` (``SUMMARY_SCHEMA`` / ``SUMMARY_VERSION``).

Why one module of ~1,130 lines: summary.json, the terminal and the HTML report are three
renderings of the same tables and findings, kept side by side so they stay alike (memory's
renderings live in report_memory.py).
"""

from __future__ import annotations

import html
import json
import math
from typing import TYPE_CHECKING, Any

from rankscope.analysis.findings import (
    MEMORY_KINDS,
    PIPELINE_KINDS,
    Finding,
    FindingKind,
    Severity,
    findings,
    job_what_if,
    pipeline_findings,
    point_to_point,
)

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.pipeline import Analysis
    from rich.console import Console

#: ``schema`` field of summary.json.
SUMMARY_SCHEMA = "rankscope-summary"
#: ``version`` field of summary.json; bump on any incompatible change (docs/summary.md).
SUMMARY_VERSION = 1
#: Where "how to read this output" lives (printed under the terminal summary).
READING_DOC = "docs/reading-output.md"
#: Longest op / range name shown in tables before it is shortened.
NAME_WIDTH = 60
#: Categories of the per-rank bars: (breakdown column, label, colour).
BAR_PARTS = (
    ("compute_ns", "compute", "#4c78a8"),
    ("comm_exposed_ns", "comm exposed", "#e45756"),
    ("memory_ns", "memory", "#72b7b2"),
    ("input_ns_part", "input", "#f2cf5b"),
    ("other_ns", "other", "#b279a2"),
    ("idle_ns_part", "idle / host", "#d8d8d8"),
)


def _disagree_hint(doc: dict[str, Any]) -> str:
    """What the clock-check disagreements mean here, and what to do about them.

    With all offsets exact (uncertainty 0: one host, one clock), a disagreement cannot be a clock
    error: it is ranks leaving the collective at different times (gloo on oversubscribed CPUs),
    which the check's "everybody ends together" assumption does not cover. Otherwise it may be
    either; where the clock cannot settle who arrived last, the analysis orders by durations.
    """
    clock = doc.get("clock") or []
    if not doc["collectives"]["clock_disagreements"]:
        return ""
    if clock and all(int(c["uncertainty_ns"]) == 0 for c in clock):
        return (
            " (every rank reads one exact clock here: these are ranks leaving a collective at "
            "different times, not clock error; nothing to do)"
        )
    return (
        " (the aligned-clock wait and the clock-free check differ by more than the clock "
        "uncertainty; where that leaves the order of arrivals open, stragglers were judged by "
        f"durations instead. Many of them: see {READING_DOC}, 'Clock check')"
    )


def _s(ns: Any) -> float:
    """ns → s, rounded to the µs."""
    return round(float(ns) / 1e9, 6)


def short_name(name: str, width: int = NAME_WIDTH, tail: int | None = None) -> str:
    """A long kernel/op name cut to ``width`` characters: its head, "…", and its last ``tail``
    characters (default: its last ``: ``/``::`` part up to half the width, else a third), because
    names that share a long prefix — ``autograd::engine::evaluate_function: AddmmBackward0`` —
    differ at the end."""
    if len(name) <= width:
        return name
    keep = width - 1
    if tail is None:
        # the last ": " / "::" part names the thing (evaluate_function: X, aten::X), up to half
        last = max(name.rfind(": ") + 2, name.rfind("::") + 2, 0)
        tail = min(len(name) - last, keep // 2) if last > 1 else keep // 3
    tail = max(0, min(keep, tail))
    return name[: keep - tail] + "…" + (name[-tail:] if tail else "")


def short_names(names: list[str], width: int = NAME_WIDTH) -> list[str]:
    """:func:`short_name` of each, keeping more of the end until shortened names are distinct."""
    keep = width - 1
    out = [short_name(n, width) for n in names]
    for tail in range(keep // 3, keep + 1):
        seen: dict[str, int] = {}
        for short in out:
            seen[short] = seen.get(short, 0) + 1
        clash = [i for i, short in enumerate(out) if seen[short] > 1 and len(names[i]) > width]
        if not clash:
            break
        for i in clash:
            out[i] = short_name(names[i], width, tail)
    return out


def _finite(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


#: Title of the what-if block (terminal, HTML report, app).
WHAT_IF_TITLE = "What if (per step, mean over profiled steps)"


def what_if_summary(table: Any) -> dict[str, Any] | None:
    """summary.json's ``what_if`` (docs/summary.md) from a what-if table
    (whatif.SCENARIO_COLUMNS); None when it is empty (the key is then left out)."""
    from rankscope.analysis.whatif import SCENARIO_KEYS, STEP_STATISTIC

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
            for r in table.itertuples(index=False)
        ],
    }


def summary(a: Analysis, found: list[Finding] | None = None) -> dict[str, Any]:
    """The summary.json document (contract: docs/summary.md).

    ``found``: :func:`findings` of ``a`` when the caller already has them (they are built once per
    rendering, so that every part of it shows the same list).
    """
    from rankscope.analysis.collectives import collective_summary

    totals = a.comm_totals.set_index("rank") if len(a.comm_totals) else None
    verdicts = a.verdicts.set_index("rank") if len(a.verdicts) else None
    ranks = []
    for r in a.whole().itertuples(index=False):
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
        for r in a.breakdown[a.breakdown["step"] >= 0].itertuples(index=False)
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
        for s in a.stragglers.itertuples(index=False)
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
        for c in a.clock.itertuples(index=False)
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
            for o in by_op.itertuples(index=False)
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
        for h in a.hta.itertuples(index=False)
    ]
    from rankscope.analysis.report_memory import memory_summary

    doc: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA,
        "version": SUMMARY_VERSION,
        "store": str(a.path),
        "run_id": str(a.meta.get("run_id", "")),
        "world_size": int(a.world_size),
        "ranks_present": len(ranks),
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
                for p in a.pipeline.itertuples(index=False)
                if p.is_bottleneck
            ],
        },
        "clock": clock,
        "collectives": colls,
        "hta": hta,
        "problems": [
            {"file": str(p.file), "rank": int(p.rank), "problem": str(p.problem)}
            for p in a.problems.itertuples(index=False)
        ],
        "findings": [f.as_json() for f in (findings(a) if found is None else found)],
    }
    memory = memory_summary(a.memory)
    if memory is not None:  # additive: absent without memory events (docs/summary.md)
        doc["memory"] = memory
    what_if = what_if_summary(getattr(a, "whatif", None))
    if what_if is not None:  # additive: absent when no replay could be built (docs/summary.md)
        doc["what_if"] = what_if
    from rankscope.analysis.kpis import kpis, to_json

    doc["kpis"] = to_json(kpis(a))  # additive: the figures `rankscope compare` compares
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
            for r in links.itertuples(index=False)
        ]
    attention = attention_summary(getattr(a, "attention", None))
    if attention:  # additive: only when the run called scaled_dot_product_attention
        doc["attention"] = attention
    return doc


def op_table_summary(table: pd.DataFrame | None) -> list[dict[str, Any]]:
    """summary.json ``op_table``: the across-ranks op table (ops.OP_TABLE_ACROSS_COLUMNS), times
    in seconds (mean per rank)."""
    if table is None or not len(table):
        return []
    out = []
    for r in table.itertuples(index=False):
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
        for r in table.itertuples(index=False)
    ]


def render_json(a: Analysis) -> str:
    """summary.json text (indented, UTF-8 safe)."""
    return json.dumps(summary(a), indent=2, ensure_ascii=False) + "\n"


# -- terminal --------------------------------------------------------------------------------


#: Verdicts as shown in the narrow terminal table ("bound by" column).
_SHORT_VERDICT = {
    "compute-bound": "compute",
    "communication-bound (wait)": "comm: wait",
    "communication-bound (transfer)": "comm: transfer",
    "input-bound": "input",
    "host-bound": "host",
    "idle": "idle",
}


#: rich style of a finding's headline in the terminal, by severity.
SEVERITY_STYLE: dict[Severity, str] = {
    Severity.PROBLEM: "bold red",
    Severity.OK: "green",
    Severity.NOTE: "yellow",
}


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole > 0 else "-"


def pipeline_lines(a: Analysis, doc: object = None) -> list[str]:
    """The pipeline findings as plain lines; nothing when the run has no send/recv ops.

    Kept for callers of the pre-findings API (``doc`` is no longer needed and is ignored);
    new code reads :func:`rankscope.analysis.findings.findings`.
    """
    return [f.text for f in pipeline_findings(findings(a))]


def finding_markup(f: Finding) -> str:
    """One finding as rich console markup: the headline coloured by severity, all text escaped
    (an input problem's message may hold brackets that rich would read as markup)."""
    from rich.markup import escape

    style = SEVERITY_STYLE[f.severity]
    return f"[{style}]{escape(f.headline)}[/{style}]{escape(f.tail)}"


#: Above this many ranks the terminal summarises per-rank tables (distribution, flagged ranks,
#: hosts) instead of listing every rank; ``--all-ranks`` and summary.json keep every row.
MANY_RANKS = 16
#: With more hosts than this, the HTML's per-host bars keep the flagged and worst hosts and add
#: up the others in one bar.
MANY_HOSTS = 16
#: Hosts kept per "worst" criterion (most exposed communication, most time).
WORST_HOSTS = 3


def print_summary(
    a: Analysis, console: Console | None = None, *, top_ops: int = 8, all_ranks: bool = False
) -> None:
    """The terminal summary: per-rank table, stragglers with evidence, memory, clocks, top ops.

    With more than :data:`MANY_RANKS` ranks (and not ``all_ranks``) the per-rank and clock tables
    are summarised so the summary fits a screen: the median, p90 and worst rank of each column,
    every flagged rank (straggler, bottleneck) and the worst rank by total time and by wait,
    one row per host when there are few hosts, and one line saying what was left out.
    """
    from rankscope.analysis.report_memory import print_memory
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    found = findings(a)
    doc = summary(a, found)
    title = f"rankscope · {a.path} · {doc['ranks_present']} of {a.world_size} rank(s)"
    show_host = len({r["host"] for r in doc["ranks"]}) > 1
    show_mem = any(r["memory_s"] >= 0.01 * r["total_s"] for r in doc["ranks"])
    cols = [
        "rank",
        *(["host"] if show_host else []),
        "total ms",
        "comp",
        "comm",
        "wait ms",
        "xfer ms",
        *(["mem"] if show_mem else []),
        "input",
        "idle",
        "bound by",
    ]
    t = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for col in cols:
        t.add_column(
            col,
            justify="left" if col in ("host", "bound by") else "right",
            no_wrap=True,
            min_width=len(col),
        )

    def cells_of(r: dict[str, Any], label: str | None = None) -> list[str]:
        tot = r["total_s"]
        cells = {
            "rank": label if label is not None else str(r["rank"]),
            "host": r["host"],
            "total ms": f"{tot * 1e3:.1f}",
            "comp": _pct(r["compute_s"], tot),
            "comm": _pct(r["comm_exposed_s"], tot),
            "wait ms": f"{r['comm_wait_s'] * 1e3:.1f}",
            "xfer ms": f"{r['comm_transfer_s'] * 1e3:.1f}",
            "mem": _pct(r["memory_s"], tot),
            "input": _pct(r["input_s"], tot),
            "idle": _pct(r["idle_s"], tot),
            "bound by": _SHORT_VERDICT.get(r["verdict"], r["verdict"]),
        }
        return [cells[c] for c in cols]

    rank_rows = doc["ranks"]
    many = len(rank_rows) > MANY_RANKS and not all_ranks
    if not many:
        for r in rank_rows:
            t.add_row(*cells_of(r))
    else:
        for label, r in many_rank_rows(rank_rows, a.flagged_ranks()):
            t.add_row(*cells_of(r, label), style="red" if label.endswith("flagged") else None)
    console.print(t)
    if many:
        console.print(
            f"[dim]{len(rank_rows)} ranks: the median, p90 and max of each column over all "
            "ranks (each column on its own: not one rank), then the flagged ranks and the "
            "ranks with the most total time and the most wait; --all-ranks lists every rank, "
            "summary.json holds them all.[/dim]"
        )
    console.print(
        "[dim]total: the rank's profiled steps; comp/comm/mem/input/idle: shares of it (comm = "
        "exposed communication); wait/xfer ms: time in it with a collective in flight, waiting "
        "for a later rank / moving data (each instant once). How to read this: "
        f"{READING_DOC}[/dim]"
    )
    if doc["stragglers"]:
        st = Table(
            title="Stragglers (most significant first)",
            title_justify="left",
            header_style="bold red",
            box=box.SIMPLE_HEAD,
        )
        for col in ("rank", "last", "p-value", "confidence", "wait caused s", "share", "cause"):
            st.add_column(col, justify="left" if col == "cause" else "right", no_wrap=True)
        for s in doc["stragglers"]:
            st.add_row(
                str(s["rank"]),
                f"{s['times_last']}/{s['collectives']}",
                f"{s['p_value']:.2g}",
                f"{s['confidence']:.3f}",
                f"{s['wait_caused_s']:.4f}",
                f"{s['wait_share']:.0%}",
                s["cause"],
            )
        console.print(st)
    # the stragglers' evidence (or "no straggler") and the pipeline finding under the table,
    # each flagged rank's what-if line under it, then the what-if block; input problems close
    # the summary
    for f in found:
        if f.kind == FindingKind.WHAT_IF:
            if f.rank is not None:
                console.print("  " + finding_markup(f))
        elif f.kind != FindingKind.INPUT_PROBLEMS and f.kind not in MEMORY_KINDS:
            console.print(finding_markup(f))
    print_what_if(found, console)
    print_memory(a.memory, found, console, finding_markup)
    print_attention(getattr(a, "attention", None), console)
    if doc["clock"] and len(doc["clock"]) > MANY_RANKS and not all_ranks:
        console.print(clock_digest(doc["clock"]))
    elif doc["clock"]:
        ct = Table(
            title="Clock alignment", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD
        )
        for col in ("rank", "host", "offset ms", "± µs", "method"):
            ct.add_column(col, justify="left" if col in ("host", "method") else "right")
        for c in doc["clock"]:
            ct.add_row(
                str(c["rank"]),
                c["host"],
                f"{c['offset_ns'] / 1e6:+.3f}",
                f"{c['uncertainty_ns'] / 1e3:.1f}",
                c["method"],
            )
        console.print(ct)
    c = doc["collectives"]
    if c["count"]:
        console.print(
            f"Collectives: {c['count']}; summed over their {c['rank_rows']} (collective, rank) "
            f"rows (rank-time, concurrent ones each count): {c['total_s']:.4f} s = wait "
            f"{c['wait_s']:.4f} s + transfer {c['transfer_s']:.4f} s; "
            f"{c['clock_disagreements']} of the rows fail the clock check{_disagree_hint(doc)}."
        )
    if len(a.ops) and top_ops:
        ot = Table(
            title=f"Top {top_ops} ops across ranks (ms per rank while the op ran: its calls' "
            "union, children included)",
            title_justify="left",
            header_style="bold",
            box=box.SIMPLE_HEAD,
        )
        for col in ("name", "calls", "mean ms", "min ms", "max ms", "spread", "slowest"):
            ot.add_column(
                col, justify="left" if col == "name" else "right", no_wrap=True, min_width=len(col)
            )
        top = a.ops.head(top_ops)
        for name, o in zip(
            short_names([str(n) for n in top["name"]], 38), top.itertuples(index=False), strict=True
        ):
            ot.add_row(
                name,
                f"{o.count_mean:.0f}",
                f"{o.wall_mean_ns / 1e6:.3f}",
                f"{o.wall_min_ns / 1e6:.3f}",
                f"{o.wall_max_ns / 1e6:.3f}",
                f"{o.spread:.0%}",
                str(o.slowest_rank),
            )
        console.print(ot)
    for f in found:
        if f.kind == FindingKind.INPUT_PROBLEMS:
            console.print(finding_markup(f))


_SUMMED_COLUMNS = (
    "total_s",
    "compute_s",
    "comm_exposed_s",
    "comm_overlapped_s",
    "comm_wait_s",
    "comm_transfer_s",
    "memory_s",
    "input_s",
    "idle_s",
)


def many_rank_rows(
    ranks: list[dict[str, Any]], flagged: list[int]
) -> list[tuple[str, dict[str, Any]]]:
    """The rows of a summarised per-rank table: (label, row) for the median, p90 and max of every
    column (each over all ranks, separately), then each flagged rank and the ranks with the most
    total time and the most wait (each once). Aggregate, not drop: every rank counts in the first
    three rows."""
    import numpy as np

    def stat_row(label: str, q: float) -> tuple[str, dict[str, Any]]:
        row: dict[str, Any] = {"rank": -1, "host": ""}
        for key in _SUMMED_COLUMNS:
            row[key] = float(np.quantile([r[key] for r in ranks], q))
        verdicts = [r["verdict"] for r in ranks]
        row["verdict"] = max(set(verdicts), key=verdicts.count) if q == 0.5 else ""
        return label, row

    out = [stat_row("median", 0.5), stat_row("p90", 0.9), stat_row("max", 1.0)]
    by_rank = {int(r["rank"]): r for r in ranks}
    shown: list[int] = []
    for rank in flagged:
        if rank in by_rank and rank not in shown:
            shown.append(rank)
            out.append((f"{rank} flagged", by_rank[rank]))
    for key, what in (("total_s", "most time"), ("comm_wait_s", "most wait")):
        worst = max(ranks, key=lambda r: r[key])
        if int(worst["rank"]) not in shown:
            shown.append(int(worst["rank"]))
            out.append((f"{worst['rank']} {what}", worst))
    return out


def clock_digest(clock: list[dict[str, Any]]) -> str:
    """One paragraph for many ranks' clocks: hosts, methods, offset range, worst uncertainty."""
    from collections import Counter

    hosts = len({c["host"] for c in clock})
    methods = Counter(str(c["method"]) for c in clock)
    offsets = [c["offset_ns"] / 1e6 for c in clock]
    worst = max(clock, key=lambda c: c["uncertainty_ns"])
    method_text = ", ".join(f"{m} {n}" for m, n in methods.most_common())
    return (
        f"Clock alignment: {len(clock)} ranks on {hosts} host(s); methods: {method_text}; "
        f"offsets {min(offsets):+.3f} … {max(offsets):+.3f} ms; largest uncertainty "
        f"±{worst['uncertainty_ns'] / 1e3:.1f} µs (rank {worst['rank']}, {worst['host']}). "
        "--all-ranks lists every rank."
    )


def print_attention(table: pd.DataFrame | None, console: Console) -> None:
    """SDPA time per rank and backend (forward / backward), when the run called attention."""
    from rich import box
    from rich.table import Table

    if table is None or not len(table):
        return
    t = Table(
        title="Attention (scaled_dot_product_attention, per rank and backend)",
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
    )
    for col in ("rank", "backend", "pass", "calls", "total ms", "ms per call", "share"):
        t.add_column(col, justify="left" if col in ("backend", "pass") else "right")
    for r in table.itertuples(index=False):
        t.add_row(
            str(r.rank),
            str(r.backend),
            "backward" if r.backward else "forward",
            str(r.calls),
            f"{r.total_ns / 1e6:.3f}",
            f"{r.mean_ns / 1e6:.3f}",
            f"{r.share:.0%}",
            style="red" if "math" in str(r.backend) else None,
        )
    console.print(t)


def print_what_if(found: list[Finding], console: Console) -> None:
    """The job-wide what-if findings as an aligned block under :data:`WHAT_IF_TITLE`; nothing
    when the analysis has none (one rank, no steps or no collectives)."""
    from rich.markup import escape

    rows = job_what_if(found)
    if not rows:
        return
    console.print(f"[bold]{WHAT_IF_TITLE}[/bold]")
    width = max(len(f.headline) for f in rows) + 1
    for f in rows:
        console.print(f"  {escape(f.headline + ':'):<{width}}  {escape(f.evidence)}")


# -- HTML ------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2430;margin:0;background:#f5f6f8}
header{background:#1f2430;color:#fff;padding:18px 32px}header h1{margin:0;font-size:22px}
header .sub{color:#aab;font-size:13px;margin-top:4px}
main{padding:20px 32px;max-width:1320px}
.scroll{overflow-x:auto}svg{max-width:100%;height:auto}
section{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);padding:16px 20px;margin:0 0 18px}
h2{font-size:17px;margin:0 0 10px}
.cards{display:flex;gap:14px;flex-wrap:wrap;margin-bottom:18px}
.card{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);padding:12px 18px;min-width:150px}
.card .v{font-size:22px;font-weight:600}.card .k{color:#667;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card.bad .v{color:#c0392b}.card.good .v{color:#1e8449}tr.bad td{color:#c0392b}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:5px 7px;border-bottom:1px solid #eceef2;text-align:right;white-space:nowrap}
th{background:#fafbfc;color:#445;font-weight:600}
td.l,th.l{text-align:left}td.wrap{white-space:normal;min-width:280px}td.name{max-width:420px;overflow:hidden;text-overflow:ellipsis}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.verdict{font-weight:600}.muted{color:#778}
.note{color:#556;font-size:12px;margin-top:8px}
img.overview{display:block;max-width:100%;image-rendering:pixelated;border:1px solid #ccc}
.legend{font-size:12px;margin-top:6px}.legend .sw{display:inline-block;width:10px;height:10px;border:1px solid #999;margin:0 4px 0 10px;vertical-align:middle}
.finding.sev-problem b{color:#c0392b}.finding.sev-ok b{color:#1e8449}.finding.sev-note b{color:#9a7d0a}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _bars_svg(a: Analysis, *, by_host: bool = False) -> str:
    """Horizontal stacked bar per rank: share of its profiled time per category.

    ``by_host``: one bar per host instead, each category added up over the host's ranks (many
    ranks: every rank's time is in a bar, none is dropped)."""
    w = a.whole()
    if len(w) == 0:
        return "<p class='muted'>No profiled time.</p>"
    if by_host:
        w = _host_rows(a, w)
        if len(w) > MANY_HOSTS:
            w = _few_host_rows(a, w)
    width, label_w, row_h = 900, 210 if by_host else 70, 26
    bar_w = width - label_w - 90
    height = row_h * len(w) + 24
    parts = [
        f"<svg width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img' aria-label='time per rank'>"
    ]
    for i, r in enumerate(w.itertuples(index=False)):
        y = 4 + i * row_h
        total = max(float(r.total_ns), 1.0)
        values = {
            "compute_ns": r.compute_ns,
            "comm_exposed_ns": r.comm_exposed_ns,
            "memory_ns": r.memory_ns,
            "input_ns_part": r.input_ns if r.device == "cpu" else 0,
            "other_ns": r.other_ns,
            "idle_ns_part": r.idle_ns,
        }
        who = str(r.label) if by_host else f"rank {int(r.rank)}"
        parts.append(
            f"<text x='{label_w - 8}' y='{y + 15}' text-anchor='end' font-size='12'>{_e(who)}</text>"
        )
        x = float(label_w)
        for key, label, colour in BAR_PARTS:
            frac = float(values[key]) / total
            if frac <= 0:
                continue
            wd = frac * bar_w
            parts.append(
                f"<rect x='{x:.2f}' y='{y}' width='{wd:.2f}' height='{row_h - 8}' fill='{colour}'>"
                f"<title>{_e(who)} {label}: {float(values[key]) / 1e6:.3f} ms ({frac:.1%})</title></rect>"
            )
            x += wd
        parts.append(
            f"<text x='{label_w + bar_w + 6}' y='{y + 15}' font-size='12' fill='#556'>{total / 1e6:.1f} ms</text>"
        )
    parts.append("</svg>")
    legend = "".join(
        f"<span><i style='background:{c}'></i>{_e(lbl)}</span>" for _, lbl, c in BAR_PARTS
    )
    return f"<div class='legend'>{legend}</div>" + "".join(parts)


def _host_rows(a: Analysis, whole: pd.DataFrame) -> pd.DataFrame:
    """The whole-run breakdown rows added up per host (``label``: host and its rank count)."""
    w = whole.copy()
    w["host"] = [a.hosts.get(int(r), "?") for r in w["rank"]]
    numeric = [c for c in w.columns if c.endswith("_ns")]
    g = w.groupby("host", sort=True)
    out = g[numeric].sum()
    out["device"] = g["device"].first()
    out["rank"] = g["rank"].min()
    out["label"] = [f"{h} ({n})" for h, n in g.size().items()]
    return out.reset_index()


def _few_host_rows(a: Analysis, hosts: pd.DataFrame) -> pd.DataFrame:
    """Many hosts: the hosts of the flagged ranks, the ``WORST_HOSTS`` with the most exposed
    communication and with the most time, then every other host added up in one row (each
    rank's time is still in exactly one bar)."""
    import pandas as pd

    flagged_hosts = {a.hosts.get(int(r), "?") for r in a.flagged_ranks()}
    share = hosts["comm_exposed_ns"] / hosts["total_ns"].clip(lower=1)
    keep = set(hosts.loc[hosts["host"].isin(flagged_hosts), "host"])
    keep |= set(hosts.loc[share.nlargest(WORST_HOSTS).index, "host"])
    keep |= set(hosts.loc[hosts["total_ns"].nlargest(WORST_HOSTS).index, "host"])
    shown = hosts[hosts["host"].isin(keep)].copy()
    shown["label"] = [
        ("⚑ " if h in flagged_hosts else "") + str(lbl)
        for h, lbl in zip(shown["host"], shown["label"], strict=True)
    ]
    rest = hosts[~hosts["host"].isin(keep)]
    if len(rest):
        numeric = [c for c in hosts.columns if c.endswith("_ns")]
        row = rest[numeric].sum().to_dict()
        n_ranks = sum(1 for r in a.whole()["rank"] if a.hosts.get(int(r), "?") not in keep)
        row.update(
            host="",
            device=rest["device"].iloc[0],
            rank=int(rest["rank"].min()),
            label=f"the other {len(rest)} hosts ({n_ranks} ranks)",
        )
        shown = pd.concat([shown, pd.DataFrame([row])], ignore_index=True)
    return shown


def shown_ranks(a: Analysis, doc: dict[str, Any]) -> set[int]:
    """The ranks a summarised report lists by name: flagged ranks and the worst by total time
    and by wait (the rows of :func:`many_rank_rows` that are ranks)."""
    return {
        int(r["rank"])
        for label, r in many_rank_rows(doc["ranks"], a.flagged_ranks())
        if int(r["rank"]) >= 0
    }


def _lateness_svg(a: Analysis, *, summarise: bool = False) -> str:
    """Arrival lateness (ms after the first rank) per collective, one dot per rank.

    ``summarise`` (many ranks): per collective a line over every rank's lateness (first to last
    arrival), a tick at the median, and dots only for the last rank and the flagged ranks — one
    dot per (collective, rank) was 400 × 1,024 circles, a 65 MB report."""
    wt = a.waits[a.waits["n_ranks"] >= 2] if len(a.waits) else a.waits
    if len(wt) == 0:
        return "<p class='muted'>No collective with two or more ranks.</p>"
    colls = sorted(wt["coll"].unique())[:400]
    wt = wt[wt["coll"].isin(colls)]
    ranks = sorted(wt["rank"].unique())
    palette = [
        "#4c78a8",
        "#f58518",
        "#54a24b",
        "#e45756",
        "#72b7b2",
        "#b279a2",
        "#ff9da6",
        "#9d755d",
        "#bab0ac",
        "#eeca3b",
    ]
    width, height, left, bottom, top = 900, 260, 56, 30, 10
    max_late = max(float(wt["lateness_ns"].max()) / 1e6, 1e-3)
    xs = {c: left + (i + 0.5) * (width - left - 10) / len(colls) for i, c in enumerate(colls)}

    def ypos(ms: float) -> float:
        return top + (height - top - bottom) * (1 - ms / max_late)

    out = [
        f"<svg width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img' aria-label='lateness per collective'>"
    ]
    for k in range(5):
        ms = max_late * k / 4
        y = ypos(ms)
        out.append(
            f"<line x1='{left}' x2='{width - 10}' y1='{y:.1f}' y2='{y:.1f}' stroke='#eceef2'/>"
        )
        out.append(
            f"<text x='{left - 6}' y='{y + 4:.1f}' text-anchor='end' font-size='11' fill='#667'>{ms:.2f}</text>"
        )
    out.append(
        f"<text x='12' y='{top + 10}' font-size='11' fill='#667' transform='rotate(-90 12 {top + 10})' text-anchor='end'>ms late</text>"
    )
    out.append(
        f"<text x='{(width + left) / 2:.0f}' y='{height - 8}' text-anchor='middle' font-size='11' fill='#667'>collective (in order)</text>"
    )
    if summarise:
        return _lateness_summary_svg(a, wt, colls, xs, ypos, out, width)
    colour_of = {rk: palette[i % len(palette)] for i, rk in enumerate(ranks)}
    for r in wt.itertuples(index=False):
        colour = colour_of[r.rank]
        ms = float(r.lateness_ns) / 1e6
        out.append(
            f"<circle cx='{xs[r.coll]:.1f}' cy='{ypos(ms):.1f}' r='{4 if r.is_last else 3}' fill='{colour}' "
            f"fill-opacity='{0.95 if r.is_last else 0.55}'><title>collective {int(r.coll)} ({_e(r.op)}), rank {int(r.rank)}: "
            f"{ms:.3f} ms late, waited {r.wait_ns / 1e6:.3f} ms</title></circle>"
        )
    out.append("</svg>")
    legend = "".join(
        f"<span><i style='background:{palette[i % len(palette)]}'></i>rank {int(rk)}</span>"
        for i, rk in enumerate(ranks[:32])
    )
    return f"<div class='legend'>{legend}</div>" + "".join(out)


#: Colours of the flagged ranks' dots in the summarised lateness plot (then grey).
FLAG_COLOURS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b")


def _lateness_summary_svg(
    a: Analysis,
    wt: pd.DataFrame,
    colls: list[Any],
    xs: dict[Any, float],
    ypos: Any,
    out: list[str],
    width: int,
) -> str:
    """The many-rank form of :func:`_lateness_svg` (``out``: its axes, already drawn)."""
    flagged = a.flagged_ranks()[: len(FLAG_COLOURS)]
    colour_of = dict(zip(flagged, FLAG_COLOURS, strict=False))
    g = wt.groupby("coll")["lateness_ns"]
    lo, med, hi = g.min() / 1e6, g.median() / 1e6, g.max() / 1e6
    n = wt.groupby("coll")["rank"].nunique()
    for c in colls:
        x = xs[c]
        out.append(
            f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{ypos(lo[c]):.1f}' y2='{ypos(hi[c]):.1f}' stroke='#9aa3b2' stroke-width='2'>"
            f"<title>collective {int(c)}: {int(n[c])} ranks arrived over {hi[c] - lo[c]:.3f} ms (median {med[c]:.3f} ms late)</title></line>"
        )
        out.append(
            f"<line x1='{x - 3:.1f}' x2='{x + 3:.1f}' y1='{ypos(med[c]):.1f}' y2='{ypos(med[c]):.1f}' stroke='#334'/>"
        )
    shown = wt[wt["is_last"] | wt["rank"].isin(flagged)]
    for r in shown.itertuples(index=False):
        colour = colour_of.get(int(r.rank), "#556")
        ms = float(r.lateness_ns) / 1e6
        out.append(
            f"<circle cx='{xs[r.coll]:.1f}' cy='{ypos(ms):.1f}' r='{4 if r.is_last else 3}' fill='{colour}' "
            f"fill-opacity='{0.95 if r.is_last else 0.6}'><title>collective {int(r.coll)} ({_e(r.op)}), rank {int(r.rank)}: "
            f"{ms:.3f} ms late{' (last)' if r.is_last else ''}, waited {r.wait_ns / 1e6:.3f} ms</title></circle>"
        )
    out.append("</svg>")
    legend = "<span><i style='background:#9aa3b2'></i>every rank: first to last arrival (tick: median)</span>"
    legend += "".join(
        f"<span><i style='background:{colour_of[rk]}'></i>rank {int(rk)} (flagged)</span>"
        for rk in flagged
    )
    legend += "<span><i style='background:#556'></i>the last rank (other ranks)</span>"
    return f"<div class='legend'>{legend}</div>" + "".join(out)


def _steps_html(a: Analysis, max_steps: int = 40, ranks: set[int] | None = None) -> str:
    """Step time per rank and step (ms), each cell shaded by its exposed-communication share.

    ``ranks``: list only these ranks, after two rows that aggregate every rank per step (the
    median and the max step time) — many ranks are summarised, not dropped."""
    st = a.breakdown[a.breakdown["step"] >= 0]
    if len(st) == 0:
        return "<p class='muted'>No ProfilerStep recorded.</p>"
    steps = sorted(st["step"].unique())[:max_steps]
    agg_rows = ""
    if ranks is not None:
        per_step = st.groupby("step")["total_ns"]
        med, mx = per_step.median(), per_step.max()
        agg_rows = "".join(
            f"<tr><th class='l'>{label} of {st['rank'].nunique()} ranks</th>"
            + "".join(f"<td>{float(series.get(s, float('nan'))) / 1e6:.1f}</td>" for s in steps)
            + "</tr>"
            for label, series in (("median", med), ("max", mx))
        )
    ranks_listed = sorted(st["rank"].unique())
    if ranks is not None:
        ranks_listed = [r for r in ranks_listed if int(r) in ranks]
    cell = {(int(r.rank), int(r.step)): r for r in st.itertuples(index=False)}
    head = "".join(f"<th>{int(s)}</th>" for s in steps)
    rows = [agg_rows] if agg_rows else []
    for rank in ranks_listed:
        tds = []
        for step in steps:
            r = cell.get((int(rank), int(step)))
            if r is None:
                tds.append("<td class='muted'>–</td>")
                continue
            share = r.comm_exposed_ns / r.total_ns if r.total_ns > 0 else 0.0
            tip = (
                f"rank {int(rank)} step {int(step)}: {r.total_ns / 1e6:.2f} ms, compute "
                f"{r.compute_ns / 1e6:.2f} ms, exposed comm {r.comm_exposed_ns / 1e6:.2f} ms, "
                f"input {r.input_ns / 1e6:.2f} ms, idle {r.idle_ns / 1e6:.2f} ms"
            )
            tds.append(
                f"<td title='{_e(tip)}' style='background:rgba(228,87,86,{0.08 + 0.6 * share:.2f})'>"
                f"{r.total_ns / 1e6:.1f}</td>"
            )
        rows.append(f"<tr><th class='l'>rank {int(rank)}</th>{''.join(tds)}</tr>")
    return (
        f"<div class='scroll'><table><thead><tr><th class='l'>ms per step</th>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
        "<p class='note'>Shade: share of the step spent in exposed communication (darker = more "
        "waiting or transferring with nothing to hide it). Hover a cell for the breakdown.</p>"
    )


def _table(
    headers: list[str],
    rows: list[list[Any]],
    left: set[int] | None = None,
    wrap: set[int] | None = None,
) -> str:
    left, wrap = left or set(), wrap or set()

    def cls(i: int) -> str:
        return " ".join(c for c, on in (("l", i in left), ("wrap", i in wrap)) if on)

    th = "".join(f"<th class='{cls(i)}'>{_e(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f"<td class='{cls(i)}'>{_e(v)}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<div class='scroll'><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>"


def _across_rows(table: Any, *, with_kind: bool) -> list[list[Any]]:
    """HTML table rows of ``ops.across_ranks`` (ops with their kind, ranges without)."""
    names = short_names([str(n) for n in table["name"]])
    return [
        [
            name,
            *([o.kind] if with_kind else []),
            o.ranks,
            f"{o.count_mean:.1f}",
            f"{o.wall_mean_ns / 1e6:.3f}",
            f"{o.wall_min_ns / 1e6:.3f}",
            f"{o.wall_max_ns / 1e6:.3f}",
            f"{o.spread:.0%}",
            o.fastest_rank,
            o.slowest_rank,
        ]
        for name, o in zip(names, table.itertuples(index=False), strict=True)
    ]


def _finding_html(f: Finding, cls: str = "") -> str:
    """One finding as a paragraph: the headline in bold (coloured by severity), escaped text."""
    classes = " ".join(c for c in ("finding", f"sev-{f.severity}", cls) if c)
    return f"<p class='{classes}'><b>{_e(f.headline)}</b>{_e(f.tail)}</p>"


def _with_their_what_if(found: list[Finding], kinds: set[FindingKind]) -> list[Finding]:
    """The findings of ``kinds``, each followed by its rank's what-if finding (the order of
    :func:`findings` puts it right after)."""
    out: list[Finding] = []
    keep = False
    for f in found:
        if f.kind in kinds:
            out.append(f)
            keep = True
        elif f.kind == FindingKind.WHAT_IF and f.rank is not None and keep:
            out.append(f)
        else:
            keep = False
    return out


def _attention_html(doc: dict[str, Any], found: list[Finding]) -> str:
    """SDPA time per rank and backend and the math-fallback findings; nothing without SDPA."""
    rows = doc.get("attention") or []
    if not rows:
        return ""
    table = _table(
        ["rank", "backend", "pass", "calls", "total ms", "ms per call", "share"],
        [
            [
                r["rank"],
                r["backend"],
                "backward" if r["backward"] else "forward",
                r["calls"],
                f"{r['total_s'] * 1e3:.3f}",
                f"{r['mean_s'] * 1e3:.3f}",
                f"{r['share']:.0%}",
            ]
            for r in rows
        ],
        {1, 2},
    )
    notes = "".join(_finding_html(f) for f in found if f.kind == FindingKind.SDPA_MATH_FALLBACK)
    return (
        "<section><h2>Attention (scaled_dot_product_attention)</h2>"
        f"{table}{notes}<p class='note'>Which implementation ran each call, from its op and "
        "kernel names (docs/analysis.md section 8); the math fallback runs unfused.</p></section>"
    )


def _op_table_html(doc: dict[str, Any]) -> str:
    """The key_averages()-grade op table across ranks (summary.json ``op_table``)."""
    rows = doc.get("op_table") or []
    if not rows:
        return ""
    names = short_names([str(r["name"]) for r in rows])
    table = _table(
        ["op", "input shapes", "calls", "self CPU ms", "CPU total ms", "self device ms",
         "device total ms", "spread", "slowest"],
        [
            [
                name,
                r["shapes"] or "",
                f"{r['calls_mean']:.1f}",
                f"{r['self_cpu_s'] * 1e3:.3f}",
                f"{r['cpu_total_s'] * 1e3:.3f}",
                f"{r['self_device_s'] * 1e3:.3f}",
                f"{r['device_total_s'] * 1e3:.3f}",
                "" if r["spread"] is None else f"{r['spread']:.0%}",
                r["slowest_rank"],
            ]
            for name, r in zip(names, rows, strict=True)
        ],
        {0, 1},
        {1},
    )  # fmt: skip
    return (
        "<section><h2>Op table (like key_averages(), mean per rank)</h2>"
        f"{table}<p class='note'>Self time: the op minus its direct children on its thread; "
        "total: with them; device time: the kernels and copies it launched (correlation ids). "
        "Sorted by self device time on GPU runs, else self CPU time; the spread is of that time "
        "across ranks.</p></section>"
    )


def _what_if_html(found: list[Finding]) -> str:
    """The what-if section: one row per scenario (the rank fixes first), its step time before →
    after and a bar of the saving (share of the step); nothing without what-if findings."""
    rows = [f for f in found if f.kind == FindingKind.WHAT_IF]
    if not rows:
        return ""
    body = []
    for f in rows:
        share = max(0.0, min(1.0, float(f.figures.get("saving_share", 0.0))))
        bar = (
            f"<div style='background:#eceef2;width:240px;height:12px;border-radius:2px'>"
            f"<div style='background:#e45756;width:{share * 240:.1f}px;height:12px;"
            f"border-radius:2px' title='{share:.1%} of the step'></div></div>"
        )
        body.append(
            f"<tr><td class='l'>{_e(f.headline)}</td><td class='l'>{_e(f.evidence)}</td>"
            f"<td class='l'>{bar}</td></tr>"
        )
    return (
        f"<section><h2>{_e(WHAT_IF_TITLE)}</h2><div class='scroll'><table><thead><tr>"
        "<th class='l'>scenario</th><th class='l'>step time, measured → predicted</th>"
        "<th class='l'>saving</th></tr></thead><tbody>"
        + "".join(body)
        + "</tbody></table></div><p class='note'>A replay of the profiled steps as a dependency "
        "graph (own work, collectives as barriers with their measured transfer) with the slow "
        "parts made normal; the median rank is that of the other ranks at the same point of the "
        f"step. Model, assumptions and where it is wrong: docs/analysis.md, section 7. How to "
        f"read it: {READING_DOC}.</p></section>"
    )


def render_html(a: Analysis, *, all_ranks: bool = False) -> str:
    """The self-contained HTML report (inline CSS and SVG; opens offline).

    With more than :data:`MANY_RANKS` ranks (and not ``all_ranks``) the per-rank parts are
    summarised as in the terminal: the distribution over all ranks, the flagged ranks and the
    worst ones, hosts as aggregated bars (:func:`shown_ranks`); summary.json keeps every rank.
    """
    from rankscope.analysis.report_memory import memory_html
    from rankscope.analysis.report_overview import overview_html

    found = findings(a)
    doc = summary(a, found)
    strag = doc["stragglers"]
    cards = [
        ("ranks", f"{doc['ranks_present']} / {a.world_size}", ""),
        ("collectives", str(doc["collectives"]["count"]), ""),
        (
            "waiting, all ranks",
            f"{sum(r['comm_wait_s'] for r in doc['ranks']):.3f} s",
            "",
        ),
        (
            "straggler",
            ", ".join(f"rank {s['rank']}" for s in strag) if strag else "none",
            "bad" if strag else "good",
        ),
    ]
    card_html = "".join(
        f"<div class='card {cls}'><div class='k'>{_e(k)}</div><div class='v'>{_e(v)}</div></div>"
        for k, v, cls in cards
    )
    many = len(doc["ranks"]) > MANY_RANKS and not all_ranks
    labelled = (
        many_rank_rows(doc["ranks"], a.flagged_ranks())
        if many
        else [(str(r["rank"]), r) for r in doc["ranks"]]
    )
    shown = shown_ranks(a, doc) if many else None
    rank_rows = [
        [
            label,
            r["host"],
            r.get("device", ""),
            f"{r['total_s']:.4f}",
            f"{r['compute_s']:.4f}",
            f"{r['comm_exposed_s']:.4f}",
            f"{r['comm_overlapped_s']:.4f}",
            f"{r['comm_wait_s']:.4f}",
            f"{r['comm_transfer_s']:.4f}",
            f"{r['memory_s']:.4f}",
            f"{r['input_s']:.4f}",
            f"{r['idle_s']:.4f}",
            r["verdict"],
        ]
        for label, r in labelled
    ]
    ranks_table = _table(
        [
            "rank",
            "host",
            "device",
            "total s",
            "compute s",
            "comm exposed s",
            "comm overlapped s",
            "wait s",
            "transfer s",
            "memory s",
            "input s",
            "idle s",
            "verdict",
        ],
        rank_rows,
        {1, 2, 12},
    )
    reasons = "".join(
        f"<li><b>rank {r['rank']}</b>: <span class='verdict'>{_e(r['verdict'])}</span> — {_e(r['verdict_reason'])}</li>"
        for r in doc["ranks"]
        if shown is None or int(r["rank"]) in shown
    )
    if many:
        reasons += (
            f"<li class='muted'>{len(doc['ranks'])} ranks: the table gives the median, p90 and max "
            "of every column over all ranks (each column on its own), then the flagged ranks and "
            "the worst by time and by wait; the bars show each host's ranks added up. "
            "<code>rankscope analyze RUN --html FILE --all-ranks</code> lists every rank; "
            "summary.json holds them all.</li>"
        )
    # the figures of each straggler in a table, then every straggler finding (or "no
    # straggler") as the terminal prints it
    strag_html = "".join(
        _finding_html(f, "whatif" if f.kind == FindingKind.WHAT_IF else "")
        for f in _with_their_what_if(
            found,
            {
                FindingKind.STRAGGLER,
                FindingKind.NO_STRAGGLER,
                FindingKind.STAGE_IMBALANCE,
                FindingKind.DATA_IMBALANCE,
                FindingKind.SLOW_LINK,
            },
        )
    )
    if strag:
        st_rows = [
            [
                s["rank"],
                f"{s['times_last']} / {s['collectives']}",
                f"{s['p_value']:.2g}",
                f"{s['confidence']:.3f}",
                f"{s['wait_caused_s']:.4f}",
                f"{s['wait_share']:.0%}",
                s["cause"],
            ]
            for s in strag
        ]
        header = ["rank", "last", "p-value", "confidence", "wait caused s", "share of wait"]
        strag_html = _table([*header, "cause"], st_rows, {6}) + strag_html
    pipe_html = "".join(
        _finding_html(f, "whatif" if f.kind == FindingKind.WHAT_IF else "note")
        for f in _with_their_what_if(found, set(PIPELINE_KINDS))
    )
    input_html = "".join(
        _finding_html(f, "note") for f in found if f.kind == FindingKind.INPUT_PROBLEMS
    )
    strag_rows = [
        [
            int(s.rank),
            f"{int(s.times_last)} / {int(s.collectives)}",
            f"{s.expected_last:.1f}",
            f"{s.p_value:.2g}",
            f"{s.wait_caused_s:.4f}",
            f"{s.wait_share:.0%}",
            s.cause,
        ]
        for s in a.stragglers.itertuples(index=False)
        if shown is None or int(s.rank) in shown
    ]
    clock_rows = [
        [
            c["rank"],
            c["host"],
            f"{c['offset_ns'] / 1e6:+.3f}",
            f"{c['uncertainty_ns'] / 1e3:.1f}",
            c["method"],
        ]
        for c in (
            sorted(doc["clock"], key=lambda c: -c["uncertainty_ns"])[:MANY_RANKS]
            if many
            else doc["clock"]
        )
    ]
    clock_note = (
        f"<p class='note'>{_e(clock_digest(doc['clock']))} The table lists the {MANY_RANKS} least certain.</p>"
        if many and doc["clock"]
        else ""
    )
    op_rows = _across_rows(a.ops, with_kind=True)
    ann_rows = _across_rows(a.annotations, with_kind=False)
    hta_html = ""
    if doc["hta"]:
        hta_html = (
            "<section><h2>GPU temporal breakdown (HTA definitions, µs)</h2>"
            + _table(
                ["rank", "idle", "compute", "non-compute", "kernel time", "comm/compute overlap %"],
                [
                    [
                        h["rank"],
                        h["idle_us"],
                        h["compute_us"],
                        h["non_compute_us"],
                        h["kernel_time_us"],
                        h["overlap_pct"],
                    ]
                    for h in doc["hta"]
                ],
            )
            + "</section>"
        )
    colls = doc["collectives"]
    coll_rows = [
        [
            o["op"],
            o["count"],
            o["bytes"],
            f"{o['total_s']:.4f}",
            f"{o['wait_s']:.4f}",
            f"{o['transfer_s']:.4f}",
        ]
        for o in colls["by_op"]
    ]
    body = f"""
<header><h1>rankscope report</h1><div class='sub'>{_e(a.path)} · run {_e(doc["run_id"] or "-")} · world size {a.world_size}</div></header>
<main>
<div class='cards'>{card_html}</div>{input_html}
<section><h2>Where the time went, per rank</h2>{_bars_svg(a, by_host=many)}{ranks_table}<ul>{reasons}</ul>
<p class='note'>Every figure is a part of the rank's profiled time (total s). Wait and transfer: time with a collective in flight, waiting until the last rank arrives (aligned clock) / moving data; each instant counts once, however many collectives are in flight. Comm exposed: communication with nothing hiding it. How to read this report: {READING_DOC}.</p></section>
{overview_html(a)}
<section><h2>Stragglers</h2>{strag_html}{pipe_html}</section>
{_what_if_html(found)}
{memory_html(a.memory, found, _finding_html)}
{_attention_html(doc, found)}
{_op_table_html(doc)}
<section><h2>Steps</h2>{_steps_html(a, ranks=shown)}</section>
<section><h2>Arrival lateness per collective</h2>{_lateness_svg(a, summarise=many)}
<p class='note'>Each dot is a rank arriving at a collective, in ms after the first rank; the last rank of each collective is drawn solid.</p>
{_table(["rank", "last", "expected by chance", "p-value", "wait caused s", "share", "cause"], strag_rows, {6})}</section>
<section><h2>Collectives</h2>{_table(["op", "count", "bytes", "rank-time s", "wait s", "transfer s"], coll_rows, {0})}
<p class='note'>{colls["clock_disagreements"]} (collective, rank) pair(s) where the aligned-clock wait and the clock-free check (duration minus the shortest duration) disagree beyond the clock uncertainty{_e(_disagree_hint(doc))}.</p></section>
{hta_html}
<section><h2>Clock alignment</h2>{clock_note}{_table(["rank", "host", "offset ms", "± µs", "method"], clock_rows, {1, 4})}</section>
<section><h2>Top ops across ranks (ms per rank while the op ran: its calls' union, children included)</h2>{_table(["name", "kind", "ranks", "calls/rank", "mean ms", "min ms", "max ms", "spread", "fastest", "slowest"], op_rows, {0, 1})}</section>
<section><h2>record_function ranges across ranks</h2>{_table(["name", "ranks", "calls/rank", "mean ms", "min ms", "max ms", "spread", "fastest", "slowest"], ann_rows, {0})}</section>
</main>"""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>rankscope report · {_e(a.path.name)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"
    )
