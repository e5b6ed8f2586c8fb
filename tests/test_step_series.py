"""Every step of the whole run (issue 30, "After the run"): the step logs merged into the store
on the aligned clock, the series' analysis against generated truth, the report's plot bins.

Step logs are generated (``launchers.step_log.append``) with known true end times, so every
figure is checked against the truth it was made from; the traces are the real 4-rank gloo job of
``tests/data/cpu_gloo_4rank_skew`` (rank 2's clock 750.02 ms ahead, runtime samples say so).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rankscope.analysis.compute import step_series as ss
from rankscope.analysis.conclude.compare import compare
from rankscope.analysis.conclude.compare_gate import GateRule, gate_checks
from rankscope.analysis.conclude.compare_model import GateConfig
from rankscope.analysis.conclude.kpis import Kpi
from rankscope.analysis.engine.driver import Analysis, analyze
from rankscope.analysis.store.reader import open_store
from rankscope.launchers import rundir, step_log
from rankscope.orchestrator.ingest.merge import merge_run_dir
from test_merge import DATA, SKEW_NS, make_run_dir

#: When the generated steps start (ns since the epoch): the recorded job's own time.
T0_NS = int(
    json.loads((DATA / "cpu_gloo_4rank_skew" / "rank0.step5.pt.trace.json").read_text())[
        "baseTimeNanoseconds"
    ]
)


def true_ends(rank: int, n: int, step_ms: float = 100.0, late_ms: float = 0.0) -> np.ndarray:
    """True end (ns, reference clock) of steps 1..n of ``rank``: every ``step_ms``, the rank
    ``late_ms`` after the others."""
    return T0_NS + (np.arange(1, n + 1) * step_ms * 1e6).astype(np.int64) + int(late_ms * 1e6)


def write_log(run: Path, rank: int, steps: np.ndarray, ends: np.ndarray, wait: int = -1) -> Path:
    path = rundir.rank_dir(run, rank) / step_log.STEP_LOG_FILE
    step_log.append(path, [(int(s), int(e), wait) for s, e in zip(steps, ends, strict=True)])
    return path


def test_merge_aligns_step_logs_with_the_traces_clock_and_ignores_a_cut_record(
    tmp_path: Path,
) -> None:
    run = make_run_dir(tmp_path, DATA / "cpu_gloo_4rank_skew", samples_for={2: -SKEW_NS})
    n = 50
    steps = np.arange(1, n + 1)
    truth = {r: true_ends(r, n, late_ms=2.0 * r) for r in (0, 2, 3)}
    write_log(run, 0, steps, truth[0], wait=1_000)
    write_log(run, 2, steps, truth[2] + SKEW_NS)  # rank 2's clock is ahead
    path3 = write_log(run, 3, steps, truth[3])
    with path3.open("ab") as f:  # a record cut by a crash
        f.write(step_log.encode([(n + 1, int(truth[3][-1]) + 10**8, -1)])[:13])
    # rank 1 has no step log (a run before issue 30): no table, no problem
    out = merge_run_dir(run, scheduler="synchronous", quiet=True)
    with open_store(out) as s:
        assert s.step_log_ranks() == [0, 2, 3]
        assert s.step_log(1).empty and list(s.step_log(1).columns) == ["steps", "end", "wait"]
        clock = s.clock().set_index("rank")
        bound = int(clock.loc[2, "uncertainty_ns"])
        log2 = s.step_log(2)
        assert log2["steps"].tolist() == list(range(1, n + 1))
        assert np.abs(log2["end"].to_numpy() - truth[2]).max() <= bound
        # the very transform of the rank's trace events (clock.py): checked against the table
        c = clock.loc[2]
        raw = truth[2] + SKEW_NS
        expect = (
            raw
            + int(c["offset_ns"])
            + np.rint(float(c["drift_ppb"]) * (raw - int(c["t_ref_ns"])) / 1e9).astype(np.int64)
        )
        assert (log2["end"].to_numpy() == expect).all()
        assert (s.step_log(0)["end"].to_numpy() == truth[0]).all()  # the reference: as recorded
        assert (s.step_log(0)["wait"] == 1_000).all() and (log2["wait"] == -1).all()
        assert len(s.step_log(3)) == n  # the cut record is not there
        assert not s.problems()["problem"].str.contains("step log").any()
        assert s.changes().empty  # no changes.jsonl: an empty table with its columns


def test_a_bad_step_log_a_restarted_rank_and_bad_change_lines(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path, DATA / "cpu_gloo_4rank_skew", samples_for={2: -SKEW_NS})
    ends = true_ends(0, 10)
    ends[6] = ends[5] - 1  # the 7th record goes back in time: it and those after are ignored
    write_log(run, 0, np.arange(1, 11), ends)
    # rank 3 was restarted after 5 steps: its second attempt counts from 1 again, later
    write_log(run, 3, np.arange(1, 6), true_ends(3, 5))
    write_log(run, 3, np.arange(1, 9), true_ends(3, 8) + 10**9)
    change = {"step": 40, "kind": "rank", "before_ms": 100.0, "after_ms": 130.0, "rank": 2,
              "behind_ms": 30.0, "sentence": "step 40: rank 2 is 30 ms behind",
              "noticed_ns": T0_NS, "trigger": 1}  # fmt: skip
    (run / rundir.CHANGES_FILE).write_text(json.dumps(change) + "\n" + '{"step": 41, "ki\n')
    out = merge_run_dir(run, scheduler="synchronous", quiet=True)
    with open_store(out) as s:
        assert s.step_log(0)["steps"].tolist() == list(range(1, 7))
        problems = s.problems()["problem"].tolist()
        assert sum("does not follow" in p for p in problems) == 1
        assert any("record 7 of 10" in p for p in problems)
        assert sum("not understood" in p for p in problems) == 1
        log3 = s.step_log(3)
        assert log3["steps"].tolist() == list(range(1, 9))  # the last attempt
        assert (log3["end"].to_numpy() == true_ends(3, 8) + 10**9).all()
        assert sum("restarted 1 time(s); the 5 record(s)" in p for p in problems) == 1
        ch = s.changes()
        assert len(ch) == 1
        row = ch.iloc[0]
        assert (row["step"], row["kind"], row["rank"], row["trigger"]) == (40, "rank", 2, 1)
        assert row["after_ms"] == 130.0 and row["sentence"] == change["sentence"]


# -- the series' analysis against generated truth -----------------------------------------------


def _logs(ends: dict[int, np.ndarray], first: int = 1) -> dict[int, pd.DataFrame]:
    return {
        r: pd.DataFrame(
            {"steps": np.arange(first, first + len(e)), "end": e, "wait": np.full(len(e), -1)}
        )
        for r, e in ends.items()
    }


def test_job_step_time_spread_and_kpis_against_generated_truth() -> None:
    rng = np.random.default_rng(3)
    n, world = 300, 4
    true_ms = 100.0 + rng.uniform(0, 10, n)  # the job's step time of each step
    true_ms[150:] += 30.0  # slower from step 151 on
    job_end = T0_NS + np.cumsum(true_ms * 1e6).astype(np.int64)
    lag_ms = {r: rng.uniform(0, 5, n) for r in range(world)}  # how early each rank ends a step
    lag_ms[2][150:] = 0.0  # rank 2 ends last from step 151 on (it is the slow one)
    ends = {r: job_end - (lag_ms[r] * 1e6).astype(np.int64) for r in range(world)}
    latest = np.max(np.stack(list(ends.values())), axis=0)
    rs = ss.run_steps(range(world), _logs(ends).__getitem__, plot_bins=7)
    job = rs.job
    assert job["step"].tolist() == list(range(1, n + 1))
    assert np.isnan(job["step_ms"].iloc[0])
    assert np.allclose(job["step_ms"].to_numpy()[1:], np.diff(latest) / 1e6)
    stacked = np.stack(list(ends.values()))
    assert np.allclose(job["spread_ms"], (stacked.max(0) - stacked.min(0)) / 1e6)
    assert (job["slowest_rank"].to_numpy()[150:] == 2).all()
    k = ss.run_kpis(rs, samples_per_step=8)
    assert k is not None
    timed = np.diff(latest) / 1e6
    assert k.steps == n - 1 and k.ranks == world
    assert np.isclose(k.p50_ms, np.percentile(timed, 50))
    assert np.isclose(k.p99_ms, np.percentile(timed, 99))
    assert np.isclose(k.steps_per_s, (n - 1) / (timed.sum() / 1e3))
    assert k.samples_per_s is not None and np.isclose(k.samples_per_s, 8 * world * k.steps_per_s)
    # per rank: its own consecutive differences
    for r in range(world):
        mine = np.diff(ends[r]) / 1e6
        row = rs.rank_totals.set_index("rank").loc[r]
        assert row["steps"] == n - 1 and np.isclose(row["mean_ms"], mine.mean())


def test_plot_bins_lose_no_step() -> None:
    """Every step's time is in exactly one bin: the bins' counts and sums equal the input's,
    for the job and for every rank, with gaps and ranks of different lengths."""
    rng = np.random.default_rng(5)
    ends = {
        0: T0_NS + np.cumsum(rng.uniform(50, 150, 1001) * 1e6).astype(np.int64),
        1: T0_NS + np.cumsum(rng.uniform(50, 150, 640) * 1e6).astype(np.int64),
    }
    logs = _logs(ends)
    logs[1] = logs[1].drop(index=range(100, 110)).reset_index(drop=True)  # a gap in rank 1's log
    rs = ss.run_steps([0, 1], logs.__getitem__, plot_bins=37)
    assert len(rs.bins) == 37
    timed = rs.job["step_ms"].dropna()
    assert rs.bins["job_steps"].sum() == len(timed)
    assert np.isclose(rs.bins["job_sum_ms"].sum(), timed.sum())
    for r, log in logs.items():
        _, ms = ss.rank_step_times(log)
        mine = rs.rank_bins[rs.rank_bins["rank"] == r]
        assert mine["steps"].sum() == len(ms)
        assert np.isclose(mine["sum_ms"].sum(), ms.sum())
    # the bins tile the steps: consecutive, no overlap
    assert rs.bins["first_step"].iloc[0] == 1 and rs.bins["last_step"].iloc[-1] == 1001
    assert (rs.bins["first_step"].to_numpy()[1:] == rs.bins["last_step"].to_numpy()[:-1] + 1).all()
    ok = rs.bins.dropna(subset=["median_ms"])
    assert ((ok["min_ms"] <= ok["median_ms"]) & (ok["median_ms"] <= ok["max_ms"])).all()


def test_windows_from_meta_records() -> None:
    meta = {
        0: [
            {"index": 0, "first_step": 10, "last_step": 12},
            {"index": 1, "first_step": 160, "last_step": 162, "trigger": {"id": 1, "reason": "r"}},
        ],
        1: [{"index": 0, "first_step": 10, "last_step": 12}],
    }
    w = ss.run_windows(meta)
    assert w["window"].tolist() == [0, 1]
    assert w["first_step"].tolist() == [11, 161] and w["last_step"].tolist() == [13, 163]
    assert w["ranks"].tolist() == [2, 1]
    assert w["triggered"].tolist() == [False, True] and w["trigger"].tolist() == [-1, 1]
    assert w["reason"].tolist() == ["", "r"]


def test_no_step_logs_no_series() -> None:
    rs = ss.run_steps([0, 1], lambda r: pd.DataFrame({"steps": [], "end": [], "wait": []}))
    assert not rs.present and ss.run_kpis(rs) is None and rs.bins.empty


# -- compare and its gate on the whole run's steps ----------------------------------------------


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    """The real 4-rank job merged and analysed once (its windows' 3 steps), without step logs."""
    run = make_run_dir(tmp_path_factory.mktemp("run"), DATA / "cpu_gloo_4rank_straggler")
    return analyze(merge_run_dir(run, scheduler="synchronous", quiet=True))


def with_series(a: Analysis, seed: int, scale: float = 1.0, n: int = 300) -> Analysis:
    """``a`` with a generated whole-run series of ``n`` steps: 100-110 ms a step (× ``scale``)."""
    rng = np.random.default_rng(seed)
    ms = rng.uniform(100, 110, n) * scale
    end = T0_NS + np.cumsum(ms * 1e6).astype(np.int64)
    logs = _logs({r: end - r * 1_000 for r in range(4)})
    return dataclasses.replace(a, run_steps=ss.run_steps(range(4), logs.__getitem__))


def test_gate_uses_every_step_of_the_run(analysed: Analysis) -> None:
    """A 10 % step-time regression over 300 steps fails a 5 % gate on the whole run's steps
    (not on the windows' 3 steps, which are equal here); an unchanged run passes."""
    base = with_series(analysed, seed=1)
    gate = GateConfig(fail_above=0.05)
    slower = compare(base, with_series(analysed, seed=2, scale=1.10))
    checks = {ch.kpi: ch for ch in gate_checks(slower, gate)}
    assert str(Kpi.STEP_TIME) not in checks  # the whole run's series stands for it
    ch = checks[str(Kpi.RUN_STEP_TIME)]
    assert ch.failed and ch.rule is GateRule.WELCH
    assert ch.base_steps == 299 and ch.new_steps == 299
    assert 0.08 < ch.rel_change < 0.12
    row = slower.kpis[(slower.kpis["kpi"] == str(Kpi.RUN_STEP_TIME))].iloc[0]
    assert row["change"] == "regression" and row["base_steps"] == 299
    same = compare(base, with_series(analysed, seed=3))
    assert not any(ch.failed for ch in gate_checks(same, gate))
    # without step logs on one side, the windows' step time is gated as before
    old = compare(analysed, with_series(analysed, seed=2, scale=1.10))
    kpis = {ch.kpi for ch in gate_checks(old, gate)}
    assert str(Kpi.STEP_TIME) in kpis and str(Kpi.RUN_STEP_TIME) not in kpis
    assert any(n.startswith("only NEW kept step logs") for n in old.notes)
    assert not any("step logs" in n for n in slower.notes)


# -- what changed in a triggered window -----------------------------------------------------------

#: The op injected into rank 1's second window, and its duration (µs, Kineto's unit).
GROWN_OP, GROWN_US = "grown_op_injected", 20_000.0


def triggered_run(tmp: Path) -> Path:
    """The real 4-rank straggler job as a run whose second window (ProfilerSteps 3-4) was
    triggered, with rank 1 running one extra 20 ms op in its step 3, and generated step logs."""
    import gzip

    run = make_run_dir(tmp, DATA / "cpu_gloo_4rank_straggler")
    path = rundir.window_path(run, 1, 1)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    step3 = next(e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#3")
    doc["traceEvents"].append(
        {"ph": "X", "cat": "cpu_op", "name": GROWN_OP, "pid": step3["pid"], "tid": step3["tid"],
         "ts": step3["ts"] + 100, "dur": GROWN_US, "args": {}}
    )  # fmt: skip
    rundir.write_bytes_atomic(path, gzip.compress(json.dumps(doc).encode()))
    for rank in range(4):
        meta_path = rundir.rank_dir(run, rank) / rundir.META_JSON
        meta = json.loads(meta_path.read_text())
        meta["windows"] = [
            {"index": 0, "file": "window-000.json.gz", "first_step": 2, "last_step": 2},
            {"index": 1, "file": "window-001.json.gz", "first_step": 3, "last_step": 4,
             "trigger": {"id": 1, "reason": "rank 1 is 20 ms behind"}},
        ]  # fmt: skip
        rundir.write_json_atomic(meta_path, meta)
        write_log(run, rank, np.arange(1, 21), true_ends(rank, 20))
    change = {"step": 3, "kind": "rank", "before_ms": 34.0, "after_ms": 54.0, "rank": 1,
              "behind_ms": 20.0, "sentence": CHANGE_SENTENCE, "noticed_ns": T0_NS, "trigger": 1}  # fmt: skip
    (run / rundir.CHANGES_FILE).write_text(json.dumps(change) + "\n")
    return run


#: What the live monitor printed in :func:`triggered_run`.
CHANGE_SENTENCE = "step 3: rank 1 is 20 ms behind the median"


def test_what_changed_in_a_triggered_window(tmp_path: Path) -> None:
    from rankscope.analysis.conclude.run_steps import what_changed
    from rankscope.analysis.render.html_report import render_html
    from rankscope.analysis.render.summary_json import summary
    from rankscope.analysis.render.terminal import print_summary
    from rich.console import Console

    a = analyze(merge_run_dir(triggered_run(tmp_path), scheduler="synchronous", quiet=True))
    wins = a.run_steps.windows
    assert wins["triggered"].tolist() == [False, True]
    [w] = what_changed(a)
    assert (w.window, w.before, w.trigger) == (1, 0, 1)
    assert w.reason == "rank 1 is 20 ms behind"
    c = w.comparison
    assert c is not None
    # the step time of each side is the window's own steps' (the breakdown's, mean over ranks)
    bd = a.breakdown
    for steps, got in (({2}, w.before_ms), ({3, 4}, w.after_ms)):
        mine = bd[bd["step"].isin(steps)]
        assert np.isclose(got, mine.groupby("step")["total_ns"].mean().mean() / 1e6)
    op = next(o for o in w.ops if o[0] == GROWN_OP)
    steps_rank1 = len(c.new.values(Kpi.STEP_TIME, 1))
    assert op[2] == 0.0 and np.isclose(op[3], GROWN_US / 1e3 / steps_rank1) and op[4] == 1
    assert w.ops[0][0] == GROWN_OP  # the largest growth
    doc = summary(a)
    [entry] = doc["run_steps"]["what_changed"]
    assert entry["window"] == 1 and entry["ops"][0]["name"] == GROWN_OP
    assert GROWN_OP in entry["sentence"]
    page = render_html(a)
    assert "What changed in the triggered windows" in page and GROWN_OP in page
    assert "step time over the whole run" in page  # the plot
    assert "<title>triggered window 1: rank 1 is 20 ms behind, steps 4-5</title>" in page
    assert "<title>window 0, steps 3-3</title>" in page
    assert f"<title>{CHANGE_SENTENCE}</title></line>" in page  # the change, marked
    assert doc["run_steps"]["changes"][0]["sentence"] == CHANGE_SENTENCE
    console = Console(record=True, width=400)
    print_summary(a, console)
    text = console.export_text()
    assert "whole run: 19 steps timed on 4 rank(s)" in text and GROWN_OP in text
    assert "1 change(s) noticed while it ran; 2 profiler window(s), 1 triggered" in text


def test_a_long_run_is_drawn_in_bins() -> None:
    """100,000 steps of 2 ranks: each line of the plot has one point per bin, not per step."""
    from rankscope.analysis.render.run_steps_section import run_steps_svg

    rng = np.random.default_rng(7)
    n = 100_000
    ends = {r: T0_NS + np.cumsum(rng.uniform(90, 110, n) * 1e6).astype(np.int64) for r in (0, 1)}
    rs = ss.run_steps([0, 1], _logs(ends).__getitem__)
    assert len(rs.bins) == ss.PLOT_BINS
    svg = run_steps_svg(rs)
    lines = svg.split("<polyline points='")[1:]
    assert len(lines) == 2  # the median rank and the job
    assert all(len(line.split("'")[0].split()) == ss.PLOT_BINS for line in lines)
    assert rs.bins["job_steps"].sum() == n - 1


def test_the_rank_named_is_the_one_whose_own_time_rose() -> None:
    """Rank 2 does 30 ms more work a step: every rank's step time rises by 30 ms (they wait
    for it), only rank 2's own time (step minus waiting) does; the others' waits rise."""
    from types import SimpleNamespace

    from rankscope.analysis.conclude.kpis import Kpis
    from rankscope.analysis.conclude.run_steps import _slower_ranks

    def kpis(extra_ms: float) -> Kpis:
        rows = []
        for rank in range(3):
            for step in range(5):
                own = 0.050 + (extra_ms / 1e3 if rank == 2 else 0.0)
                wait = 0.005 + (extra_ms / 1e3 if rank != 2 else 0.0)
                rows += [("step_time", rank, step, own + wait), ("wait", rank, step, wait)]
        samples = pd.DataFrame(rows, columns=["kpi", "rank", "step", "value"])
        return Kpis(pd.DataFrame(), samples, "run", 3, [0, 1, 2], list(range(5)), "cpu")

    named = _slower_ranks(SimpleNamespace(base=kpis(0.0), new=kpis(30.0)))  # type: ignore[arg-type]
    assert [r for r, _, _ in named] == [2]
    assert np.isclose(named[0][1], 50.0) and np.isclose(named[0][2], 80.0)
