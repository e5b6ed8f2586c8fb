"""What if: the replay reproduces the measured steps, and its predictions match reality.

* Fidelity: replaying every store of tests/data unmodified gives its measured step times back.
* Synthetic truth (``rankscope synth``): a job with a straggler / slow input / jitter and its
  twin without (same seed: a "clean" straggler of 1e-6 ms draws the same random numbers), the
  predicted saving within 10 % of the difference of the two measured step times.
* Real runs (slow): ``examples/train_ddp.py`` with and without ``--straggler-rank 2``, 25 %.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rankscope.analysis import whatif as wi

#: tests/data stores replayed (``hta/df_index_resolver``, 54 MB of one rank, is the ingest
#: benchmark: one rank, nothing to replay across ranks).
STORES = [
    "cpu_gloo_4rank_straggler",
    "cpu_gloo_4rank_skew",
    "cpu_gloo_4rank_ddp_buckets",
    "cpu_gloo_4rank_pipeline",
    "cpu_gloo_4rank_pipeline_balanced",
    "param_dlrm_8rank",
    "hta/trace_filter_2rank",
    "hta/nccl_parser_config",
]


@pytest.fixture(scope="module")
def models(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rankscope.analysis.store import open_store
    from rankscope.orchestrator.merge import merge_run_dir

    root = tmp_path_factory.mktemp("whatif")
    out: dict[str, Any] = {}
    for name in STORES:
        path = merge_run_dir(
            data_dir / name, output=root / (name.replace("/", "_") + ".h5"), quiet=True
        )
        with open_store(path) as store:
            out[name] = (path, wi.model_of_store(store))
    return out


@pytest.mark.parametrize("name", STORES)
def test_replay_of_the_unmodified_job_gives_the_measured_steps(models: dict, name: str) -> None:
    _, model = models[name]
    fid = wi.fidelity(model)
    assert len(fid) >= 1
    # exact by construction on all of them (0.0 %); "a few %" is the contract
    assert fid["error_pct"].abs().max() < 1.0, fid.to_string()
    # every replayed node is no later than measured (the weights are parts of measured spans)
    t = wi.replay(model)
    assert (t <= model.nodes["time_ns"].to_numpy() + 1).all()


def test_the_straggler_scenario_on_the_quickstart_store(models: dict) -> None:
    _, model = models["cpu_gloo_4rank_ddp_buckets"]
    table = wi.scenarios(model, stragglers=[2])
    assert list(table.columns) == list(wi.SCENARIO_COLUMNS)
    row = table.set_index("scenario").loc[wi.STRAGGLER_LIKE_MEDIAN]
    # rank 2 waits 20 ms at the start of every step (measured 43.0 -> 27.2 ms per step)
    assert row["rank"] == 2
    assert 14e6 < row["saving_ns"] < 22e6
    allm = table.set_index("scenario").loc[wi.ALL_LIKE_MEDIAN]
    # the job-wide median (of all 4) can sit a little above the median of the 3 others
    assert allm["saving_ns"] >= 0.9 * row["saving_ns"]
    assert (table["predicted_step_ns"] <= table["replayed_step_ns"] + 1).all()


def test_what_if_names_the_stragglers_and_bottlenecks_itself(models: dict) -> None:
    path, _ = models["cpu_gloo_4rank_pipeline"]
    table = wi.what_if(path)
    rows = table[table["scenario"] == wi.BOTTLENECK_LIKE_MEDIAN]
    assert rows["rank"].tolist() == [1]  # --slow-stage 1 --slow-ms 10
    assert rows["saving_pct"].iloc[0] > 30


def test_a_user_scenario_scales_one_ranks_events(models: dict) -> None:
    from rankscope.analysis.store import open_store

    path, model = models["cpu_gloo_4rank_ddp_buckets"]
    with open_store(path) as store:
        events = store.events(2)
    mask = events["name"].astype(str).str.contains("straggler").to_numpy()
    assert mask.any()
    gone = wi.scale_events(model, events, 2, mask, 0.0, "rank 2 without its extra work")
    half = wi.scale_events(model, events, 2, mask, 0.5)
    table = wi.scenarios(model, stragglers=[2], custom=[gone, half]).set_index("scenario")
    fixed = table.loc[wi.STRAGGLER_LIKE_MEDIAN, "saving_ns"]
    assert table.loc["rank 2 without its extra work", "saving_ns"] == pytest.approx(fixed, rel=0.1)
    assert 0 < table.loc[half.name, "saving_ns"] < fixed


# -- synthetic truth -------------------------------------------------------------------------

#: (job, clean twin, rank fixed or -1, scenario); 1e-6 ms: a straggler that draws the seed's
#: random numbers like the real one (same jitter everywhere) and adds 1 ns.
CASES: dict[str, tuple[dict, dict, int, str]] = {
    "straggler": (
        {"stragglers": [(5, 3.0, 1.0)]},
        {"stragglers": [(5, 1e-6, 1.0)]},
        5,
        wi.STRAGGLER_LIKE_MEDIAN,
    ),
    "intermittent": (
        {"stragglers": [(5, 3.0, 0.3)]},
        {"stragglers": [(5, 1e-6, 0.3)]},
        5,
        wi.STRAGGLER_LIKE_MEDIAN,
    ),
    "slow-input-rank": ({"slow_input": [(3, 3.0)]}, {}, 3, wi.STRAGGLER_LIKE_MEDIAN),
    "input": ({"input_ms": 3.0}, {"input_ms": 0.001}, -1, wi.NO_INPUT_STALL),
    "jitter": ({}, {"jitter": 0.0}, -1, wi.ALL_LIKE_MEDIAN),
}


def _synth_saving(root: Path, ranks: int, case: str) -> tuple[float, float]:
    """(predicted, measured) saving of ``case`` at ``ranks`` ranks, ns per step (mean)."""
    from rankscope.analysis.pipeline import SYNCHRONOUS
    from rankscope.analysis.store import open_store
    from rankscope.orchestrator.merge import merge_run_dir
    from rankscope.orchestrator.synth import SynthConfig, generate

    bad, good, rank, scenario = CASES[case]
    models = []
    for name, knobs in (("job", bad), ("clean", good)):
        out = root / f"{ranks}-{case}-{name}"
        config = SynthConfig(ranks=ranks, ranks_per_host=8, steps=10, seed=1, **knobs)
        generate(config, out)
        store = merge_run_dir(out, output=out / "trace.h5", scheduler=SYNCHRONOUS, quiet=True)
        with open_store(store) as s:
            models.append(wi.model_of_store(s))
    job, clean = models
    measured = wi.step_times(job)["step_ns"].mean() - wi.step_times(clean)["step_ns"].mean()
    table = wi.scenarios(job, stragglers=[rank] if rank >= 0 else [])
    row = table[(table["scenario"] == scenario) & (table["rank"] == rank)].iloc[0]
    assert row["replay_error_pct"] < 1.0
    return float(row["saving_ns"]), float(measured)


@pytest.mark.parametrize("case", ["straggler", "intermittent", "slow-input-rank", "input"])
def test_synthetic_saving_matches_the_job_without_it_32_ranks(case: str, tmp_path: Path) -> None:
    predicted, measured = _synth_saving(tmp_path, 32, case)
    assert measured > 0.5e6
    assert predicted == pytest.approx(measured, rel=0.10)


@pytest.mark.slow
def test_all_ranks_like_the_median_matches_a_job_without_jitter(tmp_path: Path) -> None:
    predicted, measured = _synth_saving(tmp_path, 32, "jitter")
    assert predicted == pytest.approx(measured, rel=0.10)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["straggler", "intermittent", "input"])
def test_synthetic_saving_matches_the_job_without_it_256_ranks(case: str, tmp_path: Path) -> None:
    predicted, measured = _synth_saving(tmp_path, 256, case)
    assert predicted == pytest.approx(measured, rel=0.10)


# -- real runs (torchrun, 4 ranks, gloo) -----------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(tmp_path: Path, name: str, script: str, *args: str) -> tuple[Path, list[float]]:
    """A fresh ``rankscope run`` (12 steps, every step after the first two profiled); its store
    and rank 0's per-step wall times (``--step-times``) over the profiled steps."""
    import subprocess
    import sys

    times = tmp_path / f"{name}-{{rank}}.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "rankscope.orchestrator", "run", "--nproc-per-node", "2",
            "--out", str(tmp_path), "--name", name, "--wait", "1", "--warmup", "1",
            "--active", "10", "--repeat", "1", "--no-analyze",
            str(EXAMPLES / script), "--steps", "12", "--step-times", str(times), *args,
        ],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir() and f"-{name}-" in p.name]
    step_s = json.loads(Path(str(times).format(rank=0)).read_text())["step_s"]
    return run, step_s[2:]


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[float]]]:
    root = tmp_path_factory.mktemp("whatif-real")
    return {
        "straggler": _run(
            root, "strag", "train_ddp.py", "--straggler-rank", "1", "--straggler-ms", "20"
        ),
        "clean": _run(root, "clean", "train_ddp.py"),
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_run_straggler_saving_within_25_percent(real_runs: dict) -> None:
    from rankscope.analysis.store import open_store

    (run, steps_s), (clean_run, clean_s) = real_runs["straggler"], real_runs["clean"]
    with open_store(run) as store:
        model = wi.model_of_store(store)
    with open_store(clean_run) as store:
        clean = wi.model_of_store(store)
    row = wi.scenarios(model, stragglers=[1]).iloc[0]
    assert row["scenario"] == wi.STRAGGLER_LIKE_MEDIAN
    measured = wi.step_times(model)["step_ns"].mean() - wi.step_times(clean)["step_ns"].mean()
    # the same saving by the example's own clock (rank 0's step wall times)
    by_clock = (np.mean(steps_s) - np.mean(clean_s)) * 1e9
    # needs a CPU per rank: on 2 oversubscribed cores the straggler's 20 ms wait frees a core
    # for the others, and the twin runs differ by 1-3 ms, not ~20 (measured here: 3.2 ms)
    assert measured > 10e6, (measured, by_clock, row["saving_ns"])
    assert row["saving_ns"] == pytest.approx(measured, rel=0.25), (row.to_dict(), by_clock)
