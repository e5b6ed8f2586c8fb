"""``compute/rank_views.py``: a rank task's analyses share their common views of the events,
and nothing else changes — the same results as each analysis computing its own."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rankscope.analysis.compute import breakdown as bd
from rankscope.analysis.compute.rank_views import shared, shared_views

DATA = Path(__file__).parent / "data"


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    lanes = pd.DataFrame({"lane": [0, 1], "kind": [0, 1], "pid": ["1", "0"], "tid": ["7", "s 7"]})
    events = pd.DataFrame({"lane": [0, 1, 1], "kind": [0, 3, 3], "ts": [0, 5, 9], "dur": [9, 2, 1]})
    return events, lanes


def test_one_computation_per_scope_and_frames() -> None:
    calls: list[int] = []

    def compute() -> np.ndarray:
        calls.append(1)
        return np.arange(3)

    events, lanes = _frames()
    assert shared("v", (events, lanes), (), compute) is not shared(
        "v", (events, lanes), (), compute
    )
    assert len(calls) == 2  # outside a scope: every call computes
    with shared_views():
        first = shared("v", (events, lanes), (1,), compute)
        assert shared("v", (events, lanes), (1,), compute) is first
        assert not first.flags.writeable  # a caller cannot change what the next one gets
        with pytest.raises(ValueError):
            first[0] = 5
        other = events.copy()  # equal values, another frame: computed for itself
        assert shared("v", (other, lanes), (1,), compute) is not first
        assert shared("v", (events, lanes), (2,), compute) is not first  # other arguments
        assert len(calls) == 5
    assert shared("v", (events, lanes), (1,), compute) is not first  # the scope is over


def test_threads_keep_their_own_views() -> None:
    events, lanes = _frames()
    seen: dict[str, object] = {}

    def task(name: str) -> None:
        with shared_views():
            seen[name] = shared("v", (events, lanes), (), lambda: np.zeros(1))
            barrier.wait(10)
            assert shared("v", (events, lanes), (), lambda: np.ones(1)) is seen[name]

    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=task, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen["a"] is not seen["b"]


def test_gpu_mask_and_hta_view_are_computed_once() -> None:
    """The same arrays again inside a scope (a new computation makes new ones), new ones
    outside it."""
    events, lanes = _frames()
    with shared_views():
        mask, view = bd.gpu_event_mask(events, lanes), bd.hta_view(events, lanes, 250, True)
        for _ in range(3):
            assert bd.gpu_event_mask(events, lanes) is mask
            assert bd.hta_view(events, lanes, 250, True) is view
            assert bd.gpu_lanes(lanes) is bd.gpu_lanes(lanes)
        assert bd.hta_view(events, lanes, 251, True) is not view
    assert bd.gpu_event_mask(events, lanes) is not mask
    assert np.array_equal(bd.gpu_event_mask(events, lanes), mask)


@pytest.mark.parametrize("job", ["param_dlrm_8rank", "cpu_gloo_4rank_pipeline"])
def test_rank_task_results_equal_unshared(job: str, tmp_path: Path) -> None:
    """Every frame of every rank's result is the one each analysis computing its own gives."""
    from rankscope.analysis.engine import driver
    from rankscope.analysis.engine.rank_task import _rank_task, rank_task
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    store = merge_run_dir(DATA / job, output=tmp_path / "t.h5", scheduler="synchronous", quiet=True)
    calls: list[tuple[object, ...]] = []
    real = driver.run_each

    def capture(func: object, args: list[tuple[object, ...]], *rest: object) -> object:
        calls.extend(args)
        return real(func, args, *rest)  # type: ignore[arg-type]

    driver.run_each = capture  # type: ignore[assignment]
    try:
        driver.analyze(store, driver.ClusterSpec(scheduler=driver.SYNCHRONOUS))
    finally:
        driver.run_each = real
    assert calls
    for args in calls:
        a, b = rank_task(*args), _rank_task(*args)  # type: ignore[arg-type]
        _equal(a, b, "RankResult")


def _equal(x: object, y: object, where: str) -> None:
    """Exactly equal, field by field, down to the arrays and frames."""
    assert type(x) is type(y), where
    if isinstance(x, pd.DataFrame):
        pd.testing.assert_frame_equal(x, y, check_exact=True, obj=where)  # type: ignore[arg-type]
    elif isinstance(x, np.ndarray):
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), where  # type: ignore[union-attr,arg-type]
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            _equal(getattr(x, f.name), getattr(y, f.name), f"{where}.{f.name}")
    elif isinstance(x, dict):
        assert list(x) == list(y), where  # type: ignore[call-overload]
        for k in x:
            _equal(x[k], y[k], f"{where}[{k!r}]")  # type: ignore[index]
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), where  # type: ignore[arg-type]
        for i, (u, v) in enumerate(zip(x, y, strict=True)):  # type: ignore[call-overload]
            _equal(u, v, f"{where}[{i}]")
    else:
        assert x == y or (x != x and y != y), where  # NaN equals NaN here
