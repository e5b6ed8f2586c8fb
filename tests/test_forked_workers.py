"""Forked worker processes (``--scheduler processes``, what ``auto`` picks on Linux when the
work pays for them): the same results as in-process, one line when a worker dies, the task's own
error as raised, and no worker left behind however the run ends."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from mapping_views import views_a_mapping
from rankscope.analysis.engine.scheduler import (
    PROCESSES,
    SYNCHRONOUS,
    ClusterSpec,
    WorkersError,
    run_each,
)
from rankscope.errors import UsageError

FORKED = ClusterSpec(scheduler=PROCESSES, workers=2)


def _square(x: int) -> tuple[int, int]:
    return x, x * x


def _die_on(x: int, victim: int) -> int:
    if x == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def _fail_on(x: int, bad: int) -> int:
    if x == bad:
        raise UsageError(f"input {x} is bad")
    return x


def _sleep_unless_first(x: int) -> int:
    if x:
        time.sleep(600)
    return x


def _say(x: int) -> int:
    print(f"task {x} on stderr", file=sys.stderr, flush=True)
    return x


@pytest.fixture(autouse=True)
def _no_worker_left() -> Iterator[None]:
    yield
    assert multiprocessing.active_children() == []


def test_every_result_comes_back_from_forked_workers() -> None:
    got = dict(run_each(_square, [(x,) for x in range(50)], FORKED, 50))
    assert got == {x: x * x for x in range(50)}


def test_a_worker_that_dies_is_one_line() -> None:
    """Each time, the error is one line and every worker is gone when it is raised: the pool's
    own manager thread, which reaps workers too once one died, has finished (before, a worker
    it was still reaping looked alive for a moment about once in seven runs on a busy CPU)."""
    for _ in range(8):
        with pytest.raises(WorkersError, match="forked worker process died") as err:
            list(run_each(_die_on, [(x, 5) for x in range(12)], FORKED, 12))
        assert "\n" not in str(err.value)
        assert multiprocessing.active_children() == []


def test_a_task_error_reaches_the_caller_as_raised() -> None:
    with pytest.raises(UsageError, match=r"^input 3 is bad$"):
        list(run_each(_fail_on, [(x, 3) for x in range(8)], FORKED, 8))


def test_closing_early_ends_the_workers() -> None:
    """A caller that stops after the first result (Ctrl-C, an error of its own) closes the
    runner: the workers still busy (here: sleeping 600 s) are ended, not waited for."""
    results = run_each(_sleep_unless_first, [(x,) for x in range(4)], FORKED, 4)
    assert next(results) == 0
    results.close()
    # the autouse fixture: no child process is left


#: The stream the at-fork hook below jams, while a test arms it (the hook stays registered).
_JAM: list[object] = []


def _jam_stderr_before_fork() -> None:
    """At-fork hook (parent, right before ``fork()``): once per arming, a thread starts writing
    far more than a pipe holds into ``sys.stderr`` (the jammed pipe): it blocks inside
    ``write()`` holding the stream's lock, which the child inherits locked."""
    if not _JAM:
        return
    stream = _JAM.pop()
    inside = threading.Event()

    def flood() -> None:
        inside.set()
        with contextlib.suppress(OSError, ValueError):  # the test closes the pipe's other end
            print("x" * (1 << 22), file=stream, flush=True)  # type: ignore[call-overload]

    threading.Thread(target=flood, daemon=True).start()
    inside.wait(10)
    time.sleep(0.3)  # the thread is blocked in write() by now, holding the lock


os.register_at_fork(before=_jam_stderr_before_fork)


