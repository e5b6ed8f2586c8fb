"""The HTML report's charts, drawn as inline SVG (no script, nothing fetched): the per-rank (or
per-host) time bars and the arrival lateness per collective; and the figures of the step-time
grid, whose markup is the ``steps_table`` macro of ``templates/report_sections.html.j2``.

Separate from ``html_report.py``, which computes the report's other sections, because these are
the drawing code (coordinates in px; times come in ns and are labelled in ms). The charts stay
SVG strings built here and reach the page template as ``Markup``: a template of coordinates
would hold the same code in a worse language.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.engine.driver import Analysis

#: Categories of the per-rank bars: (breakdown column, label, colour).
BAR_PARTS = (
    ("compute_ns", "compute", "#4c78a8"),
    ("comm_exposed_ns", "comm exposed", "#e45756"),
    ("memory_ns", "memory", "#72b7b2"),
    ("input_ns_part", "input", "#f2cf5b"),
    ("other_ns", "other", "#b279a2"),
    ("idle_ns_part", "idle / host", "#d8d8d8"),
)
#: With more hosts than this, the HTML's per-host bars keep the flagged and worst hosts and add
#: up the others in one bar.
MANY_HOSTS = 16
#: Hosts kept per "worst" criterion (most exposed communication, most time).
WORST_HOSTS = 3


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


def steps_table(
    a: Analysis, max_steps: int = 40, ranks: set[int] | None = None
) -> dict[str, Any] | None:
    """Step time per rank and step (ms) and each cell's shade (its exposed-communication
    share), for the ``steps_table`` macro (``templates/report_sections.html.j2``); None without
    a ProfilerStep.

    ``ranks``: list only these ranks, after two rows that aggregate every rank per step (the
    median and the max step time) — many ranks are summarised, not dropped."""
    st = a.breakdown[a.breakdown["step"] >= 0]
    if len(st) == 0:
        return None
    steps = sorted(st["step"].unique())[:max_steps]
    aggregates = []
    if ranks is not None:
        per_step = st.groupby("step")["total_ns"]
        med, mx = per_step.median(), per_step.max()
        aggregates = [
            {
                "label": f"{label} of {st['rank'].nunique()} ranks",
                "cells": [f"{float(series.get(s, float('nan'))) / 1e6:.1f}" for s in steps],
            }
            for label, series in (("median", med), ("max", mx))
        ]
    ranks_listed = sorted(st["rank"].unique())
    if ranks is not None:
        ranks_listed = [r for r in ranks_listed if int(r) in ranks]
    cell = {(int(r.rank), int(r.step)): r for r in st.itertuples(index=False)}
    rows = []
    for rank in ranks_listed:
        cells: list[dict[str, str] | None] = []
        for step in steps:
            r = cell.get((int(rank), int(step)))
            if r is None:
                cells.append(None)
                continue
            share = r.comm_exposed_ns / r.total_ns if r.total_ns > 0 else 0.0
            tip = (
                f"rank {int(rank)} step {int(step)}: {r.total_ns / 1e6:.2f} ms, compute "
                f"{r.compute_ns / 1e6:.2f} ms, exposed comm {r.comm_exposed_ns / 1e6:.2f} ms, "
                f"input {r.input_ns / 1e6:.2f} ms, idle {r.idle_ns / 1e6:.2f} ms"
            )
            cells.append(
                {"tip": tip, "alpha": f"{0.08 + 0.6 * share:.2f}", "ms": f"{r.total_ns / 1e6:.1f}"}
            )
        rows.append({"rank": int(rank), "cells": cells})
    return {"steps": [int(s) for s in steps], "aggregates": aggregates, "rows": rows}
