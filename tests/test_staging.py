"""The merge's spill (``staging.Spill``): parked columns come back as they went in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rankscope.orchestrator.ingest.staging import SPILL_PART_FORMAT, Spill


def _columns(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "ts": rng.integers(-(2**62), 2**62, 1000, dtype=np.int64),
        "name": rng.integers(0, 2**31 - 1, 1000, dtype=np.int32),
        "kind": rng.integers(-128, 127, 1000, dtype=np.int8),
        "flag": rng.random(1000) < 0.5,
        "share": rng.random(1000),
        "empty": np.zeros(0, np.int64),
        "grid": rng.integers(0, 9, (7, 3), dtype=np.uint16),
    }


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k


def test_spill_round_trip_one_file_per_part(tmp_path: Path) -> None:
    spill = Spill(tmp_path / "spill")
    events, memory = _columns(1), _columns(2)
    spill.put(3, events)
    spill.put(3, memory, part="memory")
    spill.put(12, _columns(3))
    names = sorted(p.name for p in (tmp_path / "spill").iterdir())
    assert names == sorted(
        SPILL_PART_FORMAT.format(rank=r, part=k)
        for r, k in ((3, "events"), (3, "memory"), (12, "events"))
    )
    _same(spill.take(3), events)
    _same(spill.take(3, part="memory"), memory)
    _same(spill.take(12), _columns(3))
    assert spill.take(3, part="steplog") == {} and spill.take(5) == {}
    # parking the events again forgets every part of the rank
    again = {"ts": np.arange(5, dtype=np.int64)}
    spill.put(3, again)
    _same(spill.take(3), again)
    assert spill.take(3, part="memory") == {}
    spill.drop(3)
    spill.drop(12)
    assert list((tmp_path / "spill").iterdir()) == []


def test_a_spill_in_memory_keeps_the_same_contract(tmp_path: Path) -> None:
    """``in_memory`` (a merge of one rank): the same put / take / drop, and no folder."""
    spill = Spill(tmp_path / "spill", in_memory=True)
    events, memory = _columns(1), _columns(2)
    spill.put(3, events)
    spill.put(3, memory, part="memory")
    assert not (tmp_path / "spill").exists()
    taken = spill.take(3)
    _same(taken, events)
    taken["ts"] = taken["ts"] + 1  # the caller's dict: what is parked stays as it went in
    _same(spill.take(3), events)
    _same(spill.take(3, part="memory"), memory)
    assert spill.take(3, part="steplog") == {} and spill.take(5) == {}
    spill.put(3, {"ts": np.arange(5, dtype=np.int64)})
    assert spill.take(3, part="memory") == {}  # parking the events again forgets every part
    spill.drop(3)
    assert spill.take(3) == {}
