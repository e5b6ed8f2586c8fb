"""Memory across ranks (rankscope.analysis.compute.memory): extraction, peaks, leaks, imbalance, holders.

Fast tests run on generated ground truth (and through ``rankscope merge``: the store's memory
table); the slow tests share one real run of the example with ``--profile-memory --leak-mb 1:4
--extra-memory-mb 2:64`` on 4 CPU ranks, merged and analysed by ``rankscope analyze``, and read it
through the store, summary.json, the terminal, the HTML report, Perfetto and the timeline.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rankscope.analysis.compute import memory as M
from rankscope.analysis.conclude.findings import FindingKind, Severity
from rankscope.analysis.conclude.memory_findings import memory_findings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
MiB = 2**20
GiB = 2**30


# -- generated traces and frames ----------------------------------------------------------------


def mem_event(ts_us: float, addr: int, nbytes: int, total: int, **over: Any) -> dict[str, Any]:
    """A ``[memory]`` instant event as Kineto writes it (CPU unless overridden)."""
    args: dict[str, Any] = {
        "Total Reserved": over.pop("reserved", 0),
        "Total Allocated": total,
        "Bytes": nbytes,
        "Device Id": over.pop("device_id", -1),
        "Device Type": over.pop("device_type", 0),
        "Addr": addr,
        "finished": False,
        "Ev Idx": 1,
    }
    ev = {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 7}
    return {**ev, "tid": over.pop("tid", 7), "ts": ts_us, "args": args, **over}


def op(name: str, ts_us: float, dur_us: float, cat: str = "cpu_op", tid: int = 7) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts_us, "dur": dur_us}


def frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    """A memory table from (rank, ts, device_type, device_id, addr, bytes, total_allocated,
    total_reserved, op, scope, step, window) tuples, with the contract's dtypes."""
    df = pd.DataFrame(rows, columns=list(M.MEMORY_COLUMNS))
    return df.astype(M.MEMORY_COLUMNS)


def step_series(
    rank: int,
    starts: list[float],
    *,
    device_type: int = M.DeviceType.CUDA,
    windows: list[int] | None = None,
    work: int = 64 * MiB,
) -> list[tuple[Any, ...]]:
    """Events of a rank whose allocated memory at the start of step i is ``starts[i]``: each
    step allocates ``work`` bytes (its peak) and frees them again."""
    rows = []
    did = 0 if device_type == M.DeviceType.CUDA else -1
    for i, start in enumerate(starts):
        w = windows[i] if windows else 0
        base, t = int(start), i * 1_000_000
        rows.append(
            (rank, t + 10, device_type, did, 4096, work, base + work, 0, "aten::mm", "", i, w)
        )
        rows.append((rank, t + 20, device_type, did, 4096, -work, base, 0, "", "", i, w))
    return rows


# -- statistics ----------------------------------------------------------------------------------


def test_t_tail_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 5, 8, 30, 200):
        for t in (-3.0, -0.5, 0.0, 0.3, 1.0, 2.5, 6.0, 40.0):
            assert M.t_sf(t, df) == pytest.approx(float(stats.t.sf(t, df)), rel=1e-9, abs=1e-15)


def test_slope_test_exact_and_noisy() -> None:
    x = np.arange(8.0)
    slope, se, df, p = M.slope_test(x, 5.0 + 3.0 * x, np.zeros(8))
    assert (slope, se, df, p) == (pytest.approx(3.0), 0.0, 6, 0.0)
    slope, se, df, p = M.slope_test(x, np.full(8, 5.0), np.zeros(8))
    assert slope == 0 and p == 1.0
    # two windows with different offsets: the slope within them, df = n - groups - 1
    y = np.r_[10 + 2 * x[:4], 100 + 2 * x[4:]]
    slope, _, df, p = M.slope_test(x, y, np.r_[np.zeros(4), np.ones(4)])
    assert slope == pytest.approx(2.0) and df == 5 and p == 0.0
    assert math.isnan(M.slope_test(x[:2], y[:2], np.zeros(2))[3])  # too few points


# -- extraction ----------------------------------------------------------------------------------


