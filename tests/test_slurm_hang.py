"""Hung and killed ranks of REAL 2-node Slurm jobs (tests/slurm_cluster.py's local cluster):
examples/train_hang.py, one gloo rank per emulated node, rank 1 the odd one out.

Three jobs at once (module fixture) to keep the suite short: an endless loop on rank 1 followed
by ``rankscope run --slurm --follow`` (the terminal's paragraph, exit 124, ``hung``), the same
loop as a batch job nobody follows (noticed by the first node's task, ended with scancel,
diagnosed by the merge job), and rank 1 SIGKILLed mid-step (a failure, not a hang, with what the
survivor was waiting in). Each node gets one CPU per job, so the third job waits in the queue for
the first to end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rankscope.launchers import rundir
from slurm_cluster import REPO, LocalSlurm, rankscope

EXAMPLE = REPO / "examples" / "train_hang.py"
HANG_AFTER_S = 10
EXIT_HUNG = 124
#: Seconds a job (and its merge job) may take at most here: 2 loaded cores, torch imports.
JOB_TIMEOUT_S = 480
#: scenario -> (rankscope run's extra flags, the example's arguments)
SCENARIOS: dict[str, tuple[list[str], list[str]]] = {
    "loop": (["--follow", "--no-analyze"], ["--hang", "loop", "--rank", "1", "--after", "4"]),
    "kill": (["--follow", "--no-analyze"], ["--hang", "kill", "--rank", "1", "--after", "4"]),
    "batch": ([], ["--hang", "loop", "--rank", "1", "--after", "4"]),
}

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
    results = {}
    for name, (out, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
        runs = list(out.iterdir()) if out.is_dir() else []
        assert len(runs) == 1, f"{name}: {(stdout + stderr)[-3000:]}"
        (run,) = runs
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not _merged(run):  # a batch job: its submission returned at once
            assert time.monotonic() < deadline, f"{name}: no merge job end in {run}"
            time.sleep(1.0)
        report = run / rundir.REPORT_DIR / rundir.HANG_REPORT
        status = rankscope("status", str(run), env=slurm_cluster.env())
        results[name] = {
            "code": proc.returncode,
            "terminal": stdout + stderr,
            "stderr": stderr,
            "run": run,
            "record": json.loads((run / rundir.RUN_JSON).read_text()),
            "hang": json.loads(report.read_text()) if report.exists() else None,
            "status": status,
        }
    print(f"\nslurm hang jobs: {time.monotonic() - started:.0f} s for all three")
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
    loop = _line("while True:  # the endless loop")
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
    # the terminal: our paragraph, no traceback
    assert "the job looks hung" in result["stderr"]
    assert hang["headline"] in result["stderr"]
    assert "Traceback" not in result["terminal"]


def test_a_batch_job_that_hangs_is_noticed_on_its_first_node(
    jobs: dict[str, dict[str, Any]],
) -> None:
    result = jobs["batch"]
    assert result["code"] == 0, result["terminal"][-3000:]  # the submission itself
    _check_loop(result)
    assert result["record"]["hang"]["on_hang"] == "report"


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
