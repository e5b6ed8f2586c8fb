"""`rankscope merge` end to end: every set in tests/data, run directories, atomic output, lock."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from rankscope.analysis.store.reader import open_store
from rankscope.analysis.store.schema import ClockMethod
from rankscope.errors import InputFileError
from rankscope.launchers import rundir
from rankscope.orchestrator.cli import main as cli
from rankscope.orchestrator.ingest.merge import merge_run_dir, output_lock
from rankscope.orchestrator.ingest.staging import SPILL_PART_FORMAT
from rankscope.orchestrator.ingest.step_logs import STEP_LOG_PART

DATA = Path(__file__).parent / "data"
SETS = {
    "param_dlrm_8rank": [0, 1, 2, 3, 4, 5, 6, 7],
    "hta/trace_filter_2rank": [0, 1],
    "hta/nccl_parser_config": [0],
    "hta/df_index_resolver": [1],
    "cpu_gloo_4rank_straggler": [0, 1, 2, 3],
    "cpu_gloo_4rank_skew": [0, 1, 2, 3],
    "cpu_gloo_4rank_pipeline": [0, 1, 2, 3],
}
#: rank 2 of cpu_gloo_4rank_skew ran under FAKETIME=+0.75s: its stamps are 750.02 ms ahead.
SKEW_NS = 750_020_000


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("name", list(SETS))
def test_cli_merges_every_data_set(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _digest(DATA / name)
    out = tmp_path / "trace.h5"
    rc = cli(["merge", str(DATA / name), "-o", str(out), "--scheduler", "synchronous"])
    assert rc == 0
    printed = capsys.readouterr().out
    with open_store(out) as store:
        assert store.ranks == SETS[name]
    # several ranks: a one-line clock summary; one rank has no clock to align
    assert printed.startswith("clock: ") == (len(SETS[name]) > 1), printed
    with open_store(out) as store:
        for rank in store.ranks:
            assert len(store.events(rank, columns=["ts"])) > 0
    assert _digest(DATA / name) == before, "inputs are never modified"


def test_default_scheduler_is_a_local_cluster(tmp_path: Path) -> None:
    """The default path: a real dask.distributed LocalCluster, one task per rank."""
    out = merge_run_dir(DATA / "cpu_gloo_4rank_straggler", output=tmp_path / "t.h5", quiet=True)
    ref = merge_run_dir(
        DATA / "cpu_gloo_4rank_straggler",
        output=tmp_path / "s.h5",
        scheduler="synchronous",
        quiet=True,
    )
    with open_store(out) as a, open_store(ref) as b:
        assert a.ranks == b.ranks
        for r in a.ranks:
            assert a.events(r).equals(b.events(r))
        assert a.collectives().equals(b.collectives())


def test_existing_scheduler_address(tmp_path: Path) -> None:
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster:
        out = merge_run_dir(
            DATA / "cpu_gloo_4rank_skew",
            output=tmp_path / "t.h5",
            scheduler=cluster.scheduler_address,
            quiet=True,
        )
    with open_store(out) as s:
        assert s.ranks == [0, 1, 2, 3]


def _split_windows(trace: Path, at_step: int) -> list[dict]:
    """Split a real trace into two profiler windows at ProfilerStep#at_step (both keep metadata)."""
    doc = json.loads(trace.read_text())
    base = int(doc["baseTimeNanoseconds"])
    events = doc["traceEvents"]
    cut = next(e["ts"] for e in events if e.get("name") == f"ProfilerStep#{at_step}")
    meta = [e for e in events if e.get("ph") == "M"]
    first = [e for e in events if e.get("ph") != "M" and e.get("ts", 0) < cut]
    second = [e for e in events if e.get("ph") != "M" and e.get("ts", 0) >= cut]
    assert base and first and second
    return [{**doc, "traceEvents": meta + first}, {**doc, "traceEvents": meta + second}]


def _samples(offset_ns: int, start_ns: int, rng: np.random.Generator) -> list[dict]:
    """NTP-style rounds of a leader whose clock is ``-offset_ns`` off the reference's.

    Forward/backward network delays are random (20-200 µs); each phase has 16 rounds.
    """
    out = []
    for i, phase in enumerate(["init", "window-000", "window-001"]):
        t = start_ns + i * 200_000_000
        for _ in range(16):
            d1, d2, proc = (int(x) for x in rng.integers(20_000, 200_000, 3))
            t1 = t
            t2 = t1 + offset_ns + d1
            t3 = t2 + proc // 10
            t4 = t3 - offset_ns + d2
            out.append({"phase": phase, "t1": t1, "t2": t2, "t3": t3, "t4": t4})
            t = t4 + 1_000_000
    return out