def test_memory_rows_fields_op_scope_step() -> None:
    events = [
        op("ProfilerStep#4", 100, 100, cat="user_annotation"),
        op("rankscope_example::extra_memory", 110, 20, cat="user_annotation"),
        op("aten::ones", 111, 10),
        op("aten::empty", 112, 2),
        mem_event(112.5, 0x1000, 64 * MiB, 64 * MiB),
        op("aten::mm", 140, 10),
        mem_event(141.0, 0x2000, MiB, 65 * MiB),
        mem_event(190.25, 0x1000, -64 * MiB, MiB),  # the step itself only
        mem_event(250.0, 0x3000, 8, MiB + 8, tid=9),  # another thread, after the step
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "main"}},
    ]
    mem, skipped = M.memory_rows(events, rank=3, window=2, base_ns=1_000_000_000)
    assert skipped == {}
    assert list(mem.columns) == list(M.MEMORY_COLUMNS)
    assert {c: str(t) for c, t in mem.dtypes.items() if c not in ("op", "scope")} == {
        c: t for c, t in M.MEMORY_COLUMNS.items() if t != "str"
    }
    assert mem["ts"].tolist() == [1_000_112_500, 1_000_141_000, 1_000_190_250, 1_000_250_000]
    assert mem["op"].tolist() == ["aten::ones", "aten::mm", "", ""]
    assert mem["scope"].tolist() == ["rankscope_example::extra_memory", "", "", ""]
    assert mem["step"].tolist() == [4, 4, 4, -1]
    assert mem["bytes"].tolist() == [64 * MiB, MiB, -64 * MiB, 8]
    assert (mem["rank"] == 3).all() and (mem["window"] == 2).all()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("Addr", None),
        ("Addr", "0x7f00"),
        ("Addr", -5),
        ("Bytes", 3.5),
        ("Bytes", "12"),
        ("Device Type", True),
        ("Device Id", 1e9),
        ("Total Allocated", -1),
        ("Total Reserved", [1]),
    ],
)
def test_bad_memory_fields_are_skipped_and_counted(field: str, value: Any) -> None:
    bad = mem_event(5, 0x10, 8, 8)
    if value is None:
        del bad["args"][field]
    else:
        bad["args"][field] = value
    events = [mem_event(1, 0x20, 16, 16), bad, mem_event(9, 0x20, -16, 0)]
    mem, skipped = M.memory_rows(events, rank=0)
    assert len(mem) == 2
    assert skipped == {f"memory event: missing or bad {field!r}": 1}


def test_bad_event_shapes_never_crash() -> None:
    events: list[Any] = [
        {"ph": "i", "name": "[memory]", "ts": "12", "args": {}},
        {"ph": "i", "name": "[memory]", "ts": float("nan"), "args": {}},
        {"ph": "i", "name": "[memory]", "ts": 3, "args": None},
        {"ph": "i", "name": "[memory]", "ts": 3, "args": [1, 2]},
        {"ph": "i", "name": "[memory]"},
        {"ph": "X", "name": "ProfilerStep#x", "ts": 0, "dur": 5},
        {"ph": "X", "name": "aten::mm", "ts": 0, "dur": None},
    ]
    mem, skipped = M.memory_rows(events, rank=0)
    assert len(mem) == 0 and list(mem.columns) == list(M.MEMORY_COLUMNS)
    assert sum(skipped.values()) == 5
    assert set(skipped) == {
        "memory event: missing or bad 'ts'",
        "memory event: missing or bad 'args'",
    }


def test_no_memory_events_is_a_note_not_zeros() -> None:
    mem, _ = M.memory_rows([op("aten::mm", 0, 5)], rank=0)
    pk = M.peaks(mem)
    assert len(pk) == 0 and len(M.leaks(mem)) == 0 and len(M.holders_at_peak(mem)) == 0
    found = memory_findings(pk, M.leaks(mem), M.imbalance(pk))
    assert [f.kind for f in found] == [FindingKind.NO_MEMORY_EVENTS]
    assert found[0].severity == Severity.NOTE
    assert "no memory events (run with --profile-memory)" in found[0].text


