"""``rankscope run`` end to end on CPU: real torchrun, real profiler, real gloo.

One 4-rank run is shared by several assertions (module fixture); a 2-rank run under the user's
own launcher line puts one rank under libfaketime to check the clock-sync samples.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rankscope.launchers import clocksync, rundir
from rankscope.launchers.clocksync import offset_ns, rtt_ns
from rankscope.launchers.torchrun import OMP_THREADS_ENV, TORCHELASTIC_DIR

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
#: FAKETIME shift of the faked rank, in s (its realtime clock runs ahead by this much).
FAKE_SHIFT_S = 0.5

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def rankscope_run(
    *args: str, cwd: Path = ROOT, timeout: float = 240, tmpdir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess (the same interpreter as the tests) in a user's environment:
    without the OpenMP and Kineto settings an earlier test may have set in this process (Dask's
    LocalCluster sets OMP_NUM_THREADS); ``tmpdir``: its TMPDIR."""
    env = {k: v for k, v in os.environ.items() if k not in (OMP_THREADS_ENV, "KINETO_LOG_LEVEL")}
    temp = {"TMPDIR": str(tmpdir)} if tmpdir is not None else {}
    return subprocess.run(
        [sys.executable, "-m", "rankscope", "run", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "COLUMNS": "200", **temp},
    )


#: The happy run's TMPDIR (a folder of pytest's base temp).
HAPPY_TMPDIR = "happy-tmpdir"


def only_run_dir(out: Path) -> Path:
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def load_window(path: Path) -> dict[str, Any]:
    trace: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
    return trace


def step_names(trace: dict[str, Any]) -> set[str]:
    return {
        e["name"]
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep#")
    }


def assert_optimizer_steps_nest(trace: dict[str, Any]) -> None:
    """Every ``Optimizer.step`` range lies inside one ``ProfilerStep#N`` (stepped after it closed)."""
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"].startswith("ProfilerStep#")]
    optimizer = [e for e in spans if e["name"].startswith("Optimizer.step#")]
    assert len(optimizer) == len(steps)
    for e in optimizer:
        assert any(lo <= e["ts"] and e["ts"] + e["dur"] <= hi for lo, hi in steps), e


