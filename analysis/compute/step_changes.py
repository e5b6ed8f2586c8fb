"""Noticing, while a job runs, that its steps got slower for good — or that one rank drifts away.

Pure functions of the step log's series (numpy only; the live monitor of ``rankscope run``,
``orchestrator/live.py``, feeds them what it read and decides what to do):

* :func:`job_step_ms` — the job's step time per step: the median over the ranks of each rank's
  interval between two step ends (ms). Intervals, not end times: each rank's own clock, so
  clocks that differ between hosts do not matter.
* :func:`lasting_rise` — the change-point rule, for any series: the last :attr:`ChangeRule.window`
  values (more when steps are short: the window spans at least :attr:`ChangeRule.min_seconds`)
  against a robust baseline of the values before them (up to :attr:`ChangeRule.baseline_max`). The series' own noise sets the bar, never a fixed number of
  ms: the baseline's rolling medians of the same width give the null distribution of the
  statistic, so the bar follows the noise's size, its tails AND its memory (slow steps that come
  in bursts — a busy core's time slices, a periodic data-loader stall — make the rolling medians
  wander, and the bar rises with them). The recent median must clear the median of those
  rolling medians by :attr:`ChangeRule.z` of their robust spread (MAD-based, and never less than
  the spread independent noise of the baseline's size would give), must clear the highest of
  them (a level the steady run already reached is no change: bimodal steps and bursts of slow
  ones reach high rolling medians that a robust spread alone calls rare), must be at least
  :attr:`ChangeRule.min_rise` above the baseline (a change worth a profile), and the newest half
  of the window must agree (the rise lasts: a burst that already ended is none).
* :func:`detect_job_change` — the rule on log step times (a rise is a ratio).
* :func:`rank_behind_ms` / :func:`detect_rank_drift` — which rank the others wait for. In a
  synchronous job every rank's step ENDS at about the same time (the collectives wait for the
  slowest), so the drifting rank is the one that waits LEAST: with the step log's ``wait_ns``
  known, rank r is behind by ``median over ranks of wait − wait_r``; a rank whose lateness rises
  lastingly (:func:`lasting_rise`, the smallest rise in ms set from the job's step time) is
  drifting, and the one that rose most is named. Without the waits (DDP and FSDP wait in C++:
  docs/live.md) no cheap per-rank signal is left: the step ends line up, and how late a rank's
  end is against the others' is the scheduler's noise after the last collective (a real run on
  a loaded machine "drifted" 5–11 ms that way twice in 300 steps with no slow rank). Then no
  rank is named live; the profile of the change names it.
* :func:`host_delay_ms` / :func:`job_host_ms` / :func:`host_explains` /
  :func:`job_change_host` — whether the HOST caused a rise: per step, how long the ranks'
  training threads waited for a CPU (their run-queue delay from the step log, the largest over
  the ranks: any rank can hold a synchronous step up), plus the VM's stolen time (its fraction
  of the step); a rise whose series, less that share, does not itself rise for good (the same
  rule, on the window's median) is contention on the host, not the job — reported, never
  profiled (docs/live.md).
* :func:`live_figures` — what the live line shows: steps done, the job's p50 step time over the
  last N steps, throughput, the slowest rank and by how much.

Units: step times and lateness in ms (float), times in ns since the epoch (int64).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from rankscope.analysis.store import schema

#: Scale of the MAD to a normal distribution's standard deviation.
MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class ChangeRule:
    """How :func:`lasting_rise` decides that a series rose for good."""

    window: int = field(default=10)
    """Steps the new level must hold (the recent window): the detection's delay in steps, and
    its guard against a few slow steps (all but one of them must be above the bar: bimodal
    steps with 30 % slow ones fill 9 of 10 by chance once in ~7,000 windows)."""
    baseline_min: int = field(default=64)
    """Steps of baseline needed before anything is judged (8 windows: from fewer rolling
    medians, noise that drifts slowly looks steady and its next swing like a change)."""
    baseline_max: int = field(default=512)
    """Most steps of baseline kept (the newest before the window): old enough to hold the
    noise's bursts, recent enough to follow slow drifts."""
    z: float = field(default=5.0)
    """Robust standard deviations of the rolling medians the recent median must clear."""
    min_rise: float = field(default=0.1)
    """Smallest rise reported, as a fraction of the baseline step time (0.1: +10 %): a smaller
    lasting change is real but not worth a profile."""
    min_seconds: float = field(default=1.0)
    """Shortest time a rise must last (s of the baseline's steps), whatever the step count: the
    window (and the baseline sizes with it) grows to cover it when steps are short. A host's
    own transients — another process's burst of work on shared cores, writeback, a VM's stolen
    time — last a fraction of a second (0.2–0.7 s measured on this project's 2-core VM: 10
    slow steps of a 30 ms job, which the step count alone called lasting, 2 steady runs in 10);
    a fail-slow worth a profile (a throttled GPU, a degraded link, a slow shard) lasts minutes.
    Jobs of steps >= 100 ms are judged on 10 steps as before."""

    def sizes(self, step_ms: float) -> WindowSizes:
        """The window and baseline sizes (steps) for a job of ``step_ms`` steps (ms)."""
        window = self.window
        if step_ms > 0 and self.min_seconds > 0:
            window = max(window, math.ceil(self.min_seconds * 1e3 / step_ms))
        scale = window / self.window
        return WindowSizes(
            window=window,
            baseline_min=math.ceil(self.baseline_min * scale),
            baseline_max=math.ceil(self.baseline_max * scale),
        )