def test_device_total_memory_from_a_real_gpu_trace(data_dir: Path) -> None:
    path = sorted((data_dir / "param_dlrm_8rank").glob("worker0_*.json"))[0]
    props = json.loads(path.read_text())["deviceProperties"]
    totals = M.device_total_memory(props)
    assert totals[0] == 34079899648  # Tesla V100-SXM2-32GB
    assert M.device_total_memory([]) == {} and M.device_total_memory(None) == {}
    assert M.device_total_memory([{"id": "0", "totalGlobalMem": 5}, {"id": 1}]) == {}


# -- peaks, headroom -----------------------------------------------------------------------------


def test_peaks_are_the_exact_maximum_with_step_and_time() -> None:
    rows = step_series(0, [GiB, GiB + 5 * MiB, GiB + 2 * MiB])
    rows += step_series(1, [MiB, MiB], device_type=M.DeviceType.CPU)
    mem = frame(rows)
    mem.loc[mem["device_type"] == M.DeviceType.CUDA, "total_reserved"] = 3 * GiB
    pk = M.peaks(mem)
    gpu = pk[pk["rank"] == 0].iloc[0]
    assert gpu["peak_allocated"] == GiB + 5 * MiB + 64 * MiB
    assert gpu["peak_allocated_step"] == 1 and gpu["peak_allocated_ts"] == 1_000_010
    assert gpu["peak_reserved"] == 3 * GiB
    sp = M.step_peaks(mem)
    assert sp[sp["rank"] == 0]["start_allocated"].tolist() == [GiB, GiB + 5 * MiB, GiB + 2 * MiB]
    room = M.headroom(pk, {0: 80 * GiB})
    assert len(room) == 1 and not room["is_low"].iloc[0]  # CPU rows have no headroom
    room = M.headroom(pk, {(0, 0): int(3.2 * GiB)})
    assert room["is_low"].iloc[0] and room["headroom_share"].iloc[0] == pytest.approx(0.2 / 3.2)
    found = memory_findings(pk, M.leaks(mem), M.imbalance(pk), room)
    low = [f for f in found if f.kind == FindingKind.LOW_MEMORY_HEADROOM]
    assert len(low) == 1 and low[0].rank == 0 and "(6.2% left)" in low[0].text


# -- leaks on generated ground truth --------------------------------------------------------------


def generated_series(
    rng: np.random.Generator, n_series: int, leak: bool
) -> tuple[pd.DataFrame, np.ndarray]:
    """``n_series`` CUDA ranks: a 512 MiB working set at step start plus noise of a random kind
    (none, normal, heavy-tailed t3, a 2-step sawtooth, rare spikes) and size (σ up to 2 MiB),
    10..30 steps; with ``leak``, growth of 1..8 MiB/step. Returns the frame and the slopes."""
    rows: list[tuple[Any, ...]] = []
    slopes = rng.uniform(1, 8, n_series) * MiB if leak else np.zeros(n_series)
    for rank in range(n_series):
        n = int(rng.integers(10, 31))
        sigma = rng.uniform(0, 2) * MiB
        kind = rng.integers(5)
        if kind == 0:
            noise = np.zeros(n)
        elif kind == 1:
            noise = rng.normal(0, sigma, n)
        elif kind == 2:
            noise = rng.standard_t(3, n) * sigma
        elif kind == 3:
            noise = np.where(np.arange(n) % 2 == 0, sigma, 0.0)  # e.g. gradient accumulation
        else:
            noise = np.where(rng.random(n) < 0.1, 8 * sigma, 0.0)  # an occasional spike
        starts = 512 * MiB + slopes[rank] * np.arange(n) + np.abs(noise)
        rows += step_series(rank, starts.tolist())
    return frame(rows), slopes


