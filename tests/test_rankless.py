"""Traces without rank information (plain single-process exports): ranked by a visible rule.

The data are real ``prof.export_chrome_trace`` files of a process that never initialised
torch.distributed (tests/data/rankless). One such file is rank 0; several are ranked in the
order given, and ``--rank-from REGEX`` takes the rank from the file names instead.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "rankless"


def rankscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankscope", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    for f in DATA.glob("*.json.gz"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def _ranks_by_source(store: Path) -> dict[int, str]:
    from rankscope.analysis.store.reader import open_store

    with open_store(store) as s:
        return {
            r: str(s.rank_meta(r).get("files", s.rank_meta(r).get("source", ""))) for r in s.ranks
        }


def test_one_rankless_trace_is_rank_0_and_analyses(traces: Path) -> None:
    trace = traces / "model_a.json.gz"
    res = rankscope("analyze", str(trace), "--json", str(traces / "s.json"))
    assert res.returncode == 0, res.stderr
    assert "merged as rank 0" in " ".join(res.stderr.split())
    assert "Traceback" not in res.stderr
    import json

    summary = json.loads((traces / "s.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0]


def test_several_rankless_traces_are_ranked_in_the_order_given(traces: Path) -> None:
    out = traces / "x.h5"
    res = rankscope(
        "merge", str(traces / "model_b.json.gz"), str(traces / "model_a.json.gz"), "-o", str(out)
    )
    assert res.returncode == 0, res.stderr
    line = " ".join(res.stderr.split())
    assert "ranked in the order given: model_b.json.gz → 0, model_a.json.gz → 1" in line
    assert "--rank-from" in line  # how to choose otherwise
    ranks = _ranks_by_source(out)
    assert "model_b" in ranks[0] and "model_a" in ranks[1]


def test_rank_from_takes_the_rank_from_the_names(traces: Path) -> None:
    (traces / "model_a.json.gz").rename(traces / "gpu7.json.gz")
    (traces / "model_b.json.gz").rename(traces / "gpu3.json.gz")
    out = traces / "y.h5"
    res = rankscope("merge", str(traces), "--rank-from", r"gpu(\d+)", "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert "ranked in the order given" not in res.stderr
    ranks = _ranks_by_source(out)
    assert sorted(ranks) == [3, 7] and "gpu3" in ranks[3] and "gpu7" in ranks[7]


def test_rank_from_that_finds_no_number_is_a_problem_not_a_guess(traces: Path) -> None:
    res = rankscope("merge", str(traces), "--rank-from", r"model_(\w)", "-o", str(traces / "z.h5"))
    assert res.returncode != 0
    assert res.stderr.count("finds no rank number in the file name") == 2
    assert "Traceback" not in res.stderr
    bad = rankscope("merge", str(traces), "--rank-from", "gpu(", "-o", str(traces / "z.h5"))
    assert bad.returncode == 2 and "not a regular expression" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
