"""Kineto's µs timestamps to int64 ns, and the range beyond which a stamp is dropped.

Why exact integers: absolute ns = ``baseTimeNanoseconds`` + ts·1000, and a float would lose the
ns at today's epoch stamps. ``ts`` is split into its integer µs and the fractional part,
``ns = int(floor(ts))*1000 + rint(frac*1000)``, in int64 (:func:`us_to_ns`), exact for
``|ts| < 2**43`` µs; beyond, the stamps arrive as ``Decimal`` (``kineto_json.needs_exact``) and
are converted by :func:`decimal_to_ns`. Shared by the event columns and the memory columns.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np

#: Events whose |ts| or dur (µs) reach this are dropped and counted (their ns would overflow
#: int64; ~146 years), and a ``baseTimeNanoseconds`` of |base| ≥ 2**62 makes the file a problem.
TS_LIMIT_US = 2**62 // 1000
BASE_LIMIT_NS = 2**62


def us_to_ns(values: Any) -> np.ndarray:
    """µs (float array, ≤ 3 decimals) → int64 ns, exact for |µs| < 2**43 (module docstring)."""
    arr = np.asarray(values, dtype=np.float64)
    whole = np.floor(arr)
    frac = arr - whole  # exact (Sterbenz)
    return whole.astype(np.int64) * 1000 + np.rint(frac * 1000.0).astype(np.int64)


def decimal_to_ns(values: list[Any]) -> np.ndarray:
    """Exact (``Decimal``) µs stamps → int64 ns, rounded half to even."""
    return np.fromiter(
        (int((Decimal(v) * 1000).to_integral_value()) for v in values),
        dtype=np.int64,
        count=len(values),
    )