def test_leak_false_positive_and_negative_rates() -> None:
    """1000 series without and 1000 with a leak, each tested at LEAK_ALPHA on its own (alpha is
    split over the series of a frame, so the family level here is LEAK_ALPHA x n)."""
    rng = np.random.default_rng(20261130)
    n = 1000
    clean, _ = generated_series(rng, n, leak=False)
    found = M.leaks(clean, alpha=M.LEAK_ALPHA * n)
    false_pos = float(found["is_leak"].mean())
    # the test alone, before materiality: at most its level (less: some noise kinds are exact)
    assert float(found["significant"].mean()) <= 0.02
    leaky, slopes = generated_series(rng, n, leak=True)
    found = M.leaks(leaky, alpha=M.LEAK_ALPHA * n)
    false_neg = float((~found["is_leak"]).mean())
    err = (found["slope_bytes_per_step"] - slopes) / slopes
    print(f"leak detection: false positives {false_pos:.2%}, false negatives {false_neg:.2%}")
    assert false_pos <= 0.02  # the level is 1 %
    assert false_neg <= 0.03
    assert float(np.median(np.abs(err))) < 0.05


def test_leak_test_is_calibrated_under_normal_noise() -> None:
    """Pure normal noise, no leak: the share called significant is the level (1 %)."""
    rng = np.random.default_rng(11)
    n, rows = 2000, []
    for rank in range(n):
        starts = 512 * MiB + rng.normal(0, MiB, int(rng.integers(10, 31)))
        rows += step_series(rank, starts.tolist())
    rate = float(M.leaks(frame(rows), alpha=M.LEAK_ALPHA * n)["significant"].mean())
    print(f"significant under normal noise: {rate:.2%} (level 1 %)")
    assert 0.004 <= rate <= 0.018  # 20 ± 4.4 of 2000 expected: a 2.5 σ band


def test_leak_family_level_and_materiality() -> None:
    rng = np.random.default_rng(7)
    clean, _ = generated_series(rng, 256, leak=False)
    assert not M.leaks(clean)["is_leak"].any()  # 1 % for the whole 256-rank job
    # exactly linear but slow: a cache filling up (peak 576 MiB, 64 KiB/step) is not a leak
    slow = frame(step_series(0, [512 * MiB + i * 64 * 1024 for i in range(20)]))
    row = M.leaks(slow).iloc[0]
    assert row["p_value"] == 0.0 and not row["is_leak"] and row["reason"] == "not material"
    few = M.leaks(frame(step_series(0, [MiB, 9 * MiB])))
    assert few["reason"].iloc[0] == "too few steps" and not few["is_leak"].iloc[0]


def test_cpu_counters_compare_within_windows_only() -> None:
    """The CPU counter restarts per window and the first step of each window differs (module
    docstring, measured): a leak is the slope within windows; window jumps are no leak."""
    starts, windows = [], []
    for w, offset in enumerate([0, 3 * MiB, 2 * MiB]):
        for i in range(4):
            step = w * 5 + i
            first = -0.8 * MiB if i == 0 else 0.0
            starts.append(2.6 * MiB + offset + first)
            windows.append(w)
            del step
    clean = frame(step_series(0, starts, device_type=M.DeviceType.CPU, windows=windows))
    leaky_starts = [s + 4 * MiB * i for i, s in enumerate(starts)]
    leaky = frame(step_series(1, leaky_starts, device_type=M.DeviceType.CPU, windows=windows))
    found = M.leaks(pd.concat([clean, leaky], ignore_index=True)).set_index("rank")
    assert not found.loc[0, "is_leak"] and found.loc[0, "steps"] == 9
    assert found.loc[1, "is_leak"]
    assert found.loc[1, "slope_bytes_per_step"] == pytest.approx(4 * MiB)


# -- imbalance ------------------------------------------------------------------------------------


def peak_frame(values: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "rank": np.arange(len(values), dtype=np.int32),
            "device_type": np.full(len(values), M.DeviceType.CUDA, np.int8),
            "device_id": np.zeros(len(values), np.int16),
            "peak_allocated": np.asarray(values, np.int64),
        }
    )


