"""The whole run's steps for the reader (issue 30): the run's KPIs over every step with their
units, and, for each triggered profiler window, what changed against the window before it.

"What changed" uses the compare machinery (:func:`rankscope.analysis.conclude.compare.compare`)
on the one run cut in two: each side is the run's :class:`Analysis` restricted to one window's
steps (the breakdown, the collectives' waits, the memory peaks of those steps; the ops timed
from that window's events alone), so the comparison's KPI rows, op changes and per-rank rows
are those of ``rankscope compare`` between two runs. With a window's few steps the rank test
cannot call a change (docs/compare.md, "Few steps"): the section reports the sizes (the
Hodges–Lehmann shift of the step time, which rank's step time rose most, the ops whose time per
step grew most), never a verdict.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.ops import op_stats
from rankscope.analysis.compute.step_series import RunKpis, no_steps, run_kpis
from rankscope.analysis.conclude.compare_model import CompareConfig, OpChange
from rankscope.analysis.conclude.kpis import JOB_RANK, Kpi, _number, _recorded, rank_facts

if TYPE_CHECKING:
    from rankscope.analysis.conclude.compare_model import Comparison
    from rankscope.analysis.engine.driver import Analysis

#: Ranks and ops a "what changed" names at most (the largest changes first).
TOP_CHANGES = 3


def samples_per_step(a: Analysis) -> float | None:
    """One rank's samples per step for the whole run: the run's constant (``--samples-per-step``
    as recorded), when every rank that says one says the same; else None."""
    values = {f.samples_per_step for f in rank_facts(a).values() if f.samples_per_step}
    recorded = _number(_recorded(a, "samples_per_step"))
    if recorded:
        values.add(recorded)
    return values.pop() if len(values) == 1 else None


def whole_run_kpis(a: Analysis) -> RunKpis | None:
    """The run's KPIs over every step (None without step logs)."""
    if not a.run_steps.present:
        return None
    return run_kpis(a.run_steps, samples_per_step(a))


@dataclasses.dataclass(frozen=True)
class WindowChange:
    """What changed in a triggered window against the window before it."""

    window: int
    """The triggered window's index."""
    before: int
    """The window it is compared with (the one before it in step order)."""
    trigger: int
    """The trigger's id."""
    reason: str
    """Why it was triggered (the live monitor's words)."""
    first_step: int
    """The triggered window's steps (the step log's count)."""
    last_step: int
    before_ms: float
    """The job's step time in the window before (mean over its profiled steps and ranks), ms."""
    after_ms: float
    """The same in the triggered window, ms."""
    ranks: list[tuple[int, float, float]]
    """(rank, before ms, after ms) of the ranks whose own time per step (step time minus waiting
    for other ranks in collectives) rose most, largest rise first."""
    ops: list[tuple[str, str, float, float, int]]
    """(name, kind, before ms per step, after ms per step, the rank it changed most on) of the
    ops the comparison calls slower or new (moving the step by ``min_change`` or more), largest
    growth first."""
    comparison: Comparison | None = dataclasses.field(default=None, repr=False, compare=False)
    """The comparison behind it (``rankscope compare``'s model)."""

    @property
    def sentence(self) -> str:
        """One line for the terminal and the report."""
        rel = (self.after_ms / self.before_ms - 1) * 100 if self.before_ms > 0 else math.nan
        parts = [
            f"window {self.window} (triggered: {self.reason or 'a change'}) against window "
            f"{self.before}: step time {self.before_ms:.1f} → {self.after_ms:.1f} ms ({rel:+.0f} %)"
        ]
        if self.ranks:
            r, b, n = self.ranks[0]
            parts.append(
                f"rank {r}'s own time (its step minus waiting for other ranks) rose most: "
                f"{b:.1f} → {n:.1f} ms per step"
            )
        if not self.ops:
            least = (
                self.comparison.config.min_change if self.comparison else CompareConfig.min_change
            )
            parts.append(f"no op grew by {100 * least:g} % of the step or more")
        else:
            parts.append(
                "grown: "
                + ", ".join(
                    f"{name} {b:.2f} → {n:.2f} ms per step (rank {top} most)"
                    for name, _, b, n, top in self.ops
                )
            )
        return "; ".join(parts)


def _profiler_steps(first: int, last: int) -> set[int]:
    """The profiler step numbers (``ProfilerStep#N``) of the step log's steps first..last."""
    return set(range(first - 1, last))


