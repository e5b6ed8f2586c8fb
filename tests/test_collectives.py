"""Wait / transfer / lateness / blame per collective and rank, and the clock-free cross-check."""

from __future__ import annotations

import pandas as pd
import pytest
from analysis_frames import collectives
from rankscope.analysis.compute.collectives import collective_summary, collective_waits, wait_totals


def _clock(unc: int) -> pd.DataFrame:
    return pd.DataFrame({"rank": [0, 1, 2], "uncertainty_ns": [unc, unc, unc]})


def test_wait_transfer_lateness_known_answer() -> None:
    # ranks arrive at 0, 100, 400 µs; all end at 500 µs
    us = 1000
    c = collectives(
        {0: [0], 1: [100 * us], 2: [400 * us]}, {0: [500 * us], 1: [500 * us], 2: [500 * us]}
    )
    w = collective_waits(c, _clock(0)).set_index("rank")
    assert w["wait_ns"].tolist() == [400 * us, 300 * us, 0]
    assert w["transfer_ns"].tolist() == [100 * us] * 3
    assert w["lateness_ns"].tolist() == [0, 100 * us, 400 * us]
    assert w["is_last"].tolist() == [False, False, True]
    assert (w["last_rank"] == 2).all()
    # the blame of all ranks adds up to the total wait; the last rank carries most of it
    assert w["blame_ns"].tolist() == [0.0, 50.0 * us, 650.0 * us]
    assert w["blame_ns"].sum() == w["wait_ns"].sum()
    # clock-free: duration minus the shortest duration agrees with the aligned-clock wait
    assert w["check_wait_ns"].tolist() == [400 * us, 300 * us, 0]
    assert not w["clock_disagree"].any()


def test_disagreement_beyond_clock_uncertainty_is_flagged() -> None:
    us = 1000
    # rank 1's clock is 2 ms behind: by the aligned clock it seems to arrive before rank 0 and
    # wait 2.4 ms, but its duration (0.4 ms) says it waited about 0.3 ms
    c = collectives(
        {0: [0, 0], 1: [-2000 * us, 100 * us]}, {0: [500 * us, 500 * us], 1: [-1600 * us, 500 * us]}
    )
    c.loc[(c["coll"] == 0) & (c["rank"] == 0), "start"] = 0
    w = collective_waits(c, _clock(10 * us))
    bad = w[(w["coll"] == 0) & (w["rank"] == 1)].iloc[0]
    assert bad["clock_disagree"]
    # with a clock uncertainty as large as the error, nothing is flagged
    assert not collective_waits(c, _clock(3000 * us))["clock_disagree"].any()
    # collective 1 is consistent
    assert not w[w["coll"] == 1]["clock_disagree"].any()


def test_single_rank_collectives_have_no_wait_and_no_last() -> None:
    c = collectives({0: [0, 10]}, {0: [5, 20]})
    w = collective_waits(c)
    assert (w["wait_ns"] == 0).all() and (w["last_rank"] == -1).all() and not w["is_last"].any()


def test_totals_and_summary() -> None:
    us = 1000
    c = collectives(
        {0: [0, 1000 * us], 1: [100 * us, 1000 * us]},
        {0: [200 * us, 1100 * us], 1: [200 * us, 1100 * us]},
    )
    w = collective_waits(c)
    t = wait_totals(w).set_index("rank")
    assert t.loc[0, "comm_wait_ns"] == 100 * us and t.loc[1, "comm_wait_ns"] == 0
    assert t.loc[0, "comm_dur_ns"] == 300 * us and t.loc[0, "collectives"] == 2
    s = collective_summary(w)
    assert (
        s.loc[0, "op"] == "allreduce" and s.loc[0, "count"] == 2 and s.loc[0, "bytes"] == 2 * 4096
    )


def test_summary_per_op_counts_collectives_and_sums_rank_rows() -> None:
    """collective_summary: per op, its distinct collectives, their bytes (each collective's
    largest, a negative size counted as 0) and every rank row's times summed; the longest
    first. Mixed ops, a collective whose sizes differ by rank and one of unknown size."""
    import numpy as np

    rng = np.random.default_rng(5)
    n = 60
    w = pd.DataFrame(
        {
            "coll": np.repeat(np.arange(15), 4),
            "op": np.repeat(rng.choice(["allreduce", "broadcast", "alltoall"], 15), 4),
            "bytes": rng.integers(-1, 5000, n),
            "dur_ns": rng.integers(0, 10**6, n),
            "wait_ns": rng.random(n) * 1e5,
            "transfer_ns": rng.random(n) * 1e5,
            "clock_disagree": rng.random(n) < 0.2,
        }
    ).sample(frac=1.0, random_state=2)
    s = collective_summary(w).set_index("op")
    assert s["dur_ns"].is_monotonic_decreasing
    for op, rows in w.groupby("op"):
        largest = rows.groupby("coll")["bytes"].max()
        assert s.at[op, "count"] == len(largest)
        assert s.at[op, "bytes"] == int(largest.clip(lower=0).sum())
        assert s.at[op, "dur_ns"] == rows["dur_ns"].sum()
        assert s.at[op, "clock_disagree"] == rows["clock_disagree"].sum()
        assert s.at[op, "wait_ns"] == pytest.approx(rows["wait_ns"].sum(), rel=1e-12)
    assert str(s["count"].dtype) == "int64" and str(s["bytes"].dtype) == "int64"


def test_empty_table() -> None:
    w = collective_waits(collectives({}, {}))
    assert len(w) == 0 and "wait_ns" in w.columns


def test_disagreements_on_one_exact_clock_are_explained_as_timing_not_clock_error() -> None:
    from rankscope.analysis.render.report import _disagree_hint

    exact = [{"rank": r, "uncertainty_ns": 0} for r in range(2)]
    fitted = [{"rank": 0, "uncertainty_ns": 0}, {"rank": 1, "uncertainty_ns": 40_000}]
    doc = {"collectives": {"clock_disagreements": 3}, "clock": exact}
    assert "not clock error" in _disagree_hint(doc)
    # with fitted clocks it may be either: the hint says what was done and where to read more
    fitted_hint = _disagree_hint({**doc, "clock": fitted})
    assert "not clock error" not in fitted_hint
    assert "durations" in fitted_hint and "reading-output.md" in fitted_hint
    assert _disagree_hint({"collectives": {"clock_disagreements": 0}, "clock": exact}) == ""
