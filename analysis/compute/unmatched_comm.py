"""Communication kernels that are in no collective: counted as communication, never split.

The merge matches a communication kernel across ranks only when it can tell which collective it
is (NCCL's kernels, with ``record_param_comms``; ``orchestrator/ingest/comm_kernels.py``). DeepEP's
dispatch / combine, NVSHMEM's on-stream collectives, custom all-reduce kernels and a user's
``--comm-kernel`` patterns are communication in every breakdown, but they are in no row of the
collectives table, so the waiting / transfer split (``collectives.py``) cannot cover them. This
module measures how much communication time that is, per rank, so the report can say it in one
line rather than leave it out silently.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from rankscope.analysis.store.schema import EventKind

#: Columns of :func:`unmatched_comm` (one row per rank).
UNMATCHED_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "kernels": "int64",  # communication kernels in no collective
    "dur_ns": "int64",  # their summed durations, ns (rank-time: overlapping kernels add up)
    "example": "str",  # the name of the longest of them ("" when none)
}


def unmatched_comm(events: pd.DataFrame, coll_rows: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One row: ``rank``'s communication kernels (kind ``KERNEL_COMM``) that are in no row of
    its collectives (``coll_rows``: ``Store.collectives()`` of this rank; ``event`` is the row
    index in ``events``), their count, summed duration in ns and the longest one's name."""
    kinds = events["kind"].to_numpy()
    comm = np.flatnonzero(kinds == int(EventKind.KERNEL_COMM))
    if "event" in coll_rows and len(coll_rows):
        comm = np.setdiff1d(comm, coll_rows["event"].to_numpy(np.int64), assume_unique=False)
    dur = events["dur"].to_numpy(np.int64)[comm]
    example = str(events["name"].iloc[int(comm[np.argmax(dur)])]) if len(comm) else ""
    row = {"rank": rank, "kernels": len(comm), "dur_ns": int(dur.sum()), "example": example}
    return pd.DataFrame([row]).astype(UNMATCHED_COLUMNS)
