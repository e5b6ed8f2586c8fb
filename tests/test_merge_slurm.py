"""`rankscope merge --slurm-workers N`: the ranks parsed by REAL Slurm jobs (tests/slurm_cluster.py).

The merge runs as the real command line in its own process; its workers are real dask-jobqueue
jobs on the local two-node Slurm cluster, submitted with sbatch and accounted by slurmdbd. Checked:
the store equals an in-process merge of the same traces; Slurm's accounting shows the worker jobs
ran while the merge ran and their logs show each worker registered with it; ``analyze`` merges on
the same workers; and workers that sbatch refuses, that never start, that are lost mid-merge or
that a Ctrl-C stops end in ONE line, a non-zero exit, no job and no temporary file left — lost
workers and Ctrl-C within 60 s, also when the workers' processes outlive their jobs. The cheap
flag checks at the top need no cluster.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
from rankscope.analysis.engine.scheduler import SYNCHRONOUS
from rankscope.analysis.engine.slurm_workers import SLURM_WORKER_TIMEOUT_ENV
from rankscope.analysis.store.reader import open_store
from rankscope.orchestrator.cli import build_parser
from rankscope.orchestrator.ingest.merge import MERGE_JOB_NAME, merge_run_dir
from rankscope.orchestrator.synth import SynthConfig, generate
from slurm_cluster import LocalSlurm, interruptible
from slurm_cluster import rankscope as run_rankscope
from store_compare import same_store

#: A small synthetic job: 8 ranks, ~2 k events in all (the cluster shares this 2-core machine).
SYNTH = SynthConfig(ranks=8, steps=2, layers=2, buckets=2)
#: Worker jobs asked for.
WORKERS = 2
#: Seconds a merge on Slurm workers may take here (worker start-up dominates: ~5 s when idle).
MERGE_TIMEOUT_S = 240.0
#: Seconds within which a merge must have ended after Ctrl-C or after its worker jobs were
#: cancelled, every time, even with orphan workers (docs/reliability.md).
END_BOUND_S = 60.0
#: Seconds to wait for slurmdbd to record the jobs' end.
ACCOUNTING_TIMEOUT_S = 60.0
#: What a worker's log says once it joined the merge's Dask scheduler (distributed.worker).
REGISTERED = "Registered to:"


# ---------------------------------------------------------------------------- helpers
def rankscope(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``rankscope`` command line (this venv's) to its end, within MERGE_TIMEOUT_S."""
    return run_rankscope(*args, env=env, cwd=cwd, timeout=MERGE_TIMEOUT_S)


def synth_job(folder: Path) -> Path:
    """Write the small synthetic job (rank-N.json.gz, truth.json) into ``folder``."""
    generate(SYNTH, folder)
    return folder


def temporaries(folder: Path) -> list[str]:
    """What a merge may leave beside its output: lock, temporary store, spill, workers' folder."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".trace.h5"))


def error_lines(stderr: str) -> list[str]:
    """The non-empty lines of stderr."""
    return [line for line in stderr.splitlines() if line.strip()]


def sacct_jobs(workdir: Path, since: str) -> list[dict[str, str]]:
    """The merge's worker jobs submitted from ``workdir`` since ``since``, from Slurm's accounting."""
    fields = ["JobID", "JobName", "State", "Start", "End", "NodeList", "WorkDir"]
    res = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-S", since, "--name", MERGE_JOB_NAME,
         "-o", ",".join(fields)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    rows = [
        dict(zip(fields, line.split("|"), strict=True)) for line in res.stdout.splitlines() if line
    ]
    return [r for r in rows if r["WorkDir"] == str(workdir)]


def ended_jobs(workdir: Path, since: str, n: int) -> list[dict[str, str]]:
    """Wait until accounting shows ``n`` ended jobs from ``workdir``; return them."""
    deadline = time.monotonic() + ACCOUNTING_TIMEOUT_S
    while True:
        jobs = sacct_jobs(workdir, since)
        if len(jobs) >= n and all(j["End"] not in ("Unknown", "") for j in jobs):
            return jobs
        if time.monotonic() > deadline:
            pytest.fail(f"accounting shows {jobs}, not {n} ended job(s) from {workdir}")
        time.sleep(1)


def live_jobs(workdir: Path) -> list[str]:
    """Jobs still in the queue (any live state) that were submitted from ``workdir``."""
    res = subprocess.run(
        ["squeue", "-h", "-o", "%i|%Z"], capture_output=True, text=True, timeout=60, check=True
    )
    return [line for line in res.stdout.splitlines() if line.endswith(f"|{workdir}")]


def now_for_sacct() -> str:
    """A ``sacct -S`` time a few seconds back (its resolution is one second)."""
    return (datetime.datetime.now() - datetime.timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%S")


def finished(proc: subprocess.Popen[str], timeout: float = MERGE_TIMEOUT_S) -> str:
    """The stderr of ``proc`` once it exits; killed (never left running into the next tests)
    when it has not exited within ``timeout`` seconds."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        err = proc.communicate()[1]
        subprocess.run(["scancel", f"--name={MERGE_JOB_NAME}"], timeout=60, check=False)
        pytest.fail(f"the merge did not end within {timeout:.0f} s: {err}")