@pytest.fixture(scope="module")
def happy(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """4 ranks, 10 steps, 2 windows (steps 2-4 and 7-9); rank 1 straggles; script flags pass through."""
    out = tmp_path_factory.mktemp("runs")
    proc = rankscope_run(
        "--nproc-per-node",
        "4",
        "--repeat",
        "2",
        "--out",
        str(out),
        "--no-merge",
        "--no-analyze",
        str(EXAMPLE),
        "--steps",
        "10",
        "--lr",
        "3e-4",
        "--straggler-rank",
        "1",
        "--straggler-ms",
        "2",
        "--hidden",
        "64",
        tmpdir=tmp_path_factory.mktemp(HAPPY_TMPDIR, numbered=False),
    )
    return proc, only_run_dir(out)


def test_exit_and_run_json(happy: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, run_dir = happy
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads((run_dir / rundir.RUN_JSON).read_text())
    assert run["state"] == "completed"
    assert run["exit_code"] == 0
    assert run["launcher"] == "local"
    assert run["world_size"] == 4 and run["nproc_per_node"] == 4 and run["nnodes"] == 1
    assert run["run_id"] == run_dir.name
    assert run["script_args"][:4] == ["--steps", "10", "--lr", "3e-4"]
    assert "--standalone" in run["torchrun_args"]  # default: a free port, no clash on 29500
    assert run["command"][:3] == ["rankscope", "run", "--nproc-per-node"]
    assert run["profiler"]["repeat"] == 2 and run["profiler"]["active"] == 3
    assert run["started_at"] and run["ended_at"] and run["failures"] == []
    assert (run_dir / rundir.LOGS_DIR / "torchrun.log").stat().st_size > 0
    # torchrun's per-run error-file folder lives in the run and, with no error, is removed; left
    # to torchrun it is a /tmp/torchelastic_* folder per run, never removed
    assert not (run_dir / rundir.LOGS_DIR / TORCHELASTIC_DIR).exists()
    assert not list((run_dir.parents[1] / HAPPY_TMPDIR).glob("torchelastic_*"))


def test_summary_printed(happy: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, run_dir = happy
    assert "4 ranks, 8 windows" in proc.stdout
    assert str(run_dir) in proc.stdout
    assert "train_ddp: 10 steps" in proc.stdout  # the script's own output is shown
    # neither Kineto's per-window USDT markers nor torchrun's OMP banner reach the console, yet
    # the log keeps everything
    printed = proc.stdout + proc.stderr
    assert "completed" in printed and "USDT" not in printed and OMP_THREADS_ENV not in printed
    log = (run_dir / rundir.LOGS_DIR / "torchrun.log").read_text()
    assert "profiler_start" in log, "the log is whole"


def test_windows_are_kineto_traces_of_every_rank(
    happy: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, run_dir = happy
    expected = [
        {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"},
        {"ProfilerStep#7", "ProfilerStep#8", "ProfilerStep#9"},
    ]
    for rank in range(4):
        files = sorted(rundir.rank_dir(run_dir, rank).glob(rundir.WINDOW_GLOB))
        assert [f.name for f in files] == ["window-000.json.gz", "window-001.json.gz"]
        for window, path in enumerate(files):
            trace = load_window(path)
            info = trace["distributedInfo"]
            assert (info["rank"], info["world_size"], info["backend"]) == (rank, 4, "gloo")
            assert step_names(trace) == expected[window]
            assert trace["rankscope"]["rank"] == rank and trace["rankscope"]["window"] == window
            names = {e.get("name", "") for e in trace["traceEvents"]}
            assert any(n.startswith("enumerate(DataLoader)#") for n in names)
            assert ("straggler_work" in names) == (rank == 1)
            assert_optimizer_steps_nest(trace)


def test_meta_json(happy: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, run_dir = happy
    domains = set()
    for rank in range(4):
        meta = json.loads((rundir.rank_dir(run_dir, rank) / rundir.META_JSON).read_text())
        assert (meta["rank"], meta["local_rank"], meta["world_size"], meta["local_world_size"]) == (
            rank,
            rank,
            4,
            4,
        )
        assert meta["backend"] == "gloo" and meta["device"] == "cpu" and meta["pid"] > 0
        assert meta["versions"]["torch"] and meta["versions"]["python"]
        assert "error" not in meta
        windows = meta["windows"]
        assert [(w["index"], w["file"], w["first_step"], w["last_step"]) for w in windows] == [
            (0, "window-000.json.gz", 2, 4),
            (1, "window-001.json.gz", 7, 9),
        ]
        for w in windows:
            assert w["bytes"] == (rundir.rank_dir(run_dir, rank) / w["file"]).stat().st_size
            assert w["events"] > 100 and w["complete"]
        clock = meta["clock"]
        # one host, no faketime: one clock domain whose leader is the reference: no samples
        assert clock["leader_rank"] == 0 and clock["reference_rank"] == 0
        assert clock["samples"] == [] and "error" not in clock
        domains.add(clock["domain"])
    assert len(domains) == 1


@pytest.mark.skipif(
    not LIBFAKETIME.exists() or shutil.which("bash") is None, reason="needs libfaketime"
)
@pytest.mark.parametrize("transport", ["tcp", "gloo"])
def test_own_launcher_line_with_a_faked_clock(tmp_path: Path, transport: str) -> None:
    """torchrun … -m rankscope.launchers.rank, rank 1 under libfaketime: its own clock domain.

    Also covers ``rankscope.step()`` (``--no-optimizer``) under real torchrun, and the run.json
    that rank 0 writes when no rankscope process launched the job.
    """
    wrapper = tmp_path / "rank.sh"
    wrapper.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$RANK" = 1 ]; then\n'
        f"  export LD_PRELOAD={LIBFAKETIME} FAKETIME=+{FAKE_SHIFT_S}s FAKETIME_DONT_FAKE_MONOTONIC=1\n"
        "fi\n"
        f'exec {sys.executable} -m rankscope.launchers.rank "$@"\n'
    )
    wrapper.chmod(0o755)
    run_dir = tmp_path / "run"
    env = {**os.environ, rundir.ENV_RUN_DIR: str(run_dir), clocksync.ENV_TRANSPORT: transport}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--no-python",
            str(wrapper),
            str(EXAMPLE),
            "--steps",
            "6",
            "--no-optimizer",
            "--hidden",
            "32",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads((run_dir / rundir.RUN_JSON).read_text())
    assert run["launcher"] == "external" and run["state"] == "completed"
    metas = [
        json.loads((rundir.rank_dir(run_dir, r) / rundir.META_JSON).read_text()) for r in (0, 1)
    ]
    for meta in metas:
        assert [w["file"] for w in meta["windows"]] == [
            "window-000.json.gz"
        ]  # rankscope.step() drove it
    ref, faked = metas[0]["clock"], metas[1]["clock"]
    assert ref["domain"] != faked["domain"]
    assert ref["leader_rank"] == 0 and ref["samples"] == []
    assert faked["leader_rank"] == 1 and "error" not in faked
    assert faked["method"] == f"{transport}-pingpong"
    phases = {s["phase"] for s in faked["samples"]}
    assert phases == {"init", "window-000"}
    assert len(faked["samples"]) >= 50
    best = min(faked["samples"], key=rtt_ns)
    # reference − faked clock: the faked clock is AHEAD by FAKE_SHIFT_S, so the offset is negative
    assert abs(offset_ns(best) + FAKE_SHIFT_S * 1e9) < max(5e6, rtt_ns(best) / 2 + 1e6)
    assert 0 < rtt_ns(best) < 50e6
    # Every step's end from the step log (issue 30), merged onto the aligned clock with the very
    # transform of the rank's trace events: the runtime ends step s + 1 of the log in the hook
    # that ends ProfilerStep#s, so that end lies after ProfilerStep#s started and no later than
    # ProfilerStep#s+1 starts — on rank 1 too, whose raw clock is FAKE_SHIFT_S ahead.
    from rankscope.analysis.store.reader import open_store
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    store = merge_run_dir(run_dir, output=tmp_path / "t.h5", scheduler="synchronous", quiet=True)
    with open_store(store) as s:
        assert s.step_log_ranks() == [0, 1]
        steps = s.steps()
        for r in (0, 1):
            end = s.step_log(r).set_index("steps")["end"]
            assert list(end.index) == list(range(1, 7))
            mine = steps[steps["rank"] == r].set_index("step")
            assert len(mine) >= 2
            for step, row in mine.iterrows():
                assert row["start"] < end[step + 1], (r, step)
                if step + 1 in mine.index:
                    assert end[step + 1] <= mine.loc[step + 1, "start"], (r, step)
