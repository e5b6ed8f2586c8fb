"""Numbers that explain themselves: a part never exceeds its whole, on every test store.

Each figure a user reads says what it is a part of; these tests hold every rank of every store in
``tests/data`` to it. ``cpu_gloo_4rank_ddp_buckets`` is the store that broke it before: the
quickstart run (``examples/train_ddp.py --steps 20 --straggler-rank 2 --straggler-ms 20``), whose
two DDP buckets per step are in flight together, so sums over collectives counted the same
instants twice (a wait longer than the rank's profiled time, a 187 ms ``gloo:all_reduce`` in a
108 ms window, and 112 ms of "own extra work" for 60 ms injected).
"""

from __future__ import annotations

from pathlib import Path

import pytest

STORES = [
    "cpu_gloo_4rank_straggler",
    "cpu_gloo_4rank_skew",
    "cpu_gloo_4rank_pipeline",
    "cpu_gloo_4rank_pipeline_balanced",
    "cpu_gloo_4rank_ddp_buckets",
    "param_dlrm_8rank",
    "hta/trace_filter_2rank",
]
#: summary.json rounds seconds to the µs: allow that much per figure.
ROUND_S = 2e-6


@pytest.fixture(scope="module")
def analyses(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from analysis_frames import merged
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    out = tmp_path_factory.mktemp("figures")
    return {
        name: analyze(merged(data_dir, name, out), ClusterSpec(scheduler=SYNCHRONOUS))
        for name in STORES
    }


@pytest.mark.parametrize("name", STORES)
def test_each_share_is_within_the_ranks_total(analyses: dict, name: str) -> None:
    from rankscope.analysis.render.report import summary

    doc = summary(analyses[name])
    assert doc["ranks"]
    for r in doc["ranks"]:
        total = r["total_s"] + ROUND_S
        for part in ("compute_s", "comm_s", "memory_s", "input_s", "other_s", "idle_s"):
            assert r[part] <= total, (name, r["rank"], part, r[part], r["total_s"])
        assert r["comm_exposed_s"] + r["comm_overlapped_s"] <= r["comm_s"] + 2 * ROUND_S
        # wait and transfer are instants of the profiled time, each counted once
        assert r["comm_wait_s"] + r["comm_transfer_s"] <= total + ROUND_S, (name, r)
    for s in doc["steps"]:
        for part in ("compute_s", "comm_exposed_s", "memory_s", "input_s", "idle_s"):
            assert s[part] <= s["total_s"] + ROUND_S, (name, s)


@pytest.mark.parametrize("name", STORES)
def test_straggler_evidence_is_within_the_ranks_own_time(analyses: dict, name: str) -> None:
    a = analyses[name]
    whole = a.whole().set_index("rank")["total_ns"] / 1e9
    others_total = whole.sum()
    for s in a.stragglers.itertuples(index=False):
        own_time = whole[s.rank] + ROUND_S
        assert s.late_s <= own_time, (name, s)
        assert s.own_extra_s <= own_time, (name, s)
        for part in (s.compute_extra_s, s.input_extra_s, s.host_extra_s):
            assert part <= own_time, (name, s)
        # the wait it caused is time the OTHER ranks spent waiting
        assert s.wait_caused_s <= others_total - whole[s.rank] + ROUND_S, (name, s)
    for p in a.pipeline.itertuples(index=False):
        assert p.wait_caused_s <= p.wait_traced_s + ROUND_S
        assert p.wait_caused_s <= others_total - whole[p.rank] + ROUND_S


@pytest.mark.parametrize("name", STORES)
def test_an_op_never_runs_longer_than_the_profiled_time(analyses: dict, name: str) -> None:
    a = analyses[name]
    longest_rank = float(a.whole()["total_ns"].max())
    for table in (a.ops, a.annotations):
        for o in table.itertuples(index=False):
            assert o.wall_max_ns <= longest_rank, (name, o.name, o.wall_max_ns, longest_rank)
            assert o.wall_min_ns <= o.wall_mean_ns <= o.wall_max_ns


def test_overlapping_buckets_are_counted_once(analyses: dict) -> None:
    """The quickstart store: per-collective sums exceed the wall time, the figures shown do not."""
    a = analyses["cpu_gloo_4rank_ddp_buckets"]
    t = a.comm_totals.set_index("rank")
    # the sums over collectives really do overlap here (what the old table printed)...
    assert (t["comm_wait_sum_ns"] + t["comm_transfer_sum_ns"] > t["comm_wait_ns"]).any()
    # ...and the all_reduce calls overlap each other: summed > wall on some rank
    ar = a.op_stats[a.op_stats["name"] == "gloo:all_reduce"]
    assert (ar["total_ns"] > ar["wall_ns"]).any()


def test_straggler_evidence_matches_the_injected_delay(analyses: dict) -> None:
    """Rank 2 waits 20 ms at the start of each of the 3 recorded steps: 60 ms, within 25 %."""
    a = analyses["cpu_gloo_4rank_ddp_buckets"]
    assert a.straggler_ranks() == [2]
    top = a.stragglers.iloc[0]
    recorded = int((a.breakdown.query("rank == 2")["step"] >= 0).sum())
    injected_s = 0.020 * recorded
    assert recorded == 3
    assert top["own_extra_s"] == pytest.approx(injected_s, rel=0.25)
    assert top["late_s"] == pytest.approx(injected_s, rel=0.25)
    assert top["cause"] == "own compute"


def test_shortened_op_names_stay_distinct() -> None:
    from rankscope.analysis.render.report import short_names

    names = [
        "autograd::engine::evaluate_function: AddmmBackward0",
        "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
        "aten::mm",
    ]
    short = short_names(names, 38)
    assert len(set(short)) == 3 and all(len(s) <= 38 for s in short)
    assert short[2] == "aten::mm"
    assert short[0].endswith("AddmmBackward0")


def test_run_table_speaks_the_merges_clock_words() -> None:
    """The run table said "via rank 0" where the analysis said "reference" for the same clock."""
    from rankscope.orchestrator.run_outcome import _clock_label

    row = {"rank": 1, "clock_leader": 0, "clock_reference": 0, "clock_samples": 0}
    assert _clock_label(row) == "reference"
    assert _clock_label({**row, "rank": 0}) == "reference"
    assert _clock_label({**row, "clock_leader": 2, "rank": 3}) == "same clock as rank 2"
    assert _clock_label({**row, "clock_leader": 2, "rank": 2, "clock_samples": 8}) == (
        "runtime (8 samples)"
    )
    assert _clock_label({**row, "clock_leader": None}) == "-"


def test_terminal_summary_points_to_how_to_read_it(analyses: dict) -> None:
    import io

    from rankscope.analysis.render.report import READING_DOC, print_summary
    from rich.console import Console

    out = io.StringIO()
    print_summary(analyses["cpu_gloo_4rank_ddp_buckets"], Console(file=out, width=200))
    text = out.getvalue()
    assert READING_DOC in text
    assert (Path(__file__).resolve().parents[1] / READING_DOC).is_file()
    assert "fell " in text and "each delay counted once" in text
    # the rank-time sums say what they sum over
    assert "summed over their 24 (collective, rank) rows" in text