def make_run_dir(tmp: Path, source: Path, *, samples_for: dict[int, int] | None = None) -> Path:
    """A run directory in the documented layout, built from a real 4-rank trace set.

    Each rank gets two gzip windows (split at ProfilerStep#3) and a meta.json; ranks listed in
    ``samples_for`` (rank -> offset ns to the reference) form their own clock domain with
    runtime samples, the others share the reference's domain.
    """
    run = tmp / "20261129-141500-train-ab12"
    rundir.write_json_atomic(
        run / rundir.RUN_JSON,
        {"run_id": run.name, "world_size": 4, "state": "completed", "launcher": "local"},
    )
    rng = np.random.default_rng(0)
    for rank in range(4):
        trace = source / f"rank{rank}.step5.pt.trace.json"
        windows = _split_windows(trace, at_step=3)
        for w, doc in enumerate(windows):
            rundir.write_bytes_atomic(
                rundir.window_path(run, rank, w), gzip.compress(json.dumps(doc).encode())
            )
        domain = "vm/boot/0"
        clock: dict = {"domain": domain, "leader_rank": 0, "reference_rank": 0, "samples": []}
        if samples_for and rank in samples_for:
            base = int(windows[0]["baseTimeNanoseconds"])
            t0 = base + int(float(windows[0]["traceEvents"][-1]["ts"]) * 1000)
            clock = {
                "domain": f"vm/boot/{rank}",
                "leader_rank": rank,
                "reference_rank": 0,
                "samples": _samples(samples_for[rank], t0, rng),
            }
        meta = {
            "rank": rank, "local_rank": rank, "world_size": 4, "local_world_size": 4,
            "host": "vm", "pid": 1000 + rank, "device": "cpu", "backend": "gloo",
            "versions": {"torch": "2.13.0", "python": "3.11.7"},
            "windows": [{"index": w, "file": f"window-{w:03d}.json.gz"} for w in range(2)],
            "clock": clock,
        }  # fmt: skip
        rundir.write_json_atomic(rundir.rank_dir(run, rank) / rundir.META_JSON, meta)
    return run


def test_run_directory_with_windows_and_runtime_samples(tmp_path: Path) -> None:
    """Rank 2 is +750.02 ms ahead (libfaketime); its runtime samples say so within ±RTT/2."""
    run = make_run_dir(tmp_path, DATA / "cpu_gloo_4rank_skew", samples_for={2: -SKEW_NS})
    out = merge_run_dir(run, scheduler="synchronous", quiet=True)
    assert out == run / rundir.STORE_NAME
    with open_store(run) as s:
        assert s.ranks == [0, 1, 2, 3]
        assert s.meta["run_id"] == run.name
        ev = s.events(1)
        assert set(ev["window"].unique()) == {0, 1}
        assert ev["ts"].is_monotonic_increasing
        clock = s.clock().set_index("rank")
        # gloo end times scatter by ms: less precise than the samples, so they are not used.
        assert clock.loc[2, "method"] == ClockMethod.RUNTIME
        assert {clock.loc[r, "method"] for r in (0, 1, 3)} == {ClockMethod.REFERENCE}
        bound = clock.loc[2, "uncertainty_ns"]
        assert 0 < bound <= 200_000  # rounds have RTTs of 40-400 µs
        assert abs(clock.loc[2, "offset_ns"] + SKEW_NS) <= bound
        assert clock["violations_after"].sum() == 0
        meta = s.rank_meta(2)
        assert meta["device"] == "cpu" and meta["versions"]["torch"] == "2.13.0"
        assert len(meta["files"]) == 2


def test_remerge_replaces_atomically_and_cleans_stale_temporaries(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path, DATA / "cpu_gloo_4rank_straggler")
    out = merge_run_dir(run, scheduler="synchronous", quiet=True)
    stale = run / ".trace.h5.99999.tmp"
    stale.write_bytes(b"left by a killed merge")
    first_inode = out.stat().st_ino
    with open_store(out) as old:  # a reader keeps its (old) file while the merge replaces it
        out2 = merge_run_dir(run, scheduler="synchronous", quiet=True)
        assert old.ranks == [0, 1, 2, 3]
    assert out2 == out
    assert out.stat().st_ino != first_inode, "replaced by rename, not rewritten in place"
    assert not stale.exists()
    assert not list(run.glob(".trace.h5.*.tmp"))


