"""The report's whole-run section (issue 30): the step time over every step of the run as one
inline SVG (markup in ``templates/report_sections.html.j2``, ``run_steps_section``), the
profiler windows and the live monitor's changes marked on it, and what changed in each
triggered window.

The plot draws the run's bins (``compute/step_series.py``, at most ``PLOT_BINS`` of them,
whatever the run's length: a run of 100,000 steps is 200 points a line): a band from the
fastest to the slowest rank's mean step time in each bin, the median rank's as a line, and the
job's mean step time in the bin as a darker line. Every step's time is in its bin's sums (none
is dropped to thin the plot); a bin's extremes are of the ranks' means in it, so a single slow
step shows as a rise of its bin's mean, not a spike.
"""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rankscope.analysis.compute.step_series import RunSteps

#: The plot's size and margins, px.
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 900, 240, 56, 12, 10, 32
#: Colours: the ranks' band, the median rank, the job, a scheduled / triggered window, a change.
BAND, MEDIAN, JOB = "#c6dbef", "#4c78a8", "#1f2430"
SCHEDULED, TRIGGERED, CHANGE = "#bab0ac", "#f58518", "#d62728"


def run_steps_svg(rs: RunSteps) -> str:
    """The SVG of the whole run's step time (module docstring); "" without a series."""
    bins = rs.bins
    if not len(bins) or not np.isfinite(bins["job_mean_ms"]).any():
        return ""
    first = int(bins["first_step"].iloc[0])
    last = int(bins["last_step"].iloc[-1])
    span = max(last - first + 1, 1)
    top_ms = float(np.nanmax(bins[["job_mean_ms", "max_ms"]].to_numpy(np.float64)))
    top_ms = top_ms * 1.1 if math.isfinite(top_ms) and top_ms > 0 else 1.0

    def x(step: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * (step - first) / span

    def y(ms: float) -> float:
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - ms / top_ms)

    mid = (bins["first_step"].to_numpy(np.float64) + bins["last_step"].to_numpy(np.float64) + 1) / 2
    out = [
        f"<svg width='{WIDTH}' height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}' role='img' "
        "aria-label='step time over the whole run'>"
    ]
    for k in range(5):
        ms = top_ms * k / 4
        out.append(
            f"<line x1='{LEFT}' x2='{WIDTH - RIGHT}' y1='{y(ms):.1f}' y2='{y(ms):.1f}' "
            "stroke='#eceef2'/>"
            f"<text x='{LEFT - 6}' y='{y(ms) + 4:.1f}' text-anchor='end' font-size='11' "
            f"fill='#667'>{ms:.3g}</text>"
        )
    for w in rs.windows.itertuples(index=False):
        colour = TRIGGERED if w.triggered else SCHEDULED
        what = f"triggered window {w.window}: {w.reason}" if w.triggered else f"window {w.window}"
        x0, x1 = x(int(w.first_step) - 0.5), x(int(w.last_step) + 0.5)
        out.append(
            f"<rect x='{x0:.1f}' y='{TOP}' width='{max(x1 - x0, 2):.1f}' "
            f"height='{HEIGHT - TOP - BOTTOM}' fill='{colour}' fill-opacity='0.35'>"
            f"<title>{escape(what)}, steps {int(w.first_step)}-{int(w.last_step)}</title></rect>"
        )
    band = bins[np.isfinite(bins["min_ms"].to_numpy(np.float64))]
    if len(band):
        bm = (
            band["first_step"].to_numpy(np.float64) + band["last_step"].to_numpy(np.float64) + 1
        ) / 2
        upper = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in zip(bm, band["max_ms"], strict=True))
        lower = " ".join(
            f"{x(s):.1f},{y(v):.1f}" for s, v in zip(bm[::-1], band["min_ms"][::-1], strict=True)
        )
        out.append(f"<polygon points='{upper} {lower}' fill='{BAND}' fill-opacity='0.8'/>")
        out.append(_line(bm, band["median_ms"].to_numpy(np.float64), x, y, MEDIAN, "1.2"))
    ok = np.isfinite(bins["job_mean_ms"].to_numpy(np.float64))
    out.append(_line(mid[ok], bins["job_mean_ms"].to_numpy(np.float64)[ok], x, y, JOB, "1.6"))
    for c in rs.changes.itertuples(index=False):
        cx = x(int(c.step))
        out.append(
            f"<line x1='{cx:.1f}' x2='{cx:.1f}' y1='{TOP}' y2='{HEIGHT - BOTTOM}' stroke='{CHANGE}' "
            f"stroke-dasharray='4 3' stroke-width='1.5'><title>{escape(str(c.sentence))}</title></line>"
        )
    out.append(
        f"<text x='12' y='{TOP + 10}' font-size='11' fill='#667' transform='rotate(-90 12 "
        f"{TOP + 10})' text-anchor='end'>ms per step</text>"
        f"<text x='{LEFT}' y='{HEIGHT - 10}' font-size='11' fill='#667'>step {first}</text>"
        f"<text x='{WIDTH - RIGHT}' y='{HEIGHT - 10}' text-anchor='end' font-size='11' "
        f"fill='#667'>step {last}</text></svg>"
    )
    return "".join(out)


def _line(xs: Any, ys: Any, x: Any, y: Any, colour: str, width: str) -> str:
    points = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in zip(xs, ys, strict=True))
    return f"<polyline points='{points}' fill='none' stroke='{colour}' stroke-width='{width}'/>"


def run_steps_view(rs: RunSteps, summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the template's ``run_steps_section`` takes (None without a series): the SVG, the
    KPI line, the bins' count, the windows and changes and what changed per triggered window."""
    from rankscope.analysis.conclude.run_steps import terminal_lines

    if summary is None:
        return None
    return {
        "svg": run_steps_svg(rs),
        "headline": terminal_lines(summary)[0],
        "bins": len(rs.bins),
        "legend": [
            {"colour": BAND, "label": "fastest to slowest rank (mean in the bin)"},
            {"colour": MEDIAN, "label": "median rank"},
            {"colour": JOB, "label": "job step time (mean in the bin)"},
            {"colour": SCHEDULED, "label": "profiler window"},
            {"colour": TRIGGERED, "label": "triggered window"},
            {"colour": CHANGE, "label": "change noticed"},
        ],
        "changes": [c["sentence"] for c in summary["changes"]],
        "what_changed": [w["sentence"] for w in summary["what_changed"]],
    }
