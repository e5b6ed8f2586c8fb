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

Why one module of ~1100 lines: the rank-sum test, its exact distribution, Holm's correction, the
gate's t test and the comparison tables that use them belong together.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rankscope.analysis.kpis import (
    HIGHER_IS_BETTER,
    JOB_RANK,
    TIME_CATEGORIES,
    UNITS,
    Kpi,
    KpiConfig,
)

# the Student t tail (and its incomplete beta) written once, for the leak test and the gate
from rankscope.analysis.memory import _betainc as betainc  # noqa: F401  (tested here)
from rankscope.analysis.memory import t_sf

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from rankscope.analysis.kpis import Kpis
    from rankscope.analysis.pipeline import Analysis

#: Largest total number of steps (BASE + NEW) tested with the exact Mann–Whitney distribution.
EXACT_MAX_SAMPLES = 80
#: Fewest steps per side for a test (fewer: the KPI is shown, never called a change).
MIN_SAMPLES = 3
#: KPIs :func:`gate` checks with ``--fail-above`` when no per-KPI threshold is given.
HEADLINE_KPIS = (Kpi.STEP_TIME, Kpi.THROUGHPUT, Kpi.PEAK_MEMORY, Kpi.FLOPS, Kpi.MFU)
#: Op kinds compared in :attr:`Comparison.ops` (communication is in ``collectives``).
OP_KINDS = frozenset({"CPU_OP", "KERNEL_COMPUTE", "MEMCPY", "MEMSET", "USER_ANNOTATION"})


class Change(enum.StrEnum):
    """The verdict on one KPI of one rank (``KPI_CHANGE_COLUMNS`` ``change``)."""

    REGRESSION = "regression"
    """Significantly worse, by at least ``min_change``."""
    IMPROVEMENT = "improvement"
    """Significantly better, by at least ``min_change``."""
    NO_CHANGE = "no change"
    """Within step-to-step noise, or smaller than ``min_change``."""
    UNTESTED = "untested"
    """Too few steps on a side (< MIN_SAMPLES), or missing in one run."""


class Family(enum.StrEnum):
    """The multiple-testing family of a test (Holm is applied within each)."""

    JOB = "job"
    RANK = "rank"


class OpChange(enum.StrEnum):
    """What happened to an op (``OP_CHANGE_COLUMNS`` ``change``)."""

    SLOWER = "slower"
    FASTER = "faster"
    SAME = "same"
    APPEARED = "appeared"
    DISAPPEARED = "disappeared"


class StragglerChange(enum.StrEnum):
    """What happened to a straggler (``STRAGGLER_CHANGE_COLUMNS`` ``change``)."""

    NEW = "new"
    GONE = "gone"
    PERSISTS = "persists"


