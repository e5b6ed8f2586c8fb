"""The memory part of the three renderings (``report.py``): summary.json's ``memory``, the
terminal's Memory section, the HTML report's memory section (its rows and figure here, its markup
in ``templates/memory.html.j2``).

Only renders :class:`rankscope.analysis.compute.memory.MemoryAnalysis` and the memory findings
(``memory_findings.memory_findings``, worded once). A store without memory events renders nothing
(summary.json has no ``memory`` key), unless the run asked for memory (``--profile-memory``):
then the section holds the "no memory events" finding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankscope.analysis.conclude.findings import MEMORY_KINDS, Finding

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.compute.memory import MemoryAnalysis
    from rich.console import Console

#: Above this many (rank, device) rows the terminal shows the flagged ranks, the largest peaks
#: and the distribution of the peaks instead of one row each.
TERMINAL_ROWS = 16
#: Rows of the largest peaks shown besides the flagged ranks in the compact terminal table.
TERMINAL_TOP = 4
#: Ranks drawn as their own line in the HTML figure; more are drawn as a min–max band.
FIGURE_LINES = 16
MiB = 2**20


def _mib(nbytes: float) -> str:
    return f"{nbytes / MiB:.1f}"


def _device(row: Any) -> str:
    from rankscope.analysis.compute.memory import device_name

    return device_name(int(row["device_type"]), int(row["device_id"]))


def per_device(m: MemoryAnalysis) -> pd.DataFrame:
    """One row per (rank, device): the peaks with the leak, imbalance, headroom and top holder
    columns beside them (NaN / None where a result has no row)."""
    import pandas as pd
    from rankscope.analysis.compute.memory import DEVICE_KEY

    out = m.peaks.copy()
    if not len(out):
        return out
    if len(m.leaks):
        lk = m.leaks[[*DEVICE_KEY, "slope_bytes_per_step", "p_value", "is_leak"]]
        out = out.merge(lk, on=DEVICE_KEY, how="left")
    else:
        out = out.assign(slope_bytes_per_step=float("nan"), p_value=float("nan"), is_leak=False)
    if len(m.imbalance):
        imb = m.imbalance[[*DEVICE_KEY, "excess_bytes", "is_imbalanced"]]
        out = out.merge(imb, on=DEVICE_KEY, how="left")
    else:
        out = out.assign(excess_bytes=float("nan"), is_imbalanced=False)
    if len(m.headroom):
        hr = m.headroom[[*DEVICE_KEY, "total_bytes", "headroom_bytes", "headroom_share", "is_low"]]
        out = out.merge(hr, on=DEVICE_KEY, how="left")
    else:
        out = out.assign(
            total_bytes=float("nan"),
            headroom_bytes=float("nan"),
            headroom_share=float("nan"),
            is_low=False,
        )
    h = m.holders
    seen = h[h["allocations"] > 0] if len(h) else h
    if len(seen):
        top = seen.sort_values("bytes", ascending=False, kind="stable").drop_duplicates(DEVICE_KEY)
        top = top[[*DEVICE_KEY, "op", "scope", "bytes", "share"]].rename(
            columns={
                "op": "top_op",
                "scope": "top_scope",
                "bytes": "top_bytes",
                "share": "top_share",
            }
        )
        out = out.merge(top, on=DEVICE_KEY, how="left")
    else:
        out = out.assign(
            top_op=None, top_scope=None, top_bytes=float("nan"), top_share=float("nan")
        )
    for col in ("is_leak", "is_imbalanced", "is_low"):
        out[col] = out[col].astype("boolean").fillna(False).astype(bool)
    out["flagged"] = out["is_leak"] | out["is_imbalanced"] | out["is_low"]
    return pd.DataFrame(out).reset_index(drop=True)


def _num(x: Any, digits: int | None = None) -> Any:
    """A JSON number, or None for NaN / missing."""
    import math

    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    return round(v, digits) if digits is not None else v


def _int(x: Any) -> int | None:
    v = _num(x)
    return None if v is None else int(v)


def memory_summary(m: MemoryAnalysis) -> dict[str, Any] | None:
    """summary.json's ``memory`` object (docs/summary.md); None without memory events (the key
    is then absent)."""
    if not m.has_events:
        return None
    devices = []
    for _, r in per_device(m).iterrows():
        top = None
        if isinstance(r.get("top_op"), str):
            top = {
                "op": r["top_op"],
                "scope": r["top_scope"],
                "bytes": _int(r["top_bytes"]),
                "share": _num(r["top_share"], 4),
            }
        devices.append(
            {
                "rank": int(r["rank"]),
                "device": _device(r),
                "events": int(r["events"]),
                "peak_allocated_bytes": int(r["peak_allocated"]),
                "peak_allocated_step": int(r["peak_allocated_step"]),
                "peak_reserved_bytes": int(r["peak_reserved"]),
                "total_bytes": _int(r["total_bytes"]),
                "headroom_bytes": _int(r["headroom_bytes"]),
                "headroom_share": _num(r["headroom_share"], 4),
                "leak_bytes_per_step": _num(r["slope_bytes_per_step"], 1),
                "leak_p_value": _num(r["p_value"]),
                "is_leak": bool(r["is_leak"]),
                "excess_bytes": _num(r["excess_bytes"], 1),
                "is_imbalanced": bool(r["is_imbalanced"]),
                "low_headroom": bool(r["is_low"]),
                "top_holder": top,
            }
        )
    sp = m.step_peaks
    steps = [
        {
            "rank": int(s["rank"]),
            "device": _device(s),
            "step": int(s["step"]),
            "start_allocated_bytes": int(s["start_allocated"]),
            "peak_allocated_bytes": int(s["peak_allocated"]),
            "peak_reserved_bytes": int(s["peak_reserved"]),
        }
        for _, s in sp.iterrows()
    ]
    return {"devices": devices, "steps": steps}


# -- terminal --------------------------------------------------------------------------------


def print_memory(m: MemoryAnalysis, found: list[Finding], console: Console, markup: Any) -> None:
    """The terminal's Memory section: per-rank peak, headroom, leak, top holder (compact with
    many ranks: the flagged ranks, the largest peaks and the distribution), then the memory
    findings. Nothing when the store has no memory events and the run did not ask for them."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    mine = [f for f in found if f.kind in MEMORY_KINDS]
    if not m.has_events:
        if m.requested:
            console.print("[bold]Memory[/bold]")
            for f in mine:
                console.print(markup(f))
        return
    rows = per_device(m)
    shown = rows
    compact = len(rows) > TERMINAL_ROWS
    if compact:
        top = rows.sort_values("peak_allocated", ascending=False, kind="stable").head(TERMINAL_TOP)
        keep = rows["flagged"] | rows.index.isin(top.index)
        shown = rows[keep]
    title = "Memory (peak per rank and device, MiB)"
    if compact:
        title += f": {len(shown)} of {len(rows)} rows (flagged ranks and the largest peaks)"
    t = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for col in ("rank", "device", "peak alloc", "peak rsvd", "headroom", "leak/step", "top holder"):
        t.add_column(col, justify="left" if col in ("device", "top holder") else "right")
    for _, r in shown.iterrows():
        head = "-"
        if r["headroom_share"] == r["headroom_share"] and r["headroom_share"] is not None:
            head = f"{_mib(r['headroom_bytes'])} ({r['headroom_share']:.0%})"
        leak = "-"
        if r["slope_bytes_per_step"] == r["slope_bytes_per_step"]:
            leak = _mib(r["slope_bytes_per_step"]) + (" leak" if r["is_leak"] else "")
        holder = "-"
        if isinstance(r.get("top_op"), str):
            holder = f"{r['top_op'] or 'no op'} {r['top_share']:.0%}"
        style = "red" if r["flagged"] else None
        t.add_row(
            str(int(r["rank"])),
            _device(r),
            _mib(r["peak_allocated"]),
            _mib(r["peak_reserved"]),
            head,
            leak,
            escape(holder),
            style=style,
        )
    console.print(t)
    if compact:
        q = rows["peak_allocated"].quantile([0, 0.5, 0.9, 1.0]).to_numpy()
        console.print(
            f"[dim]peak allocated over {len(rows)} (rank, device) rows: min {_mib(q[0])}, "
            f"median {_mib(q[1])}, p90 {_mib(q[2])}, max {_mib(q[3])} MiB[/dim]"
        )
    for f in mine:
        console.print(markup(f))


