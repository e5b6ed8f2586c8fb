"""Time in the unit that fits the span: the timeline's and the overview's x axis, hover, status.

The plots' x values stay **ms since an origin** (float64: Bokeh's number type; epoch ns would not
be exact). What changes with the zoom is how they are *written*: the unit is the largest one of
:data:`UNITS` of which the visible span holds at least ``min_span`` (ns below 2 µs, µs below
2 ms, ms below 2 s, s below 10 min, min below 2 h, then ``h:mm:ss``), so a 34-minute run reads
``0 min … 30 min``, never ``0.000e+0 … 2.000e+6 ms``, and a 300 µs window ``0 µs … 300 µs``.

The same table drives Python (:func:`unit_for_span`, :func:`format_time`: the hover columns, the
status lines) and the browser (:func:`time_axis`: a Bokeh ``CustomJSTickFormatter`` generated from
:data:`UNITS`, which reads the plot's x range on every redraw, so the axis follows a zoom at once
and the hover, re-rendered for the new range, agrees with it). Ticks fall on round values of
the unit (:func:`time_ticker`: 1-2-5 below a second, 1, 2, 5, 10, 15, 20, 30 s or min, 1 … 12 h).

Pure functions except :func:`time_axis` and :func:`time_ticker` (Bokeh models, imported inside).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class TimeUnit:
    """A unit to write times in."""

    name: str
    """Suffix written after a value ("ms"), or ``h:mm:ss`` (then no suffix: ``1:05:00``)."""
    ns: int
    """Nanoseconds in one unit."""
    min_span: float
    """The unit is used for spans of at least this many units (and below the next unit's)."""
    hover_decimals: int
    """Decimals of a start time in the hover (about 1 µs resolution; 1 ns for ns and µs)."""


#: The units, smallest first.
UNITS: tuple[TimeUnit, ...] = (
    TimeUnit("ns", 1, 0.0, 0),
    TimeUnit("µs", 1_000, 2.0, 3),
    TimeUnit("ms", 1_000_000, 2.0, 3),
    TimeUnit("s", 1_000_000_000, 2.0, 6),
    TimeUnit("min", 60_000_000_000, 10.0, 6),
    TimeUnit("h:mm:ss", 3_600_000_000_000, 2.0, 6),
)
#: The clock unit (``h:mm:ss``).
CLOCK = UNITS[-1]


def unit_for_span(span_ns: float) -> TimeUnit:
    """The unit to write times of a view ``span_ns`` wide in (see the module docstring)."""
    span = abs(float(span_ns))
    chosen = UNITS[0]
    for unit in UNITS:
        if span >= unit.min_span * unit.ns:
            chosen = unit
    return chosen


def _clock(ns: float, decimals: int) -> str:
    """``h:mm:ss`` (with ``decimals`` fractional digits of the seconds), sign in front."""
    sign = "-" if ns < 0 else ""
    total_s = round(abs(ns) / 1e9, decimals)
    h, rest = divmod(total_s, 3600)
    m, s = divmod(rest, 60)
    width = 2 + (decimals + 1 if decimals else 0)
    return f"{sign}{int(h)}:{int(m):02d}:{s:0{width}.{decimals}f}"


def format_time(ns: float, unit: TimeUnit, decimals: int | None = None) -> str:
    """``ns`` written in ``unit`` with ``decimals`` digits (default: the unit's hover precision):
    ``1,234.567 ms``, ``12.5 min``, ``1:05:00``."""
    d = unit.hover_decimals if decimals is None else decimals
    if unit.name == CLOCK.name:
        return _clock(ns, d)
    return f"{ns / unit.ns:,.{d}f} {unit.name}"


def format_duration(ns: float) -> str:
    """A duration in the unit that fits it, 3 significant decimals (``12.345 µs``, ``1.200 s``);
    durations from a minute up in ``h:mm:ss``."""
    unit = UNITS[0]
    for u in UNITS:
        if abs(ns) >= u.ns and u.name != "min":
            unit = u
    if unit.name == CLOCK.name or abs(ns) >= 60 * 1e9:
        return _clock(ns, 3)
    return f"{ns / unit.ns:,.{0 if unit.name == 'ns' else 3}f} {unit.name}"


def format_short(ns: float) -> str:
    """A width to 3 significant digits in the unit that fits it, trailing zeros dropped
    (``1.2 ms``, ``144 µs``, ``5.57 s``, ``2.5 min``): bin and pixel sizes in titles."""
    unit = UNITS[0]
    for u in UNITS[:-1]:
        if abs(ns) >= u.ns:
            unit = u
    v = ns / unit.ns
    if not v:
        return "0 ns"
    text = f"{v:,.{max(0, 2 - math.floor(math.log10(abs(v))))}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + f" {unit.name}"


def format_times(ns: Any, unit: TimeUnit) -> list[str]:
    """:func:`format_time` of each value of an array (the hover column of a render)."""
    return [format_time(float(v), unit) for v in ns]


def format_durations(ns: Any) -> list[str]:
    """:func:`format_duration` of each value of an array."""
    return [format_duration(float(v)) for v in ns]


def format_range(lo_ns: float, hi_ns: float, unit: TimeUnit | None = None) -> str:
    """A span ``lo``–``hi`` (ns since an origin) in ``unit`` (default: the unit that fits its
    width), with enough decimals to give its width to 3 digits: ``1.20–1.35 s``."""
    unit = unit_for_span(hi_ns - lo_ns) if unit is None else unit
    clock = unit.name == CLOCK.name
    width = max(abs(hi_ns - lo_ns), 1.0) / (1e9 if clock else unit.ns)
    d = min(max(0, 2 - math.floor(math.log10(width))), 6)
    if clock:
        return f"{_clock(lo_ns, d)}–{_clock(hi_ns, d)}"
    return f"{lo_ns / unit.ns:,.{d}f}–{hi_ns / unit.ns:,.{d}f} {unit.name}"


def tick_decimals(step_in_unit: float) -> int:
    """Fewest decimals (≤ 6) that write ticks ``step_in_unit`` apart exactly (0.25 → 2)."""
    for d in range(7):
        scaled = abs(step_in_unit) * 10**d
        if abs(scaled - round(scaled)) < 1e-6 * max(scaled, 1.0):
            return d
    return 6


def tick_labels(ticks_ms: list[float], span_ms: float) -> list[str]:
    """What the axis writes at ``ticks_ms`` (ms) for a visible span of ``span_ms``: Python's
    copy of the browser's formatter (:data:`TICK_JS`), used to test it and to document it."""
    unit = unit_for_span(span_ms * NS_PER_MS)
    step = abs(ticks_ms[1] - ticks_ms[0]) if len(ticks_ms) > 1 else abs(span_ms) or 1.0
    d = tick_decimals(step * NS_PER_MS / unit.ns)
    if unit.name == CLOCK.name:
        return [_clock(t * NS_PER_MS, min(d, 3) if step < 1000 else 0) for t in ticks_ms]
    return [f"{t * NS_PER_MS / unit.ns:,.{d}f} {unit.name}" for t in ticks_ms]


def tick_js() -> str:
    """The body of the axis' ``CustomJSTickFormatter`` (variables ``tick``, ``ticks``, ``xr``):
    the same choice as :func:`tick_labels`, with the units of :data:`UNITS`."""
    table = ", ".join(f"['{u.name}', {u.ns}, {u.min_span}]" for u in UNITS)
    return f"""
const units = [{table}];
const span_ns = Math.abs(xr.end - xr.start) * {NS_PER_MS};
let u = units[0];
for (const c of units) {{ if (span_ns >= c[2] * c[1]) {{ u = c; }} }}
const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : (Math.abs(xr.end - xr.start) || 1);
const inUnit = step * {NS_PER_MS} / u[1];
let d = 6;
for (let k = 0; k <= 6; k++) {{
  const s = inUnit * Math.pow(10, k);
  if (Math.abs(s - Math.round(s)) < 1e-6 * Math.max(s, 1)) {{ d = k; break; }}
}}
if (u[0] === 'h:mm:ss') {{
  const dd = step < 1000 ? Math.min(d, 3) : 0;
  const ns = tick * {NS_PER_MS};
  const sign = ns < 0 ? '-' : '';
  const total = Math.round(Math.abs(ns) / 1e9 * Math.pow(10, dd)) / Math.pow(10, dd);
  const h = Math.floor(total / 3600), m = Math.floor((total - 3600 * h) / 60);
  const s = total - 3600 * h - 60 * m;
  const ss = s.toFixed(dd).padStart(dd ? 3 + dd : 2, '0');
  return sign + h + ':' + String(m).padStart(2, '0') + ':' + ss;
}}
const v = tick * {NS_PER_MS} / u[1];
return v.toLocaleString('en-US', {{minimumFractionDigits: d, maximumFractionDigits: d}}) + ' ' + u[0];
"""


def time_ticker() -> Any:
    """Bokeh ticker for an x axis in ms: round values of the unit the span is written in
    (1-2-5 × 10^k below 500 ms; 1, 2, 5, 10, 15, 20, 30 s or min; 1, 2, 3, 4, 6, 8, 12 h;
    1-2-5 × 10^k days)."""
    from bokeh.models import AdaptiveTicker, CompositeTicker

    # AdaptiveTicker: interval = mantissa · base^k · min_interval (min_interval: the unit)
    s, hour, day = 1000.0, 3_600_000.0, 86_400_000.0
    sexagesimal = [1, 2, 5, 10, 15, 20, 30]
    seconds = [*sexagesimal, *(60 * m for m in sexagesimal)]  # 1 s … 30 min, in s
    return CompositeTicker(
        tickers=[
            AdaptiveTicker(mantissas=[1, 2, 5], base=10, min_interval=0, max_interval=500.0),
            AdaptiveTicker(mantissas=seconds, base=3600, min_interval=s, max_interval=1800 * s),
            AdaptiveTicker(
                mantissas=[1, 2, 3, 4, 6, 8, 12], base=24, min_interval=hour, max_interval=12 * hour
            ),
            AdaptiveTicker(mantissas=[1, 2, 5], base=10, min_interval=day),
        ]
    )


def time_axis(plot: Any, element: Any) -> None:
    """Bokeh hook: the x axis (ms since an origin) written in the unit that fits the visible
    span, with ticks on round values of it; re-chosen by the browser at every zoom."""
    from bokeh.models import CustomJSTickFormatter

    fig = plot.state
    for axis in fig.xaxis:
        axis.ticker = time_ticker()
        axis.formatter = CustomJSTickFormatter(args={"xr": fig.x_range}, code=tick_js())
