"""`rankscope analyze`: Dask schedulers give identical results, files, run directories, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pandas as pd
import pytest
from analysis_frames import merged
from rankscope.analysis.engine.driver import LOCAL, SYNCHRONOUS, Analysis, ClusterSpec, analyze
from rankscope.analysis.render.report import SUMMARY_SCHEMA, SUMMARY_VERSION
from rankscope.orchestrator.cli import main as cli_main

FRAMES = (
    "breakdown",
    "hta",
    "waits",
    "windows",
    "stragglers",
    "verdicts",
    "op_stats",
    "ops",
    "annotations",
)


@pytest.fixture(scope="module")
def store(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return merged(data_dir, "cpu_gloo_4rank_straggler", tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def gpu_store(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return merged(data_dir, "param_dlrm_8rank", tmp_path_factory.mktemp("gpu"))


def _assert_same(a: Analysis, b: Analysis) -> None:
    for name in FRAMES:
        pd.testing.assert_frame_equal(
            getattr(a, name), getattr(b, name), check_exact=True, obj=name
        )


@pytest.mark.timeout(300)
def test_results_identical_whatever_the_scheduler(gpu_store: Path) -> None:
    from distributed import LocalCluster

    sync = analyze(gpu_store, ClusterSpec(scheduler=SYNCHRONOUS))
    local = analyze(gpu_store, ClusterSpec(scheduler=LOCAL, workers=2))
    _assert_same(sync, local)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        remote = analyze(gpu_store, ClusterSpec(scheduler=cluster.scheduler_address))
    _assert_same(sync, remote)
    assert len(sync.breakdown) and len(sync.waits)


def test_cluster_spec_validation() -> None:
    with pytest.raises(ValueError, match="slurm_workers"):
        ClusterSpec(slurm_workers=0)
    with pytest.raises(ValueError, match="not both"):
        ClusterSpec(scheduler="tcp://x:1", slurm_workers=2)


def test_cli_prints_and_writes_json_and_html(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, out_html = tmp_path / "out" / "summary.json", tmp_path / "report.html"
    rc = cli_main(
        [
            "analyze",
            str(store),
            "--scheduler",
            SYNCHRONOUS,
            "--json",
            str(out_json),
            "--html",
            str(out_html),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "Stragglers" in text and "own compute" in text and "Clock alignment" in text
    doc = json.loads(out_json.read_text())
    assert doc["schema"] == SUMMARY_SCHEMA and doc["version"] == SUMMARY_VERSION
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    for r in doc["ranks"]:
        for key in (
            "host",
            "total_s",
            "compute_s",
            "comm_s",
            "comm_exposed_s",
            "comm_wait_s",
            "comm_transfer_s",
            "memory_s",
            "input_s",
            "idle_s",
            "verdict",
        ):
            assert key in r
    assert [s["rank"] for s in doc["stragglers"]] == [2]
    assert set(doc["stragglers"][0]) >= {
        "rank",
        "score",
        "confidence",
        "times_last",
        "wait_caused_s",
        "cause",
    }
    assert {c["method"] for c in doc["clock"]} <= {
        "reference",
        "runtime",
        "runtime+collectives",
        "collectives",
        "raw",
        "same-host",
    }
    assert doc["collectives"]["count"] == 3
    assert out_html.read_text().startswith("<!DOCTYPE html>")
    assert not list(tmp_path.rglob("*.tmp"))


def test_run_dir_without_store_is_merged_and_reports_go_to_report_dir(
    data_dir: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(data_dir / "cpu_gloo_4rank_straggler", run)
    rc = cli_main(["analyze", str(run), "--scheduler", SYNCHRONOUS])
    assert rc == 0
    assert (run / "trace.h5").exists()
    assert json.loads((run / "report" / "summary.json").read_text())["stragglers"][0]["rank"] == 2
    assert (run / "report" / "report.html").exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rankscope.orchestrator",
            "analyze",
            *args,
            "--scheduler",
            SYNCHRONOUS,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _newer_store(src: Path, dst: Path) -> Path:
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        f.attrs["schema_version"] = 99
    return dst


def _foreign(dst: Path) -> Path:
    with h5py.File(dst, "w") as f:
        f["x"] = [1, 2, 3]
    return dst


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda store, tmp: tmp / "missing.h5", "no such"),
        (lambda store, tmp: _foreign(tmp / "foreign.h5"), "not a rankscope store"),
        (lambda store, tmp: _newer_store(store, tmp / "newer.h5"), "newer"),
        (
            lambda store, tmp: (tmp / "junk.h5").write_text("hello") and tmp / "junk.h5",
            "not a readable HDF5",
        ),
    ],
    ids=["missing", "foreign", "newer-schema", "not-hdf5"],
)
def test_bad_store_is_one_line_and_nonzero(make, needle: str, store: Path, tmp_path: Path) -> None:
    path = make(store, tmp_path)
    proc = _cli(str(path))
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert needle in err and str(path.name) in err


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_slurm_workers_give_identical_results(
    gpu_store: Path, slurm_cluster, tmp_path: Path
) -> None:
    """--slurm-workers: a dask-jobqueue SLURMCluster on the real local Slurm cluster."""
    sync = analyze(gpu_store, ClusterSpec(scheduler=SYNCHRONOUS))
    spec = ClusterSpec(
        slurm_workers=2,
        slurm_partition=slurm_cluster.partition,
        slurm_memory="1GB",
        slurm_log_dir=tmp_path,
    )
    _assert_same(sync, analyze(gpu_store, spec))


def test_print_run_summary_at_the_end_of_a_run(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `rankscope run` calls after merging: summary on stdout, reports in RUN/report/."""
    from rankscope.orchestrator.workflow import print_run_summary

    run = tmp_path / "run"
    shutil.copytree(data_dir / "cpu_gloo_4rank_straggler", run)
    merged(data_dir, "cpu_gloo_4rank_straggler", tmp_path).rename(run / "trace.h5")
    print_run_summary(run)
    out = capsys.readouterr().out
    assert "Stragglers" in out and "own compute" in out
    assert (run / "report" / "summary.json").exists() and (run / "report" / "report.html").exists()