class CompareKind(enum.StrEnum):
    """What a :class:`CompareFinding` is about (JSON ``findings[].kind``)."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    NO_CHANGE = "no_change"
    NEW_STRAGGLER = "new_straggler"
    STRAGGLER_GONE = "straggler_gone"
    OP_CHANGES = "op_changes"
    ATTENTION_MATH = "attention_math"
    NOT_COMPARABLE = "not_comparable"


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """How the two runs are compared."""

    alpha: float = 0.05
    """Family-wise false-alarm rate (split in half between the job and per-rank families)."""
    min_change: float = 0.03
    """Smallest change called a regression or improvement, as a fraction: of the KPI's BASE
    median for the job's headline KPIs, of BASE's step time for time categories (a category
    that moves the step by less is noise, however significant)."""
    top_ops: int = 10
    """Ops listed per direction (slower, faster) in the renderings."""
    exact_max_samples: int = EXACT_MAX_SAMPLES
    """Above this many steps in all, the normal approximation of the U distribution is used."""


#: The gate's default false-alarm level (GateConfig.alpha).
GATE_ALPHA = 0.01


@dataclasses.dataclass(frozen=True)
class GateConfig:
    """When ``rankscope compare`` fails a CI job (exit 1)."""

    fail_above: float | None = None
    """Relative regression (fraction, 0.05 = 5 %) above which a significant regression of a
    headline KPI (HEADLINE_KPIS, job level) fails; None: only ``thresholds`` are checked."""
    thresholds: dict[str, float] = dataclasses.field(default_factory=dict)
    """Per-KPI thresholds (Kpi value -> fraction), overriding ``fail_above`` for that KPI and
    adding KPIs it does not cover (time categories)."""
    alpha: float = GATE_ALPHA
    """False-alarm level of one gate decision (Holm over the gated KPIs). Stricter than the
    table's 0.05 because a gate is asked on every commit: at 0.05, one commit in twenty that
    changed nothing would fail its CI, and a gate that fails without cause gets switched off."""
    run_noise: float = 0.0
    """Run-to-run noise of the machine, as a fraction of the KPI's mean (0.12 = 12 %): the
    standard deviation of a run's mean step time across runs of the same job, beyond what the
    run's own step-to-step noise explains (:func:`run_noise`; ``benchmarks/compare_noise.py``
    measures it). Steps of one run share its conditions — which rank lost its core, the node,
    its temperature — so one run per side cannot show this part; 0 assumes there is none."""


@dataclasses.dataclass(frozen=True)
class CompareFinding:
    """One conclusion of a comparison, worded once for every renderer."""

    kind: CompareKind
    text: str
    kpi: str | None = None
    rank: int | None = None
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)


#: Columns of :attr:`Comparison.kpis`: one row per KPI and rank present in both runs.
KPI_CHANGE_COLUMNS: dict[str, str] = {
    "kpi": "str",
    "rank": "int32",  # JOB_RANK (-1): the job
    "unit": "str",
    "family": "str",  # Family
    "base_steps": "int64",
    "new_steps": "int64",
    "base_p50": "float64",  # percentiles of the tested samples (job: per-step means over ranks)
    "new_p50": "float64",
    "base_p90": "float64",
    "new_p90": "float64",
    "shift": "float64",  # Hodges–Lehmann NEW − BASE, in the unit
    "rel_change": "float64",  # shift / |base median|
    "step_share": "float64",  # shift / BASE step time median (time categories; else rel_change)
    "p_value": "float64",  # Mann–Whitney U, two-sided, of a change larger than min_change
    "p_adjusted": "float64",  # Holm within the family (NaN: untested)
    "change": "str",  # Change
}

#: Columns of :attr:`Comparison.ops` (times per step, s; mean over the ranks that ran the op).
OP_CHANGE_COLUMNS: dict[str, str] = {
    "name": "str",
    "kind": "str",
    "base_s": "float64",
    "new_s": "float64",
    "delta_s": "float64",
    "rel_change": "float64",  # NaN when it appeared
    "step_share": "float64",  # delta / BASE step time (job median)
    "top_rank": "int32",  # the rank whose time changed most
    "change": "str",  # OpChange
}

#: Columns of :attr:`Comparison.collectives` (per step, s; rank JOB_RANK: mean over ranks).
COLLECTIVE_CHANGE_COLUMNS: dict[str, str] = {
    "group": "str",
    "op": "str",
    "rank": "int32",
    "base_wait_s": "float64",
    "new_wait_s": "float64",
    "delta_wait_s": "float64",
    "base_transfer_s": "float64",
    "new_transfer_s": "float64",
    "delta_transfer_s": "float64",
}

#: Columns of :attr:`Comparison.stragglers`.
STRAGGLER_CHANGE_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "change": "str",  # StragglerChange
    "base_confidence": "float64",
    "new_confidence": "float64",
    "cause": "str",  # NEW's cause (BASE's when it went away)
    "wait_caused_s": "float64",  # NEW's (BASE's when it went away)
}

#: Columns of :attr:`Comparison.whatif` (one row per scenario and rank in either run).
WHATIF_CHANGE_COLUMNS: dict[str, str] = {
    "scenario": "str",
    "rank": "int32",
    "base_saving_s": "float64",  # NaN: not in BASE
    "new_saving_s": "float64",  # NaN: not in NEW
    "delta_s": "float64",
    "base_saving_pct": "float64",
    "new_saving_pct": "float64",
}


@dataclasses.dataclass
class Comparison:
    """BASE vs NEW (every DataFrame follows its ``*_COLUMNS``)."""

    base: Kpis
    """BASE's KPIs."""
    new: Kpis
    """NEW's KPIs."""
    kpis: pd.DataFrame
    """KPI_CHANGE_COLUMNS, job rows first."""
    ops: pd.DataFrame
    """OP_CHANGE_COLUMNS, largest |delta| first."""
    collectives: pd.DataFrame
    """COLLECTIVE_CHANGE_COLUMNS."""
    stragglers: pd.DataFrame
    """STRAGGLER_CHANGE_COLUMNS (ranks that are a straggler in either run)."""
    whatif: pd.DataFrame
    """WHATIF_CHANGE_COLUMNS (empty when neither run has a what-if table)."""
    notes: list[str]
    """What cannot be compared and why (one line each)."""
    findings: list[CompareFinding]
    """The conclusions, most important first."""
    config: CompareConfig
    """How it was compared."""

    @property
    def per_rank(self) -> bool:
        """Whether ranks were compared one by one (same world size)."""
        return self.base.world_size == self.new.world_size

    def regressions(self, rank: int | None = JOB_RANK) -> pd.DataFrame:
        """Rows judged a regression (``rank`` None: every rank and the job)."""
        k = self.kpis
        rows = k[k["change"] == Change.REGRESSION]
        return rows if rank is None else rows[rows["rank"] == rank]


