"""Hung and killed ranks of REAL 2-node Slurm jobs (tests/slurm_cluster.py's local cluster):
examples/train_hang.py, one gloo rank per emulated node, rank 1 the odd one out.

Four jobs at once (module fixture; the test cluster's nodes advertise enough CPUs for all of
them and their merge jobs) to keep the suite short: an endless loop on rank 1 (a poll for a file
that never comes) followed by
``rankscope run --slurm --follow`` (the terminal's paragraph, exit 124, ``hung``); the same loop
as a batch job nobody follows, with ``--on-hang wait`` (noticed by the first node's task and
diagnosed while it is left running; cancelled afterwards, it is ``hung``); the same loop
submitted by hand with ``slurm/rankscope.sbatch`` (noticed by its first node, ended with
scancel, diagnosed by the merge job); and rank 1 SIGKILLed mid-step (a failure, not a hang,
with what the survivor was waiting in).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rankscope.launchers import rundir, step_log
from slurm_cluster import REPO, LocalSlurm, rankscope

EXAMPLE = REPO / "examples" / "train_hang.py"
HANG_AFTER_S = 10
EXIT_HUNG = 124
#: Seconds a job (and its merge job) may take at most here: 2 loaded cores, torch imports.
JOB_TIMEOUT_S = 480
#: Seconds the diagnosis of a hang left running may take after node 0 recorded the notice (a
#: process that imports the analysis and reads two answers, on 2 loaded cores).
DIAGNOSIS_TIMEOUT_S = 180
#: rank 1's endless loop: a poll for a file that never comes (``--hang poll``: it sleeps between
#: looks; the spinning ``--hang loop`` is tests/test_hang.py's — three spinning ranks for the
#: minute these jobs take would cost this module a core)
LOOP = ["--hang", "poll", "--rank", "1", "--after", "4"]
#: The window from the first step (tests/test_hang.py's PROFILED: the profiler's costly start
#: before the first step), or none in the run (its UNREAD: the killed job's windows are never read)
PROFILED = ["--wait", "0"]
UNPROFILED = ["--skip-first", "1000"]
#: scenario -> (rankscope run's extra flags, the example's arguments)
SCENARIOS: dict[str, tuple[list[str], list[str]]] = {
    "loop": (["--follow", "--no-analyze", *PROFILED], LOOP),
    "kill": (
        ["--follow", "--no-analyze", *UNPROFILED],
        ["--hang", "kill", "--rank", "1", "--after", "4"],
    ),
    "batch": (["--on-hang", "wait", *PROFILED], LOOP),
}
#: The sbatch template's job: its time limit (minutes) bounds it should nothing watch it.
TEMPLATE = REPO / "slurm" / "rankscope.sbatch"
TEMPLATE_TIME_MIN = 6

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]


def _line(text: str) -> int:
    """The line of the example that holds ``text``."""
    lines = EXAMPLE.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


def _merged(run: Path) -> bool:
    """The merge job has recorded its end (whatever the outcome)."""
    try:
        merge = json.loads((run / rundir.RUN_JSON).read_text())["slurm"]["merge"]
    except (OSError, ValueError, KeyError):
        return False
    return merge.get("state") in ("completed", "failed", "skipped")


def _notice(run: Path) -> dict[str, Any]:
    """run.json's hang notice ({} before there is one)."""
    try:
        return json.loads((run / rundir.RUN_JSON).read_text()).get("hang") or {}
    except (OSError, ValueError):
        return {}


