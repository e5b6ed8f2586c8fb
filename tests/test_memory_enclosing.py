"""Which op and scope a memory event belongs to, all events at once
(``memory_table.innermost_open``, ``range_queries.last_at_least``), against the sweep it
replaced: ranges pushed on a stack as their start passes, read from the innermost out.

Random threads of nested, overlapping and touching ranges, with empty names, allocation ops and
user annotations, and stamps on range ends; through the rule of ``memory_rows`` (decoded events)
and through the reader's columns (``decode.read_trace`` of a real file): both must name what
the sweep names.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rankscope.analysis.store import memory_table as M
from rankscope.analysis.store.range_queries import last_at_least
from rankscope.orchestrator.ingest import decode

NAMES = ("", "aten::empty", "aten::resize_", "aten::ones", "aten::add", "fwd", "x")


def sweep(
    ts: np.ndarray, tids: list[Any], ranges: Mapping[Any, list[tuple[int, int, str, bool]]]
) -> tuple[list[str], list[str]]:
    """The reference: per thread, ranges pushed in (start, -end) order as the sweep passes
    their start, the ended ones popped, the open ones read from the top of the stack down."""
    ops = [""] * len(ts)
    scopes = [""] * len(ts)
    stamps = ts.tolist()
    by_tid: dict[Any, list[int]] = {}
    for i, tid in enumerate(tids):
        by_tid.setdefault(tid, []).append(i)
    for tid, idx in by_tid.items():
        spans = sorted(ranges.get(tid, []), key=lambda r: (r[0], -r[1]))
        idx.sort(key=stamps.__getitem__)
        stack: list[tuple[int, int, str, bool]] = []
        j = 0
        for i in idx:
            t = stamps[i]
            while j < len(spans) and spans[j][0] <= t:
                while stack and stack[-1][1] < spans[j][0]:
                    stack.pop()
                stack.append(spans[j])
                j += 1
            while stack and stack[-1][1] < t:
                stack.pop()
            op = scope = innermost = ""
            for _start, end, name, user in reversed(stack):
                if end < t:
                    continue
                if not innermost:
                    innermost = name
                if not op and name not in M.ALLOCATION_OPS:
                    op = name
                if not scope and user:
                    scope = name
            ops[i] = op or innermost
            scopes[i] = scope
    return ops, scopes


def random_case(rng: random.Random) -> tuple[np.ndarray, list[Any], dict[Any, list[Any]]]:
    threads = rng.sample([1, 2, "7", 9], rng.randint(1, 3))
    ranges: dict[Any, list[tuple[int, int, str, bool]]] = {}
    for tid in threads:
        if rng.random() < 0.9:
            ranges[tid] = []
            for _ in range(rng.randint(0, 14)):
                start = rng.randint(0, 60)
                end = start + rng.choice([0, 1, rng.randint(0, 40)])
                ranges[tid].append((start, end, rng.choice(NAMES), rng.random() < 0.3))
    tids = [rng.choice([*threads, 99]) for _ in range(rng.randint(0, 25))]
    ts = np.array([rng.randint(-3, 105) for _ in tids], np.int64)
    return ts, tids, ranges


def test_last_at_least_is_the_last_value_reaching_the_limit() -> None:
    """Against a scan per query: ties, stops at -1, 0 and past the end, limits under and over
    every value."""
    rng = np.random.default_rng(31)
    for _ in range(2000):
        n, q = int(rng.integers(0, 70)), int(rng.integers(0, 30))
        values = rng.integers(0, 20, n)
        stops = rng.integers(-1, n + 2, q)
        limits = rng.integers(-1, 22, q)
        want = []
        for stop, limit in zip(stops.tolist(), limits.tolist(), strict=True):
            reach = np.flatnonzero(values[: max(stop + 1, 0)] >= limit)
            want.append(int(reach[-1]) if len(reach) else -1)
        got = last_at_least(values, stops, limits)
        assert got.dtype == np.int64 and got.tolist() == want


def test_enclosing_names_what_the_sweep_names() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        ts, tids, ranges = random_case(rng)
        assert M._enclosing(ts, tids, ranges) == sweep(ts, tids, ranges), (ts, tids, ranges)


def test_the_reader_names_what_the_sweep_names(tmp_path: Path) -> None:
    """Real files through ``decode.read_trace``: the reader builds the ranges from its columns
    (only those of allocating threads holding an event) and names, per memory event, what the
    sweep names from the same events' ranges."""
    rng = random.Random(11)
    for case in range(40):
        ts, tids, ranges = random_case(rng)
        events: list[dict[str, Any]] = []
        for tid, spans in ranges.items():
            for start, end, name, user in spans:
                cat = "user_annotation" if user else "cpu_op"
                events.append(
                    {"ph": "X", "cat": cat, "name": name, "pid": 5, "tid": tid, "ts": start,
                     "dur": end - start}
                )  # fmt: skip
        for t, tid in zip(ts.tolist(), tids, strict=True):
            args = {"Device Type": 0, "Device Id": -1, "Addr": 64, "Bytes": 8,
                    "Total Allocated": 8, "Total Reserved": 0}  # fmt: skip
            events.append(
                {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 5, "tid": tid,
                 "ts": t, "args": args}
            )  # fmt: skip
        rng.shuffle(events)
        path = tmp_path / f"case{case}.json"
        path.write_text(json.dumps({"traceEvents": events}))
        trace = decode.read_trace(path)
        if not len(ts):
            assert trace.memory is None
            continue
        assert trace.memory is not None
        # the reader's memory events in file order; the sweep's ranges: the events' ranges
        # in file order, per thread
        order = [ev for ev in events if ev["name"] == "[memory]"]
        file_ranges: dict[Any, list[tuple[int, int, str, bool]]] = {}
        for ev in events:
            if ev["ph"] == "X":
                file_ranges.setdefault(str(ev["tid"]), []).append(
                    (ev["ts"] * 1000, (ev["ts"] + ev["dur"]) * 1000, ev["name"],
                     ev["cat"] == "user_annotation")
                )  # fmt: skip
        want_ops, want_scopes = sweep(
            np.array([ev["ts"] * 1000 for ev in order], np.int64),
            [str(ev["tid"]) for ev in order],
            file_ranges,
        )
        got_ts = trace.memory["ts"]
        assert got_ts.tolist() == [ev["ts"] * 1000 for ev in order]
        strings = trace.strings
        assert [strings[c] for c in trace.memory["op"].tolist()] == want_ops
        assert [strings[c] for c in trace.memory["scope"].tolist()] == want_scopes