# -- statistics ------------------------------------------------------------------------------


def midranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x``, tied values sharing their mean rank."""
    import numpy as np

    order = np.argsort(x, kind="mergesort")
    s = x[order]
    ranks = np.empty(len(x), np.float64)
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def mann_whitney(
    base: np.ndarray, new: np.ndarray, exact_max: int = EXACT_MAX_SAMPLES
) -> tuple[float, float]:
    """Mann–Whitney U of ``new`` against ``base`` and its two-sided p-value.

    Exact (the distribution of NEW's rank sum over every subset of the pooled mid-ranks, ties
    included) up to ``exact_max`` samples in all; above, the normal approximation with the tie
    correction and a continuity correction. U counts the (base, new) pairs where new is larger
    (ties count one half): ``U / (n_base * n_new)`` is P(new > base).
    """
    import numpy as np

    a = np.asarray(base, np.float64)
    b = np.asarray(new, np.float64)
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return math.nan, math.nan
    r = midranks(np.concatenate([a, b]))
    rank_sum = float(r[n1:].sum())
    u = rank_sum - n2 * (n2 + 1) / 2
    n = n1 + n2
    if n <= exact_max:
        doubled = np.rint(2 * r).astype(np.int64)  # mid-ranks are multiples of 1/2
        total = int(doubled.sum())
        dp = np.zeros((n2 + 1, total + 1), np.float64)  # dp[k, s]: subsets of size k, sum s
        dp[0, 0] = 1.0
        for v in doubled:
            dp[1:, v:] += dp[:-1, : total + 1 - v].copy()
        dist = dp[n2]
        dist = dist / dist.sum()
        sums = np.arange(total + 1)
        centre = n2 * (n + 1)  # doubled expected rank sum
        obs = abs(2 * rank_sum - centre)
        p = float(dist[np.abs(sums - centre) >= obs - 1e-9].sum())
        return u, min(1.0, p)
    mu = n1 * n2 / 2
    _, counts = np.unique(r, return_counts=True)
    tie = float((counts**3 - counts).sum())
    var = n1 * n2 / 12 * ((n + 1) - tie / (n * (n - 1)))
    if var <= 0:
        return u, 1.0
    z = (abs(u - mu) - 0.5) / math.sqrt(var)
    return u, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def hodges_lehmann(base: np.ndarray, new: np.ndarray) -> float:
    """The median of every ``new - base`` difference (the shift the U test estimates)."""
    import numpy as np

    a = np.asarray(base, np.float64)
    b = np.asarray(new, np.float64)
    if not len(a) or not len(b):
        return math.nan
    if len(a) * len(b) > 4_000_000:  # keep memory bounded: the median of a regular subsample
        a = np.sort(a)[:: max(1, len(a) // 2000)]
        b = np.sort(b)[:: max(1, len(b) // 2000)]
    return float(np.median(np.subtract.outer(b, a)))


def holm(p: Any) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control); NaN stays NaN."""
    import numpy as np

    p = np.asarray(p, np.float64)
    out = np.full(len(p), math.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = len(ok)
    if not m:
        return out
    order = ok[np.argsort(p[ok], kind="mergesort")]
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adj
    return out


def mann_whitney_min_p(n1: int, n2: int) -> float:
    """The smallest two-sided p-value the exact U test can give with ``n1`` vs ``n2`` samples
    (no ties: both extreme orderings, ``2 / C(n1 + n2, n1)``)."""
    if n1 <= 0 or n2 <= 0:
        return 1.0
    return min(1.0, 2 / math.comb(n1 + n2, n1))


def welch_exceeds(
    base: Any, new: Any, factor: float, run_noise: float = 0.0
) -> tuple[float, float, float]:
    """One-sided Welch t test of H1 "mean(new) > factor × mean(base)" against H0 "≤": (t,
    degrees of freedom, p).

    ``D = mean(new) − factor·mean(base)`` is a linear contrast of the two means, so its variance
    ``s_new²/n_new + factor²·s_base²/n_base`` counts BASE's uncertainty too (a relative margin
    tested without treating BASE's mean as known); degrees of freedom by Welch–Satterthwaite.
    ``run_noise`` (a fraction, GateConfig.run_noise) adds each run's own offset: a run mean
    varies across runs by ``run_noise × mean`` beyond its steps' noise, so the variance gains
    ``(run_noise·mean(new))² + (factor·run_noise·mean(base))²``, a part taken as known (only the
    estimated parts enter Welch–Satterthwaite; with no step variation at all the test is a z
    test).
    Both samples without any spread and no run noise: p is 0 when D > 0, else 1 (t ±inf, df
    NaN). Fewer than 2 samples on a side: all NaN (no variance to estimate)."""
    import numpy as np

    a = np.asarray(base, np.float64)
    b = np.asarray(new, np.float64)
    n1, n2 = len(a), len(b)
    if n1 < 2 or n2 < 2:
        return math.nan, math.nan, math.nan
    d = float(b.mean()) - factor * float(a.mean())
    va = factor * factor * float(a.var(ddof=1)) / n1
    vb = float(b.var(ddof=1)) / n2
    known = run_noise * run_noise * (float(b.mean()) ** 2 + (factor * float(a.mean())) ** 2)
    se2 = va + vb + known
    if not se2 > 0:
        return (math.inf, math.nan, 0.0) if d > 0 else (-math.inf, math.nan, 1.0)
    t = d / math.sqrt(se2)
    estimated = va * va / (n1 - 1) + vb * vb / (n2 - 1)
    if not estimated > 0:  # only the known run noise: normal tail
        return t, math.inf, 0.5 * math.erfc(t / math.sqrt(2.0))
    df = se2 * se2 / estimated
    return t, df, t_sf(t, df)


def run_noise(runs: Any) -> float:
    """The run-to-run noise of same-settings runs (GateConfig.run_noise), from each run's
    per-step samples of one KPI (a list of arrays, ≥ 2 runs of ≥ 2 steps).

    One-way random effects: a run's mean varies by ``σ_run² + σ_step²/n``; the spread of the run
    means minus the part their steps explain (the mean within-run variance over the steps per
    run) leaves ``σ_run²`` (0 when the steps explain it all), reported relative to the grand
    mean. Method of moments, unbalanced runs by the harmonic mean of the step counts."""
    import numpy as np

    rs = [np.asarray(r, np.float64) for r in runs]
    rs = [r for r in rs if len(r) >= 2]
    if len(rs) < 2:
        raise ValueError("run_noise needs at least 2 runs of at least 2 steps each")
    means = np.array([r.mean() for r in rs])
    within = float(np.mean([r.var(ddof=1) for r in rs]))
    n = len(rs) / float(np.sum([1.0 / len(r) for r in rs]))
    between = float(means.var(ddof=1)) - within / n
    grand = float(means.mean())
    return math.sqrt(between) / abs(grand) if between > 0 and grand else 0.0


def runs_exceed(base_runs: Any, new_runs: Any, factor: float) -> tuple[float, float, float, float]:
    """One-sided t test of H1 "NEW's mean per run > factor × BASE's" from several runs a side:
    (t, degrees of freedom, p, the run-to-run noise the runs show).

    Each run is one observation (its mean per step): steps of one run share its conditions, so
    only runs show how much a run's mean moves. Run-to-run noise is multiplicative — a run on a
    busier core is slower by a share of its step, not by a fixed time — and the same on both
    sides (one machine), so it is estimated as one relative variance pooled over the sides that
    have ≥ 2 runs (``r² = Σ (m/mean − 1)² / Σ (k − 1)``, its degrees of freedom), and the
    contrast ``mean(NEW) − factor·mean(BASE)`` has variance ``r²·(mean(NEW)²/k_NEW +
    factor²·mean(BASE)²/k_BASE)``. One run on a side with replicates on the other is allowed
    (the estimate comes from that side). No side with 2 runs: all NaN. Runs without any
    spread: p 0 or 1."""
    import numpy as np

    a = np.asarray(base_runs, np.float64)
    b = np.asarray(new_runs, np.float64)
    ma, mb = float(a.mean()), float(b.mean())
    ss, df = 0.0, 0
    for side, m in ((a, ma), (b, mb)):
        if len(side) >= 2 and m:
            ss += float(np.sum((side / m - 1.0) ** 2))
            df += len(side) - 1
    if df < 1:
        return math.nan, math.nan, math.nan, math.nan
    r2 = ss / df
    d = mb - factor * ma
    se2 = r2 * (mb * mb / len(b) + factor * factor * ma * ma / len(a))
    if not se2 > 0:
        return (math.inf, float(df), 0.0, 0.0) if d > 0 else (-math.inf, float(df), 1.0, 0.0)
    t = d / math.sqrt(se2)
    return t, float(df), t_sf(t, df), math.sqrt(r2)


# -- the comparison --------------------------------------------------------------------------


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        {c: pd.Series(dtype=d if d != "str" else object) for c, d in columns.items()}
    )


