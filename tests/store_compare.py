"""Two merged stores hold the same data: the one comparison the tests that merge one job two
ways (Slurm workers and in-process; pandas' Arrow and object strings) make."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rankscope.analysis.store.reader import open_store

#: The run-wide tables compared besides each rank's events and lanes.
TABLES = ("collectives", "clock", "steps", "problems")


def same_store(a: Path, b: Path) -> list[int]:
    """Assert that every rank's events and lanes, the world size and the run-wide tables are
    equal (exact values, dtypes, order); returns the ranks (never none)."""
    with open_store(a) as x, open_store(b) as y:
        assert x.ranks == y.ranks and x.ranks
        assert x.world_size == y.world_size
        for rank in x.ranks:
            pd.testing.assert_frame_equal(x.events(rank), y.events(rank), check_exact=True)
            pd.testing.assert_frame_equal(x.lanes(rank), y.lanes(rank), check_exact=True)
        for table in TABLES:
            pd.testing.assert_frame_equal(
                getattr(x, table)(), getattr(y, table)(), check_exact=True, obj=table
            )
        return list(x.ranks)
