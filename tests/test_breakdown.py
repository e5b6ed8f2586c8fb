"""Breakdown per rank and step (GPU and CPU), and HTA-compatible numbers, with known answers."""

from __future__ import annotations

import numpy as np
import pytest
from analysis_frames import cpu_rank, gpu_rank
from rankscope.analysis.compute import breakdown as bd


def test_interval_union_merges_overlaps_and_touching() -> None:
    s, e = bd.interval_union(np.array([5, 0, 10, 30]), np.array([12, 5, 20, 31]))
    assert s.tolist() == [0, 30] and e.tolist() == [20, 31]
    assert bd.interval_measure((s, e)) == 21


def test_gpu_breakdown_known_answer() -> None:
    ev, ln = gpu_rank()
    out = bd.rank_breakdown(ev, ln, rank=3)
    assert out["device"].unique().tolist() == ["gpu"]
    whole = out[out["step"] == bd.WHOLE_RUN_STEP].iloc[0]
    us = 1000
    assert (whole.start, whole.end) == (100 * us, 1300 * us)
    assert whole.compute_ns == 300 * us
    assert (whole.comm_ns, whole.comm_overlapped_ns, whole.comm_exposed_ns) == (
        200 * us,
        50 * us,
        150 * us,
    )
    assert (whole.memory_ns, whole.idle_ns) == (100 * us, 650 * us)
    step1 = out[out["step"] == 1].iloc[0]
    assert (step1.start, step1.end, step1.compute_ns, step1.idle_ns) == (
        100 * us,
        1200 * us,
        200 * us,
        650 * us,
    )
    step2 = out[out["step"] == 2].iloc[0]
    assert (step2.compute_ns, step2.idle_ns) == (100 * us, 0)
    for r in out.itertuples():
        assert r.compute_ns + r.comm_exposed_ns + r.memory_ns + r.other_ns + r.idle_ns == r.total_ns


def test_hta_temporal_breakdown_drops_last_step_like_hta() -> None:
    ev, ln = gpu_rank()
    us = 1000
    h = bd.hta_temporal_breakdown(ev, ln, rank=0).iloc[0]
    assert (h.kernel_time_ns, h.idle_ns, h.compute_ns, h.non_compute_ns) == (
        500 * us,
        50 * us,
        200 * us,
        250 * us,
    )
    assert h.comm_union_ns == 200 * us and h.overlap_pct == pytest.approx(25.0)
    keep = bd.hta_temporal_breakdown(ev, ln, rank=0, drop_last_step=False).iloc[0]
    assert (keep.kernel_time_ns, keep.idle_ns, keep.compute_ns) == (1200 * us, 650 * us, 300 * us)


def test_hta_rounding_start_up_end_down_on_the_raw_grid() -> None:
    ts = np.array([100_400, 5_000])
    end = np.array([101_600, 6_000])
    rs, re_ = bd._hta_round(ts, end, 0)
    assert rs.tolist() == [101_000, 5_000] and re_.tolist() == [101_000, 6_000]
    # a clock offset of 400 ns moves the grid with it
    rs, re_ = bd._hta_round(ts, end, 400)
    assert rs.tolist() == [100_400, 5_400] and re_.tolist() == [101_400, 5_400]


def test_kernel_classes_follow_hta_regexes() -> None:
    import pandas as pd

    names = pd.Series(
        [
            "ncclKernel_SendRecv_RING",
            "ncclDevKernel_AllGather",
            "Memset (Device)",
            "Memcpy DtoD",
            "Event Sync",
            "void foo_kernel",
            "nccl_other",
        ]
    ).astype("category")
    assert bd.name_matches(names, bd.COMM_KERNEL_RE).tolist() == [
        True,
        True,
        False,
        False,
        False,
        False,
        False,
    ]
    assert bd.name_matches(names, bd.NOT_COMPUTE_RE).tolist() == [
        True,
        True,
        True,
        True,
        True,
        False,
        False,
    ]


def test_cpu_breakdown_counts_the_ddp_hole_as_communication() -> None:
    ev, ln = cpu_rank()
    out = bd.rank_breakdown(ev, ln, rank=0)
    row = out[out["step"] == 3].iloc[0]
    assert row.device == "cpu" and row.total_ns == 1000
    assert row.input_ns == 100
    assert row.comm_exposed_ns == 280 and row.comm_overlapped_ns == 0
    assert row.compute_ns == 570
    assert row.idle_ns == 50
    assert row.compute_ns + row.comm_exposed_ns + row.input_ns + row.idle_ns == row.total_ns


