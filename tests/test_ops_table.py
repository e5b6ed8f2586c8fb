"""The op table (``analysis.ops.op_table``): self / total CPU time, device time through
correlation ids, input shapes, and equality with torch's own ``key_averages()``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from analysis_frames import events, lanes
from rankscope.analysis.compute.ops import format_op_table, op_table, op_table_across_ranks, op_tree
from rankscope.analysis.store.schema import EventKind as K
from rankscope.analysis.store.schema import LaneKind

ROOT = Path(__file__).resolve().parents[1]

# lane 0: the main thread; lane 1: a GPU stream
LANES = lanes([(LaneKind.THREAD, "main"), (LaneKind.GPU_STREAM, "stream 7")])


def _rows() -> pd.DataFrame:
    """aten::linear [0, 100) > aten::addmm [10, 60) > cudaLaunchKernel [20, 25) (corr 1);
    aten::relu [70, 90) > cudaLaunchKernel [75, 78) (corr 2); kernels on the stream: gemm 30 ns
    (corr 1), relu 5 ns (corr 2), a kernel without launch (corr 9)."""
    return events(
        [
            (0, 100, "aten::linear", K.CPU_OP, 0),
            (10, 50, "aten::addmm", K.CPU_OP, 0),
            (20, 5, "cudaLaunchKernel", K.RUNTIME, 0, -1, 1),
            (70, 20, "aten::relu", K.CPU_OP, 0),
            (75, 3, "cudaLaunchKernel", K.RUNTIME, 0, -1, 2),
            (30, 30, "gemm", K.KERNEL_COMPUTE, 1, -1, 1),
            (80, 5, "relu_kernel", K.KERNEL_COMPUTE, 1, -1, 2),
            (90, 7, "orphan", K.KERNEL_COMPUTE, 1, -1, 9),
            (200, 10, "aten::linear", K.CPU_OP, 0),
        ]
    )


def _by_name(table: pd.DataFrame) -> pd.DataFrame:
    return table.set_index("name")


def test_self_and_total_cpu_time() -> None:
    t = _by_name(op_table(_rows(), 0, lanes=LANES))
    assert t.loc["aten::linear", "count"] == 2
    assert t.loc["aten::linear", "cpu_total_ns"] == 110
    assert t.loc["aten::linear", "self_cpu_ns"] == 100 - 50 - 20 + 10
    assert t.loc["aten::addmm", "self_cpu_ns"] == 45  # minus its launch
    assert t.loc["cudaLaunchKernel", "count"] == 2
    assert t.loc["cudaLaunchKernel", "self_cpu_ns"] == 8


def test_device_time_through_correlation() -> None:
    t = _by_name(op_table(_rows(), 0, lanes=LANES))
    # the innermost op around the launch owns the kernel; enclosing ops count it in their total
    assert t.loc["aten::addmm", "self_device_ns"] == 30
    assert t.loc["aten::addmm", "device_total_ns"] == 30
    assert t.loc["aten::relu", "self_device_ns"] == 5
    assert t.loc["aten::linear", "self_device_ns"] == 0
    assert t.loc["aten::linear", "device_total_ns"] == 35
    assert t.loc["cudaLaunchKernel", "device_total_ns"] == 0  # as in torch: not the runtime call
    assert t.loc["gemm", "self_device_ns"] == 30 and t.loc["gemm", "cpu_total_ns"] == 0
    assert t.loc["orphan", "device_total_ns"] == 7  # its own row, no op owns it


def test_partial_overlap_nests_nowhere_and_lanes_separate() -> None:
    ev = events(
        [
            (0, 10, "a", K.CPU_OP, 0),
            (5, 10, "b", K.CPU_OP, 0),  # starts inside a, ends after: not a child (torch's rule)
            (2, 3, "c", K.CPU_OP, 2),  # another thread: never a child of a
        ]
    )
    t = _by_name(op_table(ev, 0))
    assert t["self_cpu_ns"].to_dict() == {"a": 10, "b": 10, "c": 3}


def test_redispatch_counts_once_like_torch() -> None:
    """aten::div(Tensor, Scalar) calling aten::div(Tensor, Tensor): torch's _remove_dup_nodes."""
    ev = events(
        [
            (0, 100, "aten::div", K.CPU_OP, 0),
            (5, 90, "aten::div", K.CPU_OP, 0),
            (10, 20, "aten::to", K.CPU_OP, 0),
        ]
    )
    t = _by_name(op_table(ev, 0))
    assert t.loc["aten::div", "count"] == 1
    assert t.loc["aten::div", "self_cpu_ns"] == 80
    assert t.loc["aten::div", "cpu_total_ns"] == 100
    raw = op_tree(ev, merge_redispatch=False)
    assert len(raw) == 3


