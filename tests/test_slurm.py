"""The Slurm path against a REAL local Slurm cluster (tests/slurm_cluster.py starts it).

Every job runs the real example on two emulated nodes x 2 ranks (gloo, CPU) through the real
``rankscope`` command line, submitit, sbatch, slurmctld/slurmd and accounting; the merge runs in
the real dependent job. The fast tests at the top need no cluster (options, defaults, messages).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rankscope.errors import UsageError
from rankscope.launchers import rundir
from rankscope.launchers.slurm.node import node_torchrun_args
from rankscope.launchers.slurm.options import SlurmOptions, load_defaults, slurm_options_from_args
from rankscope.launchers.slurm.records import task_states
from rankscope.launchers.torchrun import TORCHELASTIC_DIR
from run_folders import failed_local_run, first_job_change
from slurm_cluster import REPO, LocalSlurm, interruptible, rankscope

EXAMPLE = REPO / "examples" / "train_ddp.py"
TEMPLATE = REPO / "slurm" / "rankscope.sbatch"
#: Seconds a test waits for a job and its merge job (generous: 2 loaded cores, torch imports).
JOB_TIMEOUT_S = 420.0
#: A schedule that writes a window every 3 steps until the end (so a killed job has windows).
WINDOW_EVERY_3_STEPS = ["--wait", "0", "--warmup", "1", "--active", "2", "--repeat", "0"]
#: Input delay that makes each step last ~0.2 s: long jobs with few windows.
SLOW_STEPS = ["--input-delay-ms", "200"]
#: A job that slows down for good mid-run (the live monitor's case, docs/live.md): every rank
#: waits 80 ms in its loader per step (a step mostly asleep: the machine's load moves it
#: little; ~90 ms steps, so the monitor's window is ~11 steps: a rise must last >= 1 s,
#: ChangeRule.min_seconds), rank 1 does 30 ms more of its own work from step SLOWDOWN_FROM; the
#: change needs ~70 steps of baseline after the first window, and room after it for the extra
#: window.
SLOWDOWN_FROM = 90
SLOWDOWN_STEPS = 150
SLOWDOWN = [
    "--hidden", "32", "--layers", "1", "--batch-size", "8", "--input-delay-ms", "80",
    "--straggler-rank", "1", "--straggler-ms", "30", "--straggler-from", str(SLOWDOWN_FROM),
]  # fmt: skip


# ---------------------------------------------------------------------------- helpers


def wait_until(what: str, check: Callable[[], Any], timeout: float = JOB_TIMEOUT_S) -> Any:
    """Poll ``check`` every second until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(1.0)


def record(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / rundir.RUN_JSON).read_text())


def merge_finished(run_dir: Path) -> bool:
    """The dependent job has finished the merge (whatever the outcome)."""
    if not (run_dir / rundir.RUN_JSON).exists():
        return False  # the job made the run folder but has not written run.json yet
    merge = (record(run_dir).get("slurm") or {}).get("merge") or {}
    return merge.get("state") in ("completed", "failed", "cancelled", "skipped")


def run_args(tmp_path: Path, cluster: LocalSlurm, *extra: str, time_min: int = 10) -> list[str]:
    """``rankscope run --slurm`` arguments for 2 nodes x 2 ranks of the example (script args follow)."""
    return [
        "run",
        "--slurm",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--partition",
        cluster.partition,
        "--time",
        str(time_min),
        "--out",
        str(tmp_path / "runs"),
        *extra,
        str(EXAMPLE),
    ]