@dataclass(frozen=True)
class WindowSizes:
    """:class:`ChangeRule`'s sizes for one job's step time (:meth:`ChangeRule.sizes`): the
    baseline keeps its size in windows, so its noise estimate is as good for short steps."""

    window: int
    """Steps the new level must hold."""
    baseline_min: int
    """Steps of baseline needed before anything is judged."""
    baseline_max: int
    """Most steps of baseline kept."""


#: What changed (``kind`` of ``changes.jsonl``): the store's words (``schema.ChangeKind``).
ChangeKind = schema.ChangeKind


@dataclass(frozen=True)
class Rise:
    """A lasting rise found by :func:`lasting_rise` (in the series' own unit)."""

    before: float
    """The baseline's level (median)."""
    after: float
    """The recent window's level (median)."""
    bar: float
    """The level the recent median had to clear."""
    start: int
    """Index of the first value of the recent window above the bar (where the rise began)."""


@dataclass(frozen=True)
class JobChange:
    """The job's step time rose for good (:func:`detect_job_change`)."""

    before_ms: float
    after_ms: float
    start: int
    """Index (into the series given) where the slower steps began."""

    @property
    def rise(self) -> float:
        """The rise as a fraction of ``before_ms`` (0.5: +50 %)."""
        return self.after_ms / self.before_ms - 1.0


@dataclass(frozen=True)
class RankDrift:
    """One rank drifted behind the others (:func:`detect_rank_drift`)."""

    rank: int
    behind_ms: float
    """How much later than before it is now (ms per step: what the others wait more)."""
    before_ms: float
    """Its lateness (ms) in the baseline."""
    after_ms: float
    """Its lateness (ms) in the recent window."""


