"""Stragglers: significance, wait caused, cause; and no straggler for a balanced run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysis_frames import collectives
from rankscope.analysis.compute.collectives import collective_waits
from rankscope.analysis.compute.stragglers import (
    OWN_FRACTION,
    Cause,
    Verdict,
    binomial_p_value,
    find_stragglers,
)
from rankscope.analysis.conclude.findings import no_straggler_evidence, straggler_evidence

MS = 1_000_000
STEP = 100 * MS


def _run(
    late_rank: int, late_ms: float, kind: str, n_coll: int = 12, world: int = 4, seed: int = 0
):
    """Synthetic run: collectives every STEP; ``late_rank`` arrives ``late_ms`` late because of
    ``kind`` ("compute", "input", "idle" or "propagated"); jitter of ±0.3 ms everywhere."""
    rng = np.random.default_rng(seed)
    arr: dict[int, list[int]] = {r: [] for r in range(world)}
    end: dict[int, list[int]] = {r: [] for r in range(world)}
    wins = []
    for k in range(n_coll):
        base = k * STEP
        a = {r: base + 50 * MS + int(rng.uniform(-0.3, 0.3) * MS) for r in range(world)}
        extra = int(late_ms * MS)
        if late_rank >= 0:
            a[late_rank] += extra
        last = max(a.values())
        for r in range(world):
            arr[r].append(a[r])
            end[r].append(last + 2 * MS)
            wstart = base + 2 * MS if k else base
            if kind == "propagated" and r == late_rank:
                wstart += extra  # it left its previous sync point late: not its own work
            span = a[r] - wstart
            compute, inp, idle = span - 10 * MS, 5 * MS, 5 * MS
            if r == late_rank and kind != "propagated":
                compute -= extra  # the same baseline work, then the extra on one account
                if kind == "compute":
                    compute += extra
                elif kind == "input":
                    inp += extra
                else:
                    idle += extra
            wins.append((k, r, k, wstart, a[r], a[r], compute, inp, idle, 0))
    waits = collective_waits(collectives(arr, end))
    windows = pd.DataFrame(
        wins,
        columns=[
            "coll",
            "rank",
            "step",
            "window_start",
            "window_end",
            "arrival",
            "compute_ns",
            "input_ns",
            "idle_ns",
            "comm_ns",
        ],
    )
    profiled = pd.Series([n_coll * STEP] * world, index=range(world))
    return find_stragglers(waits, windows, profiled)


@pytest.mark.parametrize(
    ("rank", "kind", "cause"),
    [
        (2, "compute", Cause.OWN_COMPUTE),
        (1, "input", Cause.INPUT),
        (3, "idle", Cause.HOST),
    ],
)
def test_late_rank_is_the_straggler_with_its_cause(rank: int, kind: str, cause: Cause) -> None:
    s = _run(rank, 20, kind)
    top = s.iloc[0]
    assert top["rank"] == rank and top["is_straggler"]
    assert top["times_last"] == 12 and top["cause"] == cause
    assert top["wait_share"] > 0.9 and top["wait_caused_s"] == pytest.approx(
        12 * 3 * 0.020, rel=0.05
    )
    assert top["confidence"] > 0.99 and top["score"] > 5
    assert s["is_straggler"].sum() == 1


def test_propagated_lateness_is_explained_but_not_named() -> None:
    """Late at every collective because it left the previous sync point late, not by its own
    work: the cause says so, and it is no straggler (fixing the rank would buy nothing; in flat
    jobs this is the collective's own completion order or a late wake-up: 7 of 60 balanced real
    runs had such a rank, docs/analysis.md)."""
    s = _run(0, 20, "propagated")
    top = s.iloc[0]
    assert top["rank"] == 0 and top["times_last"] == 12 and top["cause"] == Cause.PROPAGATED
    assert top["p_value"] < 1e-6 and top["wait_share"] > 0.9
    assert not s["is_straggler"].any()
    assert top["verdict"] == Verdict.PROPAGATED
    # and the "No straggler" finding says why the rank last at every collective is not named
    text = no_straggler_evidence(24, top.to_dict())
    assert "rank 0 was last in" in text and "propagated" in text and "not named" in text


@pytest.mark.parametrize("seed", range(6))
def test_balanced_run_has_no_straggler(seed: int) -> None:
    s = _run(-1, 0, "compute", seed=seed)
    assert not s["is_straggler"].any()
    assert set(s["verdict"]) <= {Verdict.NEVER_LAST, Verdict.NOT_SIGNIFICANT, Verdict.SMALL_SHARE}


def test_small_lateness_is_not_material() -> None:
    # always last, but only by 0.5 ms per 100 ms step: significant, yet not worth reporting
    s = _run(2, 0.5, "compute")
    assert s.iloc[0]["rank"] == 2 and s.iloc[0]["p_value"] < 0.01
    assert not s["is_straggler"].any() and s.iloc[0]["verdict"] == Verdict.IMMATERIAL
    assert "too small to matter" in no_straggler_evidence(24, s.iloc[0].to_dict())


def _steps_run(
    late: dict[int, list[float]],
    runq: dict[int, list[float]] | None = None,
    per_step: int = 2,
    world: int = 4,
    jitter_ms: float = 0.3,
    seed: int = 0,
) -> pd.DataFrame:
    """Synthetic steps of ``per_step`` collectives (the second a DDP bucket right after the
    first: a late rank is late at both); ``late[rank][s]`` ms late in step s (before its first
    collective, by its own compute), ``runq[rank][s]`` ms of run-queue delay recorded in step s
    (the runtime's ``step_cpu``). Returns find_stragglers' table."""
    from rankscope.analysis.compute.stragglers import STEP_CPU_COLUMNS

    rng = np.random.default_rng(seed)
    steps = len(next(iter(late.values()))) if late else 6
    arr: dict[int, list[int]] = {r: [] for r in range(world)}
    end: dict[int, list[int]] = {r: [] for r in range(world)}
    wins = []
    for st in range(steps):
        base = st * STEP
        delay = {r: int(late.get(r, [0.0] * steps)[st] * MS) for r in range(world)}
        first = {
            r: base + 50 * MS + delay[r] + int(rng.uniform(-1, 1) * jitter_ms * MS)
            for r in range(world)
        }
        for j in range(per_step):
            a = {r: first[r] + j * MS // 10 for r in range(world)}
            last = max(a.values())
            k = st * per_step + j
            for r in range(world):
                arr[r].append(a[r])
                end[r].append(last + 2 * MS)
                span = a[r] - (base + 2 * MS)
                wins.append(
                    (k, r, st, base + 2 * MS, a[r], a[r], span - 10 * MS, 5 * MS, 5 * MS, 0)
                )
    waits = collective_waits(collectives(arr, end))
    cols = ["coll", "rank", "step", "window_start", "window_end", "arrival"]
    windows = pd.DataFrame(wins, columns=[*cols, "compute_ns", "input_ns", "idle_ns", "comm_ns"])
    profiled = pd.Series([steps * STEP] * world, index=range(world))
    cpu = None
    if runq is not None:
        rows = [
            (r, st, STEP, STEP // 2, int((runq.get(r) or [0.0] * steps)[st] * MS))
            for r in range(world)
            for st in range(steps)
        ]
        cpu = pd.DataFrame(rows, columns=list(STEP_CPU_COLUMNS)).astype(STEP_CPU_COLUMNS)
    return find_stragglers(waits, windows, profiled, step_cpu=cpu, step_ns=float(STEP))


def test_collectives_of_one_step_are_one_sample() -> None:
    """Last at both collectives of each of 3 steps: 3 samples, not 6 (p = 1/4^3, not 1/4^6)."""
    s = _steps_run({2: [20.0, 20.0, 20.0]})
    top = s.iloc[0]
    assert top["rank"] == 2 and top["is_straggler"]
    assert top["times_last"] == 6 and top["collectives"] == 6
    assert top["units"] == 3 and top["units_last"] == 3
    assert top["p_value"] == pytest.approx(1 / 64)


def test_one_slow_step_is_not_a_straggler() -> None:
    """30 ms late in one step of three (a page fault, a preemption): not consistent, not named,
    although it is last at a third of the collectives and caused most of the waiting."""
    s = _steps_run({1: [30.0, 0.0, 0.0]})
    assert not s["is_straggler"].any(), s.head(2).to_string()


def test_lateness_within_the_step_to_step_noise_is_not_named() -> None:
    """Always last by 4 ms (material: 4 % of the step), but the ranks' arrivals move by ~10 ms
    from step to step: 3 steps cannot tell that from chance (3 standard errors of the median)."""
    s = _steps_run({3: [4.0, 4.0, 4.0]}, jitter_ms=0.0, seed=1)
    assert s.iloc[0]["rank"] == 3 and s.iloc[0]["is_straggler"]  # quiet: named
    noisy = {r: [8.0, -6.0, 2.0] if r % 2 else [-7.0, 9.0, -3.0] for r in range(3)}
    s = _steps_run({**noisy, 3: [13.0, 13.0, 13.0]}, jitter_ms=0.0, seed=1)
    top = s.iloc[0]
    assert top["rank"] == 3 and top["units_last"] == 3 and not top["is_straggler"]
    assert top["noise_s"] > 0.005 and top["verdict"] == Verdict.WITHIN_NOISE
    assert "within the step-to-step noise" in no_straggler_evidence(6, top.to_dict())


def test_cpu_taken_by_other_processes_is_said_not_blamed_on_the_rank() -> None:
    """A rank late because its main thread waited for a core (run-queue delay beyond the median
    rank's, recorded per step): its cause is "CPU taken by other processes" — and when that
    moves between ranks from step to step, nobody is named."""
    s = _steps_run({1: [15.0] * 6}, runq={1: [15.0] * 6})
    top = s.iloc[0]
    assert top["rank"] == 1 and top["is_straggler"]
    assert top["cause"] == Cause.CPU_CONTENTION and top["contention_s"] > 0.08
    # its evidence is the delay (6 x 15 ms, all of its lateness), not only "own extra work"
    assert top["contention_share"] > 0.95
    said = straggler_evidence(top.to_dict())
    assert f"waited {top['contention_s'] * 1e3:.1f} ms more than the median rank's" in said
    assert "(run-queue delay, summed over its 6 profiled steps: 100% of its lateness" in said
    # three steps of it are within the scheduler's lottery on a busy node: some rank of four is
    # starved in all three by chance in 4/64 of the runs (significance corrected over ranks)
    s = _steps_run({1: [15.0] * 3}, runq={1: [15.0] * 3})
    assert s.iloc[0]["cause"] == Cause.CPU_CONTENTION and not s["is_straggler"].any()
    moving = {0: [15.0, 0.0, 0.0], 1: [0.0, 15.0, 0.0], 2: [0.0, 0.0, 15.0]}
    s = _steps_run({**moving, 3: [6.0, 6.0, 6.0]}, runq=moving)
    top = s.iloc[0]
    # once the stolen time is taken off, rank 3's own 6 ms make it the last in every step
    assert top["rank"] == 3 and top["units_last"] == 3 and top["cause"] == Cause.OWN_COMPUTE
    assert top["is_straggler"] and s["is_straggler"].sum() == 1


def test_contention_does_not_name_a_second_rank_in_the_masked_round() -> None:
    """The issue's real case: rank 3 injected (40 ms); in the second look, with rank 3 set aside,
    contention made another rank last in most steps by a few ms, moving between steps."""
    steps = 10
    rng = np.random.default_rng(7)
    contention = {r: [float(rng.choice([0.0, 0.0, 4.0])) for _ in range(steps)] for r in range(3)}
    late = {**contention, 3: [40.0] * steps}
    s = _steps_run(late, runq=contention)
    assert s[s["is_straggler"]]["rank"].tolist() == [3], s.head(3).to_string()


def test_binomial_p_value() -> None:
    assert binomial_p_value(3, 3, 0.25) == pytest.approx(1 / 64)
    assert binomial_p_value(0, 10, 0.25) == 1.0


@pytest.mark.parametrize("n", [1, 2, 7, 40, 333, 5000, 120_000])
@pytest.mark.parametrize("chance", [1 / 2, 1 / 4, 1 / 8, 1 / 1024, 0.93])
def test_binomial_p_value_equals_scipy(n: int, chance: float) -> None:
    """The math-only tail equals scipy's survival function over the whole range of counts."""
    from scipy.stats import binom

    for k in sorted({1, 2, n // 3, int(n * chance), int(n * chance) + 1, n // 2, n - 1, n}):
        if k < 1:
            continue
        expected = float(binom.sf(k - 1, n, chance))
        got = binomial_p_value(k, n, chance)
        if expected < 1e-290:
            assert got < 1e-280
        elif expected < 0.5:
            assert got == pytest.approx(expected, rel=1e-7), (k, n, chance)
        else:
            assert got == pytest.approx(expected, abs=1e-9), (k, n, chance)


def test_real_gloo_straggler_is_rank_2_by_its_own_compute(data_dir, tmp_path) -> None:
    """tests/data/cpu_gloo_4rank_straggler: rank 2 sleeps 20 ms per step in record_function."""
    from analysis_frames import merged
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    a = analyze(
        merged(data_dir, "cpu_gloo_4rank_straggler", tmp_path), ClusterSpec(scheduler=SYNCHRONOUS)
    )
    assert a.straggler_ranks() == [2]
    top = a.stragglers.iloc[0]
    assert top["cause"] == Cause.OWN_COMPUTE and top["times_last"] == 3
    assert top["compute_extra_s"] > 0.015


def test_real_gloo_skew_straggler_is_rank_2_as_without_skew(data_dir, tmp_path) -> None:
    """tests/data/cpu_gloo_4rank_skew: the same job with rank 2 under libfaketime +750 ms. With
    ranks 1 and 3 kept on rank 0's host clock (same host, causality allows 0), rank 2's offset is
    fitted against them and the straggler comes out as on the unskewed set."""
    from analysis_frames import merged
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    a = analyze(
        merged(data_dir, "cpu_gloo_4rank_skew", tmp_path), ClusterSpec(scheduler=SYNCHRONOUS)
    )
    assert a.straggler_ranks() == [2]
    top = a.stragglers.iloc[0]
    assert top["cause"] == Cause.OWN_COMPUTE and top["times_last"] == 3


def test_param_dlrm_result(data_dir, tmp_path) -> None:
    """The written-down result of docs/analysis.md (HTA's potential stragglers: [2, 7]): rank 7 is
    last most often (5 of 8 collectives) but causes only a third of the wait, and the 8
    collectives are ONE profiled step: one sample, which cannot make anything significant (its
    p-value is the chance of being last in one step, 1/8). No straggler."""
    from analysis_frames import merged
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    a = analyze(merged(data_dir, "param_dlrm_8rank", tmp_path), ClusterSpec(scheduler=SYNCHRONOUS))
    assert a.straggler_ranks() == []
    top = a.stragglers.iloc[0]
    assert top["rank"] == 7 and top["times_last"] == 5 and top["collectives"] == 8
    assert top["units"] == 1 and top["units_last"] == 1
    assert top["p_value"] == pytest.approx(1 / 8) and top["wait_share"] < 0.5


# -- fresh runs of the example (real torchrun, 4 ranks, gloo) --------------------------------

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py"
STEPS = "12"


def _fresh_run(tmp_path: Path, name: str, *script_args: str) -> Path:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankscope.orchestrator",
            "run",
            "--nproc-per-node",
            "4",
            "--out",
            str(tmp_path),
            "--name",
            name,
            "--repeat",
            "0",
            "--no-analyze",
            str(EXAMPLE),
            "--steps",
            STEPS,
            *script_args,
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir() and f"-{name}-" in p.name]
    assert (run / "trace.h5").exists()
    return run


def _stragglers(run: Path) -> pd.DataFrame:
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    return analyze(run, ClusterSpec(scheduler=SYNCHRONOUS)).stragglers


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("rank", "ms"), [(3, 40)])
def test_fresh_run_straggler_is_found_with_own_compute(rank: int, ms: int, tmp_path: Path) -> None:
    """One real run (the rates over many, balanced and injected, with and without a busy loop
    beside them: benchmarks/straggler_rates.py, docs/analysis.md)."""
    run = _fresh_run(
        tmp_path, f"strag{rank}", "--straggler-rank", str(rank), "--straggler-ms", str(ms)
    )
    s = _stragglers(run)
    top = s.iloc[0]
    assert top["rank"] == rank and top["is_straggler"] and top["cause"] == Cause.OWN_COMPUTE
    assert s["is_straggler"].sum() == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fresh_run_slow_input_is_found_with_cause_input(tmp_path: Path) -> None:
    run = _fresh_run(tmp_path, "input", "--input-delay-ms", "40", "--input-delay-rank", "2")
    s = _stragglers(run)
    top = s.iloc[0]
    assert top["rank"] == 2 and top["is_straggler"] and top["cause"] == Cause.INPUT


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fresh_balanced_run_has_no_straggler(tmp_path: Path) -> None:
    """No rank is named for work of its own. On a node where other processes take CPU (a CI
    run with a busy loop on one core named rank 3: 37 ms of run-queue delay against 18 ms of
    extra work), a starved rank may be named, but only with the system cause and the
    run-queue delay as its evidence (Cause.CPU_CONTENTION: the issue's "CPU taken by other
    processes")."""
    from rankscope.analysis.compute.stragglers import Cause

    run = _fresh_run(tmp_path, "balanced")
    s = _stragglers(run)
    named = s[s["is_straggler"]]
    assert (named["cause"] == str(Cause.CPU_CONTENTION)).all(), s.head(2).to_string()
    # the evidence is the run-queue delay: at least half of its lateness (OWN_FRACTION). Not
    # "more than its own extra work": a rank that loses its core inside an op runs that op longer,
    # so the stolen time shows in both (a CI run: 15.3 ms of delay, 24.3 ms of longer own work)
    assert (named["contention_share"] >= OWN_FRACTION).all(), s.head(2).to_string()
    for row in named.to_dict("records"):
        said = straggler_evidence(row)
        assert "ms more than the median rank's for a core (run-queue delay" in said
