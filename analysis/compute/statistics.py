"""The project's statistics, written once: pure math on numbers and arrays, no scipy at run time.

* Student's **t** tail (:func:`t_sf`, from the regularized incomplete beta :func:`betainc`): the
  memory leak test's slope (``memory_leaks.py``) and the compare gate's Welch and run-mean tests;
* the **binomial** tail (:func:`binomial_p_value`): a rank last in k of n sync points (or the
  slowest of its peers in k of n steps) by chance (``stragglers.py``, ``rootcause.py``);
* the two-sided **Mann–Whitney U** with its exact null distribution (ties included) up to
  :data:`EXACT_MAX_SAMPLES` samples and the tie-corrected normal approximation above, the
  **Hodges–Lehmann** shift it estimates, **Holm**'s step-down correction, and the gate's
  one-sided tests: **Welch t** on per-step samples (:func:`welch_exceeds`), t on run means
  (:func:`runs_exceed`), the run-to-run noise of same-settings runs (:func:`run_noise`)
  (``rankscope compare``: why these tests and what their samples are, docs/compare.md).

Why no scipy: importing it costs ~0.8 s of a command's start-up for one tail. scipy stays the
oracle: tests/test_stragglers.py, test_memory.py and test_compare.py check every function here
against it. numpy is imported at the top: only an analysis imports this module, never a
command's parser (docs/architecture.md, "Deferred imports").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (no scipy at run time)."""
    if math.isnan(t) or not df > 0:
        return math.nan
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t > 0 else 1.0 - tail


#: Up to this many trials the first term of the tail is computed from the exact binomial
#: coefficient (``math.comb`` stays below the float range up to ~1020); beyond, in log space.
EXACT_BINOMIAL_N = 1000


def binomial_p_value(times_last: int, collectives: int, chance: float) -> float:
    """P(X >= times_last) for X ~ Binomial(collectives, chance): last this often by luck.

    Computed with :mod:`math` (no scipy import: 0.8 s of a command's start-up for one tail).
    The first probability mass term is exact up to :data:`EXACT_BINOMIAL_N` trials, in log space
    (``lgamma``) beyond, and the tail is summed outward from ``times_last`` only while terms
    still matter: above the mean the tail is summed directly (full relative precision for the tiny p-values that name stragglers); at or
    below it, ``1 - P(X < times_last)`` (the p-value is then at least about one half). Terms fall
    off geometrically away from the mean, so a sum takes O(sqrt(n)) terms, not O(n).
    """
    n, k, p = collectives, times_last, chance
    if n <= 0 or k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    upper = k > n * p
    i = k if upper else k - 1
    if n <= EXACT_BINOMIAL_N:
        term = math.comb(n, i) * p**i * (1.0 - p) ** (n - i)
    else:
        log_pmf = (
            math.lgamma(n + 1)
            - math.lgamma(i + 1)
            - math.lgamma(n - i + 1)
            + i * math.log(p)
            + (n - i) * math.log1p(-p)
        )
        term = math.exp(log_pmf)
    total = term
    odds = p / (1.0 - p)
    step = 1 if upper else -1
    while 0 <= i + step <= n:
        if step > 0:
            term *= (n - i) / (i + 1) * odds
        else:
            term *= i / (n - i + 1) / odds
        i += step
        total += term
        if term <= total * 1e-17:
            break
    tail = total if upper else 1.0 - total
    return min(1.0, max(0.0, tail))


#: Largest total number of steps (BASE + NEW) tested with the exact Mann–Whitney distribution.
EXACT_MAX_SAMPLES = 80


def midranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x``, tied values sharing their mean rank."""
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
