"""The memory leak test: a regression of allocated-at-step-start on the step number, one-sided
by Student's t tail (``statistics.t_sf``).

:func:`leaks` = :func:`judge_leaks` of :func:`leak_tests`: the per-device slope test
(:func:`slope_test`, one-sided p from :func:`t_sf`) runs per rank, the decision — significance
split over every series tested, and materiality — across ranks.

Why a module apart from ``memory.py``: the test (the fixed-effects slope and the decision across
ranks) is a self-contained piece; its t tail is ``statistics.py``'s, shared with ``compare``; the
peaks it reads come from ``memory_peaks.py``. What the CPU and CUDA counters mean, which decides
how the test groups steps, is in ``memory.py``'s docstring.

Units: bytes (int64) and bytes per step.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from rankscope.analysis.compute.memory_peaks import peaks, step_peaks
from rankscope.analysis.compute.statistics import t_sf
from rankscope.analysis.store.memory_table import DEVICE_KEY, DeviceType

#: Family-wise false-positive rate of :func:`leaks` over all (rank, device) series of one analysis.
LEAK_ALPHA = 0.01
#: A significant slope is a leak when it would add the device's peak within this many steps.
LEAK_MATERIAL_STEPS = 1000


def slope_test(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> tuple[float, float, int, float]:
    """OLS slope of ``y`` on ``x`` with one intercept per group: (slope, standard error, degrees
    of freedom, one-sided p-value of "slope > 0"). Too few points: (nan, nan, 0, nan).

    Within-group demeaning gives the fixed-effects slope; ``df = n - groups - 1``. With
    residuals exactly 0 (the usual case of a deterministic training loop) the slope is known
    exactly: p is 0 for a positive slope, 1 otherwise.
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    g = pd.Series(groups)
    xd = x - pd.Series(x).groupby(g).transform("mean").to_numpy()
    yd = y - pd.Series(y).groupby(g).transform("mean").to_numpy()
    sxx = float(np.dot(xd, xd))
    df = len(x) - int(g.nunique()) - 1
    if sxx <= 0 or df < 1:
        return math.nan, math.nan, max(df, 0), math.nan
    slope = float(np.dot(xd, yd)) / sxx
    resid = yd - slope * xd
    sse = float(np.dot(resid, resid))
    # exact zeros come out of float arithmetic as ~1e-9 of the values: relative to y's scale
    scale = float(np.dot(yd, yd))
    if sse <= 1e-20 * max(scale, 1.0):
        return slope, 0.0, df, (0.0 if slope > 0 else 1.0)
    se = math.sqrt(sse / df / sxx)
    return slope, se, df, t_sf(slope / se, df)


def leaks(
    mem: pd.DataFrame,
    *,
    alpha: float = LEAK_ALPHA,
    material_steps: int = LEAK_MATERIAL_STEPS,
) -> pd.DataFrame:
    """Is allocated memory at step start growing, per (rank, device)?

    The measure is ``start_allocated`` of :func:`step_peaks` (the counter just before each
    step's first memory event: the same point of every step), regressed on the step number by
    least squares. CUDA counters are absolute: one intercept for the whole run. CPU counters are
    comparable only within a profiler window and settle after its first step (``memory.py``'s
    docstring): one intercept per window, each window's first step left out.

    Statistic: the one-sided t-test of "slope > 0" (:func:`slope_test`). Under no leak, with
    step-to-step noise that is independent and roughly normal, the p-value is uniform, so the
    false-positive rate is what we choose: ``alpha`` family-wise, split evenly over the series
    tested (Bonferroni), so that a 512-rank job is not expected to show a false leak more often
    than a 2-rank one. Unlike a rank statistic (Mann–Kendall, Theil–Sen) it needs no special
    case for the ties that dominate here (most loops return to exactly the same value), and a
    perfectly linear growth is certain, not "as significant as n points allow".

    A significant slope is a leak only when it is material: at that rate the device's peak
    would be allocated again within ``material_steps`` steps (a training run takes thousands),
    i.e. ``slope ≥ peak_allocated / material_steps``. Slow growth — a cache filling up — is
    reported (slope, p) but not called a leak.

    Columns: rank, device_type, device_id, steps (points used), slope_bytes_per_step, slope_se,
    df, p_value, peak_allocated, material (bool), significant (bool), is_leak (bool), reason
    ("", "too few steps", "not significant", "not material").
    """
    return judge_leaks(leak_tests(mem), alpha=alpha, material_steps=material_steps)


#: Columns of :func:`leak_tests` (one device's regression; :func:`judge_leaks` adds the rest).
LEAK_TEST_COLUMNS = [*DEVICE_KEY, "steps", "slope_bytes_per_step", "slope_se", "df", "p_value"]
LEAK_TEST_COLUMNS.append("peak_allocated")


def leak_tests(mem: pd.DataFrame) -> pd.DataFrame:
    """The per-device half of :func:`leaks` (runs per rank): the slope test of each device,
    without the decision, which needs the number of series tested across all ranks."""
    sp = step_peaks(mem)
    if not len(sp):
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in LEAK_TEST_COLUMNS})
    pk = peaks(mem).set_index(DEVICE_KEY)["peak_allocated"]
    rows = []
    for key, s in sp.groupby(DEVICE_KEY, sort=True):
        s = s.sort_values("step")
        if int(key[1]) == DeviceType.CUDA:
            groups = np.zeros(len(s), np.int64)
        else:
            first = s.groupby("window")["step"].transform("min")
            s = s[s["step"] > first]
            groups = s["window"].to_numpy(np.int64)
        slope, se, df, p = slope_test(
            s["step"].to_numpy(np.float64), s["start_allocated"].to_numpy(np.float64), groups
        )
        rows.append((*key, len(s), slope, se, df, p, int(pk.loc[key])))
    return pd.DataFrame(rows, columns=LEAK_TEST_COLUMNS)


def judge_leaks(
    tests: pd.DataFrame,
    *,
    alpha: float = LEAK_ALPHA,
    material_steps: int = LEAK_MATERIAL_STEPS,
) -> pd.DataFrame:
    """The cross-rank half of :func:`leaks`: :func:`leak_tests` of every rank, concatenated,
    judged at ``alpha`` split over the series tested, and for materiality."""
    cols = [*LEAK_TEST_COLUMNS[:-1], "peak_allocated", "material", "significant", "is_leak"]
    cols.append("reason")
    if not len(tests):
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
    out = tests.sort_values(DEVICE_KEY, ignore_index=True)
    tested = int(out["p_value"].notna().sum())
    level = alpha / max(tested, 1)
    out["material"] = out["slope_bytes_per_step"].fillna(0) * material_steps >= out[
        "peak_allocated"
    ].clip(lower=1)
    out["significant"] = out["p_value"].fillna(1.0) < level
    out["is_leak"] = out["material"] & out["significant"]
    out["reason"] = np.select(
        [out["p_value"].isna(), ~out["significant"], ~out["material"]],
        ["too few steps", "not significant", "not material"],
        "",
    )
    return out[cols]
