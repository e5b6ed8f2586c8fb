"""The renderings of one comparison of ``rankscope compare``: terminal, JSON and Markdown.

What :func:`rankscope.analysis.conclude.compare.compare` found, worded for people (ms / µs, MiB / GiB,
TFLOP/s, signed percentages) the same way in every rendering, plus the headline and the gate's
rule. Separate from the command (``orchestrator/compare.py``), which resolves the two runs and
decides the gate, because these functions only render a finished :class:`Comparison`; the
self-contained HTML page, the longest rendering, is in ``analysis/render/compare_html.py``.
Formats: docs/compare.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.analysis.conclude.compare import Comparison, GateCheck, GateConfig

#: summary of ``--json``.
JSON_SCHEMA = "rankscope-compare"
JSON_VERSION = 1
#: rich style per verdict (KPI rows) and per op change.
STYLE = {
    "regression": "bold red",
    "improvement": "bold green",
    "no change": "bright_black",
    "untested": "bright_black italic",
    "slower": "red",
    "faster": "green",
    "appeared": "yellow",
    "disappeared": "cyan",
    "same": "bright_black",
}
#: Marker per verdict in the Markdown (renders everywhere, no colour needed).
MARK = {"regression": "🔴", "improvement": "🟢", "no change": "⚪", "untested": "➖"}


#: Columns of the op-change table, in every rendering (the Markdown one leaves out "rank").
OP_HEADERS = ("op", "kind", "BASE", "NEW", "Δ/step", "of step", "rank", "change")


def op_cells(r: Any) -> list[str]:
    """One op change (``compare.OP_CHANGE_COLUMNS`` row) as the texts of :data:`OP_HEADERS`:
    the figures are worded once for the terminal, the Markdown and the HTML page."""
    return [
        str(r.name),
        str(r.kind),
        fmt_value(r.base_s, "s"),
        fmt_value(r.new_s, "s"),
        f"{1e3 * r.delta_s:+.3f} ms",
        fmt_pct(r.step_share),
        str(r.top_rank),
        str(r.change),
    ]


# -- formatting ------------------------------------------------------------------------------


def fmt_value(value: float, unit: str) -> str:
    """A KPI value for people: ms / µs for seconds, MiB / GiB for bytes, T for FLOP/s."""
    if value is None or not math.isfinite(value):
        return "-"
    if unit == "s":
        return f"{value * 1e3:.2f} ms" if abs(value) >= 1e-4 else f"{value * 1e6:.0f} µs"
    if unit == "bytes":
        return f"{value / 2**30:.2f} GiB" if abs(value) >= 2**30 else f"{value / 2**20:.1f} MiB"
    if unit == "FLOP/s":
        return f"{value / 1e12:.2f} TFLOP/s"
    if unit == "share":
        return f"{100 * value:.1f}%"
    return f"{value:,.1f} {unit}"


def fmt_pct(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "n/a" if x is None or math.isnan(x) else ("+∞" if x > 0 else "−∞")
    return f"{100 * x:+.1f}%"


def fmt_p(p: float) -> str:
    return "-" if p is None or not math.isfinite(p) else (f"{p:.2g}" if p >= 1e-4 else "<1e-4")


def _rank(r: int) -> str:
    return "job" if r < 0 else str(r)


def shown_kpi_rows(c: Comparison) -> Any:
    """The KPI rows the renderings list: every job row, each rank's step time, and any rank row
    with a verdict (regression or improvement)."""
    k = c.kpis
    keep = (
        (k["rank"] < 0)
        | (k["kpi"] == "step_time")
        | k["change"].isin(["regression", "improvement"])
    )
    return k[keep]


def _ops_shown(c: Comparison) -> Any:
    o = c.ops
    top = c.config.top_ops
    slower = o[o["change"].isin(["slower", "appeared"]) & (o["delta_s"] > 0)].head(top)
    faster = o[o["change"].isin(["faster", "disappeared"]) & (o["delta_s"] < 0)].head(top)
    return slower, faster


def gate_rule(checks: list[GateCheck]) -> str:
    """Which rule decided the gate, in a few words ("Welch t on 3 vs 3 steps", or the loud
    "THRESHOLD ALONE: …" when the runs had too few steps for any test)."""
    if not checks:
        return "no gated KPI in both runs"
    parts = []
    for rule in dict.fromkeys(ch.rule for ch in checks):
        steps = ", ".join(
            dict.fromkeys(
                f"{ch.base_steps} vs {ch.new_steps} steps" for ch in checks if ch.rule == rule
            )
        )
        if rule == "Welch t":
            parts.append(f"Welch t on {steps}")
        elif rule == "t on run means":
            runs = ", ".join(
                dict.fromkeys(
                    f"{ch.base_runs} vs {ch.new_runs} runs" for ch in checks if ch.rule == rule
                )
            )
            parts.append(f"t on run means, {runs}")
        else:
            parts.append(f"THRESHOLD ALONE: {steps} cannot establish significance")
    return "; ".join(parts)


def headline(c: Comparison, checks: list[GateCheck] | None) -> str:
    """One line: the overall verdict (and the gate's and its rule, when there is a gate)."""
    from rankscope.analysis.conclude.compare import rank_test_floor

    job = c.regressions()
    k = c.kpis
    better = k[(k["rank"] < 0) & (k["change"] == "improvement")]
    failed = [ch for ch in checks or [] if ch.failed]
    if len(job):
        text = "REGRESSION: " + ", ".join(
            f"{r.kpi} {fmt_pct(r.rel_change)}" for r in job.itertuples()
        )
    elif failed:
        text = "REGRESSION beyond the gate's threshold: " + ", ".join(
            f"{ch.kpi} {fmt_pct(ch.rel_change)}" for ch in failed
        )
    elif len(better):
        text = "IMPROVEMENT: " + ", ".join(
            f"{r.kpi} {fmt_pct(r.rel_change)}" for r in better.itertuples()
        )
    elif (k["change"] == "untested").all():
        text = "NOT COMPARABLE: too few common KPIs or steps to test"
    elif rank_test_floor(k, c.config.alpha):
        text = "No change the rank test can call with so few steps"
    else:
        text = "No significant change"
    if checks is not None:
        text += f" · gate: {'FAILED' if failed else 'passed'} ({gate_rule(checks)})"
    return text


def gate_line(check: GateCheck) -> str:
    """One gated KPI's verdict: "FAILED — …" or "passed — …", the rule named in the text."""
    return f"{'FAILED' if check.failed else 'passed'} — {check.text}"


# -- terminal --------------------------------------------------------------------------------


def print_comparison(c: Comparison, console: Any, checks: list[GateCheck] | None) -> None:
    """The terminal rendering."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    console.print(
        f"[bold]rankscope compare[/bold] BASE {c.base.run_id} ({c.base.world_size} ranks, "
        f"{len(c.base.steps)} steps) → NEW {c.new.run_id} ({c.new.world_size} ranks, "
        f"{len(c.new.steps)} steps)",
        highlight=False,
    )
    for note in c.notes:
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    t = Table(box=box.SIMPLE_HEAD, header_style="bold", title_justify="left")
    for col in ("KPI", "rank", "BASE p50", "NEW p50", "change", "of step", "p (Holm)", "verdict"):
        t.add_column(col, justify="left" if col in ("KPI", "verdict") else "right")
    for r in shown_kpi_rows(c).itertuples():
        style = STYLE.get(r.change, "")
        share = fmt_pct(r.step_share) if r.unit == "s" and r.kpi != "step_time" else ""
        t.add_row(
            r.kpi,
            _rank(r.rank),
            fmt_value(r.base_p50, r.unit),
            fmt_value(r.new_p50, r.unit),
            fmt_pct(r.rel_change),
            share,
            fmt_p(r.p_adjusted),
            Text(r.change, style=style),
            style=style if r.change in ("no change", "untested") else None,
        )
    console.print(t)
    slower, faster = _ops_shown(c)
    if len(slower) or len(faster):
        o = Table(
            title="ops (time per step, mean over ranks)",
            box=box.SIMPLE_HEAD,
            header_style="bold",
            title_justify="left",
        )
        for col in OP_HEADERS:
            o.add_column(col, justify="left" if col in ("op", "kind", "change") else "right")
        for r in [*slower.itertuples(), *faster.itertuples()]:
            name, *figures, change = op_cells(r)
            o.add_row(name[:60], *figures, Text(change, style=STYLE.get(change, "")))
        console.print(o)
    coll = c.collectives
    if len(coll):
        w = Table(
            title="collectives (wait / transfer per step)",
            box=box.SIMPLE_HEAD,
            header_style="bold",
            title_justify="left",
        )
        for col in ("group", "op", "rank", "BASE wait", "NEW wait", "Δ wait", "Δ transfer"):
            w.add_column(col, justify="left" if col in ("group", "op") else "right")
        for r in coll.itertuples():
            style = "red" if r.delta_wait_s > 0 else "green"
            w.add_row(
                r.group,
                r.op,
                _rank(r.rank),
                fmt_value(r.base_wait_s, "s"),
                fmt_value(r.new_wait_s, "s"),
                Text(f"{1e3 * r.delta_wait_s:+.2f} ms", style=style),
                f"{1e3 * r.delta_transfer_s:+.2f} ms",
            )
        console.print(w)
    if len(c.whatif):
        console.print("[bold]what-if savings per step[/bold]", highlight=False)
        for r in c.whatif.itertuples():
            console.print(
                f"  {r.scenario}{'' if r.rank < 0 else f' (rank {r.rank})'}: "
                f"{fmt_value(r.base_saving_s, 's')} → {fmt_value(r.new_saving_s, 's')}",
                highlight=False,
            )
    for f in c.findings:
        style = {
            "regression": "bold red",
            "new_straggler": "bold red",
            "improvement": "bold green",
            "straggler_gone": "green",
            "no_change": "bright_black",
        }.get(str(f.kind), "")
        console.print(Text(f.text, style=style))
    failed = any(ch.failed for ch in checks or [])
    console.print(Text(headline(c, checks), style="bold red" if failed else "bold"))
    for ch in checks or []:
        style = "red" if ch.failed else "bright_black"
        if ch.rule != "Welch t":
            style = "bold yellow"  # no test was possible: loud
        console.print(Text(f"  gate: {gate_line(ch)}", style=style))


# -- JSON ------------------------------------------------------------------------------------


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return None if not math.isfinite(x) else float(f"{x:.6g}")
    if hasattr(x, "item"):
        return _clean(x.item())
    return x


def _records(df: Any) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in df.to_dict("records")]


def to_json(
    c: Comparison, checks: list[GateCheck] | None, gate_config: GateConfig | None
) -> dict[str, Any]:
    """The ``--json`` document (docs/compare.md, "JSON")."""
    from rankscope.analysis.conclude.kpis import to_json as kpis_json

    slower, faster = _ops_shown(c)
    return {
        "schema": JSON_SCHEMA,
        "version": JSON_VERSION,
        "verdict": headline(c, None),
        "base": {"run_id": c.base.run_id, **kpis_json(c.base)},
        "new": {"run_id": c.new.run_id, **kpis_json(c.new)},
        "test": {
            "name": "Mann-Whitney U (two-sided, exact up to 80 steps) + Hodges-Lehmann shift",
            "multiple_testing": "Holm within the job and the per-rank families, alpha/2 each",
            "alpha": c.config.alpha,
            "min_change": c.config.min_change,
        },
        "notes": list(c.notes),
        "findings": [
            {"kind": str(f.kind), "text": f.text, "kpi": f.kpi, "rank": f.rank} for f in c.findings
        ],
        "kpis": _records(c.kpis),
        "ops": {"slower": _records(slower), "faster": _records(faster)},
        "collectives": _records(c.collectives),
        "stragglers": _records(c.stragglers),
        "what_if": _records(c.whatif),
        "gate": None
        if checks is None or gate_config is None
        else {
            "passed": not any(ch.failed for ch in checks),
            "fail_above": gate_config.fail_above,
            "thresholds": dict(gate_config.thresholds),
            "rule": gate_rule(checks),
            "alpha": gate_config.alpha,
            "run_noise": gate_config.run_noise,
            "test": "one-sided Welch t of 'worse than the threshold' on the per-step job means "
            "(plus run_noise, the run-to-run noise allowed for), Holm over the gated KPIs at "
            "alpha; the threshold alone below 3 steps a run",
            "failures": [
                {"kpi": f.kpi, "text": f.text, **{k: _clean(v) for k, v in f.figures.items()}}
                for f in (ch.finding for ch in checks if ch.failed)
            ],
            "checks": [
                {k: _clean(str(v) if k == "rule" else v) for k, v in dataclasses.asdict(ch).items()}
                for ch in checks
            ],
        },
    }


# -- Markdown --------------------------------------------------------------------------------


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(c: Comparison, checks: list[GateCheck] | None) -> str:
    """A GitHub-flavoured Markdown summary (job summary, PR comment)."""
    lines = [f"### rankscope compare: {_md(headline(c, checks))}", ""]
    lines.append(
        f"BASE `{c.base.run_id}` ({c.base.world_size} ranks, {len(c.base.steps)} steps) → "
        f"NEW `{c.new.run_id}` ({c.new.world_size} ranks, {len(c.new.steps)} steps)"
    )
    lines.append("")
    for note in c.notes:
        lines.append(f"> **note:** {_md(note)}")
    if c.notes:
        lines.append("")
    lines += [
        "| KPI | rank | BASE p50 | NEW p50 | change | of step | p (Holm) | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in shown_kpi_rows(c).itertuples():
        share = fmt_pct(r.step_share) if r.unit == "s" and r.kpi != "step_time" else ""
        verdict = f"{MARK.get(r.change, '')} {r.change}"
        strong = "**" if r.change in ("regression", "improvement") else ""
        lines.append(
            f"| {strong}{r.kpi}{strong} | {_rank(r.rank)} | {fmt_value(r.base_p50, r.unit)} | "
            f"{fmt_value(r.new_p50, r.unit)} | {fmt_pct(r.rel_change)} | {share} | "
            f"{fmt_p(r.p_adjusted)} | {verdict} |"
        )
    lines.append("")
    kinds = {"regression", "improvement", "no_change", "op_changes"}
    others = [f for f in c.findings if str(f.kind) not in kinds]
    for f in others:
        lines.append(f"- {_md(f.text)}")
    slower, faster = _ops_shown(c)
    if len(slower) or len(faster):
        lines += [
            "",
            "<details><summary>Ops that changed (time per step, mean over ranks)</summary>",
            "",
            "| op | kind | BASE | NEW | Δ/step | of step | change |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        for r in [*slower.itertuples(), *faster.itertuples()]:
            name, kind, base, new, delta, share, _top, change = op_cells(r)
            lines.append(
                f"| `{_md(name[:80])}` | {kind} | {base} | {new} | {delta} | {share} | {change} |"
            )
        lines += ["", "</details>"]
    if checks is not None:
        failed = any(ch.failed for ch in checks)
        lines += [
            "",
            f"**Gate {'failed' if failed else 'passed'}** ({_md(gate_rule(checks))}):",
            "",
        ]
        lines += [f"- {'🔴' if ch.failed else '⚪'} {_md(gate_line(ch))}" for ch in checks]
    lines += [
        "",
        f"<sub>Table: Mann–Whitney U over steps, Holm-adjusted (α={c.config.alpha:g}); changes "
        f"under {100 * c.config.min_change:g}% are noise. Gate: one-sided Welch t of 'worse than "
        "the threshold' on the per-step means. rankscope compare.</sub>",
        "",
    ]
    return "\n".join(lines)