def test_the_end_of_a_run_and_analyze_write_the_same_report(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One merge → analyse → report path (orchestrator/workflow.py): what `rankscope run`
    writes at its end, what a Slurm run's merge job writes (`finalize`, in-process) and what
    `rankscope analyze RUN` writes are the same summary.json, rank for rank and figure for
    figure."""
    from rankscope.orchestrator.finalize import _analyze
    from rankscope.orchestrator.workflow import print_run_summary

    run = tmp_path / "run"
    shutil.copytree(data_dir / "cpu_gloo_4rank_straggler", run)
    merged(data_dir, "cpu_gloo_4rank_straggler", tmp_path).rename(run / "trace.h5")
    summary = run / "report" / "summary.json"

    def written() -> dict:
        doc = json.loads(summary.read_text())
        summary.unlink()
        return doc

    print_run_summary(run)
    at_run_end = written()
    assert _analyze(run) == 0
    in_merge_job = written()
    assert cli_main(["analyze", str(run), "--scheduler", "synchronous"]) == 0
    by_analyze = written()
    assert at_run_end == in_merge_job == by_analyze
    assert at_run_end["stragglers"], "the straggler of this run is in every one of them"


def test_one_summary_per_analyze_shared_by_its_three_outputs(
    data_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`rankscope analyze RUN` builds the findings, the advice and the summary document once
    (summary_json.summarise) and hands them to the terminal, summary.json and report.html: the
    advice is built once per analyze (it was built three times, once per rendering), and every
    advice item, finding and straggler of summary.json is in the terminal's text and the HTML's."""
    import html as html_text

    import rankscope.analysis.conclude.advice as advice_module
    import rankscope.analysis.conclude.kpis as kpis_module

    calls = {"advice": 0, "kpis": 0}
    real_advice, real_kpis = advice_module.advice, kpis_module.kpis

    def counted_advice(*args: object, **kwargs: object) -> object:
        calls["advice"] += 1
        return real_advice(*args, **kwargs)  # type: ignore[arg-type]

    def counted_kpis(*args: object, **kwargs: object) -> object:
        calls["kpis"] += 1
        return real_kpis(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(advice_module, "advice", counted_advice)
    monkeypatch.setattr(kpis_module, "kpis", counted_kpis)
    run = tmp_path / "run"
    shutil.copytree(data_dir / "cpu_gloo_4rank_straggler", run)
    assert cli_main(["analyze", str(run), "--scheduler", SYNCHRONOUS]) == 0
    assert calls == {"advice": 1, "kpis": 1}
    terminal = " ".join(capsys.readouterr().out.split())
    doc = json.loads((run / "report" / "summary.json").read_text())
    page = " ".join(html_text.unescape((run / "report" / "report.html").read_text()).split())
    headlines = [" ".join(i["headline"].split()) for i in doc["advice"]]
    headlines += [" ".join(f["headline"].split()) for f in doc["findings"]]
    assert doc["advice"] and doc["findings"] and doc["stragglers"]
    for headline in headlines:
        assert headline in terminal, headline
        assert headline in page, headline
    for s in doc["stragglers"]:
        assert f"rank {s['rank']}" in page
        assert f"{s['wait_caused_s']:.4f}" in terminal
