"""The terminal summary (rich): :func:`print_summary` and the blocks it prints.

It renders summary.json's document (:func:`rankscope.analysis.render.summary_json.summary`) and the
findings (:func:`rankscope.analysis.conclude.findings.findings`: worded there, only styled and escaped here)
to a console. Separate from the HTML report, which shows the same tables and findings as a file;
what the two share lives in ``report_format.py``, memory's block in ``report_memory.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankscope.analysis.conclude.findings import (
    MEMORY_KINDS,
    Finding,
    FindingKind,
    Severity,
    findings,
    job_what_if,
    pipeline_findings,
)
from rankscope.analysis.conclude.sections import Section
from rankscope.analysis.render.format import (
    ADVICE_TITLE,
    MANY_RANKS,
    READING_DOC,
    WHAT_IF_TITLE,
    _disagree_hint,
    clock_digest,
    many_rank_rows,
    short_names,
)
from rankscope.analysis.render.hta_section import hta_terminal_lines
from rankscope.analysis.render.summary_json import Summarised, summarise

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.conclude.advice import Advice
    from rankscope.analysis.engine.driver import Analysis
    from rich.console import Console

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
    new code reads :func:`rankscope.analysis.conclude.findings.findings`.
    """
    return [f.text for f in pipeline_findings(findings(a))]


def finding_markup(f: Finding) -> str:
    """One finding as rich console markup: the headline coloured by severity, all text escaped
    (an input problem's message may hold brackets that rich would read as markup)."""
    from rich.markup import escape

    style = SEVERITY_STYLE[f.severity]
    return f"[{style}]{escape(f.headline)}[/{style}]{escape(f.tail)}"


