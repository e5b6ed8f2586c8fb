"""``rankscope compare BASE NEW``: what changed between two runs, and a CI gate on it.

BASE and NEW are run directories, folders of traces or stores (merged first when needed, as
``rankscope analyze`` does). Both are analysed, compared by
:func:`rankscope.analysis.compare.compare` (pure), and rendered here: the terminal table
(regressions red, improvements green, noise grey), ``--json``, ``--html`` (self-contained) and
``--markdown`` (a CI job summary or PR comment). ``--fail-above PCT`` and the ``[thresholds]``
of ``--config FILE`` make it a gate: exit 1 when a job-level KPI is worse than its threshold —
by a one-sided Welch t test on the per-step means, or, with fewer than 3 steps a run, by the
threshold alone (said loudly) — 0 otherwise; every rendering names the rule that decided.
Method and formats: docs/compare.md.

Why one module of ~750 lines: resolving two runs, the gate and the four renderings of one
comparison make one command.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rankscope.errors import InputFileError, UsageError

if TYPE_CHECKING:
    from rankscope.analysis.compare import Comparison, GateCheck, GateConfig

#: Exit status when the gate fails (a gated KPI worse than its threshold).
EXIT_REGRESSION = 1
#: summary of ``--json``.
JSON_SCHEMA = "rankscope-compare"
JSON_VERSION = 1
#: Terminal width when stdout is not a terminal.
PIPE_WIDTH = 120
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


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope compare`` (import-light)."""
    parser.add_argument("base", type=Path, help="BASE: a run directory or trace.h5")
    parser.add_argument("new", type=Path, help="NEW: a run directory or trace.h5")
    parser.add_argument(
        "--base-runs",
        type=Path,
        nargs="+",
        default=[],
        metavar="RUN",
        help="more runs with BASE's settings: the gate then tests run means, seeing the "
        "run-to-run noise (docs/compare.md)",
    )
    parser.add_argument(
        "--new-runs",
        type=Path,
        nargs="+",
        default=[],
        metavar="RUN",
        help="more runs with NEW's settings (as --base-runs)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the comparison as JSON")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write a self-contained page")
    parser.add_argument(
        "--markdown", type=Path, metavar="FILE", help="write a Markdown summary (CI, PR comment)"
    )
    parser.add_argument(
        "--fail-above",
        metavar="PCT",
        help="exit 1 when a headline KPI (step time, throughput, peak memory, FLOP/s, MFU) is "
        "worse than PCT (5%% or 5): a one-sided Welch t test of 'more than PCT worse' on the "
        "per-step means (the threshold alone, said so, below 3 steps a run)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML: fail_above, alpha, gate_alpha, run_noise, min_change and per-KPI "
        "[thresholds] (docs/compare.md)",
    )
    parser.add_argument(
        "--alpha", type=float, metavar="P", help="family-wise false-alarm rate (0.05)"
    )
    parser.add_argument(
        "--gate-alpha",
        type=float,
        metavar="P",
        help="the gate's false-alarm level per comparison (0.01: it is asked on every commit)",
    )
    parser.add_argument(
        "--run-noise",
        metavar="PCT",
        help="run-to-run noise of the machine the gate allows for (e.g. 12%%: how much the mean "
        "step time of same-settings runs varies beyond their step noise; measure it with "
        "benchmarks/compare_noise.py); default 0: step noise only",
    )
    parser.add_argument("--min-change", metavar="PCT", help="smallest change called one (3%%)")
    parser.add_argument(
        "--samples-per-step",
        type=float,
        metavar="N",
        help="samples (or tokens) per step and rank, for the throughput KPI",
    )
    parser.add_argument(
        "--sample-unit", default="samples", metavar="WORD", help="what a sample is (samples)"
    )
    parser.add_argument(
        "--flops-per-step", type=float, metavar="N", help="FLOPs per step and rank (FLOP/s, MFU)"
    )
    parser.add_argument(
        "--device-name", metavar="NAME", help="accelerator name for its peak FLOP/s (H100 SXM)"
    )
    parser.add_argument(
        "--top-ops", type=int, default=8, metavar="N", help="ops shown per direction (8)"
    )


# -- configuration ---------------------------------------------------------------------------


_D = TypeVar("_D", float, None)


def _fraction(value: Any, what: str) -> float:
    from rankscope.analysis.compare import parse_fraction

    try:
        return parse_fraction(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what}: expected a percentage like 5% or 5, got {value!r}") from None


def _setting(flag: Any, doc: dict[str, Any], key: str, where: str, default: _D) -> float | _D:
    """A percentage setting: the flag (``--key-with-dashes``) over the config file's ``key`` over
    ``default``; one-line errors naming where the bad value came from."""
    if flag is not None:
        return _fraction(flag, f"--{key.replace('_', '-')}")
    if key in doc:
        return _fraction(doc[key], f"{where}: {key}")
    return default


