"""The Python API from a plain script, and runs that profiled nothing (issue 8, items 2 and 3).

A plain script calling ``analyze()`` at module level (no ``if __name__ == "__main__":``) used to
start a LocalCluster whose spawned workers re-imported the script: ~480 lines of tracebacks and the
script's top lines run three times. A run whose loop never stepped ended "completed … 0 windows"
without a word about why.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest


def _script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )


@pytest.fixture(scope="module")
def store(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from analysis_frames import merged

    return merged(data_dir, "cpu_gloo_4rank_straggler", tmp_path_factory.mktemp("api"))


def test_plain_script_analyze_at_module_level(store: Path, tmp_path: Path) -> None:
    proc = _script(
        tmp_path,
        f"""
        import rankscope
        from rankscope.analysis import analyze
        print("top of the script")
        a = analyze({str(store)!r})
        print("stragglers", a.straggler_ranks(), "ran", a.scheduler.scheduler)
        """,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    assert out.count("top of the script") == 1, out[-3000:]
    assert "stragglers [2] ran synchronous" in out


def test_plain_script_asking_for_processes_gets_threads_not_a_bootstrap_error(
    store: Path, tmp_path: Path
) -> None:
    """Explicitly asking for a LocalCluster from an unguarded script: worker processes would
    re-run the script, so the work runs on threads and says why."""
    proc = _script(
        tmp_path,
        f"""
        from rankscope.analysis import analyze
        from rankscope.analysis.engine.driver import ClusterSpec
        print("top of the script")
        a = analyze({str(store)!r}, ClusterSpec(scheduler="local"))
        print("stragglers", a.straggler_ranks(), "ran", a.scheduler.scheduler)
        print("why", a.scheduler.reason)
        """,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "Nanny" not in out
    assert out.count("top of the script") == 1
    assert "stragglers [2] ran threads" in out
    assert "__main__" in out  # the reason says how to get processes


def test_plain_script_asking_for_forked_processes_runs_them_once(
    store: Path, tmp_path: Path
) -> None:
    """Forked workers never re-import ``__main__``: a plain script gets them, its top runs once."""
    proc = _script(
        tmp_path,
        f"""
        from rankscope.analysis import analyze
        from rankscope.analysis.engine.driver import ClusterSpec
        print("top of the script")
        a = analyze({str(store)!r}, ClusterSpec(scheduler="processes", workers=2))
        print("stragglers", a.straggler_ranks(), "ran", a.scheduler.scheduler)
        """,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    assert out.count("top of the script") == 1, out[-3000:]
    assert "stragglers [2] ran processes" in out


def test_forked_workers_pay_sooner_than_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where this process can fork, ``auto`` forks its workers once the work saves more than
    their start (``FORK_START_S``: the fork, copy-on-write pages, results back) — all cores count, the parent only waits — and
    stays in-process below that; one core or one rank never forks."""
    from rankscope.analysis.engine import scheduler

    monkeypatch.setattr(scheduler, "can_fork", lambda: True)
    monkeypatch.setattr(scheduler, "cores", lambda: 2)
    spec = scheduler.ClusterSpec()
    # 2 workers: pays when the work is over 2 x FORK_START_S (1.0 s: 800,000 events)
    assert scheduler.choose(spec, 8, 1_000_000).scheduler == scheduler.PROCESSES
    assert "2 forked worker processes" in scheduler.choose(spec, 8, 1_000_000).reason
    assert scheduler.choose(spec, 8, 200_000).scheduler == scheduler.SYNCHRONOUS
    # a small job pays no worker start-up: 8 ranks of ~2,500 events (~0.4 s of work with the
    # fixed cost of each rank's task) save ~0.2 s on 2 workers, less than forking them costs
    small = scheduler.choose(spec, 8, 20_000, scheduler.ANALYSIS_RANK_S)
    assert small.scheduler == scheduler.SYNCHRONOUS and "too little" in small.reason
    assert scheduler.choose(spec, 1, 100_000_000).scheduler == scheduler.SYNCHRONOUS
    monkeypatch.setattr(scheduler, "cores", lambda: 1)
    assert scheduler.choose(spec, 8, 100_000_000).scheduler == scheduler.SYNCHRONOUS
    # 64 small ranks: their fixed cost per task (ANALYSIS_RANK_S) is the work that pays
    monkeypatch.setattr(scheduler, "cores", lambda: 2)
    assert scheduler.choose(spec, 64, 64_000).scheduler == scheduler.SYNCHRONOUS
    busy = scheduler.choose(spec, 64, 64_000, scheduler.ANALYSIS_RANK_S)
    assert busy.scheduler == scheduler.PROCESSES
    # asked for where fork is unsafe (macOS, a worker process): threads, saying why
    monkeypatch.setattr(scheduler, "can_fork", lambda: False)
    asked = scheduler.choose(scheduler.ClusterSpec(scheduler=scheduler.PROCESSES), 8, 10**8)
    assert asked.scheduler == scheduler.THREADS and "Linux" in asked.reason