def window_analysis(a: Analysis, window: int, steps: set[int], ops: pd.DataFrame) -> Analysis:
    """``a`` restricted to one profiler window: its steps' breakdown rows, memory peaks and
    ``ops`` (that window's op statistics); no whole-run series (it is one run)."""
    bd = a.breakdown
    keep = bd["step"].isin(steps) if len(bd) else pd.Series([], dtype=bool)
    memory = a.memory
    sp = memory.step_peaks
    if len(sp) and "step" in sp:
        memory = dataclasses.replace(memory, step_peaks=sp[sp["step"].isin(steps)])
    return dataclasses.replace(
        a, breakdown=bd[keep].reset_index(drop=True), op_stats=ops, memory=memory,
        run_steps=no_steps(),
    )  # fmt: skip


def window_ops(a: Analysis, windows: list[int]) -> dict[int, pd.DataFrame]:
    """Op statistics (ops.OP_STAT_COLUMNS) of each of ``windows``, every rank, from the
    store's events of that window alone."""
    from rankscope.analysis.store.reader import open_store

    frames: dict[int, list[pd.DataFrame]] = {w: [] for w in windows}
    with open_store(a.path) as store:
        for rank in store.ranks:
            events = store.events(rank)
            for w in windows:
                mine = events[events["window"].to_numpy() == w]
                if len(mine):
                    frames[w].append(op_stats(mine, rank))
    return {
        w: pd.concat(f, ignore_index=True) if f else a.op_stats.iloc[0:0] for w, f in frames.items()
    }


#: Stores whose "what changed" is kept in this process (the terminal, summary.json and the HTML
#: report each ask for it; it reads the triggered windows' events again).
CACHED_CHANGES = 4
_CHANGED: dict[tuple[str, int, int, int], list[WindowChange]] = {}


def what_changed(a: Analysis) -> list[WindowChange]:
    """For every triggered window with a window before it: what changed (module docstring)."""
    wins = a.run_steps.windows
    if not len(wins) or not wins["triggered"].any():
        return []
    try:
        stat = Path(a.path).stat()
        key = (str(a.path), stat.st_mtime_ns, stat.st_size, id(a))
    except OSError:
        return _what_changed(a)
    if key not in _CHANGED:
        while len(_CHANGED) >= CACHED_CHANGES:
            del _CHANGED[next(iter(_CHANGED))]
        _CHANGED[key] = _what_changed(a)
    return _CHANGED[key]


def _what_changed(a: Analysis) -> list[WindowChange]:
    from rankscope.analysis.conclude.compare import compare

    wins = a.run_steps.windows
    order = wins.reset_index(drop=True)
    pairs = [
        (order.iloc[i - 1], order.iloc[i]) for i in range(1, len(order)) if order["triggered"][i]
    ]
    if not pairs:
        return []
    ops = window_ops(a, sorted({int(w["window"]) for pair in pairs for w in pair}))
    out = []
    for before, after in pairs:
        wb, wa = int(before["window"]), int(after["window"])
        sb = _profiler_steps(int(before["first_step"]), int(before["last_step"]))
        sa = _profiler_steps(int(after["first_step"]), int(after["last_step"]))
        c = compare(window_analysis(a, wb, sb, ops[wb]), window_analysis(a, wa, sa, ops[wa]))
        out.append(
            WindowChange(
                window=wa,
                before=wb,
                trigger=int(after["trigger"]),
                reason=str(after["reason"]),
                first_step=int(after["first_step"]),
                last_step=int(after["last_step"]),
                before_ms=_mean_ms(c.base.values(Kpi.STEP_TIME)),
                after_ms=_mean_ms(c.new.values(Kpi.STEP_TIME)),
                ranks=_slower_ranks(c),
                ops=_grown_ops(c),
                comparison=c,
            )
        )
    return out


def _mean_ms(values: Any) -> float:
    v = np.asarray(values, np.float64)
    return float(v.mean()) * 1e3 if len(v) else math.nan


def _own_ms(k: Any, rank: int) -> float:
    """A rank's own time per step in one window, ms: its step time minus its waiting for other
    ranks in collectives (mean over the window's steps). In a synchronous job every rank's step
    time rises with the slowest rank's; only the slow rank's own time does."""
    step = _mean_ms(k.values(Kpi.STEP_TIME, rank))
    wait = _mean_ms(k.values(Kpi.WAIT, rank))
    return step - (wait if math.isfinite(wait) else 0.0)


def _slower_ranks(c: Comparison) -> list[tuple[int, float, float]]:
    rows = []
    for rank in sorted(set(c.base.ranks) & set(c.new.ranks)):
        if rank == JOB_RANK:
            continue
        b, n = _own_ms(c.base, rank), _own_ms(c.new, rank)
        if math.isfinite(b) and math.isfinite(n) and n > b:
            rows.append((rank, b, n))
    rows.sort(key=lambda r: -(r[2] - r[1]))
    return rows[:TOP_CHANGES]