def test_imbalance_uses_the_median_of_the_other_ranks() -> None:
    base = 2 * GiB
    out = M.imbalance(peak_frame([base, base + 40 * MiB, base + 64 * MiB, base + 1000])).set_index(
        "rank"
    )
    assert out["is_imbalanced"].tolist() == [False, False, False, False]  # 3 % is not material
    small = 200 * MiB
    out = M.imbalance(peak_frame([small, small + 40 * MiB, small + 64 * MiB, small + 1000]))
    out = out.set_index("rank")
    assert out.loc[2, "is_imbalanced"] and out.loc[1, "is_imbalanced"]
    assert not out.loc[0, "is_imbalanced"] and not out.loc[3, "is_imbalanced"]
    assert out.loc[2, "excess_bytes"] == pytest.approx(64 * MiB - 1000, abs=1)


def test_imbalance_needs_an_outlier_not_noise() -> None:
    rng = np.random.default_rng(3)
    flagged = 0
    for _ in range(300):
        values = 1 * GiB + rng.normal(0, 40 * MiB, 16)  # 4 % spread between 16 ranks
        flagged += int(M.imbalance(peak_frame(values.tolist()))["is_imbalanced"].sum())
    assert flagged <= 300 * 16 * 0.002
    values = [GiB] * 7 + [1.5 * GiB]
    out = M.imbalance(peak_frame(values))
    assert out["is_imbalanced"].tolist() == [False] * 7 + [True]
    assert len(M.imbalance(peak_frame([GiB]))) == 0  # one rank: nothing to compare with


# -- holders at the peak --------------------------------------------------------------------------


def test_holders_at_peak_match_by_address_within_the_peak_window() -> None:
    cpu, r = M.DeviceType.CPU, 0
    rows = [
        # window 0: an allocation whose free fell between windows (not live later)
        (r, 10, cpu, -1, 0x9, 50 * MiB, 50 * MiB, 0, "aten::cat", "", 0, 0),
        # window 1
        (r, 100, cpu, -1, 0x8, -7 * MiB, 43 * MiB, 0, "", "", 2, 1),  # free, allocation unseen
        (r, 110, cpu, -1, 0x1, 10 * MiB, 53 * MiB, 0, "aten::mm", "", 2, 1),
        (r, 120, cpu, -1, 0x2, 30 * MiB, 83 * MiB, 0, "aten::bmm", "fwd", 2, 1),
        (r, 130, cpu, -1, 0x1, -10 * MiB, 73 * MiB, 0, "", "", 2, 1),
        (r, 140, cpu, -1, 0x1, 6 * MiB, 79 * MiB, 0, "aten::bmm", "fwd", 2, 1),  # address reused
        (r, 150, cpu, -1, 0x3, 5 * MiB, 84 * MiB, 0, "aten::add", "", 2, 1),  # the peak
        (r, 160, cpu, -1, 0x3, -5 * MiB, 79 * MiB, 0, "", "", 2, 1),
    ]
    mem = frame(rows)
    assert M.peaks(mem)["peak_allocated"].iloc[0] == 84 * MiB
    h = M.holders_at_peak(mem)
    got = {(row.op, row.scope): (row.bytes, row.allocations) for row in h.itertuples()}
    assert got == {
        ("aten::bmm", "fwd"): (36 * MiB, 2),
        ("aten::add", ""): (5 * MiB, 1),
        ("", "(not seen allocated)"): (43 * MiB, 0),
    }
    bmm = h[h["op"] == "aten::bmm"]
    assert bmm["share"].iloc[0] == pytest.approx(36 / 84)
    assert h["share"].sum() == pytest.approx(1.0)
    assert M.holders_at_peak(mem)["share"].sum() <= 1.0 + 1e-12


# -- through the merge: decode, store, analysis ---------------------------------------------------


def write_trace_file(path: Path, events: list[dict[str, Any]], rank: int, **top: Any) -> Path:
    """A Kineto-like trace of ``events`` for ``rank`` (one event per line, like Kineto)."""
    doc = {"distributedInfo": {"rank": rank, "world_size": 2}, **top, "traceEvents": events}
    path.write_text(json.dumps(doc, indent=2))
    return path


