"""The offline HTML report: :func:`render_html`, one self-contained file (inline CSS and inline
SVG charts, no script, no font, nothing fetched from the network).

It lays out summary.json's document (:func:`rankscope.analysis.render.summary_json.summary`) and the
findings (worded in ``findings.py``, only styled and escaped here) as sections and tables; the
charts are drawn in ``report_html_charts.py``, memory's section in ``report_memory.py``, the
overview image in ``report_overview.py``. Separate from the terminal summary, which shows the same
tables and findings on a console; what the two share lives in ``report_format.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankscope.analysis.conclude.findings import PIPELINE_KINDS, Finding, FindingKind, findings
from rankscope.analysis.render.format import (
    MANY_RANKS,
    READING_DOC,
    WHAT_IF_TITLE,
    _disagree_hint,
    clock_digest,
    many_rank_rows,
    short_names,
)
from rankscope.analysis.render.html_charts import _bars_svg, _e, _lateness_svg, _steps_html
from rankscope.analysis.render.summary_json import summary

if TYPE_CHECKING:
    from rankscope.analysis.engine.driver import Analysis

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


def shown_ranks(a: Analysis, doc: dict[str, Any]) -> set[int]:
    """The ranks a summarised report lists by name: flagged ranks and the worst by total time
    and by wait (the rows of :func:`many_rank_rows` that are ranks)."""
    return {
        int(r["rank"])
        for label, r in many_rank_rows(doc["ranks"], a.flagged_ranks())
        if int(r["rank"]) >= 0
    }


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
    from rankscope.analysis.render.memory_section import memory_html
    from rankscope.analysis.render.overview_section import overview_html

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