def test_a_result_cut_short_does_not_hold_the_process_at_exit() -> None:
    """A worker stopped while it sent a result leaves the pool's manager thread reading the
    rest: stopping the pool must end that thread, or the interpreter's exit waits for it
    forever (a failed merge stopping its parse ahead hung so, 4 times in 40 under load). The
    cut is made here by writing a result's header and a few bytes of it into the pipe."""
    import subprocess
    import textwrap

    code = textwrap.dedent(
        """
        import os, struct, time
        from rankscope.analysis.engine.forked_workers import forked_pool, stop_pool
        pool, before = forked_pool(1)
        pool.submit(time.sleep, 0.01).result()
        manager = pool._executor_manager_thread
        os.write(pool._result_queue._writer.fileno(), struct.pack("!i", 1 << 20) + bytes(16))
        time.sleep(0.5)  # the manager thread now waits for the rest of that result
        stop_pool(pool, before)
        print(manager.is_alive())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.split() == ["False"], done.stderr[-2000:]


def test_workers_write_even_when_a_parent_thread_held_stderr_at_the_fork() -> None:
    """A thread of the parent (a progress bar refreshing) may hold the lock of ``sys.stderr``
    at the instant a worker is forked; no thread of the child ever releases it, so a worker
    writing a warning would wait forever. Here a thread is blocked writing into a full pipe at
    the fork (one worker: the parent flushes ``sys.stderr`` before each fork, which the jam
    would block): the worker writes anyway."""
    read_end, write_end = os.pipe()
    jammed = open(write_end, "w")  # noqa: SIM115 - closed below
    saved = sys.stderr
    sys.stderr = jammed
    _JAM.append(jammed)
    try:
        got = sorted(run_each(_say, [(x,) for x in range(4)], ClusterSpec(PROCESSES, workers=1), 4))
    finally:
        _JAM.clear()
        sys.stderr = saved
        os.close(read_end)  # the blocked write fails: the thread ends
        with contextlib.suppress(OSError):
            jammed.close()
    assert got == [0, 1, 2, 3]


def test_a_forked_merge_and_analysis_equal_the_in_process_ones(tmp_path: Path) -> None:
    from analysis_frames import synthetic_store
    from rankscope.analysis.engine.driver import analyze
    from rankscope.analysis.store.reader import open_store
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    store = synthetic_store(tmp_path / "job", ranks=8, stragglers=[(3, 4.0, 1.0)], seed=4)
    forked = Path(merge_run_dir(tmp_path / "job", output=tmp_path / "forked.h5", quiet=True,
                                scheduler=PROCESSES))  # fmt: skip
    with open_store(store) as a, open_store(forked) as b:
        assert a.ranks == b.ranks
        for rank in a.ranks:
            pd.testing.assert_frame_equal(a.events(rank), b.events(rank), check_exact=True)
        pd.testing.assert_frame_equal(a.collectives(), b.collectives(), check_exact=True)
    sync = analyze(store, ClusterSpec(scheduler=SYNCHRONOUS))
    fork = analyze(store, FORKED)
    assert fork.scheduler.scheduler == PROCESSES
    for name in ("breakdown", "stragglers", "waits", "op_table"):
        pd.testing.assert_frame_equal(
            getattr(sync, name), getattr(fork, name), check_exact=True, obj=name
        )
    assert sync.straggler_ranks() == fork.straggler_ranks() == [3]


def test_a_padded_heap_keeps_what_it_freed() -> None:
    """``heap_pad``: a worker's heap keeps that much freed memory at its top instead of giving
    it back, so allocating again takes no fresh pages (the read-ahead's parse: fewer page
    faults). 200 blocks of 64 KiB (heap-sized, not mapped) allocated twice: the second round
    faults on ~1,450 of its 3,200 pages in a default worker and on ~20 with a pad. The
    pools are made in a fresh interpreter: the C library's thresholds move with what a process
    freed before (this test process' history would decide the default worker's count)."""
    import subprocess
    import textwrap

    code = textwrap.dedent(
        """
        import ctypes, resource
        from rankscope.analysis.engine.forked_workers import forked_pool, stop_pool

        # 4 KiB pages whatever the system's transparent huge pages (PR_SET_THP_DISABLE, kept
        # by forked children): a count of page faults then means the same everywhere
        ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)

        def second_round_faults():
            def round_trip():
                kept = [bytearray(64 << 10) for _ in range(200)]
                for b in kept:
                    b[::4096] = bytes(len(b[::4096]))
                del kept
            round_trip()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            round_trip()
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

        for pad in (0, 64 << 20):
            pool, before = forked_pool(1, heap_pad=pad)
            try:
                print(pool.submit(second_round_faults).result(timeout=60))
            finally:
                stop_pool(pool, before)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    default, padded = map(int, done.stdout.split())
    assert default > 500 and padded * 10 < default, (default, padded)


@dataclasses.dataclass(frozen=True)
class _Holder:
    matrix: Any
    rows: list[Any]


def _columns(n: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(n)
    return {
        "ts": rng.integers(0, 2**62, n),
        "kind": rng.integers(0, 9, n).astype(np.int8),
        "ratio": rng.random(n),
        "text": np.array([f"op{i}" for i in range(5)], dtype=object),
        "n": n,
        "held": _Holder(rng.random((3, 4)), [(rng.integers(0, 5, 7) > 2, "x")]),
    }


def test_results_handed_over_through_shared_memory_equal_the_worker_s() -> None:
    """``shared``: the worker's results come back through the mapping (their arrays are views
    of it, not copies from the pipe), equal to what the worker made, one after the other in
    the same mapping, inside dicts, lists, tuples and dataclass instances; arrays of objects
    travel in the pipe; a result that no longer fits comes through the pipe whole, equal too."""
    import numpy as np
    from rankscope.analysis.engine.forked_workers import forked_pool, shared_call, stop_pool
    from rankscope.analysis.engine.shared_results import Packed, SharedResults

    shared = SharedResults(3 << 20)  # room for the first two results, not the third
    pool, before = forked_pool(1, shared=shared)
    try:
        for n, via_map in ((50_000, True), (60_000, True), (200_000, False)):
            sent = pool.submit(shared_call, _columns, n).result(timeout=60)
            assert isinstance(sent, Packed) is via_map
            got = shared.unpack(sent)
            want = _columns(n)
            assert got.keys() == want.keys() and got["n"] == n
            for k in ("ts", "kind", "ratio", "text"):
                assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
            held, want_held = got["held"], want["held"]
            assert isinstance(held, _Holder) and np.array_equal(held.matrix, want_held.matrix)
            flags, label = held.rows[0]
            assert flags.dtype == bool and np.array_equal(flags, want_held.rows[0][0])
            assert label == "x" and held.matrix.shape == (3, 4)
            assert (
                views_a_mapping(got["ts"]) is via_map and views_a_mapping(got["ratio"]) is via_map
            )
            assert views_a_mapping(held.matrix) is via_map and views_a_mapping(flags) is via_map
            assert not views_a_mapping(got["text"])
    finally:
        stop_pool(pool, before)
    with pytest.raises(ValueError, match="one worker"):
        forked_pool(2, shared=shared)