def _floor(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The statistic of a window of steps: its second-lowest value. A window's floor rises only
    when (all but one of) its steps are slower: a rise that lasts the whole window, not a few
    slow steps (bimodal steps, a burst); one fast step of noise does not hide a real rise."""
    return np.partition(x, 1, axis=axis).take(1, axis=axis)


def _median(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """A window's median (the statistic of :func:`host_explains`' residual)."""
    return np.asarray(np.median(x, axis=axis))


def lasting_rise(
    x: np.ndarray,
    rule: ChangeRule,
    min_effect: float,
    step_ms: float,
    stat: Callable[..., np.ndarray] = _floor,
) -> Rise | None:
    """Whether the last window of ``x`` rose for good above the values before them (module
    docstring); ``min_effect``: the smallest rise that counts, in ``x``'s unit; ``step_ms``: the
    job's step time, which sets the window's size (:meth:`ChangeRule.sizes`); ``stat``: the
    statistic of a window (its second-lowest value, :func:`_floor`, unless told).

    ``x`` must hold no NaN (leave out the steps that are not comparable, e.g. profiled ones).
    """
    sizes = rule.sizes(step_ms)
    w = sizes.window
    n = len(x)
    if n < w + sizes.baseline_min:
        return None
    base = x[max(0, n - w - sizes.baseline_max) : n - w]
    recent = x[n - w :]
    rolling = stat(np.lib.stride_tricks.sliding_window_view(base, w), axis=1)
    center = float(np.median(rolling))
    spread = MAD_TO_SD * float(np.median(np.abs(rolling - center)))
    base_sd = MAD_TO_SD * float(np.median(np.abs(base - np.median(base))))
    spread = max(spread, base_sd / math.sqrt(w))
    bar = max(center + rule.z * spread, float(rolling.max()), center + min_effect)
    level = float(stat(recent))
    if level <= bar:
        return None
    above = np.flatnonzero(recent > bar)
    return Rise(
        before=float(np.median(base)),
        after=float(np.median(recent)),
        bar=bar,
        start=n - w + int(above[0]),
    )


def job_step_ms(end_ns: np.ndarray) -> np.ndarray:
    """The job's step time per step (ms): ``end_ns`` is ranks × steps (each rank's end of the
    same steps, its own clock); each step's interval is the median over the ranks. One value
    fewer than steps."""
    if end_ns.shape[1] < 2:
        return np.zeros(0)
    intervals = np.diff(end_ns.astype(np.float64), axis=1) / 1e6
    return np.asarray(np.median(intervals, axis=0))


def detect_job_change(step_ms: np.ndarray, rule: ChangeRule) -> JobChange | None:
    """A lasting rise of the job's step time (``step_ms``, profiled steps left out): the rule
    on log step time, so the bar is relative to the step time."""
    positive = np.maximum(step_ms, 1e-6)
    typical = float(np.median(positive)) if positive.size else 0.0
    rise = lasting_rise(np.log(positive), rule, math.log1p(rule.min_rise), typical)
    if rise is None:
        return None
    return JobChange(
        before_ms=math.exp(rise.before), after_ms=math.exp(rise.after), start=rise.start
    )


def rank_behind_ms(wait_ns: np.ndarray) -> np.ndarray | None:
    """Each rank's lateness per step (ranks × steps, ms): ``median wait − the rank's wait`` (the
    others wait that much longer than it: it is that much behind). None unless every rank's
    ``wait_ns`` is known (>= 0) at every step."""
    if not wait_ns.size or not (wait_ns >= 0).all():
        return None
    w = wait_ns.astype(np.float64) / 1e6
    return np.asarray(np.median(w, axis=0) - w)


def detect_rank_drift(behind_ms: np.ndarray, job_ms: float, rule: ChangeRule) -> RankDrift | None:
    """The rank whose lateness (``behind_ms``, ranks × steps, profiled steps left out) rose for
    good by at least ``rule.min_rise`` of the job's step time ``job_ms``; the one that rose
    most when several did. None for fewer than 2 ranks."""
    if behind_ms.shape[0] < 2:
        return None
    best: RankDrift | None = None
    for rank in range(behind_ms.shape[0]):
        rise = lasting_rise(behind_ms[rank], rule, rule.min_rise * job_ms, job_ms)
        if rise is None:
            continue
        drift = RankDrift(
            rank=rank,
            behind_ms=rise.after - rise.before,
            before_ms=rise.before,
            after_ms=rise.after,
        )
        if best is None or drift.behind_ms > best.behind_ms:
            best = drift
    return best


def host_delay_ms(runq_ns: np.ndarray) -> np.ndarray | None:
    """How long each rank's training thread waited for a CPU per step (ranks × steps, ms): its
    run-queue delay, the time it was runnable while another task held the core (the step log's
    cumulative ``runq_ns``, ranks × (steps + 1): the record before the first step included, as
    for :func:`job_step_ms`). None unless every counter is known (>= 0) and never goes back."""
    if runq_ns.shape[1] < 2 or not (runq_ns >= 0).all():
        return None
    runq = np.diff(runq_ns.astype(np.float64), axis=1) / 1e6
    if (runq < 0).any():
        return None
    return np.asarray(runq)


def job_host_ms(delay_ms: np.ndarray) -> np.ndarray:
    """The run queue's share of the job's step time per step (ms): the LARGEST of the ranks'
    :func:`host_delay_ms`. In a synchronous job every collective waits for the slowest rank, so
    a delay of any one rank can hold up the step: the largest is the most the run queues can
    explain (a bound; which rank is critical is not known without the waits)."""
    return np.asarray(delay_ms.max(axis=0))


@dataclass(frozen=True)
class HostShare:
    """What the host's CPU contention explains of a rise (:func:`host_explains`)."""

    explained: bool
    """The rise, less the host's delays, is no lasting rise: contention on the host."""
    before_ms: float
    """The host's delay per step (ms, median) in the baseline."""
    after_ms: float
    """The host's delay per step (ms, median) in the recent window."""
    stolen_ms: float = 0.0
    """Of the rise, what the hypervisor's stolen time accounts for (ms per step)."""

    @property
    def rise_ms(self) -> float:
        """How much longer per step the job waited for a CPU (ms)."""
        return self.after_ms - self.before_ms