def test_the_merge_weighs_its_work_at_the_parse_rate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The merge sizes its work at the parse's rate (1.25 µs per estimated event + 0.02 s per
    rank, orchestrator/ingest/source_reads.py), not the analysis' (0.05 s per rank). Since the
    compiled scanner, an 8-rank synth job of 370,559 estimated events parses in 0.35-0.39 s of
    CPU (1.51 s before): in-process (0.78 s) beats 2 forked workers (1.1 s); the 64-rank job
    (2,977,075) still forks, and small jobs (param_dlrm_8rank, 19k) stay in-process."""
    from rankscope.analysis.engine import scheduler
    from rankscope.orchestrator.ingest import merge, source_reads

    monkeypatch.setattr(scheduler, "can_fork", lambda: True)
    monkeypatch.setattr(scheduler, "cores", lambda: 2)
    spec = scheduler.ClusterSpec()
    rate = (source_reads.PARSE_RANK_S, source_reads.PARSE_EVENTS_PER_S)
    assert scheduler.choose(spec, 8, 370_559, *rate).scheduler == scheduler.SYNCHRONOUS
    assert scheduler.choose(spec, 64, 2_977_075, *rate).scheduler == scheduler.PROCESSES
    assert scheduler.choose(spec, 8, 19_352, *rate).scheduler == scheduler.SYNCHRONOUS
    # the real merge of the small job says in-process, and uses the parse rate to say it
    # (8 x 0.02 s + 19,352 / 800,000 = 0.18 s; at the analysis' rate it would be 0.42 s)
    dlrm = Path(__file__).parent / "data" / "param_dlrm_8rank"
    merge.merge_run_dir(dlrm, output=tmp_path / "a.h5", scheduler="auto")
    err = capsys.readouterr().err
    assert "merge: in-process (19,352 events, ~0.2 s of work" in err, err[-2000:]


def test_scheduler_choice_follows_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where this process cannot fork (macOS, Windows): a LocalCluster once it pays."""
    from rankscope.analysis.engine import scheduler
    from rankscope.analysis.engine.driver import (
        LOCAL,
        SYNCHRONOUS,
        THREADS,
        ClusterSpec,
        choose,
    )

    monkeypatch.setattr(scheduler, "can_fork", lambda: False)
    small, big = 10_000, 100_000_000
    guarded = ClusterSpec(workers=4, main_is_guarded=True)
    assert choose(guarded, 8, small).scheduler == SYNCHRONOUS
    assert choose(guarded, 8, big).scheduler == LOCAL
    # one worker (one core or one rank) never pays for a cluster
    assert choose(ClusterSpec(workers=1, main_is_guarded=True), 8, big).scheduler == SYNCHRONOUS
    assert choose(guarded, 1, big).scheduler == SYNCHRONOUS
    # a plain script (its __main__ has a file, no guard known): processes are not safe from it;
    # the REPL and Jupyter (no file) are
    script = types.ModuleType("__main__")
    script.__file__ = "train.py"
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert choose(ClusterSpec(workers=4), 8, big).scheduler == THREADS
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    assert choose(ClusterSpec(workers=4), 8, big).scheduler == LOCAL
    # an explicit choice is honoured
    assert choose(ClusterSpec(scheduler=SYNCHRONOUS), 8, big).scheduler == SYNCHRONOUS
    assert choose(ClusterSpec(scheduler="tcp://h:8786"), 8, small).scheduler == "tcp://h:8786"


