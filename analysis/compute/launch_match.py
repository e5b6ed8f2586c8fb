"""Which runtime call launched a device event: the one launch-matching rule, on bare columns.

Why a module of its own, without pandas: the merge's per-rank task (``orchestrator/ingest/
rank_columns.py``, ``comm_links.py``) uses it on a rank's columns before any DataFrame, in a
process that has not imported pandas (``source_reads.ReadAhead``); ``ops.launches`` is the same
rule on an analysis' events.
"""

from __future__ import annotations

import numpy as np
from rankscope.analysis.store.schema import EventKind


def launch_rows(
    corr: np.ndarray, kind: np.ndarray, idx: np.ndarray, runtime: np.ndarray | None = None
) -> np.ndarray:
    """Row of the runtime call (same correlation id) that launched each device event ``idx``, on
    bare columns (``corr``, ``kind``); -1 where it has no correlation id or its launch is not
    among ``runtime`` (default: every RUNTIME event with a correlation id)."""
    out = np.full(len(idx), -1, dtype=np.int64)
    if runtime is None:
        runtime = np.flatnonzero(kind == int(EventKind.RUNTIME))
    runtime = runtime[corr[runtime] >= 0]
    if not len(runtime) or not len(idx):
        return out
    order = np.argsort(corr[runtime], kind="stable")
    rc, rows = corr[runtime][order], runtime[order]
    want = corr[idx]
    p = np.clip(np.searchsorted(rc, want), 0, len(rc) - 1)
    found = (want >= 0) & (rc[p] == want)
    out[found] = rows[p[found]]
    return out
