"""The per-rank runtime and the pieces around it: stepping rules, windows, errors, spec, argv.

Runtime tests run the real rank module (``python -m rankscope.launchers.rank``) on tiny scripts
in one process without torchrun: the profiler, the hooks and the files are the real ones.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rankscope
from rankscope.errors import UsageError
from rankscope.launchers import clocksync, rundir, step_log
from rankscope.launchers.base import create_run_dir
from rankscope.launchers.rundir import load_run
from rankscope.launchers.spec import ProfilerSettings, RunSpec
from rankscope.orchestrator import run as run_cmd

ROOT = Path(__file__).resolve().parent.parent


def run_rank(
    tmp_path: Path, body: str, *options: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run ``body`` as a script under the rank module; return the process and the run dir."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankscope.launchers.rank",
            "--run-dir",
            str(run_dir),
            *options,
            str(script),
            "--flag",
            "x",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )
    return proc, run_dir


def meta(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((rundir.rank_dir(run_dir, 0) / rundir.META_JSON).read_text())
    return data


def profiler_steps(run_dir: Path, window: int) -> list[str]:
    trace = json.loads(gzip.decompress(rundir.window_path(run_dir, 0, window).read_bytes()))
    return sorted(
        {
            e["name"]
            for e in trace["traceEvents"]
            if str(e.get("name", "")).startswith("ProfilerStep#")
        },
        key=lambda n: int(n.split("#")[1]),
    )


TWO_OPTIMIZERS = """
    import sys
    import torch
    assert sys.argv[1:] == ["--flag", "x"], sys.argv
    assert __name__ == "__main__"
    a, b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    opt_b = torch.optim.Adam(b.parameters(), lr=0.1)
    for _ in range(10):
        loss = a(torch.randn(4, 8)).sum() + b(torch.randn(4, 8)).sum()
        loss.backward()
        opt_a.step()
        opt_b.step()  # same iteration: must not advance the profiler again
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_several_optimizers_step_once_per_iteration(tmp_path: Path) -> None:
    proc, run_dir = run_rank(tmp_path, TWO_OPTIMIZERS, "--repeat", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = meta(run_dir)
    assert m["steps"] == 10
    assert [w["file"] for w in m["windows"]] == ["window-000.json.gz", "window-001.json.gz"]
    assert profiler_steps(run_dir, 0) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert profiler_steps(run_dir, 1) == ["ProfilerStep#7", "ProfilerStep#8", "ProfilerStep#9"]
    for window in (0, 1):  # the iteration ends after the LAST optimizer: both inside one step
        trace = json.loads(gzip.decompress(rundir.window_path(run_dir, 0, window).read_bytes()))
        spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        steps = [
            (e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"].startswith("ProfilerStep#")
        ]
        for name in ("Optimizer.step#SGD.step", "Optimizer.step#Adam.step"):
            ranges = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == name]
            assert len(ranges) == 3
            assert all(any(lo <= a and b <= hi for lo, hi in steps) for a, b in ranges), name
    run = load_run(run_dir)  # no rankscope process: rank 0 described the run itself
    assert run["launcher"] == "external" and run["state"] == "completed" and run["exit_code"] == 0
    assert run["script_args"] == ["--flag", "x"] and run["profiler"]["repeat"] == 2


MANUAL_STEPS = """
    import torch
    import rankscope
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(6):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()        # ignored once rankscope.step() drives the profiler
        rankscope.step()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rankscope_step_drives_the_profiler(tmp_path: Path) -> None:
    proc, run_dir = run_rank(tmp_path, MANUAL_STEPS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = meta(run_dir)
    # not 12: once rankscope.step() is called the optimizer hook stands down; only the very first
    # optimizer step (before rankscope.step() was ever called) counted
    assert m["steps"] == 7
    assert profiler_steps(run_dir, 0) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    # the step log holds EVERY step, the ones after the only window too, in order; no
    # collective ran: the wait is unknown
    log = step_log.read_steps(rundir.rank_dir(run_dir, 0) / step_log.STEP_LOG_FILE)
    assert log["steps"].tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert (np.diff(log["end_ns"]) >= 0).all()
    assert m["started_ns"] <= log["end_ns"][0] and log["end_ns"][-1] <= m["ended_ns"]
    assert (log["wait_ns"] == step_log.UNKNOWN).all()
    # and the training thread's scheduler counters at each step's end (Linux: known, cumulative;
    # the kernel updates a running thread's CPU time at its ticks and switches, so a step may
    # show none of it)
    assert (log["cpu_ns"] > 0).all() and (log["runq_ns"] >= 0).all()
    assert (np.diff(log["cpu_ns"]) >= 0).all() and (np.diff(log["runq_ns"]) >= 0).all()
    assert log["cpu_ns"][-1] > log["cpu_ns"][0]


RAISES_MID_WINDOW = """
    import rankscope
    import torch
    for i in range(10):
        torch.randn(16, 16) @ torch.randn(16, 16)
        if i == 3:
            raise ValueError("bad batch 3\\nsecond line")
        rankscope.step()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_uncaught_error_is_recorded_and_window_in_progress_flushed(tmp_path: Path) -> None:
    proc, run_dir = run_rank(
        tmp_path, RAISES_MID_WINDOW, "--wait", "0", "--warmup", "0", "--active", "5"
    )
    assert proc.returncode == 1
    assert "ValueError: bad batch 3" in proc.stderr  # re-raised: the user's traceback is intact
    m = meta(run_dir)
    assert m["error"]["type"] == "ValueError" and m["error"]["message"] == "bad batch 3"
    assert m["error"]["interrupted"] is False
    (window,) = m["windows"]
    assert window["complete"] is False and window["first_step"] == 0 and window["last_step"] == 3
    assert profiler_steps(run_dir, 0) == [
        "ProfilerStep#0",
        "ProfilerStep#1",
        "ProfilerStep#2",
        "ProfilerStep#3",
    ]
    assert load_run(run_dir)["state"] == "failed"
    # the steps done before the error are in the step log (the error path flushed it)
    log = step_log.read_steps(rundir.rank_dir(run_dir, 0) / step_log.STEP_LOG_FILE)
    assert log["steps"].tolist() == [1, 2, 3]


FAILS_IN_FIRST_ATTEMPT = """
    import os
    import rankscope
    for i in range(6):
        if i == 5 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            raise RuntimeError("first attempt dies")
        rankscope.step()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_restarted_attempt_keeps_earlier_windows(tmp_path: Path) -> None:
    """torchrun --max-restarts reruns the ranks in the same run folder: nothing is overwritten."""
    first, run_dir = run_rank(
        tmp_path, FAILS_IN_FIRST_ATTEMPT, env={"TORCHELASTIC_RESTART_COUNT": "0"}
    )
    assert first.returncode == 1
    second, _ = run_rank(tmp_path, FAILS_IN_FIRST_ATTEMPT, env={"TORCHELASTIC_RESTART_COUNT": "1"})
    assert second.returncode == 0, second.stderr[-3000:]
    m = meta(run_dir)
    assert m["attempt"] == 1 and "error" not in m
    assert [(w["index"], w["attempt"], w["first_step"]) for w in m["windows"]] == [
        (0, 0, 2),
        (1, 1, 2),
    ]
    assert profiler_steps(run_dir, 0) == profiler_steps(run_dir, 1)  # both attempts' files kept
    assert m["previous_errors"][0]["message"] == "first attempt dies"


COLLECTIVE_STEPS = """
    import threading
    import rankscope
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + __import__("os").path.abspath("store"),
                            rank=0, world_size=1)
    for i in range(8):
        t = torch.ones(4)
        if i == 5:
            dist.all_reduce(t, async_op=True).wait()  # waited in C++: not seen
        else:
            dist.all_reduce(t)
        if i == 6:
            dist.barrier()
        rankscope.step()
    dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_step_log_counts_the_time_in_blocking_collectives(tmp_path: Path) -> None:
    """wait_ns: the ns spent in torch.distributed's blocking collectives of the step; a step
    with an async one says UNKNOWN (its wait is in C++), one without any too."""
    proc, run_dir = run_rank(tmp_path, COLLECTIVE_STEPS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = step_log.read_steps(rundir.rank_dir(run_dir, 0) / step_log.STEP_LOG_FILE)
    assert log["steps"].tolist() == list(range(1, 9))
    waits = log["wait_ns"].tolist()
    assert waits[5] == step_log.UNKNOWN
    known = [w for i, w in enumerate(waits) if i != 5]
    assert all(w > 0 for w in known), waits
    # each known wait is at most its step's length (the first step's start is the profiler's)
    steps_ns = np.diff(log["end_ns"])
    assert all(waits[i] <= steps_ns[i - 1] for i in range(1, 8) if i != 5)


TRIGGERED = """
    import json, os, threading
    import rankscope
    import torch
    from pathlib import Path
    trigger = Path(os.environ["RANKSCOPE_RUN_DIR"]) / "trigger.json"
    seen = Path(os.environ["RANKSCOPE_RUN_DIR"]) / "ranks" / "00000" / "meta.json"
    def accepted(ident):
        for _ in range(400):  # the probe looks every 50 ms; meta.json says what it did
            rankscope.step()
            threading.Event().wait(0.01)
            meta = json.loads(seen.read_text()) if seen.exists() else {}
            if any(t["id"] == ident for t in meta.get("triggers", [])):
                return
        raise SystemExit("trigger never seen")
    for i in range(3):
        torch.randn(8, 8) @ torch.randn(8, 8)
        rankscope.step()
    # a request for steps far ahead: accepted; then one for a step already passed: refused
    trigger.write_text(json.dumps({"id": 1, "start_step": 600, "steps": 2, "reason": "test"}))
    accepted(1)
    trigger.write_text(json.dumps({"id": 2, "start_step": 1, "steps": 2, "reason": "late"}))
    accepted(2)
    from rankscope.launchers import runtime
    while runtime.current().meta["steps"] < 610:
        rankscope.step()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_triggered_window_records_exactly_the_steps_asked_for(tmp_path: Path) -> None:
    """RUN/trigger.json (the live monitor's request, launchers/triggers.py): the window records
    ProfilerStep#600-601 after one warm-up step, marked with its trigger; a request for steps
    already passed is refused and said so; the scheduled window stays as it was."""
    proc, run_dir = run_rank(tmp_path, TRIGGERED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = meta(run_dir)
    first, second = m["triggers"]
    assert first["accepted"] and first["why"] is None
    assert not second["accepted"] and "too late" in second["why"]
    scheduled, triggered = m["windows"]
    assert "trigger" not in scheduled and (scheduled["first_step"], scheduled["last_step"]) == (
        2,
        4,
    )
    assert triggered["trigger"] == {"id": 1, "reason": "test"}
    assert (triggered["index"], triggered["first_step"], triggered["last_step"]) == (1, 600, 601)
    assert profiler_steps(run_dir, 1) == ["ProfilerStep#600", "ProfilerStep#601"]


def test_step_outside_a_run_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rundir.ENV_RUN_DIR, raising=False)
    from rankscope.launchers import runtime

    assert runtime.start() is None
    rankscope.step()  # nothing happens, nothing raised
    assert runtime.current() is None


# ----------------------------------------------------------------------------- spec
def test_profiler_settings_validation_and_json() -> None:
    s = ProfilerSettings(wait=2, warmup=0, active=4, repeat=0, record_shapes=True)
    assert ProfilerSettings.from_json(s.to_json()) == s
    assert ProfilerSettings(wait=1, warmup=1, active=3, repeat=2).expected_windows(20) == 2
    assert ProfilerSettings(wait=1, warmup=1, active=3, repeat=0).expected_windows(20) == 4
    assert ProfilerSettings(skip_first=3).expected_windows(7) == 0
    with pytest.raises(ValueError, match="--active"):
        ProfilerSettings(active=0)
    for field in ("wait", "warmup", "repeat", "skip_first"):
        with pytest.raises(ValueError, match="--" + field.replace("_", "-")):
            ProfilerSettings(**{field: -1})


def test_run_spec_names(tmp_path: Path) -> None:
    spec = RunSpec(script="examples/train_ddp.py", nproc_per_node=4, nnodes=2)
    assert spec.name == "train_ddp" and spec.world_size == 8
    assert RunSpec(script="pkg.train", module=True).name == "train"
    for bad in ("a/b", "..", "", " ", ".hidden"):
        with pytest.raises(ValueError):
            RunSpec(script="x.py", name=bad or " ")
    with pytest.raises(UsageError):
        create_run_dir(tmp_path, "a/../b")
    run_dir = create_run_dir(tmp_path, "demo")
    assert run_dir.parent == tmp_path.resolve() and "-demo-" in run_dir.name
    assert (run_dir / rundir.RANKS_DIR).is_dir() and (run_dir / rundir.LOGS_DIR).is_dir()
    assert create_run_dir(tmp_path, "demo") != run_dir  # unique even within one second


# ----------------------------------------------------------------------------- clock samples
def test_offset_and_rtt_follow_the_contract() -> None:
    # leader 500 ms ahead of the reference, 100 µs each way, 20 µs turnaround
    t1 = 1_000_500_000_000
    t2 = t1 - 500_000_000 + 100_000
    t3 = t2 + 20_000
    t4 = t3 + 500_000_000 + 100_000
    sample = {"phase": "init", "t1": t1, "t2": t2, "t3": t3, "t4": t4}
    assert clocksync.offset_ns(sample) == -500_000_000
    assert clocksync.rtt_ns(sample) == 200_000


def test_clock_domain_and_leaders() -> None:
    domain = clocksync.clock_domain()
    host, boot, diff_ms = domain.rsplit("/", 2)
    assert (
        host
        and boot
        and abs(int(diff_ms) * 1_000_000 - clocksync.realtime_minus_monotonic_ns()) < 2_000_000
    )
    sync = clocksync.ClockSync(rank=3, domain="b", domains=["a", "a", "b", "b", "c"], group=None)
    assert sync.leaders == {"a": 0, "b": 2, "c": 4}
    assert sync.leader_rank == 2 and sync.syncing_leaders == [2, 4] and not sync.records_samples


CLOSE_RELEASES_GROUP = """
import torch.distributed as dist
from rankscope.launchers import clocksync
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
sync = clocksync.setup()
assert sync.group is not None
dist.destroy_process_group()
sync.close()
assert sync.group is None and sync.sockets == {}
print("released")
"""


def test_the_clock_sync_lets_go_of_its_gloo_group_at_close() -> None:
    """At the run's end (``RankRuntime.close``, after the script destroyed its process groups)
    the clock sync drops its gloo group, so the group's C++ object is destroyed while the
    interpreter runs, not during its finalization (clocksync.ClockSync.close)."""
    done = subprocess.run(
        [sys.executable, "-c", CLOSE_RELEASES_GROUP], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "released", done.stderr[-2000:]


# ----------------------------------------------------------------------------- argv split
def test_split_argv_keeps_script_flags_for_the_script() -> None:
    parser = run_cmd.build_parser()
    mine, torchrun, script, rest = run_cmd.split_argv(
        ["--nproc-per-node", "4", "--active", "2", "--standalone", "--out=x", "--max_restarts", "0",
         "train.py", "--lr", "3e-4", "--active", "9"],
        parser,
    )  # fmt: skip
    assert mine == ["--active", "2", "--out=x"]
    assert torchrun == ["--nproc-per-node", "4", "--standalone", "--max_restarts", "0"]
    assert script == "train.py" and rest == ["--lr", "3e-4", "--active", "9"]


def test_torchrun_switches_match_torchrun() -> None:
    """The splitter's list of value-less torchrun flags is torchrun's own."""
    from torch.distributed.run import get_args_parser

    switches = {
        opt
        for action in get_args_parser()._actions
        if action.nargs == 0 and not isinstance(action, argparse._HelpAction)
        for opt in action.option_strings
    }
    assert switches == set(run_cmd.TORCHRUN_SWITCHES)


def test_ctrl_c_during_a_profiler_transition_lands_after_it() -> None:
    """A signal inside ``signals_deferred`` runs its handler only once the block is done."""
    from rankscope.launchers.runtime import signals_deferred

    # earlier tests in the session (dask, tornado) may leave their own SIGINT handler installed:
    # start from Python's default, the one a rank has, and put theirs back afterwards
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        finished = False
        with pytest.raises(KeyboardInterrupt), signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # gives Python many chances to run a handler
                sum(range(100))
            finished = True
        assert finished
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, previous)


GC_EVERY_STEP = """
    import gc
    import rankscope
    import torch
    for i in range(6):
        torch.randn(16, 16) @ torch.randn(16, 16)
        for _ in range(2000):
            cycle = []
            cycle.append(cycle)
        gc.collect()
        rankscope.step()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_record_gc_writes_python_gc_events_the_analysis_counts(tmp_path: Path) -> None:
    """--record-gc: torch's ``Python GC`` events in the trace, counted per step after a merge."""
    from rankscope.analysis.compute.gc_pauses import GC_EVENT_NAME, gc_per_step
    from rankscope.analysis.engine.driver import SYNCHRONOUS
    from rankscope.analysis.store.reader import open_store
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    settings = ProfilerSettings(wait=0, warmup=1, active=3, repeat=1, record_gc=True)
    proc, run_dir = run_rank(tmp_path, GC_EVERY_STEP, env={rundir.ENV_PROFILER: settings.to_json()})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "record_gc_error" not in meta(run_dir)
    trace = json.loads(gzip.decompress(rundir.window_path(run_dir, 0, 0).read_bytes()))
    gcs = [e for e in trace["traceEvents"] if e.get("name") == GC_EVENT_NAME]
    assert len(gcs) >= 3 and all(e["cat"] == "python_function" and e["ph"] == "X" for e in gcs)
    store = merge_run_dir(run_dir, scheduler=SYNCHRONOUS, quiet=True)
    with open_store(store) as s:
        per_step = gc_per_step(s.events(0), 0)
    assert per_step["step"].tolist() == [1, 2, 3], per_step.to_string()
    assert (per_step["collections"] >= 1).all() and (per_step["gc_ns"] > 0).all()