def _grown_ops(c: Comparison) -> list[tuple[str, str, float, float, int]]:
    """The ops the comparison calls slower or new (their time per step moved the step by at
    least ``min_change``), largest growth first."""
    ops = c.ops
    if not len(ops):
        return []
    grown = ops[
        ops["change"].isin([str(OpChange.SLOWER), str(OpChange.APPEARED)]) & (ops["delta_s"] > 0)
    ].sort_values("delta_s", ascending=False, kind="mergesort")
    return [
        (str(r.name), str(r.kind), float(r.base_s) * 1e3, float(r.new_s) * 1e3, int(r.top_rank))
        for r in grown.head(TOP_CHANGES).itertuples(index=False)
    ]


def run_steps_summary(
    a: Analysis, changed: list[WindowChange] | None = None
) -> dict[str, Any] | None:
    """summary.json's ``run_steps`` (docs/summary.md): None without step logs."""
    k = whole_run_kpis(a)
    if k is None:
        return None
    rs = a.run_steps
    changed = what_changed(a) if changed is None else changed

    def num(x: float | None, digits: int = 3) -> float | None:
        return None if x is None or not math.isfinite(x) else round(float(x), digits)

    return {
        "steps": k.steps,
        "ranks": k.ranks,
        "definition": "the job's step time: the latest end of a step over the ranks minus the "
        "latest end of the step before, one sample per step of the whole run",
        "step_time_ms": {
            "p50": num(k.p50_ms),
            "p90": num(k.p90_ms),
            "p99": num(k.p99_ms),
            "mean": num(k.mean_ms),
        },
        "timed_s": num(k.timed_s),
        "steps_per_s": num(k.steps_per_s),
        "samples_per_s": num(k.samples_per_s),
        "spread_p50_ms": num(k.spread_p50_ms),
        "windows": [
            {
                "window": int(w.window),
                "first_step": int(w.first_step),
                "last_step": int(w.last_step),
                "triggered": bool(w.triggered),
                "trigger": int(w.trigger) if w.triggered else None,
                "reason": str(w.reason) if w.triggered else None,
            }
            for w in rs.windows.itertuples(index=False)
        ],
        "changes": [
            {
                "step": int(c.step),
                "kind": str(c.kind),
                "before_ms": num(c.before_ms),
                "after_ms": num(c.after_ms),
                "rank": int(c.rank) if int(c.rank) >= 0 else None,
                "sentence": str(c.sentence),
                "trigger": int(c.trigger) if int(c.trigger) >= 0 else None,
            }
            for c in rs.changes.itertuples(index=False)
        ],
        "what_changed": [
            {
                "window": w.window,
                "before": w.before,
                "trigger": w.trigger,
                "reason": w.reason,
                "step_time_before_ms": num(w.before_ms),
                "step_time_after_ms": num(w.after_ms),
                "ranks": [
                    {"rank": r, "before_ms": num(b), "after_ms": num(n)} for r, b, n in w.ranks
                ],
                "ops": [
                    {
                        "name": name,
                        "kind": kind,
                        "before_ms_per_step": num(b, 4),
                        "after_ms_per_step": num(n, 4),
                        "top_rank": top,
                    }
                    for name, kind, b, n, top in w.ops
                ],
                "sentence": w.sentence,
            }
            for w in changed
        ],
    }


def terminal_lines(summary: dict[str, Any] | None) -> list[str]:
    """The whole run's step time in 1-2 lines (and one per triggered window's change)."""
    if summary is None:
        return []
    t = summary["step_time_ms"]
    wins = summary["windows"]
    triggered = sum(w["triggered"] for w in wins)
    rate = f", {summary['steps_per_s']:g} steps/s" if summary["steps_per_s"] else ""
    thr = f", {summary['samples_per_s']:g} samples/s" if summary["samples_per_s"] else ""
    lines = [
        f"whole run: {summary['steps']} steps timed on {summary['ranks']} rank(s): step time p50 "
        f"{t['p50']:g} ms, p90 {t['p90']:g} ms, p99 {t['p99']:g} ms{rate}{thr}",
    ]
    if summary["changes"] or wins:
        lines.append(
            f"  {len(summary['changes'])} change(s) noticed while it ran; {len(wins)} profiler "
            f"window(s), {triggered} triggered"
        )
    lines += [f"  {w['sentence']}" for w in summary["what_changed"]]
    return lines