def test_main_lane_is_the_profiler_step_thread() -> None:
    ev, ln = cpu_rank()
    assert bd.main_lane(ev, ln) == 0
    assert not bd.is_gpu_rank(ev, ln)


# -- real traces through the real merge → store → analysis ------------------------------------

HTA_SETS = [
    "hta/trace_filter_2rank",
    "hta/df_index_resolver",
    "hta/nccl_parser_config",
    "param_dlrm_8rank",
]
HTA_TOLERANCE = 0.005


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("stores")


@pytest.mark.parametrize("name", HTA_SETS)
def test_equals_hta_on_every_gpu_set(name: str, data_dir, store_dir) -> None:
    """HTA 0.5.0's temporal breakdown and comm/compute overlap, within 0.5% (data: hta_reference.json)."""
    import json

    from analysis_frames import merged
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    ref = json.loads((data_dir / "hta_reference.json").read_text())["sets"][name]["ranks"]
    a = analyze(merged(data_dir, name, store_dir), ClusterSpec(scheduler=SYNCHRONOUS))
    got = a.hta.set_index("rank")
    assert sorted(got.index) == sorted(int(r) for r in ref)
    for rank, exp in ref.items():
        row = got.loc[int(rank)]
        for key in ("idle", "compute", "non_compute", "kernel_time", "comm_union"):
            if key in exp:
                assert row[f"{key}_ns"] / 1000 == pytest.approx(exp[key], rel=HTA_TOLERANCE), (
                    rank,
                    key,
                )
        # HTA prints the overlap rounded to 2 decimals
        assert row["overlap_pct"] == pytest.approx(
            exp["overlap_pct"], abs=max(0.01, HTA_TOLERANCE * exp["overlap_pct"])
        )
    # our own GPU breakdown partitions each rank's window
    for r in a.breakdown.itertuples():
        assert r.device == "gpu"
        assert r.compute_ns + r.comm_exposed_ns + r.memory_ns + r.other_ns + r.idle_ns == r.total_ns


def test_cpu_gloo_breakdown_partitions_the_steps(data_dir, store_dir) -> None:
    from analysis_frames import merged
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    a = analyze(
        merged(data_dir, "cpu_gloo_4rank_straggler", store_dir), ClusterSpec(scheduler=SYNCHRONOUS)
    )
    steps = a.breakdown[a.breakdown["step"] >= 0]
    assert sorted(steps["step"].unique()) == [2, 3, 4] and set(steps["rank"]) == {0, 1, 2, 3}
    for r in a.breakdown.itertuples():
        assert r.device == "cpu"
        assert r.compute_ns + r.comm_exposed_ns + r.input_ns + r.idle_ns == r.total_ns
    whole = a.whole().set_index("rank")
    # the ranks that wait for rank 2 spend most of their time in (exposed) communication,
    # which only shows as the DDP reducer's hole in the main thread
    for rank in (0, 1, 3):
        assert whole.loc[rank, "comm_exposed_ns"] > 0.5 * whole.loc[rank, "total_ns"]
    assert whole.loc[2, "compute_ns"] > 0.5 * whole.loc[2, "total_ns"]
    v = a.verdicts.set_index("rank")["verdict"]
    assert v[2] == "compute-bound" and all(
        v[r].startswith("communication-bound") for r in (0, 1, 3)
    )


# -- verdicts and ops (small tables built from the breakdown) --------------------------------


def _whole(rank: int, device: str = "cpu", **ns: int) -> dict:
    row = dict.fromkeys(bd.BREAKDOWN_COLUMNS, 0)
    row.update(rank=rank, step=bd.WHOLE_RUN_STEP, device=device, total_ns=1000, **ns)
    return row


