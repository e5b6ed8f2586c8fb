"""Smoke tests: the benchmark scripts keep working (they print figures; nothing here times)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_time_to_answer_runs_and_prints_its_table() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "time_to_answer.py"),
            "--rounds",
            "1",
            "--no-hta",
            "--sets",
            "dlrm",
            "end-of-run",
            "reader",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "| work | rankscope | HTA 0.5.0 | ratio |" in lines
    rows = [line for line in lines if line.startswith("| ") and " s" in line]
    assert len(rows) == 5, proc.stdout  # dlrm (two rows), end of run, reader (two)
    assert sum("MB/s" in row for row in rows) == 2  # one core, and the scanner ahead


@pytest.mark.slow
def test_many_ranks_runs_prints_its_table_and_names_the_stragglers(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "many_ranks.py"),
            "--ranks",
            "8",
            "--events-per-rank",
            "2000",
            "--layers",
            "4",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| ranks | trace events"))
    cells = [c.strip() for c in lines[at].strip("|").split("|")]
    assert lines[at + 2].startswith("| 8 |"), proc.stdout  # the table's one row, below |---|
    row = dict(zip(cells, (c.strip() for c in lines[at + 2].strip("|").split("|")), strict=True))
    # ranks 8/3 and 16/3 were made slow: both named, nobody else
    assert row["true stragglers"] == "2 own compute, 5 own compute", row
    assert row["named"] == row["true stragglers"], row
    assert (row["precision"], row["recall"]) == ("1.00", "1.00"), row
    assert any(line.startswith("writer at 8 ranks:") for line in lines), proc.stdout
    assert (tmp_path / "r8" / "trace.h5").exists()  # the largest job is kept


@pytest.mark.slow
def test_merge_vs_hta_tiled_rank_merges_as_one_rank(tmp_path: Path) -> None:
    """merge_vs_hta's peak-RSS row tiles the big rank's events into one bigger rank. Copied
    verbatim, each step would be recorded once per copy and the merge refuses the file as several
    ranks in one (multirank.py); each copy's steps are renumbered, so it is one rank."""
    import gzip

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import merge_vs_hta
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from rankscope.analysis.store.reader import open_store
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    text = merge_vs_hta.kineto_text(2)
    steps = merge_vs_hta.STEP_NUMBER.findall(text)
    assert len(steps) == len(set(steps)) and len(steps) >= 2
    folder = tmp_path / "tiled"
    folder.mkdir()
    (folder / "rank-0.json.gz").write_bytes(gzip.compress(text, compresslevel=1))
    out = merge_run_dir(folder, output=tmp_path / "t.h5", scheduler="synchronous", quiet=True)
    with open_store(out) as store:
        assert len(store.ranks) == 1, store.ranks
