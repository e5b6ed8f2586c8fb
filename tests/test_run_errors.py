"""What ``rankscope run`` does when things go wrong: bad input, a raising rank, SIGKILL, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rankscope.launchers import rundir
from rankscope.launchers.torchrun import TORCHELASTIC_DIR

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"


def rankscope_run(
    *args: str, timeout: float = 240, tmpdir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    temp = {"TMPDIR": str(tmpdir)} if tmpdir is not None else {}
    return subprocess.run(
        [sys.executable, "-m", "rankscope", "run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **temp},
    )


def run_dirs(out: Path) -> list[Path]:
    return [p for p in out.iterdir() if p.is_dir()] if out.exists() else []


def window_files(run_dir: Path, rank: int) -> list[str]:
    return sorted(p.name for p in rundir.rank_dir(run_dir, rank).glob(rundir.WINDOW_GLOB))


def first_window_recorded(run_dir: Path, rank: int) -> bool:
    """Whether the rank's meta.json (written atomically) lists window 0 as written, complete."""
    try:
        meta = json.loads((rundir.rank_dir(run_dir, rank) / rundir.META_JSON).read_text())
    except FileNotFoundError:
        return False
    return any(w["index"] == 0 and w["complete"] for w in meta.get("windows", []))


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing_script.py"], "script not found: missing_script.py"),
        (["--active", "0", str(EXAMPLE)], "--active must be an integer >= 1"),
        (["--wait", "-1", str(EXAMPLE)], "--wait must be an integer >= 0"),
        (["--repeat", "-2", str(EXAMPLE)], "--repeat must be an integer >= 0"),
        (["--warmup", "x", str(EXAMPLE)], "invalid int value"),
        (["--name", "a/b", str(EXAMPLE)], "--name must not contain '/'"),
        (["--name", "..", str(EXAMPLE)], "--name must not contain '..'"),
        (["--name", "", str(EXAMPLE)], "--name must not be empty"),
        (
            ["--nproc-per-node", "2", "--no-python", str(EXAMPLE)],
            "cannot profile a non-Python program",
        ),
        (["--nproc-per-node"], "--nproc-per-node needs a value"),
        ([], "no training script given"),
        (["--bogus-flag", "1", str(EXAMPLE)], "torchrun: unrecognized arguments: --bogus-flag"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_launched(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "runs"
    proc = rankscope_run("--out", str(out), *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("rankscope run: error: ") and message in lines[0]
    assert "Traceback" not in proc.stderr
    assert run_dirs(out) == []


def test_output_dir_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = rankscope_run("--out", str(blocker / "runs"), str(EXAMPLE))
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "\n" not in line and f"output folder {blocker / 'runs'} cannot be created" in line


def test_help_is_fast_to_reach_and_complete() -> None:
    proc = rankscope_run("--help")
    assert proc.returncode == 0
    for flag in (
        "--wait",
        "--warmup",
        "--active",
        "--repeat",
        "--record-shapes",
        "--out",
        "--name",
        "--no-merge",
    ):
        assert flag in proc.stdout
    assert "rankscope.launchers.rank" in proc.stdout  # how to keep one's own launcher line


# ----------------------------------------------------------------------------- job failures
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_raising_rank_fails_the_run_and_keeps_every_window(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "tmp").mkdir()
    proc = rankscope_run(
        "--nproc-per-node", "2", "--out", str(tmp_path / "out"), "--no-merge", "--no-analyze",
        str(EXAMPLE), "--steps", "12", "--hidden", "32", "--fail-rank", "1", "--fail-step", "7",
        tmpdir=tmp_path / "tmp",
    )  # fmt: skip
    assert proc.returncode != 0
    (run_dir,) = run_dirs(tmp_path / "out")
    # torchrun's error file of the failed rank is kept with the run, nothing in TMPDIR
    (error_file,) = (run_dir / rundir.LOGS_DIR / TORCHELASTIC_DIR).glob("*/attempt_0/1/error.json")
    assert "injected failure on rank 1 at step 7" in error_file.read_text()
    assert not list((tmp_path / "tmp").glob("torchelastic_*"))
    run = json.loads((run_dir / rundir.RUN_JSON).read_text())
    assert run["state"] == "failed" and run["exit_code"] not in (0, None)
    first = run["failures"][0]
    assert first["rank"] == 1
    assert first["error"] == "RuntimeError: injected failure on rank 1 at step 7"
    assert "rank 1 failed" in proc.stdout and "injected failure on rank 1 at step 7" in proc.stdout
    # its traceback (and torchrun's ChildFailedError) is in the log, not on the terminal
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-3000:]
    assert "the ranks' output and tracebacks:" in proc.stdout
    log = (run_dir / rundir.LOGS_DIR / "torchrun.log").read_text()
    assert "injected failure on rank 1 at step 7" in log and "Traceback" in log
    for rank in (0, 1):  # window 0 (steps 2-4) was complete on both ranks before the failure
        assert window_files(run_dir, rank) == ["window-000.json.gz"]
    meta = json.loads((rundir.rank_dir(run_dir, 1) / rundir.META_JSON).read_text())
    assert meta["error"]["type"] == "RuntimeError" and meta["error"]["rank"] == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkilled_rank_fails_the_run_and_keeps_every_window(tmp_path: Path) -> None:
    proc = rankscope_run(
        "--nproc-per-node", "2", "--out", str(tmp_path), "--no-merge", "--no-analyze",
        str(EXAMPLE), "--steps", "12", "--hidden", "32", "--kill-rank", "1", "--kill-step", "7",
    )  # fmt: skip
    assert proc.returncode != 0
    (run_dir,) = run_dirs(tmp_path)
    run = json.loads((run_dir / rundir.RUN_JSON).read_text())
    assert run["state"] == "failed"
    killed = [f for f in run["failures"] if f["rank"] == 1]
    assert killed and killed[0]["error"] == "killed by SIGKILL" and killed[0]["exit_code"] == -9
    assert "rank 1 failed" in proc.stdout and "killed by SIGKILL" in proc.stdout
    for rank in (0, 1):
        assert window_files(run_dir, rank) == ["window-000.json.gz"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_interrupts_and_flushes(tmp_path: Path) -> None:
    # ``python -m rankscope run …``, with Ctrl-C's default handling restored first: a test run
    # with SIGINT ignored (a non-interactive shell's background job, `pytest &`) passes that on
    # through exec, and the launcher would never see the interrupt (its ranks, started by a
    # process that handles SIGINT, get the default again).
    interruptible = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
    )
    proc = subprocess.Popen(
        [
            sys.executable, "-c", interruptible,
            "rankscope", "run", "--nproc-per-node", "2", "--out", str(tmp_path),
            "--no-merge", "--no-analyze", "--repeat", "0", "--wait", "0", "--warmup", "0", "--active", "100",
            str(EXAMPLE), "--steps", "1000000", "--hidden", "32",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        # Ctrl-C once every rank's meta.json records its first window as written and complete.
        # The rank is then recording its second window: the first was handed to the writer
        # thread inside the profiler step that ends it and starts the next, and a signal that
        # arrives during that step is held back until the step is over (the runtime's
        # signals_deferred). So the interrupt lands in a window in progress, after a complete one.
        deadline = time.monotonic() + 200
        while not (
            (dirs := run_dirs(tmp_path)) and all(first_window_recorded(dirs[0], r) for r in (0, 1))
        ):
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "no window recorded in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-3000:]
    (run_dir,) = run_dirs(tmp_path)
    run = json.loads((run_dir / rundir.RUN_JSON).read_text())
    assert run["state"] == "interrupted" and run["exit_code"] == 130
    assert run["failures"] == []  # Ctrl-C is not a rank failure
    for rank in (0, 1):
        meta = json.loads((rundir.rank_dir(run_dir, rank) / rundir.META_JSON).read_text())
        files = window_files(run_dir, rank)
        assert [w["file"] for w in meta["windows"]] == files
        # the first window complete; the window in progress at Ctrl-C flushed, incomplete
        assert meta["windows"][0]["index"] == 0 and meta["windows"][0]["complete"] is True
        assert meta["windows"][-1]["index"] >= 1 and meta["windows"][-1]["complete"] is False
        assert meta["error"]["interrupted"] is True