def test_second_merge_of_same_output_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "trace.h5"
    with output_lock(out), pytest.raises(InputFileError, match="another merge is writing"):
        merge_run_dir(DATA / "cpu_gloo_4rank_skew", output=out, scheduler="synchronous", quiet=True)
    assert not out.exists()


def test_problem_free_set_prints_summary_and_exits_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli(["merge", str(DATA / "cpu_gloo_4rank_skew"), "-o", str(tmp_path / "t.h5"),
              "--scheduler", "synchronous", "--strict"])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    # Ranks 1 and 3 share rank 0's host clock; only the faked rank 2 is fitted.
    assert out[0].startswith("clock: collectives 1, reference 1, same-host 2")
    assert "merged 4 of 4 rank(s)" in out[1]


def _wait_for(pred, timeout_s: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_lock_held_by_another_process(tmp_path: Path) -> None:
    """A real second process holds the lock: the merge fails at once with a clear message."""
    import subprocess
    import sys

    out = tmp_path / "trace.h5"
    ready = tmp_path / "ready"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; "
            "from rankscope.orchestrator.ingest.merge import output_lock\n"
            f"with output_lock(Path({str(out)!r})):\n"
            f"    Path({str(ready)!r}).touch(); sys.stdin.read()",  # held until killed
        ],
        stdin=subprocess.PIPE,
    )
    try:
        assert _wait_for(ready.exists)
        rc = cli(
            [
                "merge",
                str(DATA / "cpu_gloo_4rank_skew"),
                "-o",
                str(out),
                "--scheduler",
                "synchronous",
            ]
        )
        assert rc == 1
        assert not out.exists()
    finally:
        holder.kill()
        holder.communicate()  # closes its stdin too
    # Once the holder is gone (the OS drops its lock), the merge works.
    assert (
        cli(
            [
                "merge",
                str(DATA / "cpu_gloo_4rank_skew"),
                "-o",
                str(out),
                "--scheduler",
                "synchronous",
                "-q",
            ]
        )
        == 0
    )


@pytest.mark.parametrize("where", ["synchronous", "processes"])
def test_interrupted_merge_leaves_no_store(tmp_path: Path, where: str) -> None:
    """Ctrl-C while the temporary store is being written: exit 130, no trace.h5, no temporary,
    and (``--scheduler processes``) no forked worker left: the one reading the pipe is ended.

    The merge is held inside that stretch by a real mechanism: rank 3's second window is a named
    pipe. The merge parses ranks in order, in-process (``--scheduler synchronous``): by the time
    it opens the pipe, the temporary store is created with its header and ranks 0-2 are parked in
    the spill (forked workers: those of ranks 0-2 whose results came back first, in any order);
    reading the pipe then blocks for as long as its writer (this test) sends nothing.
    Opening the pipe's write end without blocking succeeds only once the merge has it open for
    reading, so the interrupt lands there on any machine, fast or slow. The same run directory,
    with the real window in place of the pipe, then merges: the interrupt, not the input, stopped
    the first merge.
    """
    import os
    import signal
    import subprocess
    import sys
    import time

    run = make_run_dir(tmp_path, DATA / "cpu_gloo_4rank_skew")
    held = rundir.window_path(run, 3, 1)
    real = tmp_path / "rank3-window-001.json.gz"
    os.replace(held, real)
    os.mkfifo(held)
    out = run / rundir.STORE_NAME
    # ``python -m rankscope.orchestrator.cli merge …``, with Ctrl-C's default handling restored
    # first: a test run with SIGINT ignored (a non-interactive shell's background job, `pytest &`)
    # passes that on through exec, and the merge would never see the interrupt.
    interruptible = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", interruptible, "rankscope.orchestrator.cli", "merge", str(run),
         "--scheduler", where],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    writer = -1
    try:
        deadline = time.monotonic() + 120
        writer = _open_once_read(held, proc, deadline)
        # Where the merge waits: the temporary store open for writing (HDF5 still holds its
        # header in memory), ranks 0-2 parked in the spill.
        (tmp_store,) = run.glob(".trace.h5.*[0-9].tmp")
        assert tmp_store.is_file()
        (spill,) = run.glob(".trace.h5.*.ranks.tmp")
        files = sorted(p.name for p in spill.iterdir())
        parked = {name[:5] for name in files}
        # one file per parked part of a rank (its columns one after the other), not per column
        parts = {(name[:5], name.split(".")[1]) for name in files}
        assert len(parts) == len(files)
        assert all(name == SPILL_PART_FORMAT.format(rank=int(r), part=k) for (r, k), name in
                   zip(sorted(parts), files, strict=True))  # fmt: skip
        assert {k for _, k in parts} <= {"events", "memory", STEP_LOG_PART}
        if where == "synchronous":
            assert parked == {"00000", "00001", "00002"}
        else:
            assert parked <= {"00000", "00001", "00002"}  # whichever finished; never rank 3
            while len(_processes_of(run)) < 2:  # the parent and the worker on the pipe
                assert time.monotonic() < deadline, "no forked worker seen"
                time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if writer >= 0:
            os.close(writer)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert _processes_of(run) == [], "a worker outlived the merge"
    assert not out.exists()
    assert sorted(p.name for p in run.glob(".trace.h5*")) == [], "no temporary, no lock file"
    # The input itself merges: the real window back in place of the pipe.
    os.replace(real, held)
    rc = cli(["merge", str(run), "--scheduler", "synchronous", "-q"])
    assert rc == 0
    with open_store(out) as store:
        assert store.ranks == [0, 1, 2, 3]
        assert set(store.events(3, columns=["window"])["window"].unique()) == {0, 1}