def submit(
    tmp_path: Path,
    cluster: LocalSlurm,
    *extra: str,
    time_min: int = 10,
    script_args: tuple[str, ...] = (),
) -> tuple[Path, str]:
    """Submit; returns (run dir, job id) — ``rankscope run --slurm`` returns at once."""
    args = run_args(tmp_path, cluster, *extra, time_min=time_min)
    res = rankscope(*args, *script_args, env=cluster.env(), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return parse_submission(res.stdout.splitlines())


def parse_submission(lines: list[str]) -> tuple[Path, str]:
    """(run dir, job id) from what ``rankscope run --slurm`` prints."""
    job_id = (
        next(ln for ln in lines if "submitted Slurm job" in ln).split("Slurm job ")[1].split()[0]
    )
    run_dir = Path(next(ln for ln in lines if ln.startswith("rankscope run: /")).split(": ", 1)[1])
    assert run_dir.is_dir() and job_id.isdigit()
    return run_dir, job_id


def task_rows(status_text: str, state: str) -> int:
    """Rows of ``rankscope status``'s task table in ``state``."""
    return sum(1 for ln in status_text.splitlines() if ln.startswith("│") and f"│ {state} " in ln)


def store_ranks(store: Path) -> list[int]:
    import h5py

    with h5py.File(store, "r") as f:
        return sorted(int(k) for k in f["ranks"])


def windows_written(run_dir: Path) -> dict[int, int]:
    ranks = run_dir / rundir.RANKS_DIR
    return {
        int(d.name): len(list(d.glob(rundir.WINDOW_GLOB)))
        for d in ranks.iterdir()
        if d.name.isdigit()
    }


# ---------------------------------------------------------------------------- no cluster needed
def test_options_validate_each_field() -> None:
    SlurmOptions(
        nodes=2, gpus_per_node=0, cpus_per_task=2, mem="64G", time=5, sbatch_args=("--exclusive",)
    )
    bad: list[tuple[dict[str, Any], str]] = [
        ({"nodes": 0}, "--nodes"),
        ({"time": 0}, "--time"),
        ({"gpus_per_node": -1}, "--gpus-per-node"),
        ({"cpus_per_task": 0}, "--cpus-per-task"),
        ({"mem": "lots"}, "--mem"),
        ({"partition": ""}, "--partition"),
        ({"sbatch_args": ("exclusive",)}, "--key=value"),
        ({"sbatch_args": ("--nodes=3",)}, "sets --nodes itself"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            SlurmOptions(**kwargs)


def test_extra_sbatch_args_become_submitit_parameters() -> None:
    opts = SlurmOptions(sbatch_args=("--exclusive", "--reservation=r1", "--mail-type=END"))
    assert opts.additional_parameters() == {
        "exclusive": True,
        "reservation": "r1",
        "mail_type": "END",
    }
    assert SlurmOptions.from_dict(opts.to_dict()) == opts


def test_defaults_from_config_file_then_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "slurm.toml"
    cfg.write_text('[slurm]\npartition = "gpu"\naccount = "proj"\ntime = 120\n')
    env = {"RANKSCOPE_SLURM_CONFIG": str(cfg)}
    assert load_defaults(env) == {"partition": "gpu", "account": "proj", "time": 120}
    env |= {"RANKSCOPE_SLURM_PARTITION": "debug", "RANKSCOPE_SLURM_TIME": "7"}
    assert load_defaults(env) == {"partition": "debug", "account": "proj", "time": 7}
    cfg.write_text('partitoin = "typo"\n')
    with pytest.raises(UsageError, match="unknown key"):
        load_defaults(env)
    with pytest.raises(UsageError, match="not found"):
        load_defaults({"RANKSCOPE_SLURM_CONFIG": str(tmp_path / "missing.toml")})
    with pytest.raises(UsageError, match="whole number of minutes"):
        load_defaults({"RANKSCOPE_SLURM_CONFIG": "", "RANKSCOPE_SLURM_TIME": "1h"})


def test_sbatch_script_asks_gpus_only_when_wanted(tmp_path: Path) -> None:
    """The script submitit writes from our parameters: GPUs only when > 0, no USR2 before the end."""
    from submitit.slurm.slurm import _make_sbatch_string

    cpu = SlurmOptions(nodes=2, partition="debug", time=5).executor_parameters(2, "rankscope-x")
    text = _make_sbatch_string(command="true", folder=tmp_path, **cpu)
    assert "--gpus" not in text and "--signal=CONT@1" in text and "USR2" not in text
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "#SBATCH --cpus-per-task=2" in text and "#SBATCH --time=5" in text
    assert "--kill-on-bad-exit=1" in text
    gpu = SlurmOptions(
        nodes=4, gpus_per_node=8, cpus_per_task=64, mem="500G", sbatch_args=("--exclusive",)
    )
    text = _make_sbatch_string(command="true", folder=tmp_path, **gpu.executor_parameters(8, "x"))
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --cpus-per-task=64" in text
    assert "#SBATCH --mem=500G" in text and "#SBATCH --exclusive" in text


def test_slurm_flags_need_slurm() -> None:
    import argparse

    from rankscope.launchers.slurm.options import add_slurm_arguments

    parser = argparse.ArgumentParser()
    add_slurm_arguments(parser)
    assert slurm_options_from_args(parser.parse_args([])) == {}
    with pytest.raises(UsageError, match="--partition only apply with --slurm"):
        slurm_options_from_args(parser.parse_args(["--partition", "gpu"]))


def test_rendezvous_flags_are_rankscopes_on_slurm() -> None:
    args = ["--standalone", "--nproc-per-node", "2", "--nnodes=1", "--master-port", "29500"]
    assert node_torchrun_args([*args, "--max-restarts", "0"]) == (
        ["--nproc-per-node", "2", "--max-restarts", "0"],
        2,
    )
    # no --nproc-per-node: one rank per GPU of the node (torchrun alone would start one)
    assert node_torchrun_args(["--standalone"], gpus_per_node=8) == (["--nproc-per-node=8"], 8)
    assert node_torchrun_args([], gpus_per_node=0) == (["--nproc-per-node=1"], 1)
    with pytest.raises(UsageError, match="number of ranks per node"):
        node_torchrun_args(["--nproc-per-node", "auto"])


def test_task_states_follow_the_job(tmp_path: Path) -> None:
    """A task still 'running' when the job was cancelled or timed out shows the job's state."""
    run_dir = tmp_path / "run"
    slurm_dir = run_dir / "slurm"
    slurm_dir.mkdir(parents=True)
    rundir.write_json_atomic(
        slurm_dir / "task-7-000.json", {"node": 0, "host": "n1", "state": "running"}
    )
    rundir.write_json_atomic(
        slurm_dir / "task-7-001.json",
        {"node": 1, "host": "n2", "state": "completed", "exit_code": 0},
    )
    rec = {"state": "timeout", "slurm": {"job_id": "7", "nodes": 3}}
    states = [t["state"] for t in task_states(run_dir, rec)]
    assert states == ["timeout", "completed", "timeout"]
    rec = {"state": "queued", "slurm": {"job_id": "8", "nodes": 2}}
    assert [t["state"] for t in task_states(run_dir, rec)] == ["queued", "queued"]


def test_status_of_a_local_run(tmp_path: Path) -> None:
    run_dir = failed_local_run(tmp_path)
    res = rankscope("status", str(run_dir))
    assert res.returncode == 0, res.stderr
    assert (
        "failed" in res.stdout
        and "rank 1 failed" in res.stdout
        and "RuntimeError: injected" in res.stdout
    )
    res = rankscope("status", "--json", str(run_dir))
    assert json.loads(res.stdout)["state"] == "failed"
    res = rankscope("status", str(tmp_path / "nothing"))
    assert res.returncode == 1 and "Traceback" not in res.stderr and "run.json" in res.stderr
    res = rankscope("cancel", str(run_dir))
    assert res.returncode == 2 and "local run" in res.stderr and "Traceback" not in res.stderr


def test_no_slurm_on_path_is_one_clear_line(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    res = rankscope(
        "run",
        "--slurm",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--out",
        str(tmp_path / "runs"),
        str(EXAMPLE),
        env=env,
    )
    assert res.returncode == 2
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert (
        "`sbatch` is not on PATH" in err and "slurm/slurm-up.sh" in err and "without --slurm" in err
    )
    assert not any((tmp_path / "runs").iterdir()), "nothing may be created"


# ---------------------------------------------------------------------------- real Slurm
@pytest.mark.slurm
def test_unreachable_controller_and_bad_partition(
    tmp_path: Path, slurm_cluster: LocalSlurm
) -> None:
    args = [
        "run",
        "--slurm",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--out",
        str(tmp_path / "runs"),
    ]
    res = rankscope(
        *args, str(EXAMPLE), env=slurm_cluster.env(SLURM_CONF=str(tmp_path / "nowhere.conf"))
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "cannot reach the Slurm controller" in res.stderr and "nowhere.conf" in res.stderr
    assert "slurm/slurm-up.sh" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = rankscope(*args, "--partition", "nope", str(EXAMPLE), env=slurm_cluster.env())
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "partition 'nope' does not exist" in res.stderr and "debug" in res.stderr
    assert not any((tmp_path / "runs").iterdir()), "nothing may be created"
    # sbatch itself refuses: one line; the run directory records why
    res = rankscope(*args, "--sbatch-arg=--no-such-option=1", str(EXAMPLE), env=slurm_cluster.env())
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "rankscope run: error: sbatch refused the job: sbatch: unrecognized option '--no-such-option=1'"
    ]
    (run_dir,) = (tmp_path / "runs").iterdir()
    rec = record(run_dir)
    assert rec["state"] == "failed" and "sbatch refused" in rec["failures"][0]["error"]


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_queued_job_shows_why_and_cancel_skips_the_merge(
    tmp_path: Path, slurm_cluster: LocalSlurm
) -> None:
    """A job that may not start yet stays queued: status says why; cancelling it leaves nothing to merge.

    ``--begin`` in an hour makes Slurm hold it with reason ``BeginTime`` on any machine (asking for
    more CPUs than a node has gives a reason that depends on the host's core count and Slurm's
    scheduling pass, which made this test machine-dependent).
    """
    run_dir, job_id = submit(tmp_path, slurm_cluster, "--sbatch-arg=--begin=now+1hour")
    waiting = f"queued  (Slurm job {job_id}: PENDING, waiting: BeginTime)"

    def reason_shown() -> subprocess.CompletedProcess[str] | None:
        res = rankscope("status", str(run_dir), env=slurm_cluster.env())
        return res if res.returncode == 0 and waiting in res.stdout else None

    res = wait_until("the reason it waits", reason_shown, timeout=120)
    assert task_rows(res.stdout, "queued") == 2, res.stdout
    res = rankscope("cancel", str(run_dir), env=slurm_cluster.env())
    assert res.returncode == 0 and f"Slurm job {job_id} cancelled" in res.stdout
    wait_until("the merge job", lambda: merge_finished(run_dir))
    rec = record(run_dir)
    assert rec["state"] == "cancelled" and rec["slurm"]["merge"]["state"] == "skipped"
    assert not (run_dir / rundir.STORE_NAME).exists()


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_nodes_end_to_end(tmp_path: Path, slurm_cluster: LocalSlurm) -> None:
    """--follow: submit, wait for the job and its merge job, print the summary and analysis."""
    res = rankscope(
        "run",
        "--slurm",
        "--follow",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--partition",
        "debug",
        "--time",
        "10",
        "--out",
        str(tmp_path / "runs"),
        str(EXAMPLE),
        "--steps",
        "8",
        env=slurm_cluster.env(),
        cwd=tmp_path,
        timeout=JOB_TIMEOUT_S,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "submitted Slurm job" in res.stdout
    run_dir = Path(
        next(ln for ln in res.stdout.splitlines() if ln.startswith("rankscope run: /")).split(
            ": ", 1
        )[1]
    )
    rec = record(run_dir)
    assert rec["state"] == "completed" and rec["world_size"] == 4 and rec["nnodes"] == 2
    slurm = rec["slurm"]
    assert slurm["state"] == "COMPLETED" and slurm["merge"]["state"] == "completed"
    assert [t["state"] for t in slurm["tasks"]] == ["completed", "completed"]
    assert {t["host"] for t in slurm["tasks"]} == {"n1", "n2"}, "one task per emulated node"
    assert store_ranks(run_dir / rundir.STORE_NAME) == [0, 1, 2, 3]
    (script,) = (run_dir / "logs").glob(f"slurm-{slurm['job_id']}/*_submission.sh")
    assert "--gpus" not in script.read_text(), "--gpus-per-node 0 asks Slurm for no GPU"
    # each node's torchrun kept its error-file folder in the run (not /tmp) and removed it empty
    assert not list((run_dir / rundir.LOGS_DIR / TORCHELASTIC_DIR).glob("*"))
    said = "".join(p.read_text() for p in script.parent.glob("*_log.out"))  # the tasks' stdout
    assert f"--log-dir={run_dir / rundir.LOGS_DIR / TORCHELASTIC_DIR}/" in said
    summary = json.loads((run_dir / rundir.REPORT_DIR / rundir.SUMMARY_JSON).read_text())
    assert summary["ranks_present"] == 4
    printed = res.stdout.replace("\n", "")  # rich wraps long paths at 80 columns
    assert f"wrote {run_dir / rundir.REPORT_DIR / rundir.SUMMARY_JSON}" in printed, (
        "analysis printed"
    )
    # another shell, after the submitting process has gone
    res = rankscope("status", str(run_dir), env=slurm_cluster.env())
    assert res.returncode == 0, res.stderr
    assert (
        "completed" in res.stdout and f"merge job {slurm['merge_job_id']}: completed" in res.stdout
    )
    assert str(run_dir / rundir.STORE_NAME) in res.stdout


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cancel_while_running_merges_the_windows_written(
    tmp_path: Path, slurm_cluster: LocalSlurm
) -> None:
    # --follow, then Ctrl-C: rankscope stops following, the job goes on
    args = run_args(tmp_path, slurm_cluster, "--follow", *WINDOW_EVERY_3_STEPS)
    follow = subprocess.Popen(
        interruptible(*args, "--steps", "100000", *SLOW_STEPS),  # it gets Ctrl-C below
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=slurm_cluster.env(),
        cwd=tmp_path,
    )
    lines: list[str] = []
    try:
        if follow.stdout is None:
            raise AssertionError("no stdout pipe")
        for line in follow.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("rankscope run: /"):
                break
        run_dir, job_id = parse_submission(lines)
        # windows appear on every rank while the job runs
        wait_until(
            "a window on all 4 ranks",
            lambda: (
                (run_dir / "ranks").is_dir()
                and len(windows_written(run_dir)) == 4
                and min(windows_written(run_dir).values()) >= 1
            ),
        )
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=120)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 0 and "stopped following" in err, err
    # status from another shell, after the submitting process has gone
    res = rankscope("status", str(run_dir), env=slurm_cluster.env())
    assert ": running" in res.stdout and task_rows(res.stdout, "running") == 2, res.stdout
    res = rankscope("cancel", str(run_dir), env=slurm_cluster.env())
    assert res.returncode == 0, res.stderr
    assert f"Slurm job {job_id} cancelled" in res.stdout
    assert record(run_dir)["state"] == "cancelled"
    wait_until("the merge job", lambda: merge_finished(run_dir))
    rec = record(run_dir)
    assert rec["state"] == "cancelled" and rec["slurm"]["merge"]["state"] == "completed"
    assert store_ranks(run_dir / rundir.STORE_NAME) == [0, 1, 2, 3]
    res = rankscope("status", str(run_dir), env=slurm_cluster.env())
    assert ": cancelled" in res.stdout and task_rows(res.stdout, "cancelled") == 2, res.stdout
    res = rankscope("cancel", str(run_dir), env=slurm_cluster.env())
    assert res.returncode == 0 and "already ended: cancelled" in res.stdout


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_rank_fails_the_job_and_the_others_are_merged(
    tmp_path: Path, slurm_cluster: LocalSlurm
) -> None:
    run_dir, _ = submit(
        tmp_path,
        slurm_cluster,
        *WINDOW_EVERY_3_STEPS,
        script_args=("--steps", "40", "--kill-rank", "1", "--kill-step", "7"),
    )
    wait_until("the merge job", lambda: merge_finished(run_dir))
    res = rankscope("status", str(run_dir), env=slurm_cluster.env())
    rec = record(run_dir)
    assert rec["state"] == "failed" and rec["slurm"]["state"] == "FAILED", rec
    killed = [f for f in rec["failures"] if f["rank"] == 1]
    assert killed and "SIGKILL" in killed[0]["error"], rec["failures"]
    assert "rank 1 failed" in res.stdout and "SIGKILL" in res.stdout
    assert "failed" in [t["state"] for t in rec["slurm"]["tasks"]]
    # every rank wrote windows 0 and 1 (steps 0-5) before rank 1 died at step 7
    assert rec["slurm"]["merge"]["state"] == "completed"
    assert {0, 2, 3} <= set(store_ranks(run_dir / rundir.STORE_NAME))


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_time_limit_gives_timeout_and_a_merged_store(
    tmp_path: Path, slurm_cluster: LocalSlurm
) -> None:
    """``--time 1`` reaches Slurm as the job's limit. Slurm would end the job 60-90 s in
    (slurmctld checks limits every 30 s); to spare the suite most of that minute, once every rank
    has written a window the limit is cut to 0 with ``scontrol update`` (what an admin may do):
    Slurm's own limit check then ends the job with TIMEOUT, as at the end of the minute. Until
    then the limit is lifted to 15 minutes, so that ranks slow to start on a loaded machine are
    not ended by the minute before they wrote a window."""
    run_dir, job_id = submit(
        tmp_path,
        slurm_cluster,
        *WINDOW_EVERY_3_STEPS,
        time_min=1,
        script_args=("--steps", "100000", *SLOW_STEPS),
    )
    env = slurm_cluster.env()
    shown = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, env=env, timeout=60
    )
    assert "TimeLimit=00:01:00" in shown.stdout, shown.stdout + shown.stderr

    def set_limit(minutes: int) -> None:
        """The job's time limit changed as an admin may (``scontrol update``)."""
        done = subprocess.run(
            ["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    # the limit lifted while the ranks start: on a loaded machine four ranks' imports and first
    # window can take longer than the minute (CI: no window in 420 s, the job ended by its limit
    # first); the test is that Slurm's limit ends the job, not how fast the ranks start
    set_limit(15)

    def every_rank_wrote_a_window() -> bool:
        ranks = run_dir / rundir.RANKS_DIR
        return (
            ranks.is_dir()
            and sum(any(r.glob(rundir.WINDOW_GLOB)) for r in ranks.iterdir() if r.is_dir()) == 4
        )

    wait_until("a window from every rank", every_rank_wrote_a_window)
    set_limit(0)
    wait_until("the merge job", lambda: merge_finished(run_dir))
    rankscope("status", str(run_dir), env=slurm_cluster.env())
    rec = record(run_dir)
    assert rec["state"] == "timeout" and rec["slurm"]["state"] == "TIMEOUT", rec
    assert [t["state"] for t in rec["slurm"]["tasks"]] == ["timeout", "timeout"]
    assert rec["slurm"]["merge"]["state"] == "completed"
    assert store_ranks(run_dir / rundir.STORE_NAME) == [0, 1, 2, 3]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sbatch_template_by_hand(tmp_path: Path, slurm_cluster: LocalSlurm) -> None:
    """A job submitted by hand with the template, nobody following it: merged and analysed by
    its merge job; its first node's live monitor notices that rank 1 slows the job down from
    step :data:`SLOWDOWN_FROM` (30 ms more per step than the others' 80 ms in the loader) and has
    it profiled by one extra window on every rank (docs/live.md)."""
    out = tmp_path / "hand"
    env = slurm_cluster.env(
        NPROC_PER_NODE="2", RANKSCOPE_OUT=str(out), RANKSCOPE_PYTHON=sys.executable
    )
    res = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", "--time=10", str(TEMPLATE), str(EXAMPLE),
         "--steps", str(SLOWDOWN_STEPS), *SLOWDOWN],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip().split(";")[0]
    run_dir = wait_until(
        "the run directory", lambda: next(iter(out.glob("*")), None) if out.is_dir() else None
    )
    wait_until("the merge job", lambda: merge_finished(run_dir))
    rec = record(run_dir)
    assert rec["slurm"]["job_id"] == job_id and rec["state"] == "completed", rec
    assert rec["slurm"]["merge"]["state"] == "completed"
    # the run directory is one `rankscope merge` accepts, as it is
    res = rankscope(
        "merge", str(run_dir), "--scheduler", "synchronous", "-o", str(tmp_path / "again.h5")
    )
    assert res.returncode == 0, res.stderr
    assert store_ranks(tmp_path / "again.h5") == [0, 1, 2, 3]
    said = (tmp_path / f"rankscope-{job_id}.out").read_text()
    # the first node's monitor: the change noticed after the slow-down, said in the job's output
    first = first_job_change(run_dir)
    assert first["step"] > SLOWDOWN_FROM, first
    assert first["after_ms"] > first["before_ms"] + 20, first
    assert first["sentence"] in said and first["trigger"] == 1, said[-3000:]
    # ... and profiled: one extra window from the same step on every rank, after the notice
    trigger = json.loads((run_dir / rundir.TRIGGER_FILE).read_text())
    assert trigger["id"] == 1 and first["step"] < trigger["start_step"], trigger
    for r in range(4):
        meta = json.loads((rundir.rank_dir(run_dir, r) / rundir.META_JSON).read_text())
        triggered = [w for w in meta["windows"] if "trigger" in w]
        assert len(triggered) == 1 and triggered[0]["complete"], (r, meta["windows"])
        assert triggered[0]["first_step"] == trigger["start_step"], (r, triggered)