def print_summary(
    a: Analysis,
    console: Console | None = None,
    *,
    top_ops: int = 8,
    all_ranks: bool = False,
    summarised: Summarised | None = None,
) -> None:
    """The terminal summary: per-rank table, stragglers with evidence, memory, clocks, top ops.

    With more than :data:`MANY_RANKS` ranks (and not ``all_ranks``) the per-rank and clock tables
    are summarised so the summary fits a screen: the median, p90 and worst rank of each column,
    every flagged rank (straggler, bottleneck) and the worst rank by total time and by wait,
    one row per host when there are few hosts, and one line saying what was left out.
    ``summarised``: :func:`summarise` of ``a`` when the caller renders it in other forms too
    (built here when None).
    """
    from rankscope.analysis.render.memory_section import print_memory
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    built = summarise(a) if summarised is None else summarised
    found, advised, doc = built.found, built.advised, built.doc
    print_advice(advised, console)
    title = f"rankscope · {a.path} · {doc['ranks_present']} of {a.world_size} rank(s)"
    show_host = len({r["host"] for r in doc["ranks"]}) > 1
    show_mem = any(r["memory_s"] >= 0.01 * r["total_s"] for r in doc["ranks"])
    show_waits = Section.COLLECTIVES.value in doc["sections"]  # one rank: no one to wait for
    spread = Section.RANK_SPREAD.value in doc["sections"]
    cols = [
        "rank",
        *(["host"] if show_host else []),
        "total ms",
        "comp",
        "comm",
        *(["wait ms", "xfer ms"] if show_waits else []),
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
    from rankscope.analysis.conclude.run_steps import terminal_lines
    from rich.markup import escape as escape_markup

    for line in terminal_lines(doc.get("run_steps")):  # the whole run's steps (issue 30)
        console.print(escape_markup(line))
    if many:
        console.print(
            f"[dim]{len(rank_rows)} ranks: the median, p90 and max of each column over all "
            "ranks (each column on its own: not one rank), then the flagged ranks and the "
            "ranks with the most total time and the most wait; --all-ranks lists every rank, "
            "summary.json holds them all.[/dim]"
        )
    waits = (
        "; wait/xfer ms: time in it with a collective in flight, waiting for a later rank / "
        "moving data (each instant once)"
        if show_waits
        else ""
    )
    console.print(
        "[dim]total: the rank's profiled steps; comp/comm/mem/input/idle: shares of it (comm = "
        f"exposed communication){waits}. How to read this: {READING_DOC}[/dim]"
    )
    if doc.get("stragglers"):
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
    from rich.markup import escape

    for line in hta_terminal_lines(doc):
        console.print(escape(line))
    clock = doc.get("clock")
    if clock and len(clock) > MANY_RANKS and not all_ranks:
        console.print(clock_digest(clock))
    elif clock:
        ct = Table(
            title="Clock alignment", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD
        )
        for col in ("rank", "host", "offset ms", "± µs", "method"):
            ct.add_column(col, justify="left" if col in ("host", "method") else "right")
        for c in clock:
            ct.add_row(
                str(c["rank"]),
                c["host"],
                f"{c['offset_ns'] / 1e6:+.3f}",
                f"{c['uncertainty_ns'] / 1e3:.1f}",
                c["method"],
            )
        console.print(ct)
    c = doc.get("collectives")
    if c and c["count"]:
        console.print(
            f"Collectives: {c['count']}; summed over their {c['rank_rows']} (collective, rank) "
            f"rows (rank-time, concurrent ones each count): {c['total_s']:.4f} s = wait "
            f"{c['wait_s']:.4f} s + transfer {c['transfer_s']:.4f} s; "
            f"{c['clock_disagreements']} of the rows fail the clock check{_disagree_hint(doc)}."
        )
    if len(a.ops) and top_ops:
        # one rank: its own times (no spread across ranks, no slowest rank)
        op_cols = ["name", "calls", "mean ms", "min ms", "max ms", "spread", "slowest"]
        op_cols = op_cols if spread else ["name", "calls", "ms"]
        across = " across ranks" if spread else ""
        per_rank = " per rank" if spread else ""
        ot = Table(
            title=f"Top {top_ops} ops{across} (ms{per_rank} while the op ran: its calls' "
            "union, children included)",
            title_justify="left",
            header_style="bold",
            box=box.SIMPLE_HEAD,
        )
        for col in op_cols:
            ot.add_column(
                col, justify="left" if col == "name" else "right", no_wrap=True, min_width=len(col)
            )
        top = a.ops.head(top_ops)
        for name, o in zip(
            short_names([str(n) for n in top["name"]], 38), top.itertuples(index=False), strict=True
        ):
            cells = [name, f"{o.count_mean:.0f}", f"{o.wall_mean_ns / 1e6:.3f}"]
            if spread:
                cells += [
                    f"{o.wall_min_ns / 1e6:.3f}",
                    f"{o.wall_max_ns / 1e6:.3f}",
                    f"{o.spread:.0%}",
                    str(o.slowest_rank),
                ]
            ot.add_row(*cells)
        console.print(ot)
    for f in found:
        if f.kind == FindingKind.INPUT_PROBLEMS:
            console.print(finding_markup(f))
    print_advice_reminder(advised, console)


def print_advice_reminder(items: list[Advice], console: Console) -> None:
    """One closing line that points back to the advice at the top (the summary is long; a
    reader who scrolled to its end should leave with the first thing to do)."""
    from rich.markup import escape

    if items:
        first = items[0]
        more = f" (+{len(items) - 1} more)" if len(items) > 1 else ""
        console.print(
            f"[bold]{ADVICE_TITLE} first[/bold]: "
            + escape(f"[{first.bottleneck}] {first.headline}; {first.gain}{more}")
            + " — details at the top."
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


def print_advice(items: list[Advice], console: Console) -> None:
    """The advice, most valuable first: per item its class and what was seen, the change to
    make and the gain; one line saying so when no rule fired."""
    from rich.markup import escape

    if not items:
        console.print(
            f"[bold]{ADVICE_TITLE}[/bold]: nothing a rule acts on in this trace "
            "(the rules: docs/advice.md)"
        )
        return
    console.print(f"[bold]{ADVICE_TITLE}[/bold] (most valuable first; docs/advice.md)")
    for n, item in enumerate(items, 1):
        seen, do, gain = item.lines()
        console.print(f" {n}. {escape(seen)}")
        console.print(f"    [bold]{escape(do)}[/bold]")
        console.print(f"    {escape(gain)}")


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
