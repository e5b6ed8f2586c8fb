"""Whether an array's memory is a view of a shared mapping (``analysis/engine/shared_results.py``):
what the tests of the read-ahead's hand-over check, rather than only equal values."""

from __future__ import annotations

import mmap

import numpy as np


def views_a_mapping(a: np.ndarray) -> bool:
    """``a`` (through the arrays it views) lies in an ``mmap``, not in memory of its own."""
    base: object = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)