def _torch_nesting(order: Any, lane: Any, ts: Any, end: Any, n: int) -> list[int]:
    """Each event's parent (row, -1 none) by torch's stack rule: ``order`` is the host events
    sorted by (lane, start, -end); a lane's stack is popped until its top contains the event
    (starts before its start... ends no earlier than its end), which is then its parent."""
    parent_of = [-1] * n
    end_of = end.tolist()
    stack: list[int] = []
    last_lane = None
    for i, ln, s, e in zip(
        order.tolist(), lane[order].tolist(), ts[order].tolist(), end[order].tolist(), strict=True
    ):
        if ln != last_lane:
            stack = []
            last_lane = ln
        while stack:
            top = stack[-1]
            if s >= end_of[top] or e > end_of[top]:
                stack.pop()
            else:
                parent_of[i] = top
                break
        stack.append(i)
    return parent_of


def _torch_rule(order: list[int], parent_of: list[int], names: list[str]) -> tuple[list, list]:
    """torch's ``_remove_dup_nodes`` walked as torch walks it (parents before children, an only
    child of the same name dropped and its children moved up): the oracle of the numpy rule."""
    parent_of = list(parent_of)
    n_children: dict[int, int] = {}
    for i in order:
        if parent_of[i] >= 0:
            n_children[parent_of[i]] = n_children.get(parent_of[i], 0) + 1
    up: dict[int, int] = {}
    keep = []
    for i in order:
        p = parent_of[i]
        while p in up:
            p = up[p]
        parent_of[i] = p
        if p >= 0 and names[p] == names[i] and n_children.get(p, 0) == 1:
            up[i] = p
            n_children[p] = n_children.get(i, 0)
            continue
        keep.append(i)
    return keep, parent_of


def test_nesting_and_redispatch_in_numpy_equal_the_stack_walk() -> None:
    """The numpy nesting (nearest containing predecessor, by binary lifting) and redispatch
    rule give torch's stack walk exactly, on 4,000 random event sets: nested, crossing,
    zero-length, equal stamps, several lanes, chains of same-name only children."""
    import numpy as np
    from rankscope.analysis.compute.op_nesting import merge_redispatch, nest

    rng = np.random.default_rng(7)
    for trial in range(4000):
        n = int(rng.integers(1, 60))
        ts = rng.integers(0, 40 if trial % 2 else 400, n).astype(np.int64)
        dur = rng.integers(0, 30 if trial % 2 else 400, n).astype(np.int64)
        lane = rng.integers(0, 3, n).astype(np.int64)
        names = np.asarray([f"op{k}" for k in rng.integers(0, 3, n)], dtype=object)
        end = ts + dur
        rows = np.arange(n)
        order = rows[np.lexsort((-end, ts, lane))]
        stack = _torch_nesting(order, lane, ts, end, n)
        parent = nest(order, lane, ts, end, n)
        assert parent.tolist() == stack, (ts, dur, lane)
        keep, want = _torch_rule(order.tolist(), stack, names.tolist())
        got_order, got_parent = merge_redispatch(order, parent, names)
        assert got_order.tolist() == keep
        assert got_parent[order].tolist() == [want[i] for i in order.tolist()]


def test_group_by_shape_and_sorting() -> None:
    ev = events(
        [
            (0, 10, "aten::mm", K.CPU_OP, 0),
            (20, 30, "aten::mm", K.CPU_OP, 0),
            (60, 40, "aten::mm", K.CPU_OP, 0),
        ]
    )
    ev["shapes"] = pd.Categorical(["[[2, 3], [3, 4]]", "[[8, 8], [8, 8]]", "[[8, 8], [8, 8]]"])
    t = op_table(ev, 0, group_by_shape=True, sort_by="self_cpu_time_total")
    assert t["shapes"].tolist() == ["[[8, 8], [8, 8]]", "[[2, 3], [3, 4]]"]
    assert t["count"].tolist() == [2, 1]
    assert op_table(ev, 0)["count"].tolist() == [3]
    text = format_op_table(t, "self_cpu_time_total")
    assert "Input Shapes" in text and "[[8, 8], [8, 8]]" in text
    with pytest.raises(ValueError, match="unknown sort key"):
        op_table(ev, 0, sort_by="nope")


