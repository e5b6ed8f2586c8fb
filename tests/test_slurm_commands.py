"""The one Slurm command layer (``slurm/commands.py``, ``rankscope.slurm.commands``) and what its
two callers — the Slurm launcher and the merge's/analysis' Slurm workers — make of its outcomes.

No cluster and no mocks: the tools are real executables on a PATH made for the test (a folder
without them, a script that sleeps past its bound, scripts that print what squeue and sacct
printed on this project's local cluster, ``slurm/slurm-up.sh --nodes 2``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rankscope.analysis.engine.scheduler import ClusterSpec
from rankscope.analysis.engine.slurm_workers import SlurmWorkers
from rankscope.errors import UsageError, WorkersError
from rankscope.launchers.rundir import RunState
from rankscope.launchers.slurm import commands as launcher_commands
from rankscope.launchers.slurm.commands import SlurmError, query_job, run_state
from rankscope.slurm.commands import (
    JobInfo,
    NoAnswer,
    Otherwise,
    SlurmJobState,
    ToolMissing,
    error_line,
    missing_tool,
    parse_sacct,
    parse_squeue,
    parse_state,
    run_tool,
    squeue,
)

#: ``squeue --noheader --states=all --jobs=1,2,3,4 --format=%i|%T|%N|%M|%r`` on the local
#: cluster: a completed job, one held by ``--begin``, a cancelled one, one that exited 3.
SQUEUE_OUT = """\
3|CANCELLED|n1|0:04|None
1|COMPLETED|n1|0:00|None
4|FAILED|n2|0:00|NonZeroExitCode
2|PENDING||0:00|BeginTime
"""
#: ``sacct --allocations --noheader --parsable2 --format=JobIDRaw,State,ExitCode,NodeList,
#: Elapsed,Reason`` for the same jobs.
SACCT_OUT = """\
1|COMPLETED|0:0|n1|00:00:00|None
2|PENDING|0:0|None assigned|00:00:00|None
3|CANCELLED by 0|0:0|n1|00:00:04|None
4|FAILED|3:0|n2|00:00:00|None
"""
#: What squeue says on stderr (exit status 1) about a job id it no longer knows.
SQUEUE_INVALID = "slurm_load_jobs error: Invalid job id specified"


def tool(folder: Path, name: str, body: str) -> Path:
    """An executable shell script ``folder/name`` running ``body``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def path_env(folder: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``folder`` first on PATH (its tools shadow real ones)."""
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def printing(folder: Path, name: str, stdout: str, *, status: int = 0, stderr: str = "") -> Path:
    """A tool that records its arguments in ``folder/NAME.args`` and prints what it is given."""
    (folder / f"{name}.out").parent.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.out").write_text(stdout)
    (folder / f"{name}.err").write_text(stderr)
    return tool(
        folder,
        name,
        f'echo "$@" > "{folder}/{name}.args"\ncat "{folder}/{name}.out"\n'
        f'cat "{folder}/{name}.err" >&2\nexit {status}',
    )


# -- the one way to run a tool ------------------------------------------------------------------


def test_a_missing_tool_is_its_own_outcome(tmp_path: Path) -> None:
    empty = {"PATH": str(tmp_path / "empty")}
    with pytest.raises(ToolMissing) as missing:
        run_tool(["squeue", "--noheader"], timeout_s=5, env=empty)
    assert missing.value.tool == "squeue" and not isinstance(missing.value, NoAnswer)
    tool(tmp_path / "bin", "sbatch", "exit 0")
    assert missing_tool(["sbatch", "sinfo"], {"PATH": str(tmp_path / "bin")}) == "sinfo"
    assert missing_tool(["sbatch"], {"PATH": str(tmp_path / "bin")}) is None


def test_a_tool_that_does_not_answer_is_killed_at_its_bound(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    tool(tmp_path / "bin", "squeue", f'echo $$ > "{pid_file}"\nexec sleep 300')
    with pytest.raises(NoAnswer) as late:
        run_tool(["squeue"], timeout_s=0.5, env=path_env(tmp_path / "bin"))
    assert late.value.tool == "squeue" and late.value.timeout_s == 0.5
    assert not isinstance(late.value, ToolMissing)
    assert not Path(f"/proc/{pid_file.read_text().strip()}").exists(), "killed and reaped"


def test_input_environment_and_exit_status_reach_the_caller(tmp_path: Path) -> None:
    tool(tmp_path / "bin", "sbatch", 'cat\necho "conf=$SLURM_CONF" >&2\nexit 3')
    script = "#!/bin/bash\n#SBATCH --ntasks=1\n"
    res = run_tool(
        ["sbatch", "--test-only"],
        timeout_s=30,
        env=path_env(tmp_path / "bin", SLURM_CONF="/x/slurm.conf"),
        stdin=script,
    )
    assert (res.returncode, res.stdout, res.stderr) == (3, script, "conf=/x/slurm.conf\n")


# -- Slurm's output, parsed once ----------------------------------------------------------------


def test_states_as_sacct_and_squeue_print_them() -> None:
    assert parse_state("CANCELLED by 0") is SlurmJobState.CANCELLED
    assert parse_state("PENDING+") is SlurmJobState.PENDING
    assert parse_state(" REQUEUE_HOLD ") is SlurmJobState.REQUEUE_HOLD
    assert parse_state("NO_SUCH_STATE") is None and parse_state("") is None


def test_squeue_lines_of_the_local_cluster() -> None:
    assert parse_squeue(SQUEUE_OUT) == {
        "3": JobInfo("3", SlurmJobState.CANCELLED, None, "n1", "0:04", ""),
        "1": JobInfo("1", SlurmJobState.COMPLETED, None, "n1", "0:00", ""),
        "4": JobInfo("4", SlurmJobState.FAILED, None, "n2", "0:00", "NonZeroExitCode"),
        "2": JobInfo("2", SlurmJobState.PENDING, None, "", "0:00", "BeginTime"),
    }
    assert parse_squeue("5|NOT_A_STATE|n1|0:01|None\n\n") == {}


def test_sacct_lines_of_the_local_cluster() -> None:
    assert parse_sacct("1", SACCT_OUT) == JobInfo(
        "1", SlurmJobState.COMPLETED, 0, "n1", "00:00:00", ""
    )
    assert parse_sacct("3", SACCT_OUT) == JobInfo(
        "3", SlurmJobState.CANCELLED, 0, "n1", "00:00:04", ""
    )
    assert parse_sacct("4", SACCT_OUT) == JobInfo("4", SlurmJobState.FAILED, 3, "n2", "00:00:00")
    assert parse_sacct("2", SACCT_OUT) == JobInfo(
        "2", SlurmJobState.PENDING, 0, "None assigned", "00:00:00", ""
    )
    # the reason is kept for a pending job only
    waiting = "2|PENDING|0:0|None assigned|00:00:00|BeginTime\n"
    held = parse_sacct("2", waiting)
    assert held is not None and held.reason == "BeginTime"
    assert parse_sacct("4", SACCT_OUT.replace("3:0|n2|00:00:00|None", "3:0|n2|00:00:00|X")) == (
        parse_sacct("4", SACCT_OUT)
    )
    # a signal ended the batch script: 128 + its number
    assert parse_sacct("6", "6|FAILED|0:9|n1|00:00:01|None\n") == JobInfo(
        "6", SlurmJobState.FAILED, 137, "n1", "00:00:01"
    )
    assert parse_sacct("7", SACCT_OUT) is None


def test_squeue_tells_a_forgotten_id_from_a_failure(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    printing(bin_, "squeue", SQUEUE_OUT)
    jobs = squeue(["1", "2", "3", "4"], timeout_s=30, env=path_env(bin_), all_states=True)
    assert jobs is not None and [j.state for j in jobs.values()] == [
        SlurmJobState.CANCELLED,
        SlurmJobState.COMPLETED,
        SlurmJobState.FAILED,
        SlurmJobState.PENDING,
    ]
    assert (bin_ / "squeue.args").read_text().split() == [
        "--noheader",
        "--states=all",
        "--jobs=1,2,3,4",
        "--format=%i|%T|%N|%M|%r",
    ]
    printing(bin_, "squeue", "", status=1, stderr=SQUEUE_INVALID)
    assert squeue(["99"], timeout_s=30, env=path_env(bin_)) == {}
    assert "--states=all" not in (bin_ / "squeue.args").read_text()
    printing(bin_, "squeue", "", status=1, stderr="slurm_load_jobs error: Unable to contact")
    assert squeue(["99"], timeout_s=30, env=path_env(bin_)) is None


def test_the_error_line_of_a_tool() -> None:
    sbatch = (
        "sbatch: error: invalid partition specified: nope\n"
        "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    )
    assert error_line(sbatch) == "sbatch: error: invalid partition specified: nope"
    assert error_line(sbatch, otherwise=Otherwise.LAST) == error_line(sbatch)
    said = "  sbatch: unrecognized option '--x=1'\nTry \"sbatch --help\" for more information\n"
    assert error_line(said) == "sbatch: unrecognized option '--x=1'"
    assert error_line(said, otherwise=Otherwise.LAST) == 'Try "sbatch --help" for more information'
    assert error_line("\n \n") == "" == error_line("", otherwise=Otherwise.LAST)


# -- each caller's own words ----------------------------------------------------------------------


def test_the_launcher_says_a_missing_tool_and_a_silent_one_in_its_words(tmp_path: Path) -> None:
    with pytest.raises(SlurmError) as missing:
        query_job("7", env={"PATH": str(tmp_path / "empty")})
    assert str(missing.value) == (
        "Slurm is not available here: `sacct` is not on PATH; "
        f"{launcher_commands.LOCAL_CLUSTER_HINT}"
    )
    assert missing.value.exit_code == 2
    tool(tmp_path / "bin", "sinfo", "exec sleep 300")
    with pytest.raises(SlurmError) as late, launcher_commands._slurm_errors():
        run_tool(["sinfo"], timeout_s=1.0, env=path_env(tmp_path / "bin"))
    assert str(late.value) == "`sinfo` did not answer within 1 s; is slurmctld up?"


def test_the_launcher_follows_every_queued_state(tmp_path: Path) -> None:
    """Slurm's holding and finishing states are states of a live job: before they were known,
    a job in them was invisible (None: "not visible yet")."""
    bin_ = tmp_path / "bin"
    printing(bin_, "sacct", "")  # not in accounting yet
    printing(bin_, "squeue", "7|REQUEUE_HOLD||0:00|JobHeldAdmin\n")
    info = query_job("7", env=path_env(bin_))
    assert info == JobInfo("7", SlurmJobState.REQUEUE_HOLD, None, "", "0:00", "JobHeldAdmin")
    assert run_state(info.state) == RunState.QUEUED
    assert run_state(SlurmJobState.STAGE_OUT) == RunState.RUNNING
    assert run_state(SlurmJobState.SIGNALING) == RunState.RUNNING
    assert run_state(SlurmJobState.NODE_FAIL) == RunState.FAILED
    # accounting's PENDING is stale once the queue runs the job (query_job's docstring)
    printing(bin_, "sacct", "7|PENDING|0:0|n1|00:00:03|None\n")
    printing(bin_, "squeue", "7|RUNNING|n1|0:03|None\n")
    running = query_job("7", env=path_env(bin_))
    assert running is not None and run_state(running.state) == RunState.RUNNING


def test_the_workers_say_what_squeue_said_in_their_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the job logs are looked for here: none
    workers = SlurmWorkers(ClusterSpec(slurm_workers=2, slurm_start_timeout_s=60))
    workers.job_ids = ["1", "2", "3", "4", "9"]
    printing(tmp_path / "bin", "squeue", SQUEUE_OUT)
    monkeypatch.setenv("PATH", path_env(tmp_path / "bin")["PATH"])
    assert workers.describe() == (
        " (job 1 COMPLETED; job 2 PENDING (BeginTime); job 3 CANCELLED; "
        "job 4 FAILED (NonZeroExitCode); job 9 ended)"
    )
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(WorkersError) as missing:
        workers.describe()
    assert str(missing.value) == (
        "Slurm is not available here: `squeue` is not on PATH (--slurm-workers submits "
        "Slurm jobs; without Slurm use --scheduler)"
    )
    assert missing.value.exit_code == UsageError.exit_code