def ended_in_time(proc: subprocess.Popen[str], since: float) -> str:
    """The stderr of ``proc``, which must exit within END_BOUND_S of ``since`` (monotonic)."""
    err = finished(proc, timeout=max(0.0, since + END_BOUND_S - time.monotonic()))
    elapsed = time.monotonic() - since
    assert elapsed < END_BOUND_S, f"the merge ended {elapsed:.1f} s after, not within 60 s: {err}"
    print(f"the merge ended {elapsed:.1f} s after")  # shown with -s: the margin left
    return err


def release(fifo: Path) -> None:
    """Let a reader blocked in ``open`` of the named pipe ``fifo`` go on (it then reads nothing):
    a worker that outlived its job must not stay blocked after the test."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))  # O_RDWR never blocks on a FIFO


def blocked_merge(
    tmp_path: Path, cluster: LocalSlurm, **env: str
) -> tuple[subprocess.Popen[str], Path, Path]:
    """A merge on Slurm workers that cannot finish by itself, once both workers have joined it.

    Rank 7's trace is a named pipe nobody writes: the worker parsing it blocks in ``open`` (the
    merging process itself never opens a trace). The merge handles Ctrl-C as from a terminal,
    whatever the test session ignores (``interruptible``); ``env`` adds to its environment (and so
    to its worker jobs'). Returns the process, the output folder and the folder the process runs
    in (the jobs' WorkDir).
    """
    job = synth_job(tmp_path / "job")
    (job / "rank-7.json.gz").unlink()
    os.mkfifo(job / "rank-7.json.gz")
    out = tmp_path / "out"
    out.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = subprocess.Popen(
        interruptible("merge", *sorted(map(str, job.glob("rank-*"))), "-o", str(out / "trace.h5"),
                      "--slurm-workers", str(WORKERS), "-q"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
        # every wait on Slurm bounded well inside the test's own timeout
        env=cluster.env(**{SLURM_WORKER_TIMEOUT_ENV: "60"}, **env),
    )  # fmt: skip
    deadline = time.monotonic() + MERGE_TIMEOUT_S
    while True:
        logs = [p for p in out.glob(".trace.h5.*.workers.tmp/*.err") if REGISTERED in p.read_text()]
        # Registered is not yet parsing: the merge hands out tasks once IT has seen both workers
        # (scancel in between is "a job ended before all workers had connected", another case).
        # A worker opening rank 7 is parsing: a write end opened without blocking succeeds only
        # then; held open (never written), the worker's read blocks, and the merge with it.
        if len(logs) >= WORKERS and (fd := _writer_if_read(job / "rank-7.json.gz")) is not None:
            weakref.finalize(proc, os.close, fd)
            return proc, out, cwd
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out_text, err = proc.communicate()
            pytest.fail(f"the workers never joined (exit {proc.returncode}): {err}{out_text}")
        time.sleep(0.5)


def _writer_if_read(fifo: Path) -> int | None:
    """A write end of ``fifo`` when a process has it open for reading (else None)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader yet
            return None
        raise


# ---------------------------------------------------------------------------- no cluster needed
def test_scheduler_and_slurm_workers_exclude_each_other(tmp_path: Path) -> None:
    """Both flags: argparse's ONE line, exit 2, before anything is read or submitted."""
    job = synth_job(tmp_path / "job")
    proc = rankscope(
        "merge", str(job), "--scheduler", "tcp://localhost:8786", "--slurm-workers", "2"
    )
    assert proc.returncode == 2
    assert error_lines(proc.stderr) == [
        "rankscope merge: error: argument --slurm-workers: not allowed with argument --scheduler"
    ]
    assert temporaries(job) == [] and not (job / "trace.h5").exists()


@pytest.mark.parametrize("command", ["merge", "analyze"])
@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (
            ["--slurm-workers", "0"],
            "argument --slurm-workers: must be a whole number >= 1, not '0'",
        ),
        (["--slurm-partition", "debug"], "--slurm-partition needs --slurm-workers N"),
    ],
    ids=["zero-workers", "partition-alone"],
)
def test_cluster_flags_are_checked_alike(
    command: str, flags: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankscope.orchestrator.cli import main as cli

    try:
        rc = cli([command, str(tmp_path), *flags])
    except SystemExit as exc:  # argparse's own error (CommandParser.error)
        rc = int(exc.code or 0)
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_merge_and_analyze_share_the_cluster_flags() -> None:
    """Defined once (``cluster_flags.add_cluster_flags``): same flags, same help, same group."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[union-attr]
    flags = ("--scheduler", "--slurm-workers", "--slurm-partition")

    def described(name: str) -> list[tuple[str, str | None, str | None]]:
        actions = sub[name]._option_string_actions
        return [(f, actions[f].help, actions[f].metavar) for f in flags]

    assert described("merge") == described("analyze")


# ---------------------------------------------------------------------------- the real cluster
@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_slurm_workers_write_the_same_store(tmp_path: Path, slurm_cluster: LocalSlurm) -> None:
    """8 ranks parsed by 2 Slurm jobs: the store equals the in-process merge's, the jobs ran
    (accounting) and their workers joined the merge (their logs), nothing is left behind."""
    job = synth_job(tmp_path / "job")
    ref = merge_run_dir(job, output=tmp_path / "ref.h5", scheduler=SYNCHRONOUS, quiet=True)
    cwd, logs = tmp_path / "cwd", tmp_path / "logs"
    cwd.mkdir()
    # dask-jobqueue's own setting keeps the job logs where this test can read them afterwards
    # (by default they live in the workers' folder beside the output, removed at the end).
    env = slurm_cluster.env(DASK_JOBQUEUE__SLURM__LOG_DIRECTORY=str(logs))
    since = now_for_sacct()
    t0 = datetime.datetime.now().replace(microsecond=0)
    proc = rankscope(
        "merge", str(job), "--slurm-workers", str(WORKERS),
        "--slurm-partition", slurm_cluster.partition, env=env, cwd=cwd,
    )  # fmt: skip
    t1 = datetime.datetime.now()
    assert proc.returncode == 0, proc.stderr
    assert f"merge: {WORKERS} Slurm worker job(s) in partition debug" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"merged {SYNTH.ranks} of {SYNTH.ranks} rank(s)" in proc.stdout

    assert same_store(job / "trace.h5", ref) == list(range(SYNTH.ranks))
    with open_store(ref) as store:
        assert len(store.collectives()) > 0
    assert temporaries(job) == [], "lock, temporary store, spill and workers' folder removed"

    jobs = ended_jobs(cwd, since, WORKERS)
    assert len(jobs) == WORKERS, jobs
    for j in jobs:
        start = datetime.datetime.fromisoformat(j["Start"])
        end = datetime.datetime.fromisoformat(j["End"])
        assert t0 <= start <= end <= t1, (j, t0, t1)  # they ran while the merge ran
        assert j["NodeList"] in {"n1", "n2"}, j
        assert j["State"].startswith("CANCELLED"), j  # stopped by the merge once it was done
        log = logs / f"{MERGE_JOB_NAME}-{j['JobID']}.err"
        assert REGISTERED in log.read_text(), f"{log}: the worker never joined the merge"
    assert live_jobs(cwd) == []


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_analyze_merges_on_the_same_slurm_workers(
    tmp_path: Path, slurm_cluster: LocalSlurm
) -> None:
    """``analyze --slurm-workers`` of an unmerged folder merges on Slurm workers first."""
    job = synth_job(tmp_path / "job")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    since = now_for_sacct()
    proc = rankscope(
        "analyze", str(job), "--slurm-workers", str(WORKERS), env=slurm_cluster.env(), cwd=cwd
    )
    assert proc.returncode == 0, proc.stderr
    assert f"merge: {WORKERS} Slurm worker job(s)" in proc.stderr
    assert f"analysis: {WORKERS} Slurm worker job(s)" in proc.stderr
    assert (job / "report" / "summary.json").is_file()
    assert len(ended_jobs(cwd, since, WORKERS)) == WORKERS  # the merge's own jobs
    assert temporaries(job) == []


@pytest.mark.slurm
def test_refused_workers_are_one_line(tmp_path: Path, slurm_cluster: LocalSlurm) -> None:
    """A partition that does not exist: sbatch's own words, exit 2, nothing submitted or left."""
    job = synth_job(tmp_path / "job")
    proc = rankscope(
        "merge", str(job), "--slurm-workers", "2", "--slurm-partition", "nope", "-q",
        env=slurm_cluster.env(), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("rankscope merge: error: --slurm-workers 2: sbatch refused")
    assert "invalid partition specified: nope" in lines[0]
    assert temporaries(job) == [] and not (job / "trace.h5").exists()
    assert live_jobs(tmp_path) == []


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_workers_that_never_start_time_out(tmp_path: Path, slurm_cluster: LocalSlurm) -> None:
    """Jobs held in the queue (``--begin=now+1hour`` through dask-jobqueue's own setting): after
    the timeout, one line with squeue's reason; the jobs are cancelled, nothing is left."""
    job = synth_job(tmp_path / "job")
    env = slurm_cluster.env(
        **{SLURM_WORKER_TIMEOUT_ENV: "8"},
        DASK_JOBQUEUE__SLURM__JOB_EXTRA_DIRECTIVES='["--begin=now+1hour"]',
    )
    proc = rankscope(
        "merge", str(job), "--slurm-workers", str(WORKERS), "-q", env=env, cwd=tmp_path
    )
    assert proc.returncode == 1
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "the Slurm workers did not start within 8 s: 0 of 2 connected" in lines[0]
    assert "PENDING (BeginTime)" in lines[0] and SLURM_WORKER_TIMEOUT_ENV in lines[0]
    assert temporaries(job) == [] and not (job / "trace.h5").exists()
    assert live_jobs(tmp_path) == [], "the held jobs are cancelled, not left in the queue"


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_worker_jobs_that_end_before_joining(tmp_path: Path, slurm_cluster: LocalSlurm) -> None:
    """The queued jobs are cancelled (by an admin, a limit…) before any worker joined: one line
    at the next look, not after the start timeout; nothing is left."""
    job = synth_job(tmp_path / "job")
    env = slurm_cluster.env(DASK_JOBQUEUE__SLURM__JOB_EXTRA_DIRECTIVES='["--begin=now+1hour"]')
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "merge", str(job), "--slurm-workers", str(WORKERS),
         "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    deadline = time.monotonic() + MERGE_TIMEOUT_S
    while len(queued := live_jobs(tmp_path)) < WORKERS:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the jobs were never queued: {proc.communicate()}")
        time.sleep(0.5)
    ids = [line.split("|")[0] for line in queued]
    t0 = time.monotonic()
    subprocess.run(["scancel", *ids], check=True, timeout=60)
    err = finished(proc)
    assert time.monotonic() - t0 < 60, "noticed at once, not after the 300 s start timeout"
    assert proc.returncode == 1, err
    lines = error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"ended before all {WORKERS} workers had connected" in lines[0]
    assert any(f"job {i} CANCELLED" in lines[0] for i in ids), lines[0]
    assert temporaries(job) == [] and not (job / "trace.h5").exists()
    assert live_jobs(tmp_path) == []


def worker_job_ids(out: Path) -> list[str]:
    """The Slurm job ids of a running merge's workers (from their log names)."""
    (workers,) = out.glob(".trace.h5.*.workers.tmp")
    return [p.stem.rsplit("-", 1)[1] for p in workers.glob(f"{MERGE_JOB_NAME}-*.err")]


def cancel_workers_expect_one_line(proc: subprocess.Popen[str], out: Path, cwd: Path) -> None:
    """scancel every worker job of the merge ``proc``: it must end within 60 s with exit 1 and
    one line naming each job CANCELLED, and leave no job behind."""
    ids = worker_job_ids(out)
    t0 = time.monotonic()
    subprocess.run(["scancel", *ids], check=True, timeout=60)
    err = ended_in_time(proc, t0)
    assert proc.returncode == 1, err
    lines = error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("rankscope merge: error: every Slurm worker was lost")
    for job_id in ids:
        assert f"job {job_id} CANCELLED" in lines[0], lines[0]
    assert live_jobs(cwd) == []


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lost_workers_are_one_line(tmp_path: Path, slurm_cluster: LocalSlurm) -> None:
    """Both worker jobs cancelled while a rank is being parsed: within 60 s, one line naming the
    jobs and Slurm's verdict from their logs, exit 1, no store, no temporary, no job left."""
    proc, out, cwd = blocked_merge(tmp_path, slurm_cluster)
    # What the workers write is beside the output (shared), not in a node's /tmp: their logs
    # (blocked_merge read them there) and Dask's scratch space.
    (workers,) = out.glob(".trace.h5.*.workers.tmp")
    assert (workers / "dask-scratch-space").is_dir()
    assert len(worker_job_ids(out)) == WORKERS
    cancel_workers_expect_one_line(proc, out, cwd)
    assert temporaries(out) == [] and not (out / "trace.h5").exists()


#: The ``python`` of worker jobs whose processes escape Slurm (tests/test_merge_slurm.py): it
#: starts the real one in its own session from a subshell that exits at once, so it is no
#: descendant of the job's batch shell, exactly what ``proctrack/linuxproc`` (process tracking
#: by parentage, this cluster's) makes of a nanny whose batch shell died first on ``scancel``:
#: reparented to init, missed by the SIGKILL that follows. The job itself then waits for its end.
ESCAPING_PYTHON = """#!/bin/sh
( setsid "$REAL_PYTHON" "$@" </dev/null & echo $! >"$ESCAPED_DIR/$SLURM_JOB_ID" )
exec sleep infinity
"""


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_orphan_workers_do_not_keep_the_merge_alive(
    tmp_path: Path, slurm_cluster: LocalSlurm
) -> None:
    """Worker processes that outlive their cancelled jobs (orphans, still connected to the
    merge's scheduler, one blocked in ``open``): the merge gives up with one line within 60 s of
    the scancel, cancels what is left, removes its temporaries, and does not wait on them."""
    escaped = tmp_path / "escaped"
    escaped.mkdir()
    python = tmp_path / "escaping-python"
    python.write_text(ESCAPING_PYTHON)
    python.chmod(0o755)
    proc, out, cwd = blocked_merge(
        tmp_path, slurm_cluster, DASK_JOBQUEUE__SLURM__PYTHON=str(python),
        REAL_PYTHON=sys.executable, ESCAPED_DIR=str(escaped),
    )  # fmt: skip
    try:
        assert sorted(p.name for p in escaped.iterdir()) == sorted(worker_job_ids(out))
        cancel_workers_expect_one_line(proc, out, cwd)
    finally:
        # the orphans are this test's: each escaped session, by its leader's process id
        for pid_file in escaped.iterdir():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        release(tmp_path / "job" / "rank-7.json.gz")
    assert temporaries(out) == [] and not (out / "trace.h5").exists()


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_interrupted_merge_cancels_its_workers(tmp_path: Path, slurm_cluster: LocalSlurm) -> None:
    """Ctrl-C while the workers parse: within 60 s, "interrupted" (exit 130), the jobs
    cancelled, nothing left.

    (dask-jobqueue's import turns SIGINT into a silent ``sys.exit()``; rankscope undoes that.)
    """
    proc, out, cwd = blocked_merge(tmp_path, slurm_cluster)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    err = ended_in_time(proc, t0)
    assert proc.returncode == 130, err
    assert error_lines(err) == ["rankscope merge: interrupted"]
    assert temporaries(out) == [] and not (out / "trace.h5").exists()
    assert live_jobs(cwd) == []
