"""The reader's fast paths keep its answers: memory events checked per block, the ranges handed
to the memory attribution, the interning and the pid/tid codes (issue 31, fourth pass).

Each fast path is compared with the rule it replaces on real decoded events: the per-event check
(``MemoryColumns._memory_event``), ``memory_table.attribute`` over every range of the thread,
and ``pd.factorize``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rankscope.analysis.store import memory_table
from rankscope.orchestrator.ingest import kineto_json
from rankscope.orchestrator.ingest.decode import read_trace
from rankscope.orchestrator.ingest.event_columns import EventColumns
from rankscope.orchestrator.ingest.memory_columns import holding
from rankscope.orchestrator.ingest.string_codes import factorize
from test_memory import mem_event, op


def decoded(events: list[dict[str, Any]]) -> list[kineto_json.KEvent]:
    """``events`` as the reader decodes them (typed structs)."""
    return kineto_json.BLOCK_DECODER.decode(json.dumps(events).encode())


class OneByOne(EventColumns):
    """The reader with every memory event judged alone (the rule before the block check)."""

    def _memory_block(self, mem: list[kineto_json.KEvent]) -> bool:
        return False


class Counting(EventColumns):
    """The reader, counting the memory events judged alone."""

    alone = 0

    def _memory_event(self, ev: kineto_json.KEvent) -> None:
        self.alone += 1
        super()._memory_event(ev)


def kept(acc: EventColumns) -> tuple[dict[str, list[Any]], dict[str, int], list[Any]]:
    parts = {k: np.concatenate(v).tolist() for k, v in acc.memory_parts.items()}
    return parts, acc.memory_skipped, acc.memory_threads


GOOD = [mem_event(1.5, 0x20, 16, 16), mem_event(3, 0x30, -16, 0, tid=9), mem_event(7, 0x20, 4, 4)]


def test_well_formed_memory_events_are_kept_in_one_block_check() -> None:
    """A block of well-formed memory events (ints and decimal stamps) is kept without judging
    any event alone, and keeps what the event-by-event rule keeps."""
    fast, slow = Counting(), OneByOne()
    for acc in (fast, slow):
        acc.add(decoded([op("aten::empty", 1, 1), *GOOD, mem_event(8, 0x40, 2**40, 2**40)]))
    assert fast.alone == 0
    assert kept(fast) == kept(slow)
    assert len(kept(fast)[0]["ts"]) == 4


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ts", 2**62),
        ("ts", -(2**62)),
        ("ts", 1e300),
        ("args", None),
        ("Addr", None),
        ("Addr", -5),
        ("Addr", 2**64),
        ("Bytes", 3.5),
        ("Bytes", 2**63),
        ("Device Type", True),
        ("Device Type", 2**7),
        ("Device Id", 2**15),
        ("Total Allocated", -1),
        ("Total Reserved", [1]),
    ],
)
def test_a_block_with_a_bad_memory_event_keeps_what_one_by_one_keeps(
    field: str, value: Any
) -> None:
    """One bad event among good ones: the block is judged event by event, so the good ones are
    kept and the bad one is counted under its reason, exactly as before."""
    bad = mem_event(5, 0x10, 8, 8)
    if field == "args":
        del bad["args"]
    elif field == "ts":
        bad["ts"] = value
    elif value is None:
        del bad["args"][field]
    else:
        bad["args"][field] = value
    events = [GOOD[0], bad, *GOOD[1:]]
    block = decoded(events)
    fast, slow = Counting(), OneByOne()
    for acc in (fast, slow):
        acc.add(block)
    assert fast.alone == len(events)
    assert kept(fast) == kept(slow)
    assert len(kept(fast)[0]["ts"]) == 3
    assert sum(fast.memory_skipped.values()) == 1


def test_only_ranges_holding_a_memory_event_are_attributed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory attribution (``memory_table.innermost_open``, once per allocating thread)
    gets only the ranges that hold an event of their thread (a stamp on either end counts), and
    names the same op and scope as the rule does with every range of the thread."""
    seen: list[list[tuple[int, int]]] = []
    innermost_open = memory_table.innermost_open

    def spy(stamps: np.ndarray, starts: np.ndarray, ends: np.ndarray, **masks: Any) -> Any:
        seen.append(list(zip(starts.tolist(), ends.tolist(), strict=True)))
        return innermost_open(stamps, starts, ends, **masks)

    monkeypatch.setattr(memory_table, "innermost_open", spy)
    events = [
        op("ProfilerStep#1", 100, 100, cat="user_annotation"),
        op("fwd", 105, 60, cat="user_annotation"),
        op("aten::ones", 110, 10),
        op("aten::empty", 111, 2),  # holds the event at 111.5
        op("aten::add", 130, 5),  # holds nothing
        op("aten::mul", 140, 5),  # the event at its end (145)
        op("aten::div", 150, 5),  # the event at its start (150)
        op("aten::sub", 150, 5, tid=9),  # another thread: holds nothing of its own
        op("bwd", 170, 20, cat="user_annotation"),  # holds nothing
        mem_event(111.5, 0x10, 8, 8),
        mem_event(145, 0x20, 8, 16),
        mem_event(150, 0x30, 8, 24),
        mem_event(160, 0x40, 8, 32, tid=9),
    ]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": events}, indent=2))
    ft = read_trace(trace)
    assert ft.memory is not None
    (spans,) = seen  # thread 9's range holds none of its events: that thread gets no call
    holding = {"fwd", "aten::ones", "aten::empty", "aten::mul", "aten::div"}
    assert spans == sorted(
        (int(ev["ts"] * 1000), int((ev["ts"] + ev["dur"]) * 1000))
        for ev in events
        if ev["name"] in holding and ev.get("tid") == 7
    )  # in the rule's push order: by start
    # every range of the allocating threads (the ranges before this pass), same answers
    every: dict[Any, list[tuple[int, int, str, bool]]] = {}
    for ev in events:
        if ev["ph"] == "X" and not ev["name"].startswith("ProfilerStep#"):
            start, end = int(ev["ts"] * 1000), int((ev["ts"] + ev["dur"]) * 1000)
            key = ("7", str(ev["tid"]))
            every.setdefault(key, []).append(
                (start, end, ev["name"], ev["cat"] == "user_annotation")
            )
    ts = np.array([111500, 145000, 150000, 160000], np.int64)
    threads = [("7", "7"), ("7", "7"), ("7", "7"), ("7", "9")]
    ops, scopes = memory_table.attribute(ts, threads, every, [])[:2]
    assert [ft.strings[c] for c in ft.memory["op"]] == ops
    assert [ft.strings[c] for c in ft.memory["scope"]] == scopes
    assert ops == ["aten::ones", "aten::mul", "aten::div", ""]  # aten::empty: an allocation op
    assert scopes == ["fwd", "fwd", "fwd", ""]


def test_holding_counts_both_ends_of_a_range() -> None:
    starts = np.array([0, 10, 20, 30], np.int64)
    ends = np.array([5, 15, 25, 35], np.int64)
    assert holding(starts, ends, np.array([15, 20, 7], np.int64)).tolist() == [
        False,
        True,
        True,
        False,
    ]
    assert not holding(starts, ends, np.zeros(0, np.int64)).any()


def test_factorize_gives_pandas_codes_for_pids_and_tids() -> None:
    """Ints and strings apart (``1`` is not ``"1"``), codes in first-seen order: pandas' answer."""
    values: list[Any] = [7, "7", 3, 7, "stream 7", 3, 2**70, "7", 0]
    codes, uniques = factorize(values)
    pd_codes, pd_uniques = pd.factorize(pd.Series(values, dtype=object))
    assert codes.tolist() == pd_codes.tolist()
    assert uniques == pd_uniques.tolist()


def test_interning_appends_new_strings_in_first_seen_order() -> None:
    acc = EventColumns({"b": 0})
    codes = acc._intern(["c", "b", "a", "c", "a"])
    assert codes.dtype == np.int32
    assert codes.tolist() == [1, 0, 2, 1, 2]
    assert list(acc.strings) == ["b", "c", "a"]
