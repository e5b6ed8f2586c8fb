"""Real hung jobs: ``rankscope run`` on 2-rank gloo jobs of examples/train_hang.py that hang the
ways real jobs do, each checked against what the example did (which rank, which collective,
which line).

The five jobs run at once (module fixture) to keep the suite short: an endless loop and a desync
(all_gather against all_reduce), noticed by the watch; a data-loader worker that never yields
under a short collective timeout (gloo's timeout error in the waiting rank: a hang, named as
one, with the loader's line); a rank killed with SIGKILL mid-step (a failure, not a hang); and
steps that grow from 0.2 to 3 s (slow, not hung). Each job costs three torch imports (torchrun
and two ranks) on 2 shared cores: there is no job per notice path and placement, but one per
story."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rankscope.launchers.hang_probe import BLOCKED_EXIT_LINE

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_hang.py"
HANG_AFTER_S = 10
#: --hang-after of the growing job: above its longest step (3 s), as a user would set it.
GROW_HANG_AFTER_S = 20
EXIT_HUNG = 124
#: The timeout scenario's collective timeout (init_process_group's ``timeout=``), and its
#: --hang-after: far above it, so that the timeout, not the watch, notices the hang.
PG_TIMEOUT_S = 10
TIMEOUT_HANG_AFTER_S = 200
#: rankscope run's flags for the jobs whose windows nobody reads: no merge, no analysis, and no
#: window at all (--skip-first beyond their steps): no CPU spent on traces never read.
UNREAD = ["--no-merge", "--no-analyze", "--skip-first", "1000"]
#: The endless loop's job keeps its window, from its first step (--wait 0): the profiler's start
#: comes before the first step, under the rule for the start-up (3 x --hang-after, at least
#: 120 s), not inside a step, where any pause on a loaded machine counts against the 10 s.
PROFILED = ["--wait", "0"]
#: scenario -> the example's arguments (and rankscope run's extra flags)
SCENARIOS: dict[str, tuple[list[str], list[str]]] = {
    "loop": (["--hang", "loop", "--rank", "1", "--after", "4"], PROFILED),
    "desync": (["--hang", "desync", "--rank", "1", "--after", "4"], UNREAD),
    "kill": (["--hang", "kill", "--rank", "1", "--after", "4"], UNREAD),
    "grow": (
        ["--grow", "0.2:3", "--steps", "4"],
        [*UNREAD, "--hang-after", str(GROW_HANG_AFTER_S)],
    ),
    # rank 1's loader stops; rank 0's all_reduce times out after PG_TIMEOUT_S, long before
    # --hang-after: the timeout is the notice
    "timeout": (
        ["--hang", "loader", "--rank", "1", "--after", "4", "--pg-timeout", str(PG_TIMEOUT_S)],
        [*UNREAD, "--hang-after", str(TIMEOUT_HANG_AFTER_S)],
    ),
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _line(text: str) -> int:
    """The line of the example that holds ``text``."""
    lines = EXAMPLE.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every scenario's exit status, terminal output, run folder, run.json and hang.json."""
    base = tmp_path_factory.mktemp("hangs")
    procs = {}
    for name, (script_args, flags) in SCENARIOS.items():
        out = base / name
        cmd = [
            sys.executable, "-m", "rankscope.orchestrator", "run", "--nproc-per-node", "2",
            "--hang-after", str(HANG_AFTER_S), "--out", str(out), *flags,
            str(EXAMPLE), *script_args,
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs[name] = (
            out,
            subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=base
            ),
        )
    results = {}
    for name, (out, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        (run,) = out.iterdir()
        report = run / "report" / "hang.json"
        results[name] = {
            "code": proc.returncode,
            "terminal": stdout + stderr,
            "stderr": stderr,
            "run": run,
            "record": json.loads((run / "run.json").read_text()),
            "hang": json.loads(report.read_text()) if report.exists() else None,
        }
    return results


def _ranks(hang: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in hang["ranks"]}


def _hung(result: dict[str, Any]) -> dict[str, Any]:
    """The checks every hung run passes; returns its hang.json."""
    assert result["code"] == EXIT_HUNG, result["terminal"][-3000:]
    assert result["record"]["state"] == "hung"
    hang = result["hang"]
    assert hang is not None
    assert hang["notice"]["idle_s"] < HANG_AFTER_S + 30
    assert result["record"]["hang"]["headline"] == hang["headline"]
    # the terminal: our paragraph, no traceback (the ranks' teardown noise is in the log only)
    assert hang["headline"] in result["stderr"]
    assert "Traceback" not in result["terminal"]
    return hang


def test_an_endless_loop_is_named_with_its_line(runs: dict[str, dict[str, Any]]) -> None:
    result = runs["loop"]
    hang = _hung(result)
    assert (
        hang["collective"]["op"] == "all_reduce"
        and hang["collective"]["group_desc"] == "default_pg"
    )
    assert hang["culprits"] == [1]
    ranks = _ranks(hang)
    loop = _line("while True:  # the endless loop")
    assert ranks[1]["state"] == "missing" and ranks[1]["line"] in (loop, loop + 1)
    assert Path(ranks[1]["file"]).name == "train_hang.py"
    assert ranks[0]["state"] == "waiting" and ranks[0]["line"] == _line("# the gradient all-reduce")
    # the collective it waits in, named through torch's decorator around it (c10d_logger.py)
    assert ranks[0]["inside"] == "distributed_c10d.py:all_reduce"
    assert ranks[1]["steps"] == 4  # steps 0-3 finished; it hangs in step 4
    # the windows recorded before the hang are still merged and analysed
    assert (result["run"] / "report" / "summary.json").exists()
    # and `rankscope status` says it, from any shell
    status = subprocess.run(
        [sys.executable, "-m", "rankscope.orchestrator", "status", str(result["run"])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert ": hung" in status.stdout and "exit code 124" in status.stdout
    assert hang["headline"] in status.stdout.replace("\n", " ")
    assert "rank 1 (missing): in train_hang.py:" in status.stdout


def test_a_stuck_data_loader_is_named_where_the_loop_asks_for_a_batch(
    runs: dict[str, dict[str, Any]],
) -> None:
    """Rank 1's DataLoader worker never yields: the timeout scenario's job (its collective
    timeout notices the hang; the watch's notice is the endless loop's and the desync's)."""
    result = runs["timeout"]
    assert result["code"] == EXIT_HUNG and result["record"]["state"] == "hung"
    hang = result["hang"]
    assert hang is not None and hang["culprits"] == [1]
    rank1 = _ranks(hang)[1]
    assert rank1["state"] == "missing"
    assert rank1["line"] == _line("for step, batch in enumerate(loader):")
    assert "dataloader.py" in rank1["inside"]


def test_a_desync_is_named_with_both_call_sites(runs: dict[str, dict[str, Any]]) -> None:
    hang = _hung(runs["desync"])
    assert hang["desync"] is True
    ranks = _ranks(hang)
    assert (ranks[0]["op"], ranks[0]["line"]) == ("all_reduce", _line("# the gradient all-reduce"))
    assert (ranks[1]["op"], ranks[1]["line"]) == (
        "all_gather",
        _line("dist.all_gather(out, grads)"),
    )
    # both ranks wait in collectives that can never complete, where their SIGTERM handler cannot
    # run: the first whose wait outlasts its probe's bound ends itself once torchrun's SIGTERM
    # came; the other either does the same or, its peer gone, sees its collective fail and ends
    # on SIGTERM as usual (which comes first depends on when each probe looked) — never left to
    # torchrun's SIGKILL, 30 s later
    log = (runs["desync"]["run"] / "logs" / "torchrun.log").read_text()
    blocked = [
        rank
        for rank, op in ((0, "all_reduce"), (1, "all_gather"))
        if BLOCKED_EXIT_LINE.format(rank=rank, where=f"distributed_c10d.py:{op}") in log
    ]
    assert blocked, log[-3000:]
    assert "closing signal SIGTERM" in log and "forcefully exiting" not in log


def test_a_killed_rank_is_a_failure_not_a_hang(runs: dict[str, dict[str, Any]]) -> None:
    result = runs["kill"]
    assert result["code"] != EXIT_HUNG and result["record"]["state"] == "failed"
    assert result["hang"] is None and "hang" not in result["record"]
    first = result["record"]["failures"][0]
    assert first["rank"] == 1 and "SIGKILL" in first["error"]
    # the terminal: the summary names it; torchrun's ChildFailedError and the ranks'
    # tracebacks are in the log only
    assert "Traceback" not in result["terminal"], result["terminal"][-3000:]
    assert "rank 1 failed first: killed by SIGKILL" in result["terminal"]
    log = (result["run"] / "logs" / "torchrun.log").read_text()
    assert "Traceback" in log and "ChildFailedError" in log
    # what the survivor was waiting in when it died (its own answer to torchrun's SIGTERM)
    said = result["stderr"]
    assert (
        "When rank 1 died, the others were waiting in all_reduce #5 of the default group:" in said
    )
    assert (
        f"rank 0: waiting in all_reduce #5 of the default group, in train_hang.py:{_line('# the gradient all-reduce')}"
        in said
    )


def test_a_collective_timeout_is_a_hang_named_with_who_and_where(
    runs: dict[str, dict[str, Any]],
) -> None:
    """Rank 0's all_reduce times out (gloo's error, PG_TIMEOUT_S after it entered it) while rank
    1 waits on its data loader: hung (exit 124), rank 1 named with its line, not 'rank 0 failed'."""
    result = runs["timeout"]
    assert result["code"] == EXIT_HUNG, result["terminal"][-3000:]
    assert result["record"]["state"] == "hung"
    hang = result["hang"]
    assert hang is not None and "Timed out waiting" in hang["notice"]["collective_timeout"]["error"]
    assert hang["notice"]["collective_timeout"]["rank"] == 0
    assert hang["collective"]["op"] == "all_reduce" and hang["culprits"] == [1]
    ranks = _ranks(hang)
    assert ranks[1]["state"] == "missing"
    assert ranks[1]["line"] == _line("for step, batch in enumerate(loader):")
    assert "dataloader.py" in ranks[1]["inside"]
    assert ranks[0]["state"] == "waiting" and ranks[0]["line"] == _line("# the gradient all-reduce")
    assert result["record"]["hang"]["headline"] == hang["headline"]
    assert hang["headline"] in result["stderr"] and "A collective timed out" in result["stderr"]
    assert "Traceback" not in result["terminal"], result["terminal"][-3000:]


def test_steps_that_grow_to_3_s_are_slow_not_hung(runs: dict[str, dict[str, Any]]) -> None:
    result = runs["grow"]
    assert result["code"] == 0, result["terminal"][-3000:]
    assert result["record"]["state"] == "completed" and result["hang"] is None
    assert "hung" not in result["stderr"]