def test_a_killed_merge_leaves_no_forked_worker(tmp_path: Path) -> None:
    """SIGKILL to a merge whose forked worker is blocked in its task (reading a named pipe that
    never gets data): the parent cannot end its workers, the kernel does (``PR_SET_PDEATHSIG``),
    so nothing is left running; the input then merges."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run = make_run_dir(tmp_path, DATA / "cpu_gloo_4rank_skew")
    held = rundir.window_path(run, 3, 1)
    real = tmp_path / "rank3-window-001.json.gz"
    os.replace(held, real)
    os.mkfifo(held)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "merge", str(run), "--scheduler", "processes"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    writer = -1
    try:
        deadline = time.monotonic() + 120
        writer = _open_once_read(held, proc, deadline)
        merge_pids = _processes_of(run)
        assert len(merge_pids) >= 2  # the parent and the worker on the pipe
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        # Each of them gone or a zombie: an exiting process loses its command line before its
        # files are closed, so "no process names the run" can hold while a worker still holds
        # the merge's lock; a zombie has closed them all.
        while live := [pid for pid in merge_pids if _running(pid)]:
            assert time.monotonic() < deadline + 60, f"workers outlived the merge: {live}"
            time.sleep(0.05)
        assert not _processes_of(run)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if writer >= 0:
            os.close(writer)
    assert proc.returncode == -signal.SIGKILL
    os.replace(real, held)
    assert cli(["merge", str(run), "--scheduler", "synchronous", "-q"]) == 0
    with open_store(run / rundir.STORE_NAME) as store:
        assert store.ranks == [0, 1, 2, 3]


def _open_once_read(held: Path, proc: subprocess.Popen[str], deadline: float) -> int:
    """The write end of the named pipe ``held``, opened once the merge ``proc`` has it open for
    reading (until then a non-blocking open fails with ENXIO): the merge has reached that
    window, on any machine, fast or slow."""
    import errno
    import os
    import time

    while True:
        try:
            return os.open(held, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            assert exc.errno == errno.ENXIO, exc
            assert proc.poll() is None, f"the merge ended first: {proc.communicate()}"
            assert time.monotonic() < deadline, "the merge never opened the named pipe"
            time.sleep(0.01)


def _running(pid: int) -> bool:
    """True while process ``pid`` exists and is not yet a zombie (whose files are all closed)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False  # gone (reaped)
    state = next((ln for ln in status.splitlines() if ln[:6] == "State:"), "")
    return "zombie" not in state and "dead" not in state


def _processes_of(run: Path) -> list[int]:
    """PIDs of live processes whose command line names ``run`` (a merge and its forked workers,
    which share the parent's command line)."""
    import os

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state = next(
                (ln for ln in (entry / "status").read_text().splitlines() if ln[:6] == "State:"),
                "",
            )
        except OSError:
            continue  # gone meanwhile
        if str(run).encode() in cmdline and "zombie" not in state:
            found.append(int(entry.name))
    return found