def test_sorting_ties_keep_first_seen_order() -> None:
    """Descending on the sort column, then ascending names, then the groups' first-seen order
    (host ops in nesting order, then device events): pandas' stable sort of the table."""
    ev = events(
        [
            (0, 10, "aten::x", K.CPU_OP, 0),
            (20, 10, "aten::x", K.CPU_OP, 0),
            (40, 10, "aten::a", K.CPU_OP, 0),
            (60, 20, "aten::z", K.CPU_OP, 0),
            (90, 5, "gemm", K.CPU_OP, 0),
            (100, 5, "gemm", K.KERNEL_COMPUTE, 1),
        ]
    )
    ev["shapes"] = pd.Categorical(["[[1]]", "[[2]]", "[[1]]", "[[1]]", "[[3]]", "[[3]]"])
    t = op_table(ev, 0, lanes=LANES, group_by_shape=True, sort_by="cpu_time_total")
    assert list(zip(t["name"], t["shapes"], strict=True)) == [
        ("aten::z", "[[1]]"),
        ("aten::a", "[[1]]"),
        ("aten::x", "[[1]]"),
        ("aten::x", "[[2]]"),
        ("gemm", "[[3]]"),
        ("gemm", "[[3]]"),
    ]
    assert t["kind"].tolist()[-2:] == ["CPU_OP", "KERNEL_COMPUTE"]
    by_count = op_table(ev, 0, lanes=LANES, sort_by="count")
    assert by_count["name"].tolist() == ["aten::x", "aten::a", "aten::z", "gemm", "gemm"]
    assert by_count["count"].tolist() == [2, 1, 1, 1, 1]


def test_across_ranks_spread_and_slowest() -> None:
    a = op_table(_rows(), 0, lanes=LANES)
    slow = _rows()
    slow.loc[slow["name"] == "gemm", "dur"] = 90
    b = op_table(slow, 1, lanes=LANES)
    across = op_table_across_ranks(pd.concat([a, b]), sort_by="self_cuda_time_total", top=None)
    row = across.set_index("name").loc["gemm"]
    assert row["ranks"] == 2 and row["slowest_rank"] == 1 and row["fastest_rank"] == 0
    assert row["self_device_mean_ns"] == 60
    assert row["spread"] == pytest.approx(1.0)
    # the kernel and the op that launched it have the same self device time, ahead of the rest
    assert set(across["name"].iloc[:2]) == {"gemm", "aten::addmm"}


def _torch_key(shapes: str) -> str:
    """Our shape key as torch writes it: ``[]`` for ops without recorded shapes (user ranges),
    and ``[]`` for a tensor-list input (torch's ``shapes()`` records none; the trace does)."""
    if not shapes:
        return "[]"
    dims = json.loads(shapes)
    return str([[] if d and isinstance(d[0], list) else d for d in dims])


@pytest.mark.slow
def test_equals_key_averages_on_a_real_run(tmp_path: Path) -> None:
    """One real CPU run (examples/attention.py, one process): its Chrome trace merged and
    tabled equals ``prof.key_averages()`` of the same run: count, self and total CPU time for
    every op, per op and per (op, input shapes), within 1 ns per call (µs rounding)."""
    import rankscope
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    trace, ka = tmp_path / "trace.json", tmp_path / "key_averages.json"
    subprocess.run(
        [sys.executable, str(ROOT / "examples/attention.py"), "--steps", "2", "--seq", "32",
         "--profile", str(trace), "--key-averages", str(ka)],
        check=True, cwd=tmp_path, capture_output=True,
    )  # fmt: skip
    store = merge_run_dir(trace, output=tmp_path / "trace.h5", quiet=True)
    with rankscope.open(store) as st:
        ev = st.events(0, columns=["ts", "dur", "name", "cat", "kind", "lane", "corr", "shapes"])
        lanes_ = st.lanes(0)
    torch_tables = json.loads(ka.read_text())
    for by_shape, key in ((False, "ops"), (True, "ops_by_shape")):
        ours = op_table(ev, 0, lanes=lanes_, group_by_shape=by_shape)
        if by_shape:
            ours["shapes"] = ours["shapes"].map(_torch_key)
            ours = ours.groupby(["name", "shapes"], as_index=False).sum(numeric_only=True)
        ours = ours.set_index(["name", "shapes"])
        theirs = pd.DataFrame(torch_tables[key]).set_index(["name", "shapes"])
        assert sorted(ours.index) == sorted(theirs.index), key
        j = theirs.merge(ours, left_index=True, right_index=True, suffixes=("", "_ours"))
        assert (j["count"] == j["count_ours"]).all(), key
        tol = j["count"] * 1e-3 + 1e-6  # µs: 1 ns per call
        assert ((j["self_cpu_ns"] / 1e3 - j["self_cpu_us"]).abs() <= tol).all(), key
        assert ((j["cpu_total_ns"] / 1e3 - j["cpu_total_us"]).abs() <= tol).all(), key
        # CPU run: no device time on either side
        assert (j["device_total_ns"] == 0).all() and (j["device_total_us"] == 0).all()
