"""Concurrency: two merges of one folder, readers during a re-merge, windows written during a merge.

docs/reliability.md ("Concurrency") lists what the user sees in each case.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rankscope.analysis.store.reader import open_store
from rankscope.atomic import atomic_output
from rankscope.orchestrator.ingest.merge import merge_run_dir

DATA = Path(__file__).parent / "data"
RUN = DATA / "cpu_gloo_4rank_pipeline"
STRAGGLER = DATA / "cpu_gloo_4rank_straggler"


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".lock", ".tmp")))


def test_two_merges_of_one_folder_at_once(tmp_path: Path) -> None:
    """Both start together: each one either merges or says another merge holds the lock."""
    for r in range(4):
        shutil.copy2(STRAGGLER / f"rank{r}.step5.pt.trace.json", tmp_path)
    cmd = [sys.executable, "-m", "rankscope", "merge", str(tmp_path)]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    assert any(rc == 0 for rc, _ in results), results
    for rc, err in results:
        if rc != 0:
            assert rc == 1, err
            lines = [line for line in err.splitlines() if line.strip()]
            assert len(lines) == 1 and "another merge is writing this store" in lines[0], err
    assert _leftovers(tmp_path) == []
    with open_store(tmp_path / "trace.h5") as store:
        assert store.ranks == [0, 1, 2, 3]


def test_a_reader_keeps_its_store_while_a_merge_rewrites_it(tmp_path: Path) -> None:
    """`analyze`/`view` hold the store open; a re-merge renames a new file over the name:
    the open reader keeps reading the old file whole, a new reader sees the new one."""
    for r in range(2):
        shutil.copy2(STRAGGLER / f"rank{r}.step5.pt.trace.json", tmp_path)
    out = merge_run_dir(tmp_path, quiet=True, scheduler="synchronous")
    with open_store(out) as old:
        before = old.events(0)
        shutil.copy2(STRAGGLER / "rank2.step5.pt.trace.json", tmp_path)
        merge_run_dir(tmp_path, quiet=True, scheduler="synchronous")
        assert old.ranks == [0, 1]
        again = old.events(0)
        assert np.array_equal(again["ts"].to_numpy(), before["ts"].to_numpy())
        old.collectives()
    with open_store(out) as new:
        assert new.ranks == [0, 1, 2]


def test_a_window_being_written_during_the_merge_is_not_read(tmp_path: Path) -> None:
    """The runtime writes each window to a temporary name renamed when complete: a merge that
    runs meanwhile merges the complete windows only, and reports nothing about the other."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    rank0 = run / "ranks" / "00000"
    window = rank0 / "window-001.json.gz"
    data = (rank0 / "window-000.json.gz").read_bytes()
    with atomic_output(window) as fh:
        fh.write(data[: len(data) // 2])  # half written, not renamed yet
        fh.flush()
        assert [p.name for p in rank0.iterdir() if p.name.endswith(".tmp")]
        out = merge_run_dir(run, quiet=True, scheduler="synchronous")
        with open_store(out) as store:
            assert store.ranks == [0, 1, 2, 3]
            assert store.problems().empty, store.problems()
            first = len(store.events(0))
        fh.write(data[len(data) // 2 :])
    assert window.is_file()
    merge_run_dir(run, quiet=True, scheduler="synchronous")
    with open_store(out) as store:
        assert len(store.events(0)) == 2 * first  # the same window twice, now complete


def test_a_partial_kineto_export_is_not_read(tmp_path: Path) -> None:
    """Kineto's own export temporary (``.export-KKK.json.tmp``) beside the windows is ignored."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "ranks" / "00001" / ".export-001.json.tmp").write_bytes(b'{"traceEvents": [{"ph"')
    out = merge_run_dir(run, quiet=True, scheduler="synchronous")
    with open_store(out) as store:
        assert store.ranks == [0, 1, 2, 3]
        assert store.problems().empty
    assert os.path.exists(run / "ranks" / "00001" / ".export-001.json.tmp")


class _AllWorkersGone(Exception):
    """What the check raises in the test below (the merge's: WorkersError)."""


def test_a_finished_result_whose_worker_died_is_not_waited_for_forever() -> None:
    """A task finished on a worker, then the worker died before its value was gathered (its
    Slurm job cancelled): Dask reschedules the task, and with no worker left ``result()`` would
    wait forever. ``result_of`` looks at the workers while it waits and ends with the check's
    error. A real Dask scheduler and one real worker process (``dask worker --no-nanny``: no
    nanny to restart it), killed with SIGKILL."""
    import signal
    import time

    from distributed import Client, LocalCluster
    from rankscope.analysis.engine.scheduler import result_of

    with (
        LocalCluster(n_workers=0, processes=True, dashboard_address=None) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        worker = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
             "--no-nanny", "--nthreads", "1", "--no-dashboard"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            client.wait_for_workers(1, timeout=120)
            fut = client.submit(sum, [20, 22], pure=False)
            deadline = time.monotonic() + 120
            while fut.status != "finished":
                assert time.monotonic() < deadline, fut.status
                time.sleep(0.05)
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(timeout=60)
            while client.nthreads():
                assert time.monotonic() < deadline, "the scheduler did not see the worker die"
                time.sleep(0.05)
            checks = []

            def check() -> None:
                checks.append(time.monotonic())
                if len(checks) >= 2 and not client.nthreads():
                    raise _AllWorkersGone

            t0 = time.monotonic()
            try:
                result_of(fut, 0.5, check)
            except _AllWorkersGone:
                pass
            else:
                raise AssertionError("a value of a dead worker was returned")
            assert len(checks) == 2 and checks[0] - t0 >= 0.4  # it waited, looking in between
        finally:
            if worker.poll() is None:
                os.kill(worker.pid, signal.SIGKILL)
                worker.wait(timeout=60)


def test_dask_logs_of_a_lost_worker_are_not_printed_beside_our_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What Dask logs when Slurm workers are lost (seen beside the one-line error in a real
    run of test_lost_workers_are_one_line: the in-process scheduler's "Couldn't gather keys"
    and asyncio's traceback of the gather ``result_of`` stopped waiting on, ``AllExit``) is
    dropped once the runner starts; every other record of those loggers still gets through."""
    import logging

    from distributed.client import AllExit
    from rankscope.analysis.engine.scheduler import _drop_handled_dask_logs

    _drop_handled_dask_logs()
    _drop_handled_dask_logs()  # once per process, however often the runner starts
    scheduler, aio = logging.getLogger("distributed.scheduler"), logging.getLogger("asyncio")
    assert len(scheduler.filters) == len(aio.filters) == 1
    with caplog.at_level(logging.INFO):
        scheduler.error("Couldn't gather keys: %s", {"parse_source-1": "queued"})
        try:
            raise AllExit
        except AllExit:
            aio.error("Task exception was never retrieved\nfuture: <Task …>", exc_info=True)
        scheduler.error("Worker tcp://n1:1 failed to heartbeat")  # not ours: kept
        try:
            raise ValueError("a real bug")
        except ValueError:
            aio.error("Task exception was never retrieved\nfuture: <Task …>", exc_info=True)
    assert [r.getMessage().splitlines()[0] for r in caplog.records] == [
        "Worker tcp://n1:1 failed to heartbeat",
        "Task exception was never retrieved",
    ]


QUIET_SCRIPT = """
import logging
import distributed
from distributed.comm.core import CommClosedError
from rankscope.analysis.engine.scheduler import quiet_dask_logs

def closed(name):
    try:
        raise CommClosedError()
    except CommClosedError:
        logging.getLogger(name).info("Batched Comm Closed %r", "<TCP (closed)>", exc_info=True)

with quiet_dask_logs():
    closed("distributed.batched")
    logging.getLogger("distributed.scheduler").warning("Removing worker tcp://n1:1")
    logging.getLogger("distributed.scheduler").error("kept: an error")
closed("distributed.batched")
"""


def test_dask_info_records_of_cancelled_workers_stay_quiet_until_the_clean_up_ends() -> None:
    """Cancelling Slurm workers makes the in-process scheduler log "Batched Comm Closed" with a
    traceback at INFO; dask-jobqueue quiets Dask only until its cluster's close ends, and such a
    record came later once in CI (test_slurm_workers_write_the_same_store). The runner keeps
    Dask's stderr handlers at ERROR for the whole run and its clean-up: a real interpreter with
    Dask's own logging set-up prints only the error inside, and INFO again after."""
    proc = subprocess.run(
        [sys.executable, "-c", QUIET_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "kept: an error" in lines[0]
    assert "Batched Comm Closed" in lines[1]  # after the context: restored
    assert "Removing worker" not in proc.stderr
    assert proc.stderr.count("Traceback") == 1