def test_store_round_trip_of_the_memory_table(tmp_path: Path) -> None:
    """Two ranks' memory events through ``rankscope merge``: the store's memory table is what
    memory_rows makes of the same events, its ts on the aligned clock like the events', and
    a malformed event is a problem of the store; GPU totals come from deviceProperties."""
    from rankscope.analysis.store.reader import open_store
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    traces = tmp_path / "traces"
    traces.mkdir()
    per_rank = {}
    for rank in (0, 1):
        events = [
            op("ProfilerStep#1", 100, 100, cat="user_annotation"),
            op("fwd", 105, 60, cat="user_annotation"),
            op("aten::ones", 110, 10),
            op("aten::empty", 111, 2),
            mem_event(
                111.5,
                0x1000,
                (rank + 1) * MiB,
                (rank + 1) * MiB,
                device_type=1,
                device_id=0,
                reserved=2 * MiB,
            ),
            mem_event(
                150.25, 0x1000, -(rank + 1) * MiB, 0, device_type=1, device_id=0, reserved=2 * MiB
            ),
            mem_event(160.0, 0x2000, 8, 8, device_type=1, device_id=0, Addr="bad"),
        ]
        events[-1]["args"]["Addr"] = "bad"
        base = 1_700_000_000_000_000_000 + rank * 5_000  # rank 1's clock 5 µs ahead
        props = [{"id": 0, "name": "H200", "totalGlobalMem": 140 * GiB}]
        write_trace_file(
            traces / f"rank{rank}.json", events, rank,
            baseTimeNanoseconds=base, deviceProperties=props,
        )  # fmt: skip
        per_rank[rank] = M.memory_rows(events, rank=rank, base_ns=base)
    out = merge_run_dir(traces, quiet=True)
    with open_store(out) as store:
        mem = store.memory()
        assert list(mem.columns) == list(M.MEMORY_COLUMNS)
        assert store.has_memory() and store.device_memory(1) == {0: 140 * GiB}
        clock = store.clock().set_index("rank")
        events0 = store.events(1, columns=["ts", "name"])
        problems = store.problems()
    assert (problems["problem"] == "memory event: missing or bad 'Addr': 1 skipped").sum() == 2
    for rank, (rows, skipped) in per_rank.items():
        assert skipped == {"memory event: missing or bad 'Addr'": 1}
        got = mem[mem["rank"] == rank].reset_index(drop=True)
        offset = int(clock.loc[rank, "offset_ns"])
        assert got["ts"].tolist() == (rows["ts"] + offset).tolist()  # the events' clock
        for col in ("bytes", "total_allocated", "total_reserved", "addr", "op", "scope", "step"):
            assert got[col].tolist() == rows[col].tolist(), col
    # the memory event sits inside aten::ones on the aligned clock too
    ones = events0[events0["name"] == "aten::ones"]["ts"].iloc[0]
    assert ones < mem[mem["rank"] == 1]["ts"].iloc[0] < ones + 10_000


def test_stores_without_memory_still_open(data_dir: Path, tmp_path: Path) -> None:
    """A store written before the memory table (or of a run without it) reads as no events."""
    import shutil

    from analysis_frames import merged
    from rankscope.analysis.engine.driver import ClusterSpec, analyze
    from rankscope.analysis.render.report import summary
    from rankscope.analysis.store.reader import open_store

    path = merged(data_dir, "cpu_gloo_4rank_straggler", tmp_path)
    old = tmp_path / "old.h5"
    shutil.copy(path, old)
    with open_store(old) as store:
        assert not store.has_memory()
        assert store.memory().empty and list(store.memory().columns) == list(M.MEMORY_COLUMNS)
        assert store.device_memory(0) == {}
    a = analyze(old, ClusterSpec(scheduler="synchronous"))
    assert not a.memory.has_events and "memory" not in summary(a)


# -- the real example ----------------------------------------------------------------------------