@pytest.mark.parametrize(
    ("parts", "wait_xfer", "verdict"),
    [
        ({"compute_ns": 700, "comm_exposed_ns": 200, "idle_ns": 100}, (100, 100), "compute-bound"),
        (
            {"compute_ns": 200, "comm_exposed_ns": 700, "idle_ns": 100},
            (900, 100),
            "communication-bound (wait)",
        ),
        (
            {"compute_ns": 200, "comm_exposed_ns": 700, "idle_ns": 100},
            (100, 900),
            "communication-bound (transfer)",
        ),
        ({"compute_ns": 200, "input_ns": 600, "idle_ns": 200}, (0, 0), "input-bound"),
        ({"compute_ns": 200, "idle_ns": 800}, (0, 0), "host-bound"),
        ({"compute_ns": 10, "idle_ns": 990}, (0, 0), "idle"),
    ],
)
def test_verdict_names_the_largest_share(
    parts: dict, wait_xfer: tuple[int, int], verdict: str
) -> None:
    import pandas as pd
    from rankscope.analysis.compute.verdict import verdicts

    whole = pd.DataFrame([_whole(0, **parts)])
    totals = pd.DataFrame(
        {"rank": [0], "comm_wait_ns": [wait_xfer[0]], "comm_transfer_ns": [wait_xfer[1]]}
    )
    v = verdicts(whole, totals).iloc[0]
    assert v["verdict"] == verdict
    assert str(round(100 * parts.get("compute_ns", 0) / 1000)) + "%" in v["reason"]


def test_ops_across_ranks_spread_and_slowest_rank() -> None:
    from analysis_frames import cpu_rank
    from rankscope.analysis.compute.ops import across_ranks, annotation_stats, op_stats

    ev0, _ = cpu_rank()
    ev1, _ = cpu_rank(extra_compute=300)  # rank 1's second aten::mm takes 300 ns longer
    stats = pd_concat([op_stats(ev0, 0), op_stats(ev1, 1)])
    table = across_ranks(stats).set_index("name")
    mm = table.loc["aten::mm"]
    assert mm["ranks"] == 2 and mm["count_mean"] == 2
    assert (mm["wall_min_ns"], mm["wall_max_ns"]) == (360, 660)
    assert mm["total_mean_ns"] == 510  # no overlapping calls: summed == wall
    assert mm["slowest_rank"] == 1 and mm["fastest_rank"] == 0
    assert mm["spread"] == pytest.approx(300 / 510)
    assert table.loc["gloo:all_reduce", "spread"] == 0
    ann = across_ranks(pd_concat([annotation_stats(ev0, 0), annotation_stats(ev1, 1)]))
    assert set(ann["name"]) == {
        "forward",
        "backward",
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    }


def pd_concat(frames: list) -> object:
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def test_grouped_unions_equal_one_union_per_group() -> None:
    """The vectorised unions of all groups equal interval_union group by group (random sets,
    touching, nested and negative-length intervals included), and so do clipped walls."""
    import numpy as np
    from rankscope.analysis.compute.breakdown import grouped_unions, interval_union, measure_below
    from rankscope.analysis.compute.ops import _walls

    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        groups = int(rng.integers(1, 8))
        g = rng.integers(0, groups, n)
        ts = 10**15 + rng.integers(0, 2000, n)
        end = ts + rng.integers(-5, 300, n)
        got = grouped_unions(g, ts, end)
        assert got is not None
        gg, s, e = got
        for k in range(groups):
            ref_s, ref_e = interval_union(ts[g == k], end[g == k])
            assert np.array_equal(s[gg == k], ref_s) and np.array_equal(e[gg == k], ref_e)
        # windows: disjoint (vectorised) and overlapping (the per-group fallback) against paint
        lo = np.sort(rng.integers(10**15, 10**15 + 2400, 4))
        for hi in (np.append(lo[1:], lo[-1] + 100), lo + 700):
            fast = _walls(g, ts, end, groups, lo, hi)
            for k in range(groups):
                iv = interval_union(ts[g == k], end[g == k])
                keep = iv[1] > iv[0]
                ref = sum(
                    int(
                        np.sum(
                            np.clip(
                                np.minimum(iv[1][keep], b) - np.maximum(iv[0][keep], a), 0, None
                            )
                        )
                    )
                    for a, b in zip(lo, hi, strict=True)
                )
                assert fast[k] == ref
    starts, ends = np.array([0, 10, 30]), np.array([5, 20, 40])
    assert measure_below(starts, ends, np.array([-1, 3, 7, 15, 25, 35, 99])).tolist() == [
        0,
        3,
        5,
        10,
        15,
        20,
        25,
    ]
    # times too wide to lift: the caller falls back to a loop
    assert grouped_unions(np.array([0, 1]), np.array([0, 2**62]), np.array([1, 2**62 + 1])) is None
