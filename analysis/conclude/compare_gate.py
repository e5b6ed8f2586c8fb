"""The CI gate of ``rankscope compare``: whether a gated KPI of the job is worse than its
threshold, decided per KPI (:class:`GateCheck`) by the rule the samples allow (:class:`GateRule`).

The method (one-sided Welch t on per-step job means, t on run means with replicate runs, the
threshold alone below MIN_SAMPLES steps, Holm over the gate's family at ``GateConfig.alpha``) is
"The gate's test" in :mod:`rankscope.analysis.conclude.compare`'s docstring and in docs/compare.md.
Separate from the comparison table because it asks another question of another family, with its
own level and its own words (``--fail-above``, ``--threshold``); it reads a finished
:class:`~rankscope.analysis.conclude.compare_model.Comparison` and never changes it. Only the
command's work imports it, never its parser: numpy is imported at the top.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from rankscope.analysis.compute.statistics import holm, runs_exceed, welch_exceeds
from rankscope.analysis.conclude.compare_model import (
    HEADLINE_KPIS,
    MIN_SAMPLES,
    CompareFinding,
    CompareKind,
    GateConfig,
    _pct,
)
from rankscope.analysis.conclude.kpis import HIGHER_IS_BETTER, JOB_RANK, Kpi

if TYPE_CHECKING:
    from rankscope.analysis.conclude.compare_model import Comparison
    from rankscope.analysis.conclude.kpis import Kpis


def parse_fraction(text: str | float) -> float:
    """``"5%"``, ``"5"`` or ``5`` → 0.05 (a bare number is a percentage); ValueError otherwise."""
    if isinstance(text, int | float):
        value = float(text)
    else:
        t = str(text).strip().removesuffix("%").strip()
        value = float(t)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a percentage: {text!r}")
    return value / 100


class GateRule(enum.StrEnum):
    """What decided a gated KPI (``GateCheck.rule``; JSON ``gate.checks[].rule``)."""

    WELCH = "Welch t"
    """A one-sided Welch t test of "worse than the threshold" on the per-step job means."""
    RUNS = "t on run means"
    """Several runs a side (``--base-runs`` / ``--new-runs``): a one-sided t test on the runs'
    mean per step, the run-to-run noise measured from the runs themselves (:func:`runs_exceed`)."""
    THRESHOLD = "threshold alone"
    """Too few steps for any test (< MIN_SAMPLES on a side): the change of the means against
    the threshold, nothing else — said loudly in every rendering."""


@dataclasses.dataclass(frozen=True)
class GateCheck:
    """One gated KPI of the job: its threshold, the change of its per-step mean, the rule that
    decided and the verdict."""

    kpi: str
    threshold: float
    """The largest tolerated regression (fraction of BASE's mean)."""
    base_steps: int
    new_steps: int
    base_mean: float
    new_mean: float
    rel_change: float
    """NEW's mean per step / BASE's − 1 (signed; a regression is > 0 for lower-is-better KPIs)."""
    rule: GateRule
    t: float
    """Welch's t of "worse than the threshold" (NaN under the threshold rule)."""
    df: float
    p_value: float
    """One-sided p of H0 "at most the threshold worse" (NaN under the threshold rule)."""
    p_adjusted: float = math.nan
    """Holm over the gate's Welch-tested KPIs (NaN under the threshold rule or until decided)."""
    failed: bool = False
    """The verdict (False until decided)."""
    text: str = ""
    """The verdict in one line, naming the rule (empty until decided)."""
    base_runs: int = 1
    """Runs behind BASE's mean (GateRule.RUNS: the runs tested; else 1)."""
    new_runs: int = 1
    run_noise: float = math.nan
    """GateRule.RUNS: the run-to-run noise the runs show (relative SD of a run's mean)."""

    @property
    def finding(self) -> CompareFinding:
        """The check as a finding (kind ``regression`` when it failed, else ``no_change``)."""
        return CompareFinding(
            CompareKind.REGRESSION if self.failed else CompareKind.NO_CHANGE,
            self.text,
            kpi=self.kpi,
            figures={
                "rel_change": self.rel_change,
                "threshold": self.threshold,
                "rule": str(self.rule),
                "p_value": self.p_value,
                "p_adjusted": self.p_adjusted,
                "base_steps": self.base_steps,
                "new_steps": self.new_steps,
            },
        )


def gate_limits(config: GateConfig) -> dict[str, float]:
    """KPI -> threshold: ``fail_above`` for HEADLINE_KPIS, overridden or extended by
    ``thresholds``."""
    limits: dict[str, float] = {}
    if config.fail_above is not None:
        limits.update({str(k): config.fail_above for k in HEADLINE_KPIS})
    limits.update({str(Kpi(k)): v for k, v in config.thresholds.items()})
    return limits


def _job_samples(k: Kpis) -> dict[str, Any]:
    """KPI -> the job's per-step samples (step order) of one run's KPIs."""
    s = k.samples[k.samples["rank"] == JOB_RANK].sort_values(["kpi", "step"])
    return {str(n): g["value"].to_numpy(np.float64) for n, g in s.groupby("kpi", sort=False)}


def _whole_run_for_windows(
    limits: dict[str, float], config: GateConfig, sb: dict[str, Any], sn: dict[str, Any]
) -> None:
    """Where both runs have the whole run's step series (``run_step_time``: every step a
    sample), the step time is gated on it, not on the profiled windows' few steps (which it
    includes): ``step_time``'s threshold moves to ``run_step_time`` unless that has its own, and
    ``step_time`` is no longer gated unless its threshold was given by name."""
    whole, windowed = str(Kpi.RUN_STEP_TIME), str(Kpi.STEP_TIME)
    if not len(sb.get(whole, ())) or not len(sn.get(whole, ())) or windowed not in limits:
        return
    limits.setdefault(whole, limits[windowed])
    if windowed not in {str(Kpi(k)) for k in config.thresholds}:
        del limits[windowed]


def gate_checks(
    c: Comparison,
    config: GateConfig,
    base_runs: Sequence[Kpis] = (),
    new_runs: Sequence[Kpis] = (),
) -> list[GateCheck]:
    """Every gated KPI the job has in both runs, decided (:mod:`rankscope.analysis.conclude.compare`'s
    docstring, "The gate's test").

    With at least MIN_SAMPLES steps a side: fails when the one-sided Welch t test of "worse by
    more than the threshold" is significant at ``alpha`` after Holm over the gate's tested KPIs
    (the mean change is then beyond the threshold). With fewer: fails when the mean change is
    beyond the threshold (GateRule.THRESHOLD; the text says no test was possible).

    ``base_runs`` / ``new_runs``: further runs of BASE's and NEW's settings (replicates). With
    them the unit is the run: a KPI with ≥ 2 runs on a side is tested on the runs' means
    (GateRule.RUNS, :func:`runs_exceed`), the run-to-run noise measured from them
    (``config.run_noise`` is then not used)."""
    limits = gate_limits(config)
    alpha = config.alpha
    noise = config.run_noise
    sb, sn = _job_samples(c.base), _job_samples(c.new)
    _whole_run_for_windows(limits, config, sb, sn)
    more_b = [_job_samples(k) for k in base_runs]
    more_n = [_job_samples(k) for k in new_runs]
    checks: list[GateCheck] = []
    for kpi in Kpi:
        limit = limits.get(str(kpi))
        a, b = sb.get(str(kpi), np.empty(0)), sn.get(str(kpi), np.empty(0))
        if limit is None or not len(a) or not len(b):
            continue
        higher = kpi in HIGHER_IS_BETTER
        per_a = [a, *(m[str(kpi)] for m in more_b if len(m.get(str(kpi), ())))]
        per_b = [b, *(m[str(kpi)] for m in more_n if len(m.get(str(kpi), ())))]
        if max(len(per_a), len(per_b)) >= 2:
            checks.append(_runs_check(str(kpi), limit, higher, per_a, per_b))
            continue
        ma, mb = float(np.mean(a)), float(np.mean(b))
        rel = _rel_change(ma, mb)
        tested = len(a) >= MIN_SAMPLES and len(b) >= MIN_SAMPLES
        # H1 "worse by more than the limit": new > (1+limit)·base, or for higher-is-better
        # new < (1−limit)·base, i.e. −new > (1−limit)·(−base)
        t, df, p = (
            (
                welch_exceeds(-a, -b, 1.0 - limit, noise)
                if higher
                else welch_exceeds(a, b, 1.0 + limit, noise)
            )
            if tested
            else (math.nan, math.nan, math.nan)
        )
        checks.append(
            GateCheck(
                kpi=str(kpi),
                threshold=limit,
                base_steps=len(a),
                new_steps=len(b),
                base_mean=ma,
                new_mean=mb,
                rel_change=rel,
                rule=GateRule.WELCH if tested else GateRule.THRESHOLD,
                t=t,
                df=df,
                p_value=p,
            )
        )
    adjusted = holm([ch.p_value for ch in checks])
    family = sum(ch.rule is not GateRule.THRESHOLD for ch in checks)
    return [
        _decide(ch, float(p), alpha, family, noise) for ch, p in zip(checks, adjusted, strict=True)
    ]


def _rel_change(base_mean: float, new_mean: float) -> float:
    """NEW's mean / BASE's − 1 (signed); +inf for a rise from 0, 0 when both are 0."""
    if base_mean:
        return (new_mean - base_mean) / abs(base_mean)
    return math.inf if new_mean > base_mean else 0.0


def _runs_check(
    kpi: str, limit: float, higher: bool, per_a: list[Any], per_b: list[Any]
) -> GateCheck:
    """A KPI with several runs on a side, tested on run means (GateRule.RUNS)."""
    runs_a = [float(np.mean(x)) for x in per_a]
    runs_b = [float(np.mean(x)) for x in per_b]
    ma, mb = float(np.mean(runs_a)), float(np.mean(runs_b))
    # worse by more than the limit: new > (1+limit)·base, or, higher being better,
    # −new > (1−limit)·(−base)
    sign = -1.0 if higher else 1.0
    factor = 1.0 - limit if higher else 1.0 + limit
    t, df, p, seen = runs_exceed([sign * x for x in runs_a], [sign * x for x in runs_b], factor)
    return GateCheck(
        kpi=kpi,
        threshold=limit,
        base_steps=sum(len(x) for x in per_a),
        new_steps=sum(len(x) for x in per_b),
        base_mean=ma,
        new_mean=mb,
        rel_change=_rel_change(ma, mb),
        rule=GateRule.RUNS,
        t=t,
        df=df,
        p_value=p,
        base_runs=len(runs_a),
        new_runs=len(runs_b),
        run_noise=seen,
    )


def _decide(
    ch: GateCheck, p_adjusted: float, alpha: float, family: int, run_noise: float
) -> GateCheck:
    """``ch`` with its Holm-adjusted p, its verdict and its text (naming the rule)."""
    worse = -ch.rel_change if ch.kpi in HIGHER_IS_BETTER else ch.rel_change
    steps = f"{ch.base_steps} vs {ch.new_steps} steps"
    limit = f"{100 * ch.threshold:g}%"
    if ch.rule is not GateRule.THRESHOLD:
        failed = p_adjusted < alpha and worse > ch.threshold
        family_text = f", Holm over {family} gated KPIs" if family > 1 else ""
        if ch.rule is GateRule.RUNS:
            how = (
                f"t on run means, {ch.base_runs} vs {ch.new_runs} runs (run-to-run noise seen "
                f"{100 * ch.run_noise:.1f}%), one-sided p={p_adjusted:.2g}{family_text}"
            )
        else:
            flat = "" if math.isfinite(ch.t) else ", no step-to-step variation"
            noise = (
                f" + {100 * run_noise:g}% run-to-run noise"
                if run_noise > 0
                else ", step noise only"
            )
            how = f"Welch t on {steps}{noise}, one-sided p={p_adjusted:.2g}{family_text}{flat}"
        text = (
            f"{ch.kpi} {_pct(ch.rel_change)} > {limit} ({how})"
            if failed
            else f"{ch.kpi} {_pct(ch.rel_change)}: not shown worse than {limit} ({how}; fails "
            f"below p={alpha:g})"
        )
    else:
        failed = worse > ch.threshold
        text = (
            f"{ch.kpi} {_pct(ch.rel_change)} {'>' if failed else '≤'} {limit} — decided on the "
            f"threshold alone: {steps} cannot establish significance (a test needs at least "
            f"{MIN_SAMPLES} steps per run)"
        )
    return dataclasses.replace(ch, p_adjusted=p_adjusted, failed=bool(failed), text=text)


def gate(c: Comparison, config: GateConfig) -> list[CompareFinding]:
    """The gated KPIs that fail (:func:`gate_checks`) as findings. Empty: the gate passes."""
    return [ch.finding for ch in gate_checks(c, config) if ch.failed]