def test_unsized_cluster_counts_the_parents_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unsized, the parent's core adds nothing to a LocalCluster: 2 cores stay in-process, 16
    cores pay (where this process cannot fork)."""
    from rankscope.analysis.engine import scheduler

    monkeypatch.setattr(scheduler, "can_fork", lambda: False)
    guarded = scheduler.ClusterSpec(main_is_guarded=True)
    monkeypatch.setattr(scheduler, "cores", lambda: 2)
    two = scheduler.choose(guarded, 8, 100_000_000)
    assert two.scheduler == scheduler.SYNCHRONOUS and "one is the parent's" in two.reason
    monkeypatch.setattr(scheduler, "cores", lambda: 16)
    assert scheduler.choose(guarded, 8, 100_000_000).scheduler == scheduler.LOCAL
    assert scheduler.choose(guarded, 8, 10_000).scheduler == scheduler.SYNCHRONOUS


def test_nothing_profiled_says_why() -> None:
    from rankscope.orchestrator.run_outcome import nothing_profiled

    prof = {"skip_first": 0, "wait": 1, "warmup": 1, "active": 3}
    rank = {"rank": 0, "windows": 0, "steps": 0, "profiler": prof}
    none_seen = nothing_profiled({"windows": 0, "ranks": [rank]})
    assert none_seen and "rankscope.step()" in none_seen and "optimizer.step()" in none_seen
    short = nothing_profiled({"windows": 0, "ranks": [{**rank, "steps": 2}]})
    assert short and "2 step(s)" in short and "step 3" in short and "--warmup" in short
    assert nothing_profiled({"windows": 3, "ranks": [{**rank, "windows": 3}]}) is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_without_steps_warns_at_the_end_and_analyze_says_why(tmp_path: Path) -> None:
    train = tmp_path / "no_steps.py"
    train.write_text(
        "import torch\na = torch.randn(64, 64)\nfor _ in range(6):\n    a = torch.tanh(a @ a)\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankscope",
            "run",
            "--nproc-per-node",
            "1",
            "--out",
            str(tmp_path / "runs"),
            str(train),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "nothing was profiled: no training step was seen" in out
    assert "rankscope.step()" in out.splitlines()[-1] or "rankscope.step()" in proc.stderr
    (run,) = (tmp_path / "runs").iterdir()
    ana = subprocess.run(
        [sys.executable, "-m", "rankscope", "analyze", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in (ana.stdout + ana.stderr).splitlines() if ln.strip()]
    assert ana.returncode != 0
    assert len(lines) == 1, lines
    assert "no training step was seen" in lines[0] and str(run) in lines[0]


def test_many_small_ranks_count_as_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """1,024 ranks of 1,000 events: the fixed cost per rank task makes it ~50 s of work, which
    a LocalCluster pays for where cores allow (issue 15: the events alone said 1.3 s)."""
    from rankscope.analysis.engine import scheduler
    from rankscope.analysis.engine.scheduler import ANALYSIS_RANK_S, ClusterSpec, choose

    monkeypatch.setattr(scheduler, "can_fork", lambda: False)

    spec = ClusterSpec(workers=4, main_is_guarded=True)
    assert choose(spec, 1024, 1_024_000).scheduler == scheduler.SYNCHRONOUS
    busy = choose(spec, 1024, 1_024_000, ANALYSIS_RANK_S)
    assert busy.scheduler == scheduler.LOCAL