def _until(what: str, check: Any, timeout: float = JOB_TIMEOUT_S, must: bool = True) -> Any:
    """Poll ``check()`` every second until it returns something true; after ``timeout`` s, fail
    (``must``) or return what it returns then."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() >= deadline:
            assert not must, f"no {what} in {timeout:.0f} s"
            return found
        time.sleep(1.0)
    return found


def _submit_template(cluster: LocalSlurm, out: Path) -> subprocess.CompletedProcess[str]:
    """The loop, submitted by hand with the sbatch template (its hang rule in its environment)."""
    env = cluster.env(
        NPROC_PER_NODE="1",
        RANKSCOPE_OUT=str(out),
        RANKSCOPE_PYTHON=sys.executable,
        RANKSCOPE_HANG_AFTER=str(HANG_AFTER_S),
        RANKSCOPE_PROFILER=json.dumps({"wait": 0, "warmup": 1, "active": 3, "repeat": 1}),
    )
    out.mkdir(parents=True)
    return subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", f"--time={TEMPLATE_TIME_MIN}", str(TEMPLATE),
         str(EXAMPLE), *LOOP],
        capture_output=True, text=True, env=env, cwd=out, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def jobs(
    slurm_cluster: LocalSlurm, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """Every scenario's exit status, terminal, run folder, run.json, hang.json and status."""
    base = tmp_path_factory.mktemp("slurm-hangs")
    started = time.monotonic()
    procs = {}
    for name, (flags, script_args) in SCENARIOS.items():
        out = base / name
        cmd = [
            sys.executable, "-m", "rankscope", "run", "--slurm", "--nodes", "2",
            "--nproc-per-node", "1", "--partition", slurm_cluster.partition, "--time", "10",
            "--hang-after", str(HANG_AFTER_S), "--out", str(out), *flags,
            str(EXAMPLE), *script_args,
        ]  # fmt: skip
        procs[name] = (
            out,
            subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=slurm_cluster.env(),
                cwd=base,
            ),
        )
    template = _submit_template(slurm_cluster, base / "template")
    assert template.returncode == 0, template.stderr
    results: dict[str, dict[str, Any]] = {}
    for name, (out, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
        runs = list(out.iterdir()) if out.is_dir() else []
        assert len(runs) == 1, f"{name}: {(stdout + stderr)[-3000:]}"
        results[name] = {"code": proc.returncode, "terminal": stdout + stderr, "stderr": stderr}
        results[name]["run"] = runs[0]
    # the batch job left running: diagnosed while it runs, then cancelled by hand
    run = results["batch"]["run"]
    _until("hang notice", lambda: _notice(run))
    report = run / rundir.REPORT_DIR / rundir.HANG_REPORT
    # (not there in time: the test says so; the job is cancelled all the same)
    _until("diagnosis while it runs", report.exists, DIAGNOSIS_TIMEOUT_S, must=False)
    asked_ns = time.time_ns()
    status = rankscope("status", str(run), env=slurm_cluster.env())  # refreshes run.json
    results["batch"]["running"] = {
        "diagnosed": report.exists(),
        "status": status,
        "asked_ns": asked_ns,
        "answered_ns": time.time_ns(),
        "record": json.loads((run / rundir.RUN_JSON).read_text()),
        # what the live line is made of: the hung job makes no more steps
        "steps": [
            step_log.read_steps(rundir.rank_dir(run, r) / step_log.STEP_LOG_FILE) for r in (0, 1)
        ],
        "rank0": json.loads((rundir.rank_dir(run, 0) / rundir.META_JSON).read_text()),
    }
    cancel = rankscope("cancel", str(run), env=slurm_cluster.env())
    assert cancel.returncode == 0, cancel.stderr
    out = base / "template"
    results["template"] = {"code": 0, "terminal": template.stdout, "stderr": template.stderr}
    results["template"]["run"] = _until(
        "template run folder", lambda: next((p for p in out.iterdir() if p.is_dir()), None)
    )
    for name, result in results.items():
        run = result["run"]
        _until(f"{name}: merge job end in {run}", lambda run=run: _merged(run))
        report = run / rundir.REPORT_DIR / rundir.HANG_REPORT
        result.update(
            record=json.loads((run / rundir.RUN_JSON).read_text()),
            hang=json.loads(report.read_text()) if report.exists() else None,
            status=rankscope("status", str(run), env=slurm_cluster.env()),
        )
    print(f"\nslurm hang jobs: {time.monotonic() - started:.0f} s for all four")
    return results


def _check_loop(result: dict[str, Any]) -> dict[str, Any]:
    """What a hung loop on rank 1 gives, followed or not; returns its hang.json."""
    record = result["record"]
    assert record["state"] == "hung" and record["exit_code"] == EXIT_HUNG, record
    assert record["slurm"]["state"] == "CANCELLED"  # what Slurm saw: rankscope ended it
    hang = result["hang"]
    assert hang is not None
    assert hang["notice"]["idle_s"] < HANG_AFTER_S + 30
    assert record["hang"]["headline"] == hang["headline"]
    assert hang["culprits"] == [1]
    assert hang["collective"]["op"] == "all_reduce"
    assert hang["collective"]["group_desc"] == "default_pg"
    ranks = {r["rank"]: r for r in hang["ranks"]}
    loop = _line("while not NEVER_WRITTEN.exists():  # the endless poll")
    assert ranks[1]["state"] == "missing" and ranks[1]["line"] in (loop, loop + 1)
    assert Path(ranks[1]["file"]).name == "train_hang.py"
    assert ranks[0]["state"] == "waiting" and ranks[0]["line"] == _line("# the gradient all-reduce")
    # `rankscope status`, from another shell after the job and its merge have ended
    status = result["status"]
    assert status.returncode == 0, status.stderr
    assert ": hung" in status.stdout and "exit code 124" in status.stdout, status.stdout
    assert hang["headline"] in status.stdout.replace("\n", " ")
    assert "rank 1 (missing): in train_hang.py:" in status.stdout
    return hang


def test_a_followed_endless_loop_is_named_and_ended(jobs: dict[str, dict[str, Any]]) -> None:
    result = jobs["loop"]
    assert result["code"] == EXIT_HUNG, result["terminal"][-3000:]
    hang = _check_loop(result)
    # --no-analyze: its merge job only merged (the windows written before the hang)
    merge = result["record"]["slurm"]["merge"]
    assert merge["state"] == "completed" and merge["merge_exit_code"] == 0, merge
    assert "analyze_exit_code" not in merge
    assert not (result["run"] / rundir.REPORT_DIR / rundir.SUMMARY_JSON).exists()
    # the terminal: our paragraph, no traceback
    assert "the job looks hung" in result["stderr"]
    assert hang["headline"] in result["stderr"]
    assert "Traceback" not in result["terminal"]


def test_a_batch_job_left_hung_is_diagnosed_while_it_runs(
    jobs: dict[str, dict[str, Any]],
) -> None:
    """``--on-hang wait`` on a batch job: node 0 notices, asks, and has it diagnosed at once
    (the job is not ended); cancelled afterwards, the run is ``hung``."""
    result = jobs["batch"]
    assert result["code"] == 0, result["terminal"][-3000:]  # the submission itself
    running = result["running"]
    assert running["diagnosed"], running["record"]
    assert running["record"]["state"] == "running"  # left running
    assert running["record"]["hang"]["on_hang"] == "wait"
    headline = running["record"]["hang"]["headline"]
    said = running["status"].stdout
    assert headline and headline in said.replace("\n", " ")
    # `rankscope status` calls it hung while it is kept running, and says how to end it
    assert ": hung" in said and "kept running for a debugger" in said, said
    assert f"rankscope cancel {result['run']}" in said.replace("\n", ""), said
    hang = _check_loop(result)
    assert hang["headline"] == headline
    assert result["record"]["slurm"]["merge"]["analyze_exit_code"] == 0  # analysed by default


def test_status_of_a_running_batch_job_shows_the_live_line(
    jobs: dict[str, dict[str, Any]],
) -> None:
    """``rankscope status RUN`` of the batch job while it runs (hung after its steps: its step
    logs no longer change, so the line's figures are known exactly): the steps every rank has
    done, the job's p50 step time from the ranks' step logs, and the time since its ranks started
    (not since it was submitted: time in Slurm's queue is not the run's)."""
    running = jobs["batch"]["running"]
    out = running["status"].stdout
    lines = [ln for ln in out.splitlines() if ln.startswith("rankscope: step ")]
    assert len(lines) == 1, out
    line = lines[0]
    found = re.search(r"step (\d+) · ([\d.]+) ms/step \(p50 of the last (\d+)\)", line)
    clock = re.search(r"(\d+):(\d\d):(\d\d) elapsed", line)
    assert found and clock, line
    # the truth, from the step logs: steps every rank has done; each step's interval is the
    # median over the ranks of each rank's own interval (docs/live.md), p50 over those steps
    logs = running["steps"]
    done = min(int(log["steps"][-1]) for log in logs)
    assert done >= 3, logs  # the loop starts after --after 4 steps
    ends = np.stack([log["end_ns"][log["steps"] <= done] for log in logs])
    per_step = np.median(np.diff(ends, axis=1), axis=0) / 1e6
    assert int(found[1]) == done
    assert int(found[3]) == len(per_step) == done - 1
    assert abs(float(found[2]) - float(np.median(per_step))) <= 0.05 + 1e-9, (line, per_step)
    shown_s = int(clock[1]) * 3600 + int(clock[2]) * 60 + int(clock[3])
    started = running["rank0"]["started_ns"]
    assert (running["asked_ns"] - started) // 10**9 <= shown_s, line
    assert shown_s <= (running["answered_ns"] - started) / 1e9, line


def test_a_job_of_the_sbatch_template_is_watched_on_its_first_node(
    jobs: dict[str, dict[str, Any]],
) -> None:
    """Submitted by hand with slurm/rankscope.sbatch (RANKSCOPE_HANG_AFTER): node 0's watch
    notices, asks, ends it with scancel; the merge job diagnoses it."""
    result = jobs["template"]
    assert result["record"]["slurm"]["submitted_by"] == "sbatch template"
    assert result["record"]["hang"]["on_hang"] == "report"
    _check_loop(result)


def test_a_killed_rank_on_slurm_is_a_failure_not_a_hang(jobs: dict[str, dict[str, Any]]) -> None:
    result = jobs["kill"]
    record = result["record"]
    assert result["code"] not in (0, EXIT_HUNG), result["terminal"][-3000:]
    assert record["state"] == "failed" and result["hang"] is None and "hang" not in record
    # rank 0's collective failed when its peer vanished ("Connection closed by peer"): a
    # victim; each node's torchrun named its own rank the root cause, the job's is rank 1
    first = record["failures"][0]
    assert first["rank"] == 1 and "SIGKILL" in first["error"], record["failures"]
    # "failed first" when rank 0's own failure (the closed connection) was recorded beside it,
    # "failed" when torchrun ended rank 0 first: which comes first is the nodes' race
    assert re.search(r"rank 1 failed( first)?: killed by SIGKILL", result["terminal"]), result[
        "terminal"
    ][-3000:]
    said = result["stderr"]
    assert (
        "When rank 1 died, the others were waiting in all_reduce #5 of the default group:" in said
    ), result["terminal"][-3000:]
    assert (
        f"rank 0: waiting in all_reduce #5 of the default group, in train_hang.py:{_line('# the gradient all-reduce')}"
        in said
    )