# -- HTML --------------------------------------------------------------------------------------

_PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]


def memory_svg(m: MemoryAnalysis, flagged: set[int]) -> str:
    """Allocated memory per rank over time (aligned clock), one line per (rank, device) — its
    binned maximum (``memory.memory_series``: the peak survives the binning) — or, with more
    than :data:`FIGURE_LINES` of them, the flagged ranks as lines over a grey band from the
    lowest to the highest of the others, bin by bin."""
    import numpy as np

    s = m.series
    if not len(s):
        return ""
    width, height, left, bottom, top, right = 900, 240, 64, 30, 10, 120
    t0, t1 = int(s["t_start"].min()), int(s["t_end"].max())
    span = max(t1 - t0, 1)
    ymax = max(float(s["allocated_max"].max()), 1.0)
    pw, ph = width - left - right, height - top - bottom

    def xp(t: Any) -> Any:
        return left + (np.asarray(t, np.float64) - t0) / span * pw

    def yp(v: Any) -> Any:
        return top + ph * (1 - np.asarray(v, np.float64) / ymax)

    parts = [
        f"<svg width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img' "
        "aria-label='allocated memory per rank over time'>",
        f"<line x1='{left}' y1='{top + ph}' x2='{left + pw}' y2='{top + ph}' stroke='#99a'/>",
        f"<text x='{left - 6}' y='{top + 10}' text-anchor='end' font-size='11'>"
        f"{_mib(ymax)} MiB</text>",
        f"<text x='{left - 6}' y='{top + ph}' text-anchor='end' font-size='11'>0</text>",
        f"<text x='{left + pw}' y='{height - 8}' text-anchor='end' font-size='11'>"
        f"{span / 1e9:.2f} s</text>",
    ]
    keys = list(s.groupby(["rank", "device_type", "device_id"], sort=True).groups)
    lines = keys if len(keys) <= FIGURE_LINES else [k for k in keys if int(k[0]) in flagged]
    banded = [k for k in keys if k not in lines]
    if banded:
        grid = np.linspace(t0, t1, 301)
        rest = s[s.set_index(["rank", "device_type", "device_id"]).index.isin(banded)]
        b = np.clip(
            np.searchsorted(grid, rest["t_start"].to_numpy(np.float64), "right") - 1, 0, 299
        )
        g = rest.assign(bin=b).groupby("bin")["allocated_max"]
        lo, hi = g.min(), g.max()
        xs = xp(grid[lo.index.to_numpy()])
        upper = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, yp(hi.to_numpy()), strict=True))
        lower = " ".join(
            f"{x:.1f},{y:.1f}" for x, y in zip(xs[::-1], yp(lo.to_numpy())[::-1], strict=True)
        )
        parts.append(
            f"<polygon points='{upper} {lower}' fill='#ccd' stroke='none'>"
            f"<title>{len(banded)} other (rank, device) series: lowest to highest</title></polygon>"
        )
    for i, key in enumerate(lines):
        d = s[(s["rank"] == key[0]) & (s["device_type"] == key[1]) & (s["device_id"] == key[2])]
        pts = " ".join(
            f"{x:.1f},{y:.1f}"
            for x, y in zip(xp(d["t_start"]), yp(d["allocated_max"].to_numpy()), strict=True)
        )
        colour = "#c0392b" if int(key[0]) in flagged and len(keys) > len(lines) else None
        colour = colour or _PALETTE[i % len(_PALETTE)]
        label = f"rank {int(key[0])}"
        parts.append(
            f"<polyline points='{pts}' fill='none' stroke='{colour}' stroke-width='1.5'>"
            f"<title>{label}: peak {_mib(d['allocated_max'].max())} MiB</title></polyline>"
        )
        parts.append(
            f"<text x='{left + pw + 6}' y='{top + 12 + 13 * i}' font-size='11' "
            f"fill='{colour}'>{label}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def memory_view(m: MemoryAnalysis, found: list[Finding]) -> dict[str, Any] | None:
    """What the HTML report's memory section (``templates/memory.html.j2``) shows; None when it
    has nothing to say (see the module)."""
    from rankscope.analysis.render.templating import finding, markup

    mine = [finding(f) for f in found if f.kind in MEMORY_KINDS]
    if not m.has_events:
        return {"has_events": False, "findings": mine} if m.requested else None
    rows = per_device(m)
    flagged = {int(r) for r in rows.loc[rows["flagged"], "rank"]}
    body = []
    for _, r in rows.iterrows():
        holder = ""
        if isinstance(r.get("top_op"), str):
            holder = f"{r['top_op'] or 'no op'} ({r['top_scope']}) {r['top_share']:.0%}"
        head = "-"
        if r["headroom_share"] == r["headroom_share"] and r["headroom_share"] is not None:
            head = f"{_mib(r['headroom_bytes'])} ({r['headroom_share']:.0%})"
        leak = "-"
        if r["slope_bytes_per_step"] == r["slope_bytes_per_step"]:
            leak = _mib(r["slope_bytes_per_step"]) + (" leak" if r["is_leak"] else "")
        cells = [
            int(r["rank"]),
            _device(r),
            _mib(r["peak_allocated"]),
            int(r["peak_allocated_step"]),
            _mib(r["peak_reserved"]),
            head,
            leak,
            holder,
        ]
        body.append({"bad": bool(r["flagged"]), "cells": cells})
    headers = ["rank", "device", "peak allocated MiB", "at step", "peak reserved MiB"]
    headers += ["headroom MiB", "leak MiB/step", "top holder at the peak"]
    return {
        "has_events": True,
        "findings": mine,
        "svg": markup(memory_svg(m, flagged)),
        "bins": int(m.series.groupby(["rank", "device_type", "device_id"]).size().max()),
        "banded_above": FIGURE_LINES if len(rows) > FIGURE_LINES else None,
        "headers": headers,
        "left": [1, 7],
        "rows": body,
    }