def raw_max_total_allocated(run: Path, rank: int) -> int:
    """The issue's definition of the peak, straight from the JSON."""
    return max(
        e["args"]["Total Allocated"]
        for path in run.glob(f"ranks/{rank:05d}/window-*.json.gz")
        for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        if e.get("name") == "[memory]"
    )


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """4 CPU ranks, 15 steps, 3 windows of 4 steps: rank 1 leaks 4 MiB/step, rank 2 holds 64 MiB
    more; ranks 0 and 3 (no knob) are the no-leak control, rank 2 (steady) a second one. Run
    once, merged and analysed by ``rankscope analyze`` (summary.json, terminal, HTML)."""
    tmp_path = tmp_path_factory.mktemp("memory_run")
    schedule = ["--wait", "0", "--warmup", "1", "--active", "4", "--repeat", "0"]
    script = [str(EXAMPLE), "--steps", "15", "--hidden", "128"]
    knobs = ["--leak-mb", "1:4", "--extra-memory-mb", "2:64"]
    out = ["--out", str(tmp_path), "--no-merge", "--no-analyze"]
    head = [sys.executable, "-m", "rankscope", "run", "--nproc-per-node", "4", "--profile-memory"]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(
        [*head, *schedule, *out, *script, *knobs],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary_path, html_path = tmp_path / "summary.json", tmp_path / "report.html"
    cmd = [sys.executable, "-m", "rankscope", "analyze", str(run), "--scheduler", "synchronous"]
    proc = subprocess.run(
        [*cmd, "--json", str(summary_path), "--html", str(html_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {
        "run": run,
        "terminal": " ".join(proc.stdout.split()),
        "summary": json.loads(summary_path.read_text()),
        "html": html_path.read_text(),
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_leak_and_extra_memory(real_run: dict[str, Any]) -> None:
    """The analyses on the store's memory table, against the knobs' ground truth."""
    from rankscope.analysis.store.reader import open_store

    run = real_run["run"]
    with open_store(run) as store:
        mem = store.memory()
        problems = store.problems()
    assert not problems["problem"].str.startswith("memory event").any()
    assert set(mem["device_type"]) == {M.DeviceType.CPU}

    pk = M.peaks(mem).set_index("rank")
    for rank in range(4):
        assert pk.loc[rank, "peak_allocated"] == raw_max_total_allocated(run, rank)

    found = M.leaks(mem).set_index("rank")
    print(found.to_string())
    assert found.loc[1, "is_leak"]
    assert found.loc[1, "slope_bytes_per_step"] == pytest.approx(4 * MiB, rel=0.10)
    assert not found.loc[[0, 2, 3], "is_leak"].any()

    # every block of the knob is freed inside the window that allocated it: a free after a
    # window's last step happens with memory profiling off, and the CPU counter keeps the block
    extra = mem[(mem["rank"] == 2) & (mem["bytes"].abs() == 64 * MiB)]
    allocs = extra[extra["bytes"] > 0]
    assert len(allocs) == 12  # 3 windows x 4 steps
    for window, group in allocs.groupby("window"):
        first_ts = group["ts"].min()
        frees = extra[(extra["window"] == window) & (extra["bytes"] < 0) & (extra["ts"] > first_ts)]
        assert len(frees) == len(group), (
            f"window {window}: {len(group)} allocated, {len(frees)} freed"
        )

    imb = M.imbalance(M.peaks(mem)).set_index("rank")
    print(imb.to_string())
    assert imb.loc[2, "is_imbalanced"]
    assert imb.loc[2, "excess_bytes"] == pytest.approx(64 * MiB, rel=0.10)
    assert not imb.loc[[0, 3], "is_imbalanced"].any()

    holders = M.holders_at_peak(mem)
    top = holders[(holders["rank"] == 2) & (holders["allocations"] > 0)].iloc[0]
    assert (top["op"], top["scope"]) == ("aten::ones", "rankscope_example::extra_memory")
    assert top["bytes"] == 64 * MiB

    findings = memory_findings(M.peaks(mem), M.leaks(mem), M.imbalance(M.peaks(mem)), None, holders)
    kinds = {(f.kind, f.rank) for f in findings}
    assert (FindingKind.MEMORY_LEAK, 1) in kinds and (FindingKind.MEMORY_IMBALANCE, 2) in kinds
    assert not {(FindingKind.MEMORY_LEAK, r) for r in (0, 2, 3)} & kinds
    print("\n".join(f.text for f in findings))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_run_summary_terminal_and_html(real_run: dict[str, Any]) -> None:
    """summary.json's ``memory`` (docs/summary.md), the terminal's Memory section, the report."""
    doc = real_run["summary"]
    devices = {d["rank"]: d for d in doc["memory"]["devices"]}
    assert sorted(devices) == [0, 1, 2, 3]
    for rank, d in devices.items():
        assert d["device"] == "cpu"
        assert d["peak_allocated_bytes"] == raw_max_total_allocated(real_run["run"], rank)
        assert d["total_bytes"] is None  # CPU: no headroom
    assert devices[1]["is_leak"] and not any(devices[r]["is_leak"] for r in (0, 2, 3))
    assert devices[1]["leak_bytes_per_step"] == pytest.approx(4 * MiB, rel=0.10)
    assert devices[2]["is_imbalanced"]
    assert devices[2]["excess_bytes"] == pytest.approx(64 * MiB, rel=0.10)
    top = devices[2]["top_holder"]
    assert (top["op"], top["scope"], top["bytes"]) == (
        "aten::ones",
        "rankscope_example::extra_memory",
        64 * MiB,
    )
    steps = doc["memory"]["steps"]
    assert {s["rank"] for s in steps} == {0, 1, 2, 3} and all(s["step"] >= 0 for s in steps)
    kinds = {(f["kind"], f["rank"]) for f in doc["findings"]}
    assert ("memory_leak", 1) in kinds and ("memory_imbalance", 2) in kinds

    text = real_run["terminal"]
    assert "Memory (peak per rank and device, MiB)" in text
    assert "Memory leak: rank 1 (cpu)" in text and "Memory imbalance: rank 2 (cpu)" in text
    assert "aten::ones" in text

    page = real_run["html"]
    assert "<h2>Memory</h2>" in page and "allocated memory per rank over time" in page
    assert page.count("<polyline") >= 4


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_run_perfetto_counters_and_timeline_lanes(
    real_run: dict[str, Any], tmp_path: Path
) -> None:
    """The Perfetto export has a memory counter track per rank (``ph: C``, aligned ts); the
    timeline has a memory lane per rank with allocated and reserved curves."""
    import importlib

    from rankscope.analysis.render.perfetto import export_perfetto
    from rankscope.analysis.store.reader import open_store

    timeline = importlib.import_module("rankscope.analysis.views.timeline")
    out = tmp_path / "trace.json"
    with open_store(real_run["run"]) as store:
        mem = store.memory()
        stats = export_perfetto(store, out)
        rows = timeline.timeline_rows(store)
        ext = timeline.store_extent(store)
        window = (ext.start_ns, ext.end_ns)
        overlay = timeline.timeline_overlay(store, window, origin_ns=ext.start_ns, width=300)
        allocated, reserved = timeline.memory_paths(store, rows, window, ext.start_ns, 300)
    doc = json.loads(out.read_text())
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert stats.counters == {r: int((mem["rank"] == r).sum()) for r in range(4)}
    assert {(e["pid"], e["name"]) for e in counters} == {(r, "memory cpu") for r in range(4)}
    first = mem[mem["rank"] == 0].iloc[0]
    c0 = next(e for e in counters if e["pid"] == 0)
    assert c0["ts"] == pytest.approx(first["ts"] / 1000, abs=1.0)
    assert c0["args"]["allocated"] == first["total_allocated"]

    lanes = [r for r in rows if r.lane == timeline.MEMORY_LANE]
    assert [r.label for r in lanes] == [f"r{r} memory" for r in range(4)]
    assert len(allocated) == len(reserved) == 4
    assert all(len(x) <= 600 for x, _ in allocated)  # per pixel: min and max
    # each rank's peak is drawn: the top of its row (row + ROW_PAD) is reached
    for (_, y), row in zip(allocated, lanes, strict=True):
        i = rows.index(row)
        assert float(np.min(y)) >= i + timeline.ROW_PAD - 1e-9
    labels = [layer.label for layer in overlay]
    assert "memory allocated" in labels and "memory reserved" in labels
