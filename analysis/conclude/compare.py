"""Two runs compared: what changed from BASE to NEW, KPI by KPI and rank by rank, and whether it
is more than step-to-step noise.

Pure functions (no printing, no files): :func:`compare` takes two analyses and returns a
:class:`Comparison` of DataFrames (each with a documented ``*_COLUMNS`` contract) and structured
:class:`CompareFinding`\\ s; :func:`gate_checks` / :func:`gate` decide a CI job's fate from it.
``rankscope compare`` (``orchestrator/compare.py``) only renders. Method and definitions:
docs/compare.md.

**The table's test.** Every profiled step is one sample of a KPI (the job's sample is the mean
over ranks of that step: ranks of one step are tied by its collectives, so they are one
observation). Step times are skewed and have outliers (a page fault, a late rank, the OS), so the
test is rank-based: a two-sided **Mann–Whitney U** test of NEW's steps against BASE's, with the
exact null distribution (ties included, by counting subsets of mid-ranks) up to
:data:`EXACT_MAX_SAMPLES` steps and the tie-corrected normal approximation above. The size of
the change is the **Hodges–Lehmann** shift (the median of every NEW − BASE difference of steps),
robust like the test, relative to BASE's median. The null hypothesis is "a change of at most
``min_change``" (BASE is moved by that margin towards NEW before the test), so a real but small
change inside the noise is not called. A change is significant when its Holm-adjusted p-value is
below ``alpha / 2``: many KPIs and ranks are tested at once, so the family-wise false-alarm rate
is held at ``alpha`` — Holm within the job-level family and within the per-rank family, each at
``alpha / 2`` (Bonferroni across the two). A rank test cannot be significant with few steps
(3 vs 3: p ≥ 0.1; 5 vs 5: p ≥ 2/252, and Holm over 8 KPIs at 0.025 needs less): the table then
says so (:func:`rank_test_floor`) instead of reporting "no change".

**The gate's test** is another question, asked of one pre-declared family: is a gated KPI (the
headline KPIs with ``fail_above``, and any KPI with its own threshold) *worse than its threshold*?
For each, a one-sided **Welch t** test of H0 "NEW's mean per step is at most (1 + threshold) ×
BASE's" (``(1 − threshold)`` for higher-is-better KPIs): a linear hypothesis in the two means, so
BASE's own uncertainty is counted (:func:`welch_exceeds`). Its samples are the same per-step job
means (every rank of every step, each step one observation); the mean is what a regression
costs (the run's time is the sum of its steps), and an outlier step widens the test's standard
error as much as it moves the mean. Unlike a rank test it has real power at 3 steps a side (a
doubling of the step time in 10 % step noise: median p ≈ 0.001). Holm over the gate's family at
the gate's own level (``GateConfig.alpha``, 0.01: it is asked on every commit). Steps of one run
share its conditions, so runs of the same job differ by more than their steps suggest; the
machine's measured run-to-run noise (``GateConfig.run_noise``, :func:`run_noise`) enters the
test's variance. With fewer than :data:`MIN_SAMPLES` steps on a side no test is possible: the
gate then decides on the threshold alone and says so (:class:`GateRule`).

The pieces: the statistics (rank-sum test, Holm, Welch t: ``statistics.py``), the model
(verdicts, configs, column contracts, :class:`Comparison`: ``compare_model.py``), the tables
(``compare_tables.py``) and the gate (``compare_gate.py``). This module is the entry point — it
assembles the comparison and words its findings — and every name of those modules is importable
from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankscope.analysis.compute.statistics import EXACT_MAX_SAMPLES as EXACT_MAX_SAMPLES

# the Student t tail (and its incomplete beta) written once, for the leak test and the gate
from rankscope.analysis.compute.statistics import betainc as betainc
from rankscope.analysis.compute.statistics import hodges_lehmann as hodges_lehmann
from rankscope.analysis.compute.statistics import holm as holm
from rankscope.analysis.compute.statistics import mann_whitney as mann_whitney
from rankscope.analysis.compute.statistics import mann_whitney_min_p as mann_whitney_min_p
from rankscope.analysis.compute.statistics import midranks as midranks
from rankscope.analysis.compute.statistics import run_noise as run_noise
from rankscope.analysis.compute.statistics import runs_exceed as runs_exceed
from rankscope.analysis.compute.statistics import t_sf as t_sf
from rankscope.analysis.compute.statistics import welch_exceeds as welch_exceeds
from rankscope.analysis.conclude.compare_gate import GateCheck as GateCheck
from rankscope.analysis.conclude.compare_gate import GateRule as GateRule
from rankscope.analysis.conclude.compare_gate import _decide as _decide
from rankscope.analysis.conclude.compare_gate import _job_samples as _job_samples
from rankscope.analysis.conclude.compare_gate import _rel_change as _rel_change
from rankscope.analysis.conclude.compare_gate import _runs_check as _runs_check
from rankscope.analysis.conclude.compare_gate import gate as gate
from rankscope.analysis.conclude.compare_gate import gate_checks as gate_checks
from rankscope.analysis.conclude.compare_gate import gate_limits as gate_limits
from rankscope.analysis.conclude.compare_gate import parse_fraction as parse_fraction
from rankscope.analysis.conclude.compare_model import (
    COLLECTIVE_CHANGE_COLUMNS as COLLECTIVE_CHANGE_COLUMNS,
)
from rankscope.analysis.conclude.compare_model import GATE_ALPHA as GATE_ALPHA
from rankscope.analysis.conclude.compare_model import HEADLINE_KPIS as HEADLINE_KPIS
from rankscope.analysis.conclude.compare_model import KPI_CHANGE_COLUMNS as KPI_CHANGE_COLUMNS
from rankscope.analysis.conclude.compare_model import MIN_SAMPLES as MIN_SAMPLES
from rankscope.analysis.conclude.compare_model import OP_CHANGE_COLUMNS as OP_CHANGE_COLUMNS
from rankscope.analysis.conclude.compare_model import OP_KINDS as OP_KINDS
from rankscope.analysis.conclude.compare_model import (
    STRAGGLER_CHANGE_COLUMNS as STRAGGLER_CHANGE_COLUMNS,
)
from rankscope.analysis.conclude.compare_model import WHATIF_CHANGE_COLUMNS as WHATIF_CHANGE_COLUMNS
from rankscope.analysis.conclude.compare_model import Change as Change
from rankscope.analysis.conclude.compare_model import CompareConfig as CompareConfig
from rankscope.analysis.conclude.compare_model import CompareFinding as CompareFinding
from rankscope.analysis.conclude.compare_model import CompareKind as CompareKind
from rankscope.analysis.conclude.compare_model import Comparison as Comparison
from rankscope.analysis.conclude.compare_model import Family as Family
from rankscope.analysis.conclude.compare_model import GateConfig as GateConfig
from rankscope.analysis.conclude.compare_model import OpChange as OpChange
from rankscope.analysis.conclude.compare_model import StragglerChange as StragglerChange
from rankscope.analysis.conclude.compare_model import _pct as _pct
from rankscope.analysis.conclude.compare_tables import _collective_rates as _collective_rates
from rankscope.analysis.conclude.compare_tables import _empty as _empty
from rankscope.analysis.conclude.compare_tables import _frame as _frame
from rankscope.analysis.conclude.compare_tables import _pctl as _pctl
from rankscope.analysis.conclude.compare_tables import _per_step_ops as _per_step_ops
from rankscope.analysis.conclude.compare_tables import compare_collectives as compare_collectives
from rankscope.analysis.conclude.compare_tables import compare_kpis as compare_kpis
from rankscope.analysis.conclude.compare_tables import compare_ops as compare_ops
from rankscope.analysis.conclude.compare_tables import compare_stragglers as compare_stragglers
from rankscope.analysis.conclude.compare_tables import compare_whatif as compare_whatif
from rankscope.analysis.conclude.kpis import JOB_RANK, TIME_CATEGORIES, Kpi, KpiConfig

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.conclude.kpis import Kpis
    from rankscope.analysis.engine.driver import Analysis


def comparability(base: Kpis, new: Kpis) -> list[str]:
    """One line per thing that cannot be compared (empty: everything can)."""
    notes = []
    if base.world_size != new.world_size:
        notes.append(
            f"world sizes differ (BASE {base.world_size}, NEW {new.world_size} ranks): job-level "
            "KPIs, ops and what-if savings are compared; per-rank KPIs, per-rank waits and "
            "stragglers by rank are not"
        )
    for name, k in (("BASE", base), ("NEW", new)):
        if not k.steps:
            notes.append(f"{name} has no profiled steps: no per-step KPI can be compared")
        elif len(k.steps) < MIN_SAMPLES:
            notes.append(
                f"{name} has {len(k.steps)} profiled step(s): at least {MIN_SAMPLES} are needed "
                "per side to test a change"
            )
    if base.steps and new.steps and not set(base.steps) & set(new.steps):
        notes.append(
            f"no common step numbers (BASE {base.steps[0]}–{base.steps[-1]}, NEW "
            f"{new.steps[0]}–{new.steps[-1]}): steps are compared as two samples, not step by step"
        )
    if base.device != new.device and base.steps and new.steps:
        notes.append(f"devices differ (BASE {base.device}, NEW {new.device})")
    whole = {
        name: k.row(Kpi.RUN_STEP_TIME) is not None for name, k in (("BASE", base), ("NEW", new))
    }
    if whole["BASE"] != whole["NEW"]:
        has, lacks = ("BASE", "NEW") if whole["BASE"] else ("NEW", "BASE")
        notes.append(
            f"only {has} kept step logs (every step of the run): the whole run's step time "
            f"(run_step_time) is not compared; {lacks}'s profiled steps stand for it"
        )
    return notes


def rank_test_floor(kpis: pd.DataFrame, alpha: float) -> str | None:
    """A line when no job row of ``kpis`` (KPI_CHANGE_COLUMNS) can be called a change however
    large it is: the U test's smallest p times the Holm factor of the job family is not below
    ``alpha / 2`` (3 vs 3 steps: 0.1; 5 vs 5 steps and 8 KPIs: 8 × 2/252 = 0.063). None when a
    call is possible."""
    job = kpis[(kpis["rank"] == JOB_RANK) & (kpis["change"] != Change.UNTESTED)]
    m = len(job)
    if not m:
        return None
    rows = list(job.itertuples())
    pmin = min(mann_whitney_min_p(int(r.base_steps), int(r.new_steps)) for r in rows)
    level = alpha / 2
    if pmin * m < level:
        return None
    need = MIN_SAMPLES
    while mann_whitney_min_p(need, need) * m >= level and need < EXACT_MAX_SAMPLES:
        need += 1
    nb, nn = int(job["base_steps"].max()), int(job["new_steps"].max())
    return (
        f"{nb} vs {nn} steps: the rank test's smallest two-sided p is {pmin:.2g}, and Holm over "
        f"{m} job KPIs needs p < {level / m:.2g}: no KPI row can be called a change, however "
        f"large (that takes {need} steps per run; the gate tests differently)"
    )


def compare_findings(c: Comparison) -> list[CompareFinding]:
    """The conclusions of ``c``, worded once (regressions, improvements, stragglers, ops)."""
    out: list[CompareFinding] = []
    for note in c.notes:
        out.append(CompareFinding(CompareKind.NOT_COMPARABLE, note))
    k = c.kpis
    job = k[k["rank"] == JOB_RANK]
    for r in job.itertuples():
        if r.change not in (Change.REGRESSION, Change.IMPROVEMENT):
            continue
        kind = CompareKind.REGRESSION if r.change == Change.REGRESSION else CompareKind.IMPROVEMENT
        share = "" if r.kpi not in TIME_CATEGORIES else f" ({_pct(r.step_share)} of the step)"
        out.append(
            CompareFinding(
                kind,
                f"{r.change.capitalize()}: {r.kpi} {_pct(r.rel_change)}{share} "
                f"(p={r.p_adjusted:.2g}, Holm)",
                kpi=r.kpi,
                figures={"rel_change": r.rel_change, "p_adjusted": r.p_adjusted},
            )
        )
    if not any(f.kind in (CompareKind.REGRESSION, CompareKind.IMPROVEMENT) for f in out):
        tested = job[job["change"] != Change.UNTESTED]
        if len(tested) and rank_test_floor(k, c.config.alpha):
            n = f"{int(tested['base_steps'].max())} vs {int(tested['new_steps'].max())}"
            out.append(
                CompareFinding(
                    CompareKind.NO_CHANGE,
                    f"No change called: {n} steps are too few for the rank test (note above)",
                )
            )
        elif len(tested):
            out.append(
                CompareFinding(
                    CompareKind.NO_CHANGE,
                    f"No significant change: {len(tested)} job KPIs within step-to-step noise "
                    f"or below {100 * c.config.min_change:.0f}%",
                )
            )
    for r in c.stragglers.itertuples():
        if r.change == StragglerChange.NEW:
            out.append(
                CompareFinding(
                    CompareKind.NEW_STRAGGLER,
                    f"New straggler: rank {r.rank} ({r.cause}, caused "
                    f"{1000 * r.wait_caused_s:.1f} ms of waiting)",
                    rank=int(r.rank),
                    figures={"cause": r.cause, "confidence": r.new_confidence},
                )
            )
        elif r.change == StragglerChange.GONE:
            out.append(
                CompareFinding(
                    CompareKind.STRAGGLER_GONE,
                    f"Straggler gone: rank {r.rank} ({r.cause} in BASE)",
                    rank=int(r.rank),
                )
            )
    moved = c.ops[c.ops["change"] != OpChange.SAME].head(3)
    if len(moved):
        parts = [
            f"{o.name} {1000 * o.delta_s:+.2f} ms/step ({o.change})" for o in moved.itertuples()
        ]
        out.append(CompareFinding(CompareKind.OP_CHANGES, "Ops: " + "; ".join(parts)))
    return out


def compare(
    base: Analysis,
    new: Analysis,
    config: CompareConfig | None = None,
    kpi_config: KpiConfig | None = None,
    new_kpi_config: KpiConfig | None = None,
) -> Comparison:
    """BASE vs NEW (``new_kpi_config``: NEW's when it differs, e.g. another samples per step)."""
    from rankscope.analysis.conclude.kpis import kpis

    config = config or CompareConfig()
    kb = kpis(base, kpi_config)
    kn = kpis(new, new_kpi_config or kpi_config)
    same_world = kb.world_size == kn.world_size
    table = compare_kpis(kb, kn, config)
    floor = rank_test_floor(table, config.alpha)
    c = Comparison(
        base=kb,
        new=kn,
        kpis=table,
        ops=compare_ops(base, new, kb, kn, config),
        collectives=compare_collectives(base, new, kb, kn),
        stragglers=compare_stragglers(base, new)
        if same_world
        else _empty(STRAGGLER_CHANGE_COLUMNS),
        whatif=compare_whatif(base, new),
        notes=comparability(kb, kn) + ([floor] if floor else []),
        findings=[],
        config=config,
    )
    c.findings = compare_findings(c) + attention_findings(base, new)
    return c


def attention_findings(base: Analysis, new: Analysis) -> list[CompareFinding]:
    """NEW's SDPA math fallback measured against BASE's fused calls of the same query shape
    (e.g. the same job with the flash backend): how much slower each call ran."""
    from rankscope.analysis.compute.attention import math_fallback_findings

    calls = getattr(new, "attention_calls", None)
    if calls is None or not len(calls):
        return []
    ref = getattr(base, "attention_calls", None)
    return [
        CompareFinding(
            CompareKind.ATTENTION_MATH,
            f"{f.headline}: {f.evidence}",
            rank=f.rank,
            figures=dict(f.figures),
        )
        for f in math_fallback_findings(
            calls, reference=ref if ref is not None and len(ref) else None
        )
    ]


# -- the CI gate -----------------------------------------------------------------------------