def _frame(rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    import pandas as pd

    if not rows:
        return _empty(columns)
    return pd.DataFrame(rows, columns=list(columns)).astype(
        {k: v for k, v in columns.items() if v != "str"}
    )


def _pctl(values: np.ndarray, q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if len(values) else math.nan


def compare_kpis(base: Kpis, new: Kpis, config: CompareConfig | None = None) -> pd.DataFrame:
    """KPI_CHANGE_COLUMNS for every (KPI, rank) both runs have (per rank only when the world
    sizes match): the test, the shift and the verdict (see the module docstring)."""
    import numpy as np

    config = config or CompareConfig()
    ranks = [JOB_RANK]
    if base.world_size == new.world_size:
        ranks += sorted(set(base.ranks) & set(new.ranks))

    def series(k: Kpis) -> dict[tuple[str, int], np.ndarray]:
        s = k.samples.sort_values(["kpi", "rank", "step"], kind="mergesort")
        return {
            (str(kpi), int(rank)): g["value"].to_numpy(np.float64)
            for (kpi, rank), g in s.groupby(["kpi", "rank"], sort=False)
        }

    sb, sn = series(base), series(new)
    units = dict(
        zip(
            zip(new.summary["kpi"], new.summary["rank"], strict=True),
            new.summary["unit"],
            strict=True,
        )
    )
    rows = []
    for kpi in Kpi:
        for rank in ranks:
            key = (str(kpi), rank)
            if key not in sb or key not in sn:
                continue
            a, b = sb[key], sn[key]
            tested = len(a) >= MIN_SAMPLES and len(b) >= MIN_SAMPLES
            shift = hodges_lehmann(a, b)
            med = float(np.median(a)) if len(a) else math.nan
            rel = shift / abs(med) if med else (math.inf if shift else 0.0)
            step_share = rel
            scale = abs(med) if math.isfinite(med) else 0.0
            if kpi in TIME_CATEGORIES:
                steps = sb.get((str(Kpi.STEP_TIME), rank), np.empty(0))
                step = float(np.median(steps)) if len(steps) else math.nan
                step_share = shift / step if step and math.isfinite(step) else math.nan
                scale = step if math.isfinite(step) else 0.0
            # H0: the change is at most min_change (BASE moved by the margin, towards NEW)
            margin = math.copysign(config.min_change * scale, shift if shift else 1.0)
            p = mann_whitney(a + margin, b, config.exact_max_samples)[1] if tested else math.nan
            rows.append(
                {
                    "kpi": str(kpi),
                    "rank": rank,
                    "unit": units.get(key, UNITS[kpi]),
                    "family": str(Family.JOB if rank == JOB_RANK else Family.RANK),
                    "base_steps": len(a),
                    "new_steps": len(b),
                    "base_p50": _pctl(a, 50),
                    "new_p50": _pctl(b, 50),
                    "base_p90": _pctl(a, 90),
                    "new_p90": _pctl(b, 90),
                    "shift": shift,
                    "rel_change": rel,
                    "step_share": step_share,
                    "p_value": p,
                    "p_adjusted": math.nan,
                    "change": str(Change.UNTESTED if not tested else Change.NO_CHANGE),
                }
            )
    out = _frame(rows, KPI_CHANGE_COLUMNS)
    for family in Family:
        idx = out.index[out["family"] == str(family)]
        out.loc[idx, "p_adjusted"] = holm(out.loc[idx, "p_value"].to_numpy())
    level = config.alpha / 2
    for i, r in out.iterrows():
        if r["change"] == Change.UNTESTED or not (r["p_adjusted"] < level):
            continue
        effect = r["step_share"] if r["kpi"] in TIME_CATEGORIES else r["rel_change"]
        if not (abs(effect) >= config.min_change):
            continue
        worse = (r["shift"] < 0) if r["kpi"] in HIGHER_IS_BETTER else (r["shift"] > 0)
        out.at[i, "change"] = str(Change.REGRESSION if worse else Change.IMPROVEMENT)
    return out


def _per_step_ops(a: Analysis, steps: dict[int, int]) -> pd.DataFrame:
    """(name, kind, rank, s per step) of the compared op kinds."""
    s = a.op_stats
    if not len(s):
        return s.assign(per_step=[])
    s = s[s["kind"].isin(OP_KINDS)].copy()
    n = s["rank"].map(lambda r: max(1, steps.get(int(r), 1)))
    s["per_step"] = s["total_ns"].astype("float64") / n / 1e9
    return s[["name", "kind", "rank", "per_step"]]


def compare_ops(
    base: Analysis, new: Analysis, kb: Kpis, kn: Kpis, config: CompareConfig
) -> pd.DataFrame:
    """OP_CHANGE_COLUMNS: each op's summed time per step (mean over ranks), BASE vs NEW."""
    import numpy as np

    def steps_of(k: Kpis) -> dict[int, int]:
        s = k.samples[(k.samples["kpi"] == str(Kpi.STEP_TIME)) & (k.samples["rank"] >= 0)]
        return {int(r): len(g) for r, g in s.groupby("rank")}

    ob, on = _per_step_ops(base, steps_of(kb)), _per_step_ops(new, steps_of(kn))
    if not len(ob) and not len(on):
        return _empty(OP_CHANGE_COLUMNS)
    step = kb.values(Kpi.STEP_TIME)
    step_s = float(np.median(step)) if len(step) else math.nan
    mb = ob.groupby(["name", "kind"])["per_step"].mean()
    mn = on.groupby(["name", "kind"])["per_step"].mean()
    rb = ob.set_index(["name", "kind", "rank"])["per_step"]
    rn = on.set_index(["name", "kind", "rank"])["per_step"]
    rows = []
    for key in sorted(set(mb.index) | set(mn.index)):
        b = float(mb.get(key, 0.0))
        n = float(mn.get(key, 0.0))
        delta = n - b
        share = delta / step_s if step_s else math.nan
        if key not in mb.index:
            change = OpChange.APPEARED
        elif key not in mn.index:
            change = OpChange.DISAPPEARED
        elif abs(share) >= config.min_change:
            change = OpChange.SLOWER if delta > 0 else OpChange.FASTER
        else:
            change = OpChange.SAME
        top_rank, top = -1, -1.0
        ranks = {int(i[2]) for i in rb.index if i[:2] == key} | {
            int(i[2]) for i in rn.index if i[:2] == key
        }
        for r in ranks:
            d = abs(float(rn.get((*key, r), 0.0)) - float(rb.get((*key, r), 0.0)))
            if d > top:
                top_rank, top = r, d
        rows.append(
            {
                "name": str(key[0]),
                "kind": str(key[1]),
                "base_s": b,
                "new_s": n,
                "delta_s": delta,
                "rel_change": delta / b if b else math.nan,
                "step_share": share,
                "top_rank": top_rank,
                "change": str(change),
            }
        )
    out = _frame(rows, OP_CHANGE_COLUMNS)
    order = out["delta_s"].abs().sort_values(ascending=False, kind="mergesort").index
    return out.loc[order].reset_index(drop=True)


def _collective_rates(a: Analysis, k: Kpis) -> pd.DataFrame:
    """Wait and transfer per step (s) per (group, op, rank), within the profiled steps."""
    import numpy as np
    import pandas as pd

    w = a.waits
    bd = a.breakdown
    bd = bd[bd["step"] >= 0]
    if not len(w) or not len(bd):
        return pd.DataFrame(columns=["group", "op", "rank", "wait", "transfer"])
    span = bd.groupby("rank").agg(s0=("start", "min"), s1=("end", "max"), n=("step", "size"))
    w = w.join(span, on="rank", how="inner")
    w = w[(w["arrival"] >= w["s0"]) & (w["arrival"] < w["s1"])]
    g = w.groupby(["group", "op", "rank"]).agg(
        wait=("wait_ns", "sum"), transfer=("transfer_ns", "sum"), n=("n", "first")
    )
    g["wait"] = g["wait"].astype(np.float64) / g["n"] / 1e9
    g["transfer"] = g["transfer"].astype(np.float64) / g["n"] / 1e9
    return g.drop(columns="n").reset_index()


def compare_collectives(base: Analysis, new: Analysis, kb: Kpis, kn: Kpis) -> pd.DataFrame:
    """COLLECTIVE_CHANGE_COLUMNS: wait and transfer per step, per (group, op), job then ranks."""
    cb, cn = _collective_rates(base, kb), _collective_rates(new, kn)
    rows = []
    same_world = kb.world_size == kn.world_size
    keys = sorted(
        {(g, o) for g, o in zip(cb["group"], cb["op"], strict=True)}
        | {(g, o) for g, o in zip(cn["group"], cn["op"], strict=True)}
    )
    for group, op in keys:
        sb = cb[(cb["group"] == group) & (cb["op"] == op)]
        sn = cn[(cn["group"] == group) & (cn["op"] == op)]

        def row(
            rank: int, b: pd.DataFrame, n: pd.DataFrame, group: Any = group, op: Any = op
        ) -> dict[str, Any]:
            bw, nw = (
                float(b["wait"].mean()) if len(b) else 0.0,
                float(n["wait"].mean()) if len(n) else 0.0,
            )
            bt = float(b["transfer"].mean()) if len(b) else 0.0
            nt = float(n["transfer"].mean()) if len(n) else 0.0
            return {
                "group": str(group),
                "op": str(op),
                "rank": rank,
                "base_wait_s": bw,
                "new_wait_s": nw,
                "delta_wait_s": nw - bw,
                "base_transfer_s": bt,
                "new_transfer_s": nt,
                "delta_transfer_s": nt - bt,
            }

        rows.append(row(JOB_RANK, sb, sn))
        if same_world:
            for r in sorted(set(sb["rank"]) | set(sn["rank"])):
                rows.append(row(int(r), sb[sb["rank"] == r], sn[sn["rank"] == r]))
    return _frame(rows, COLLECTIVE_CHANGE_COLUMNS)


def compare_stragglers(base: Analysis, new: Analysis) -> pd.DataFrame:
    """STRAGGLER_CHANGE_COLUMNS: stragglers that appeared, went away or persist."""
    sb, sn = set(base.straggler_ranks()), set(new.straggler_ranks())

    def info(a: Analysis, rank: int) -> dict[str, Any]:
        s = a.stragglers
        hit = s[s["rank"] == rank] if len(s) else s
        return hit.iloc[0].to_dict() if len(hit) else {}

    rows = []
    for rank in sorted(sb | sn):
        ib, i_n = info(base, rank), info(new, rank)
        change = (
            StragglerChange.PERSISTS
            if rank in sb and rank in sn
            else (StragglerChange.NEW if rank in sn else StragglerChange.GONE)
        )
        src = ib if change is StragglerChange.GONE else i_n
        rows.append(
            {
                "rank": rank,
                "change": str(change),
                "base_confidence": float(ib.get("confidence", math.nan)),
                "new_confidence": float(i_n.get("confidence", math.nan)),
                "cause": str(src.get("cause", "")),
                "wait_caused_s": float(src.get("wait_caused_s", math.nan)),
            }
        )
    order = {StragglerChange.NEW: 0, StragglerChange.GONE: 1, StragglerChange.PERSISTS: 2}
    rows.sort(key=lambda r: order[StragglerChange(str(r["change"]))])
    return _frame(rows, STRAGGLER_CHANGE_COLUMNS)


def compare_whatif(base: Analysis, new: Analysis) -> pd.DataFrame:
    """WHATIF_CHANGE_COLUMNS from ``Analysis.whatif`` (empty when neither run has one)."""
    wb = getattr(base, "whatif", None)
    wn = getattr(new, "whatif", None)
    frames = [w for w in (wb, wn) if w is not None and len(w)]
    if not frames:
        return _empty(WHATIF_CHANGE_COLUMNS)

    def index(w: Any) -> dict[tuple[str, int], Any]:
        if w is None or not len(w):
            return {}
        return {(str(r.scenario), int(r.rank)): r for r in w.itertuples()}

    ib, i_n = index(wb), index(wn)
    rows = []
    for key in list(ib) + [k for k in i_n if k not in ib]:
        b, n = ib.get(key), i_n.get(key)
        bs = float(b.saving_ns) / 1e9 if b is not None else math.nan
        ns = float(n.saving_ns) / 1e9 if n is not None else math.nan
        rows.append(
            {
                "scenario": key[0],
                "rank": key[1],
                "base_saving_s": bs,
                "new_saving_s": ns,
                "delta_s": (0.0 if math.isnan(ns) else ns) - (0.0 if math.isnan(bs) else bs),
                "base_saving_pct": float(b.saving_pct) if b is not None else math.nan,
                "new_saving_pct": float(n.saving_pct) if n is not None else math.nan,
            }
        )
    return _frame(rows, WHATIF_CHANGE_COLUMNS)


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
    return notes


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%" if math.isfinite(x) else "n/a"


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
    from rankscope.analysis.kpis import kpis

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
    from rankscope.analysis.attention import math_fallback_findings

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
    import numpy as np

    s = k.samples[k.samples["rank"] == JOB_RANK].sort_values(["kpi", "step"])
    return {str(n): g["value"].to_numpy(np.float64) for n, g in s.groupby("kpi", sort=False)}


def gate_checks(
    c: Comparison,
    config: GateConfig,
    base_runs: Sequence[Kpis] = (),
    new_runs: Sequence[Kpis] = (),
) -> list[GateCheck]:
    """Every gated KPI the job has in both runs, decided (module docstring, "The gate's test").

    With at least MIN_SAMPLES steps a side: fails when the one-sided Welch t test of "worse by
    more than the threshold" is significant at ``alpha`` after Holm over the gate's tested KPIs
    (the mean change is then beyond the threshold). With fewer: fails when the mean change is
    beyond the threshold (GateRule.THRESHOLD; the text says no test was possible).

    ``base_runs`` / ``new_runs``: further runs of BASE's and NEW's settings (replicates). With
    them the unit is the run: a KPI with ≥ 2 runs on a side is tested on the runs' means
    (GateRule.RUNS, :func:`runs_exceed`), the run-to-run noise measured from them
    (``config.run_noise`` is then not used)."""
    import numpy as np

    limits = gate_limits(config)
    alpha = config.alpha
    noise = config.run_noise
    sb, sn = _job_samples(c.base), _job_samples(c.new)
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
    import numpy as np

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