def host_explains(
    series_ms: np.ndarray, host_ms: np.ndarray, rule: ChangeRule, min_effect: float, step_ms: float
) -> HostShare:
    """Whether the host's CPU contention accounts for a rise of ``series_ms`` (the job's step
    time, or one rank's lateness; ms per step) found by the rule: ``host_ms`` is the host's
    share of each of those steps (ms). The series less the host's share must itself rise for
    good, by at least ``min_effect`` ms, for the rise to be the job's; otherwise the host
    explains it within the noise. The residual is judged by :func:`lasting_rise` with the
    window's MEDIAN (not its floor: a few steps with a large host delay are not allowed to hide
    a rise of the job in the others).

    Both series must hold the same steps (profiled ones left out of both); ``step_ms`` sets
    the window's size as for the rise itself."""
    sizes = rule.sizes(step_ms)
    n, w = len(series_ms), sizes.window
    base = host_ms[max(0, n - w - sizes.baseline_max) : n - w]
    recent = host_ms[n - w :]
    before = float(np.median(base)) if base.size else 0.0
    after = float(np.median(recent)) if recent.size else 0.0
    residual = lasting_rise(series_ms - host_ms, rule, min_effect, step_ms, stat=_median)
    return HostShare(explained=residual is None, before_ms=before, after_ms=after)


def job_change_host(
    step_ms: np.ndarray,
    runq_ms: np.ndarray,
    change: JobChange,
    rule: ChangeRule,
    steal: np.ndarray | None = None,
) -> HostShare:
    """:func:`host_explains` for a rise of the job's step time (``step_ms``, the series the
    change was found in; ``runq_ms``: :func:`job_host_ms` of the same steps): the part the host
    does not explain must be at least ``rule.min_rise`` of the step time before.

    ``steal``: per step, the fraction of the host's CPU time its hypervisor gave to other work
    (``/proc/stat``, when the ranks run on the host it was read on). A vCPU taken away for a
    fraction f of a step delays the step's work by about f of the step time (first order: the
    work of ``before_ms`` waits f × before_ms), on top of the run-queue delays (Linux counts
    the time stolen while a thread waits in its run queue in both: an upper bound)."""
    typical = float(np.median(step_ms)) if step_ms.size else 0.0
    host = runq_ms
    stolen = 0.0
    if steal is not None:
        lost = np.clip(np.asarray(steal, np.float64), 0.0, 1.0) * change.before_ms
        host = runq_ms + lost
        sizes = rule.sizes(typical)
        n, w = len(step_ms), sizes.window
        base = lost[max(0, n - w - sizes.baseline_max) : n - w]
        stolen = float(np.median(lost[n - w :]) - (np.median(base) if base.size else 0.0))
    share = host_explains(step_ms, host, rule, rule.min_rise * change.before_ms, typical)
    return HostShare(share.explained, share.before_ms, share.after_ms, stolen)


def drift_host(
    behind_ms: np.ndarray, delay_ms: np.ndarray, drift: RankDrift, job_ms: float, rule: ChangeRule
) -> HostShare:
    """:func:`host_explains` for one rank's drift (``behind_ms``, ``delay_ms``: ranks × steps,
    the same steps): the host's share of its lateness is how much longer it waited for a CPU
    than the median rank (the stolen time is the whole host's: it explains no one rank)."""
    own = delay_ms[drift.rank] - np.median(delay_ms, axis=0)
    return host_explains(behind_ms[drift.rank], own, rule, rule.min_rise * job_ms, job_ms)


@dataclass(frozen=True)
class LiveFigures:
    """What the live line says (:func:`live_figures`)."""

    steps: int
    """Steps every rank has done."""
    p50_ms: float | None
    """The job's median step time over the last steps (ms); None before two steps."""
    samples_per_s: float | None
    """Throughput of the job (samples per second, all ranks), when samples per step are known."""
    slowest_rank: int | None
    """The rank the others wait for most (None: no wait times, or one rank)."""
    slowest_by_ms: float | None
    """How much the others wait for it per step (ms, median over the last steps)."""


def live_figures(
    steps: int,
    end_ns: np.ndarray,
    wait_ns: np.ndarray,
    last: int,
    samples_per_step: float | None,
) -> LiveFigures:
    """The live line's figures from the newest ``last`` steps of every rank (``end_ns`` /
    ``wait_ns``: ranks × steps, the newest last); ``samples_per_step``: samples one rank does
    per step, when known (throughput = ranks × it / p50)."""
    end_ns, wait_ns = end_ns[:, -last:], wait_ns[:, -last:]
    job = job_step_ms(end_ns)
    p50 = float(np.median(job)) if job.size else None
    rate = None
    if p50 is not None and p50 > 0 and samples_per_step:
        rate = end_ns.shape[0] * samples_per_step / (p50 / 1e3)
    slowest = by = None
    behind = rank_behind_ms(wait_ns) if end_ns.shape[0] > 1 else None
    if behind is not None:
        typical = np.median(behind, axis=1)
        slowest = int(np.argmax(typical))
        by = float(typical[slowest])
    return LiveFigures(
        steps=steps, p50_ms=p50, samples_per_s=rate, slowest_rank=slowest, slowest_by_ms=by
    )