def load_config(path: Path | None) -> dict[str, Any]:
    """The ``--config`` TOML file as a dict (empty without one); one-line errors."""
    import tomllib

    from rankscope.analysis.kpis import Kpi

    if path is None:
        return {}
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InputFileError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(f"{path}: not valid TOML ({exc})") from None
    known = {"fail_above", "alpha", "gate_alpha", "run_noise", "min_change", "thresholds"}
    extra = sorted(set(doc) - known)
    if extra:
        raise InputFileError(f"{path}: unknown key(s) {', '.join(extra)} (known: {sorted(known)})")
    thresholds = doc.get("thresholds", {})
    if not isinstance(thresholds, dict):
        raise InputFileError(f'{path}: [thresholds] must be a table of KPI = "PCT"')
    names = {str(k) for k in Kpi}
    bad = sorted(set(thresholds) - names)
    if bad:
        raise InputFileError(
            f"{path}: unknown KPI(s) in [thresholds]: {', '.join(bad)} (known: "
            f"{', '.join(sorted(names))})"
        )
    return doc


def configs(args: argparse.Namespace) -> tuple[Any, GateConfig, Any]:
    """(CompareConfig, GateConfig, KpiConfig) from the flags over the config file."""
    from rankscope.analysis.compare import CompareConfig, GateConfig
    from rankscope.analysis.kpis import KpiConfig

    doc = load_config(args.config)
    where = str(args.config)
    alpha = args.alpha if args.alpha is not None else doc.get("alpha", 0.05)
    if not isinstance(alpha, int | float) or not 0 < float(alpha) < 1:
        raise UsageError(f"alpha must be between 0 and 1, got {alpha!r}")
    gate_alpha = args.gate_alpha if args.gate_alpha is not None else doc.get("gate_alpha")
    if gate_alpha is None:
        gate_alpha = GateConfig.alpha
    if not isinstance(gate_alpha, int | float) or not 0 < float(gate_alpha) < 1:
        raise UsageError(f"gate_alpha must be between 0 and 1, got {gate_alpha!r}")
    noise = _setting(args.run_noise, doc, "run_noise", where, 0.0)
    min_change = _setting(args.min_change, doc, "min_change", where, CompareConfig.min_change)
    fail_above = _setting(args.fail_above, doc, "fail_above", where, None)
    thresholds = {
        k: _fraction(v, f"{where}: thresholds.{k}") for k, v in doc.get("thresholds", {}).items()
    }
    if args.top_ops < 0:
        raise UsageError(f"--top-ops must be >= 0, got {args.top_ops}")
    if args.samples_per_step is not None and args.samples_per_step <= 0:
        raise UsageError(f"--samples-per-step must be > 0, got {args.samples_per_step}")
    return (
        CompareConfig(alpha=float(alpha), min_change=min_change, top_ops=args.top_ops),
        GateConfig(
            fail_above=fail_above,
            thresholds=thresholds,
            alpha=float(gate_alpha),
            run_noise=noise,
        ),
        KpiConfig(
            samples_per_step=args.samples_per_step,
            sample_unit=args.sample_unit,
            flops_per_step=args.flops_per_step,
            device_name=args.device_name,
        ),
    )


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
    from rankscope.analysis.compare import rank_test_floor

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
    from rankscope.analysis.kpis import to_json as kpis_json

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


# -- HTML ------------------------------------------------------------------------------------

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


# -- the command -----------------------------------------------------------------------------


def _analysis(path: Path) -> Any:
    from rankscope.analysis.pipeline import ClusterSpec, analyze
    from rankscope.orchestrator.analyze import resolve_store

    store = resolve_store(path)
    return analyze(store, ClusterSpec(main_is_guarded=True))


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope compare``: 0, or EXIT_REGRESSION when the gate fails."""
    from rankscope.analysis.compare import compare, gate_checks
    from rankscope.analysis.kpis import kpis
    from rankscope.launchers import rundir
    from rich.console import Console

    compare_config, gate_config, kpi_config = configs(args)
    gated = gate_config.fail_above is not None or bool(gate_config.thresholds)
    if (args.base_runs or args.new_runs) and not gated:
        raise UsageError("--base-runs / --new-runs are for the gate: give --fail-above or --config")
    base, new = _analysis(args.base), _analysis(args.new)
    c = compare(base, new, compare_config, kpi_config)
    more_base = [kpis(_analysis(r), kpi_config) for r in args.base_runs]
    more_new = [kpis(_analysis(r), kpi_config) for r in args.new_runs]
    checks = gate_checks(c, gate_config, more_base, more_new) if gated else None
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    print_comparison(c, console, checks)
    outputs = [
        (args.json, lambda: json.dumps(to_json(c, checks, gate_config), indent=1) + "\n"),
        (args.html, lambda: render_html(c, checks)),
        (args.markdown, lambda: render_markdown(c, checks)),
    ]
    for path, render in outputs:
        if path is not None:
            rundir.write_bytes_atomic(path, render().encode())
            console.print(f"wrote {path}", highlight=False)
    return EXIT_REGRESSION if any(ch.failed for ch in checks or []) else 0
