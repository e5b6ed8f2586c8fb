"""A rank's step table and comm group names, built in numpy by the merge, against their pandas
form (``drop_duplicates("step").sort_values("start")``; masked writes of the group names)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from rankscope.analysis.store.schema import EventKind
from rankscope.orchestrator.ingest.comm_links import normalise_groups
from rankscope.orchestrator.ingest.rank_columns import _steps


def test_steps_first_of_each_number_in_start_order() -> None:
    """Repeated ``ProfilerStep#N`` keep their first range; ties in start, other events and
    names without a number are as pandas leaves them."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        n = int(rng.integers(0, 40))
        numbers = rng.integers(0, 12, n)
        names = [f"ProfilerStep#{k}" for k in numbers] + ["ProfilerStep", "aten::mm"]
        kind = np.array([int(EventKind.PROFILER_STEP)] * (n + 1) + [0], np.int8)
        ts = rng.integers(0, 15, n + 2).astype(np.int64)
        dur = rng.integers(0, 9, n + 2).astype(np.int64)
        columns = {"kind": kind, "name": np.arange(n + 2), "ts": ts, "dur": dur}
        rows = [(int(k), int(ts[i]), int(ts[i] + dur[i])) for i, k in enumerate(numbers)]
        want = (
            pd.DataFrame(rows, columns=["step", "start", "end"])
            .drop_duplicates("step")
            .sort_values("start")
            .reset_index(drop=True)
        )
        got = pd.DataFrame(_steps(columns, names))
        pd.testing.assert_frame_equal(got, want.astype("int64"), check_exact=True)


def test_group_names_filled_per_stream_and_for_gloo() -> None:
    """A GPU event without a group takes ``stream#i`` (i: its lane's first-seen order among
    them), a host (gloo) one ``gloo``; named groups are kept."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(0, 30))
        comm = pd.DataFrame(
            {
                "group": rng.choice(["", "0", "pg1"], n).astype(object),
                "lane": rng.integers(0, 6, n).astype(np.int32),
            }
        )
        cpu = pd.Series(rng.random(n) < 0.3, index=comm.index)
        want = comm["group"].astype(str).copy()
        gpu_missing = (want == "") & ~cpu
        order = {x: i for i, x in enumerate(pd.unique(comm["lane"][gpu_missing]))}
        want[gpu_missing] = [f"stream#{order[x]}" for x in comm["lane"][gpu_missing]]
        want[(comm["group"] == "") & cpu] = "gloo"
        got = normalise_groups(
            comm["group"].to_numpy(object), cpu.to_numpy(), comm["lane"].to_numpy()
        )
        assert got.dtype == object and got.tolist() == want.tolist()
