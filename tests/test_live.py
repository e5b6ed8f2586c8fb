"""The live monitor on a real job (issue 30): a slow-down is noticed live, profiled by one extra
window on every rank from the same step, and that window's analysis names the slow rank.

ONE real ``rankscope run`` (torchrun, gloo, 3 ranks, 300 steps): every rank waits 80 ms in its
data loader each step (a step mostly asleep, so the machine's load moves it little; ~90 ms steps,
so the detector's window is its 10 steps — shorter steps get a window of >= 1 s,
``ChangeRule.min_seconds``), and from step 150 rank 2 does 30 ms more of its own work
(``--straggler-from``). No scheduled window falls
in the run (``--skip-first 1000``): the only window is the one the monitor asks for, so the
run's analysis is that window's.

(The host rule — contention on the host said, never profiled — is tested on generated series
and on real step-log files in tests/test_step_changes.py. A real run with busy loops started
mid-run was tried here and removed: in a CI run with the other worker's load the steps got
FASTER after the loops started (130 -> 105 ms, run-queue delay 35 -> 12 ms: the other load
ended as the loops began, and CFS lets a thread that wakes from its loader's sleep preempt busy
loops), so nothing was noticed and the test failed: its premise does not hold on a shared
machine. docs/live.md.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rankscope.launchers import rundir, step_log
from run_folders import first_job_change

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"
SLOW_FROM = 150


@pytest.fixture(scope="module")
def slowed(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("live")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "KINETO_LOG_LEVEL")}
    args = [
        sys.executable, "-m", "rankscope", "run", "--nproc-per-node", "3",
        "--skip-first", "1000", "--active", "5", "--total-steps", "300",
        "--out", str(out), str(EXAMPLE), "--steps", "300", "--hidden", "32",
        "--layers", "1", "--batch-size", "8", "--input-delay-ms", "80",
        "--straggler-rank", "2", "--straggler-ms", "30", "--straggler-from", str(SLOW_FROM),
    ]  # fmt: skip
    proc = subprocess.run(
        args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        env={**env, "COLUMNS": "200"},
    )
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return proc, run_dir


def metas(run_dir: Path) -> list[dict[str, Any]]:
    return [
        json.loads((rundir.rank_dir(run_dir, r) / rundir.META_JSON).read_text()) for r in range(3)
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_slowdown_is_noticed_profiled_and_named(
    slowed: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    proc, run_dir = slowed
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # every step of every rank is in its step log
    for r in range(3):
        log = step_log.read_steps(rundir.rank_dir(run_dir, r) / step_log.STEP_LOG_FILE)
        assert log["steps"].tolist() == list(range(1, 301))
    # the change: noticed live within 20 steps of step 150, one line on the terminal
    first = first_job_change(run_dir)
    assert SLOW_FROM < first["step"] <= SLOW_FROM + 20, first
    assert first["after_ms"] > first["before_ms"] + 20
    assert first["sentence"] in proc.stdout
    assert first["trigger"] == 1
    # one triggered window, from the same step on every rank, <= 10 steps after the report
    trigger = json.loads((run_dir / rundir.TRIGGER_FILE).read_text())
    assert trigger["id"] == 1 and trigger["steps"] == 5
    assert first["step"] < trigger["start_step"] <= first["step"] + 10
    for meta in metas(run_dir):
        triggered = [w for w in meta["windows"] if "trigger" in w]
        assert len(triggered) == 1, meta["windows"]
        w = triggered[0]
        assert w["trigger"]["id"] == 1 and w["first_step"] == trigger["start_step"]
        assert w["last_step"] == trigger["start_step"] + 4 and w["complete"]
    # the run's analysis (of that window: the only one) names rank 2 and its own work
    summary = json.loads((run_dir / rundir.REPORT_DIR / rundir.SUMMARY_JSON).read_text())
    stragglers = summary["stragglers"]
    assert [s["rank"] for s in stragglers] == [2], stragglers
    assert stragglers[0]["cause"] == "own compute", stragglers[0]


def test_live_options_round_trip_through_run_json() -> None:
    """A batch job's monitor (``rankscope monitor``) reads ``rankscope run``'s live options
    back from ``run.json``; a run of the sbatch template records none: the defaults."""
    from rankscope.orchestrator.live_options import LiveOptions, TriggerMode

    given = LiveOptions(trigger=TriggerMode.OFF, max_triggers=5, total_steps=1000, no_live=True)
    assert LiveOptions.from_dict(json.loads(json.dumps(given.to_dict()))) == given
    assert LiveOptions.from_dict({}) == LiveOptions()


def test_the_batch_monitor_command_notices_triggers_and_stops_on_sigterm(tmp_path: Path) -> None:
    """``rankscope monitor RUN``, the command a Slurm batch job's first node starts beside
    torchrun (its real run on the test cluster: tests/test_slurm.py's template job), on step
    logs written here: 2 ranks, 125 steps of 120 ms then 10 of 240 ms (the known truth; steps long enough
    for a 10-step window, ``ChangeRule.min_seconds``). The
    change is noticed at its first look, written to changes.jsonl with trigger.json, said in its
    output; SIGTERM (the node's, once torchrun has ended) ends it with exit 0 after a last line."""
    import time

    import numpy as np

    run = tmp_path / "run"
    rundir.write_json_atomic(
        run / rundir.RUN_JSON,
        {
            "state": "running",
            "launcher": "slurm",
            "world_size": 2,
            "profiler": {"skip_first": 1000},  # no scheduled window: every step counts
            "options": {"live": {"trigger": "on", "max_triggers": 1, "total_steps": 500}},
        },
    )
    rng = np.random.default_rng(7)
    step_ms = np.r_[np.full(125, 120.0), np.full(10, 240.0)]
    now = time.time_ns()
    for r in range(2):
        ends = now - np.cumsum((step_ms + rng.normal(0, 3.0, step_ms.size))[::-1])[::-1] * 1e6
        records = [(k + 1, int(e), step_log.UNKNOWN) for k, e in enumerate(ends)]
        path = rundir.rank_dir(run, r) / step_log.STEP_LOG_FILE
        path.parent.mkdir(parents=True)
        step_log.append(path, records)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "monitor", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        changes = run / rundir.CHANGES_FILE
        deadline = time.monotonic() + 120
        while not changes.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    (change,) = [json.loads(line) for line in changes.read_text().splitlines()]
    assert change["kind"] == "job" and change["step"] == 135 and change["trigger"] == 1
    assert 115 < change["before_ms"] < 125 and 235 < change["after_ms"] < 245, change
    trigger = json.loads((run / rundir.TRIGGER_FILE).read_text())
    assert trigger["id"] == 1 and trigger["start_step"] > 135, trigger
    assert change["sentence"] in out
    # the newest live line, written at the end (a log: not redrawn), with the ETA of run.json's
    # --total-steps
    assert out.splitlines()[-1].startswith("rankscope: step 135/500 · "), out
    assert "ETA" in out.splitlines()[-1] and "Traceback" not in err, err
