"""The ``--html`` rendering of ``rankscope compare``: one self-contained page.

Inline CSS, no scripts, opens offline. Separate from the other renderings
(``analysis/render/compare.py``, whose wording of figures, headline and gate rule it reuses)
because the page's tables of KPIs, ops, collectives, stragglers and what-if savings are the
longest rendering of one comparison. Format: docs/compare.md.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from rankscope.analysis.render.compare import (
    OP_HEADERS,
    _ops_shown,
    _rank,
    fmt_p,
    fmt_pct,
    fmt_value,
    gate_line,
    gate_rule,
    headline,
    op_cells,
)

if TYPE_CHECKING:
    from rankscope.analysis.conclude.compare import Comparison, GateCheck

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:3px 10px;border-bottom:1px solid #ddd}
th{text-align:left;background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.regression,.slower{color:#b00020;font-weight:600}.improvement,.faster{color:#137333;font-weight:600}
.noise,.same,.untested{color:#888}.appeared{color:#a66a00}.disappeared{color:#0b6e99}
.verdict{font-size:17px;padding:.6em 1em;border-radius:6px;background:#f4f4f4;display:inline-block}
.bad{background:#fde7e9}.good{background:#e6f4ea}.note{color:#8a6d00}
"""


def _table(head: list[str], rows: list[tuple[list[str], str]], numeric: set[int]) -> str:
    h = "".join(f"<th>{html.escape(x)}</th>" for x in head)
    body = []
    for cells, cls in rows:
        tds = "".join(
            f"<td class='{'n' if i in numeric else ''}'>{html.escape(str(v))}</td>"
            for i, v in enumerate(cells)
        )
        body.append(f"<tr class='{cls}'>{tds}</tr>")
    return f"<table><tr>{h}</tr>{''.join(body)}</table>"


def render_html(c: Comparison, checks: list[GateCheck] | None) -> str:
    """A self-contained page (inline CSS, no scripts, opens offline)."""
    verdict = headline(c, checks)
    failed = any(ch.failed for ch in checks or [])
    bad = failed or len(c.regressions())
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>rankscope compare</title>"
        f"<style>{_CSS}</style></head><body>",
        "<h1>rankscope compare</h1>",
        f"<p>BASE <code>{html.escape(c.base.run_id)}</code> ({c.base.world_size} ranks, "
        f"{len(c.base.steps)} steps) → NEW <code>{html.escape(c.new.run_id)}</code> "
        f"({c.new.world_size} ranks, {len(c.new.steps)} steps)</p>",
        f"<div class='verdict {'bad' if bad else 'good'}'>{html.escape(verdict)}</div>",
    ]
    parts += [f"<p class='note'>note: {html.escape(n)}</p>" for n in c.notes]
    parts.append("<ul>" + "".join(f"<li>{html.escape(f.text)}</li>" for f in c.findings) + "</ul>")
    if checks is not None:
        parts.append(
            f"<h2>Gate {'failed' if failed else 'passed'} "
            f"({html.escape(gate_rule(checks))})</h2><ul>"
            + "".join(
                f"<li class='{'regression' if ch.failed else 'noise'}'>"
                f"{html.escape(gate_line(ch))}</li>"
                for ch in checks
            )
            + "</ul>"
        )
    rows = []
    for r in c.kpis.itertuples():
        share = fmt_pct(r.step_share) if r.unit == "s" and r.kpi != "step_time" else ""
        cls = {"no change": "noise"}.get(r.change, r.change)
        rows.append(
            (
                [
                    r.kpi,
                    _rank(r.rank),
                    fmt_value(r.base_p50, r.unit),
                    fmt_value(r.new_p50, r.unit),
                    fmt_value(r.base_p90, r.unit),
                    fmt_value(r.new_p90, r.unit),
                    fmt_pct(r.rel_change),
                    share,
                    fmt_p(r.p_value),
                    fmt_p(r.p_adjusted),
                    r.change,
                ],
                cls,
            )
        )
    parts.append("<h2>KPIs, job and rank by rank</h2>")
    parts.append(
        _table(
            [
                "KPI",
                "rank",
                "BASE p50",
                "NEW p50",
                "BASE p90",
                "NEW p90",
                "change",
                "of step",
                "p",
                "p (Holm)",
                "verdict",
            ],
            rows,
            set(range(1, 10)),
        )
    )
    slower, faster = _ops_shown(c)
    if len(slower) or len(faster):
        parts.append("<h2>Ops (time per step, mean over ranks)</h2>")
        parts.append(
            _table(
                list(OP_HEADERS),
                [(op_cells(r), r.change) for r in [*slower.itertuples(), *faster.itertuples()]],
                {2, 3, 4, 5, 6},
            )
        )
    if len(c.collectives):
        parts.append("<h2>Collectives (wait and transfer per step)</h2>")
        parts.append(
            _table(
                ["group", "op", "rank", "BASE wait", "NEW wait", "Δ wait", "Δ transfer"],
                [
                    (
                        [
                            r.group,
                            r.op,
                            _rank(r.rank),
                            fmt_value(r.base_wait_s, "s"),
                            fmt_value(r.new_wait_s, "s"),
                            f"{1e3 * r.delta_wait_s:+.2f} ms",
                            f"{1e3 * r.delta_transfer_s:+.2f} ms",
                        ],
                        "slower" if r.delta_wait_s > 0 else "faster",
                    )
                    for r in c.collectives.itertuples()
                ],
                {2, 3, 4, 5, 6},
            )
        )
    if len(c.stragglers):
        parts.append("<h2>Stragglers</h2>")
        parts.append(
            _table(
                ["rank", "change", "cause", "wait caused"],
                [
                    (
                        [str(r.rank), r.change, r.cause, fmt_value(r.wait_caused_s, "s")],
                        "regression" if r.change == "new" else "improvement",
                    )
                    for r in c.stragglers.itertuples()
                ],
                {0, 3},
            )
        )
    if len(c.whatif):
        parts.append("<h2>What-if savings per step</h2>")
        parts.append(
            _table(
                ["scenario", "rank", "BASE", "NEW", "Δ"],
                [
                    (
                        [
                            r.scenario,
                            _rank(r.rank),
                            fmt_value(r.base_saving_s, "s"),
                            fmt_value(r.new_saving_s, "s"),
                            f"{1e3 * r.delta_s:+.2f} ms",
                        ],
                        "",
                    )
                    for r in c.whatif.itertuples()
                ],
                {1, 2, 3, 4},
            )
        )
    parts.append(
        f"<p class='noise'>Mann–Whitney U over steps (exact up to 80 steps), Hodges–Lehmann "
        f"shift, Holm-adjusted p (α={c.config.alpha:g}, split between the job and per-rank "
        f"families); changes under {100 * c.config.min_change:g}% are noise. The gate: a "
        "one-sided Welch t test of 'worse than the threshold' on the per-step means (the "
        "threshold alone below 3 steps a run).</p></body></html>\n"
    )
    return "".join(parts)
