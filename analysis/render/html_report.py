"""The offline HTML report: :func:`render_html`, one self-contained file (inline CSS and inline
SVG charts, no script, no font, nothing fetched from the network).

It lays out summary.json's document (:func:`rankscope.analysis.render.summary_json.summary`) and the
findings (worded in ``findings.py``) as sections and tables: this module computes each section's
rows, figures and words as plain values; the markup is in ``templates/report.html.j2`` and the
templates it imports (rendered by ``templating.py``, which escapes every value once). The charts
are drawn in ``html_charts.py``, memory's section in ``memory_section.py``, the overview image in
``overview_section.py``. Separate from the terminal summary, which shows the same tables and
findings on a console; what the two share lives in ``format.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankscope.analysis.conclude.findings import PIPELINE_KINDS, Finding, FindingKind
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
from rankscope.analysis.render.hta_section import hta_tables
from rankscope.analysis.render.html_charts import _bars_svg, _lateness_svg, steps_table
from rankscope.analysis.render.summary_json import Summarised, summarise
from rankscope.analysis.render.templating import finding, markup, render, table

if TYPE_CHECKING:
    from rankscope.analysis.conclude.advice import Advice
    from rankscope.analysis.engine.driver import Analysis

#: The report's page template (``templates/``).
TEMPLATE = "report.html.j2"


def shown_ranks(a: Analysis, doc: dict[str, Any]) -> set[int]:
    """The ranks a summarised report lists by name: flagged ranks and the worst by total time
    and by wait (the rows of :func:`many_rank_rows` that are ranks)."""
    return {
        int(r["rank"])
        for label, r in many_rank_rows(doc["ranks"], a.flagged_ranks())
        if int(r["rank"]) >= 0
    }


def _across_rows(frame: Any, *, with_kind: bool) -> list[list[Any]]:
    """HTML table rows of ``ops.across_ranks`` (ops with their kind, ranges without)."""
    names = short_names([str(n) for n in frame["name"]])
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
        for name, o in zip(names, frame.itertuples(index=False), strict=True)
    ]


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


def _attention(doc: dict[str, Any], found: list[Finding]) -> dict[str, Any] | None:
    """SDPA time per rank and backend and the math-fallback findings; None without SDPA."""
    rows = doc.get("attention") or []
    if not rows:
        return None
    t = table(
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
    notes = [finding(f) for f in found if f.kind == FindingKind.SDPA_MATH_FALLBACK]
    return {"table": t, "findings": notes}


def _op_table(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The key_averages()-grade op table across ranks (summary.json ``op_table``); None
    without one."""
    rows = doc.get("op_table") or []
    if not rows:
        return None
    names = short_names([str(r["name"]) for r in rows])
    return table(
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


#: The "What to do" section's line when no rule fires.
ADVICE_NONE = "Nothing a rule acts on in this trace (the rules: docs/advice.md)."


def _advice(items: list[Advice]) -> dict[str, Any]:
    """The "What to do" section: each item's class, headline, evidence, fix and gain."""
    return {
        "title": ADVICE_TITLE,
        "entries": [
            {
                "bottleneck": str(i.bottleneck),
                "headline": i.headline,
                "seen": i.seen,
                "fix": i.fix,
                "gain": i.gain,
            }
            for i in items
        ],
        # said only when there is nothing to do (each value passed is one the page prints)
        **({} if items else {"empty": ADVICE_NONE}),
    }


def _what_if(found: list[Finding]) -> dict[str, Any] | None:
    """The what-if section: one row per scenario (the rank fixes first), its step time before →
    after and the width of the saving's bar (px of 240: its share of the step); None without
    what-if findings."""
    rows = []
    for f in found:
        if f.kind != FindingKind.WHAT_IF:
            continue
        share = max(0.0, min(1.0, float(f.figures.get("saving_share", 0.0))))
        rows.append(
            {
                "headline": f.headline,
                "evidence": f.evidence,
                "width": f"{share * 240:.1f}",
                "share": f"{share:.1%}",
            }
        )
    if not rows:
        return None
    return {"title": WHAT_IF_TITLE, "rows": rows, "reading_doc": READING_DOC}


def _hta(doc: dict[str, Any]) -> dict[str, Any] | None:
    """HTA's GPU temporal breakdown per rank (µs); None without it."""
    if not doc["hta"]:
        return None
    return table(
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


def _ranks_table(labelled: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Where the time went, one row per rank (or per summary row: ``labelled``)."""
    return table(
        ["rank", "host", "device", "total s", "compute s", "comm exposed s", "comm overlapped s",
         "wait s", "transfer s", "memory s", "input s", "idle s", "verdict"],
        [
            [
                label,
                r["host"],
                r.get("device", ""),
                *(f"{r[k]:.4f}" for k in ("total_s", "compute_s", "comm_exposed_s",
                                          "comm_overlapped_s", "comm_wait_s", "comm_transfer_s",
                                          "memory_s", "input_s", "idle_s")),
                r["verdict"],
            ]
            for label, r in labelled
        ],
        {1, 2, 12},
    )  # fmt: skip


def _straggler_tables(
    a: Analysis, doc: dict[str, Any], shown: set[int] | None
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The stragglers' figures (None without a straggler) and the lateness section's table of
    every rank's straggler test (``shown``: only these ranks)."""
    strag = doc.get("stragglers", [])
    figures = None
    if strag:
        figures = table(
            ["rank", "last", "p-value", "confidence", "wait caused s", "share of wait", "cause"],
            [
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
            ],
            {6},
        )
    tests = table(
        ["rank", "last", "expected by chance", "p-value", "wait caused s", "share", "cause"],
        [
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
        ],
        {6},
    )
    return figures, tests


def _run_steps(a: Analysis, doc: dict[str, Any]) -> dict[str, Any] | None:
    """The whole-run section's data (None without step logs), its plot as Markup."""
    from rankscope.analysis.render.run_steps_section import run_steps_view

    view = run_steps_view(a.run_steps, doc.get("run_steps"))
    if view is not None:
        view["svg"] = markup(view["svg"])
    return view


def render_html(
    a: Analysis, *, all_ranks: bool = False, summarised: Summarised | None = None
) -> str:
    """The self-contained HTML report (inline CSS and SVG; opens offline).

    With more than :data:`MANY_RANKS` ranks (and not ``all_ranks``) the per-rank parts are
    summarised as in the terminal: the distribution over all ranks, the flagged ranks and the
    worst ones, hosts as aggregated bars (:func:`shown_ranks`); summary.json keeps every rank.
    ``summarised``: :func:`summarise` of ``a`` when the caller renders it in other forms too
    (built here when None).
    """
    return render(TEMPLATE, **report_context(a, all_ranks=all_ranks, summarised=summarised))


def report_context(
    a: Analysis, *, all_ranks: bool = False, summarised: Summarised | None = None
) -> dict[str, Any]:
    """What :data:`TEMPLATE` takes: every section's rows, figures and words as plain values
    (the charts as ``Markup``); a section it leaves out is None. See :func:`render_html`."""
    from rankscope.analysis.render.memory_section import memory_view
    from rankscope.analysis.render.overview_section import overview_view

    built = summarise(a) if summarised is None else summarised
    found, advised, doc = built.found, built.advised, built.doc
    # what compares ranks is left out where it does not apply (one rank: conclude/sections.py)
    sections = set(doc["sections"])
    strag = doc.get("stragglers", [])
    cards = [{"key": "ranks", "value": f"{doc['ranks_present']} / {a.world_size}", "cls": ""}]
    if Section.COLLECTIVES in sections:
        cards += [
            {"key": "collectives", "value": str(doc["collectives"]["count"]), "cls": ""},
            {
                "key": "waiting, all ranks",
                "value": f"{sum(r['comm_wait_s'] for r in doc['ranks']):.3f} s",
                "cls": "",
            },
        ]
    if Section.STRAGGLERS in sections:
        cards.append(
            {
                "key": "straggler",
                "value": ", ".join(f"rank {s['rank']}" for s in strag) if strag else "none",
                "cls": "bad" if strag else "good",
            }
        )
    many = len(doc["ranks"]) > MANY_RANKS and not all_ranks
    labelled = (
        many_rank_rows(doc["ranks"], a.flagged_ranks())
        if many
        else [(str(r["rank"]), r) for r in doc["ranks"]]
    )
    shown = shown_ranks(a, doc) if many else None
    reasons = [
        {"rank": r["rank"], "verdict": r["verdict"], "reason": r["verdict_reason"]}
        for r in doc["ranks"]
        if shown is None or int(r["rank"]) in shown
    ]
    # the figures of each straggler in a table, then every straggler finding (or "no
    # straggler") as the terminal prints it
    strag_kinds = {
        FindingKind.STRAGGLER,
        FindingKind.NO_STRAGGLER,
        FindingKind.STAGE_IMBALANCE,
        FindingKind.DATA_IMBALANCE,
        FindingKind.SLOW_LINK,
        FindingKind.UNMATCHED_COMM,
    }
    strag_findings = [
        finding(f, "whatif" if f.kind == FindingKind.WHAT_IF else "")
        for f in _with_their_what_if(found, strag_kinds)
    ]
    pipe_findings = [
        finding(f, "whatif" if f.kind == FindingKind.WHAT_IF else "note")
        for f in _with_their_what_if(found, set(PIPELINE_KINDS))
    ]
    strag_figures, strag_tests = _straggler_tables(a, doc, shown)
    all_clock = doc.get("clock", [])
    clock = (
        sorted(all_clock, key=lambda c: -c["uncertainty_ns"])[:MANY_RANKS] if many else all_clock
    )
    clock_table = table(
        ["rank", "host", "offset ms", "± µs", "method"],
        [
            [
                c["rank"],
                c["host"],
                f"{c['offset_ns'] / 1e6:+.3f}",
                f"{c['uncertainty_ns'] / 1e3:.1f}",
                c["method"],
            ]
            for c in clock
        ],
        {1, 4},
    )
    colls = doc.get("collectives", {"by_op": [], "clock_disagreements": 0})
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
    return dict(
        name=a.path.name,
        path=a.path,
        run_id=doc["run_id"] or "-",
        world_size=a.world_size,
        advice=_advice(advised),
        cards=cards,
        input_findings=[finding(f, "note") for f in found if f.kind == FindingKind.INPUT_PROBLEMS],
        bars=markup(_bars_svg(a, by_host=many)),
        ranks=_ranks_table(labelled),
        reasons=reasons,
        many_ranks=len(doc["ranks"]) if many else None,
        reading_doc=READING_DOC,
        overview=overview_view(a),
        stragglers=strag_figures,
        straggler_findings=strag_findings,
        pipeline_findings=pipe_findings,
        what_if=_what_if(found),
        memory=memory_view(a.memory, found),
        attention=_attention(doc, found),
        op_table=_op_table(doc),
        steps=steps_table(a, ranks=shown),
        run_steps=_run_steps(a, doc),
        lateness=markup(_lateness_svg(a, summarise=many))
        if Section.STRAGGLERS in sections
        else None,
        lateness_table=strag_tests,
        collectives=table(
            ["op", "count", "bytes", "rank-time s", "wait s", "transfer s"], coll_rows, {0}
        )
        if Section.COLLECTIVES in sections
        else None,
        disagreements=colls["clock_disagreements"],
        disagree_hint=_disagree_hint(doc),
        hta=_hta(doc),
        hta_analyses=[
            {"title": title, "table": table(header, rows, {len(header) - 1} if "sequence" in header else None)}
            for title, header, rows in hta_tables(doc)
        ],
        clock_summary=(
            {"digest": clock_digest(all_clock), "rows": MANY_RANKS} if many and all_clock else None
        ),
        clock=clock_table if Section.CLOCK in sections else None,
        ops=table(
            ["name", "kind", "ranks", "calls/rank", "mean ms", "min ms", "max ms", "spread",
             "fastest", "slowest"],
            _across_rows(a.ops, with_kind=True),
            {0, 1},
        ),
        ranges=table(
            ["name", "ranks", "calls/rank", "mean ms", "min ms", "max ms", "spread", "fastest",
             "slowest"],
            _across_rows(a.annotations, with_kind=False),
            {0},
        ),
    )  # fmt: skip
