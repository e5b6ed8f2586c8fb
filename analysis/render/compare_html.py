"""The ``--html`` rendering of ``rankscope compare``: one self-contained page.

Inline CSS, no scripts, opens offline. Separate from the other renderings
(``analysis/render/compare.py``, whose wording of figures, headline and gate rule it reuses)
because the page's tables of KPIs, ops, collectives, stragglers and what-if savings are the
longest rendering of one comparison. This module words the rows; the markup and the CSS are in
``templates/compare.html.j2`` (rendered by ``templating.py``, which escapes every value once).
Format: docs/compare.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from rankscope.analysis.render.templating import render

if TYPE_CHECKING:
    from rankscope.analysis.conclude.compare import Comparison, GateCheck

#: The page's template (``templates/``).
TEMPLATE = "compare.html.j2"


def _table(head: list[str], rows: list[tuple[list[str], str]], numeric: set[int]) -> dict[str, Any]:
    """What the page's ``table`` macro takes: the headers, the rows (cells and the row's CSS
    class: its verdict or change) and each column's class (``n``: numeric, right-aligned)."""
    classes = ["n" if i in numeric else "" for i in range(len(head))]
    return {"headers": head, "rows": rows, "classes": classes}


def _kpis(c: Comparison) -> dict[str, Any]:
    """The KPIs, job and rank by rank."""
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
    return _table(
        ["KPI", "rank", "BASE p50", "NEW p50", "BASE p90", "NEW p90", "change", "of step", "p",
         "p (Holm)", "verdict"],
        rows,
        set(range(1, 10)),
    )  # fmt: skip


def _ops(c: Comparison) -> dict[str, Any] | None:
    """The ops that got slower, then those that got faster; None when none changed."""
    slower, faster = _ops_shown(c)
    if not (len(slower) or len(faster)):
        return None
    return _table(
        list(OP_HEADERS),
        [(op_cells(r), r.change) for r in [*slower.itertuples(), *faster.itertuples()]],
        {2, 3, 4, 5, 6},
    )


def _collectives(c: Comparison) -> dict[str, Any] | None:
    """Wait and transfer per step, per collective; None without collectives."""
    if not len(c.collectives):
        return None
    return _table(
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


def _stragglers(c: Comparison) -> dict[str, Any] | None:
    """Stragglers that appeared or went away; None without."""
    if not len(c.stragglers):
        return None
    return _table(
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


def _what_if(c: Comparison) -> dict[str, Any] | None:
    """The what-if savings per step on both sides; None without."""
    if not len(c.whatif):
        return None
    return _table(
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


def render_html(c: Comparison, checks: list[GateCheck] | None) -> str:
    """A self-contained page (inline CSS, no scripts, opens offline)."""
    return render(TEMPLATE, **compare_context(c, checks))


def compare_context(c: Comparison, checks: list[GateCheck] | None) -> dict[str, Any]:
    """What :data:`TEMPLATE` takes (``checks``: the gate's, None without a gate); a table it
    leaves out is None."""
    failed = any(ch.failed for ch in checks or [])
    gate = None
    if checks is not None:
        gate = {
            "failed": failed,
            "rule": gate_rule(checks),
            "checks": [{"failed": ch.failed, "line": gate_line(ch)} for ch in checks],
        }
    return dict(
        base={"run_id": c.base.run_id, "ranks": c.base.world_size, "steps": len(c.base.steps)},
        new={"run_id": c.new.run_id, "ranks": c.new.world_size, "steps": len(c.new.steps)},
        verdict=headline(c, checks),
        bad=bool(failed or len(c.regressions())),
        notes=list(c.notes),
        findings=[f.text for f in c.findings],
        gate=gate,
        kpis=_kpis(c),
        ops=_ops(c),
        collectives=_collectives(c),
        stragglers=_stragglers(c),
        what_if=_what_if(c),
        alpha=f"{c.config.alpha:g}",
        min_change=f"{100 * c.config.min_change:g}",
    )
