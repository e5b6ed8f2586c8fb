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
    assert len(rows) == 4, proc.stdout  # dlrm (two rows), end of run, reader
    assert any("MB/s" in row for row in rows)
