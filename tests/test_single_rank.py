"""A single-rank trace (one plain ``prof.export_chrome_trace`` file) gets what applies to one rank.

The data are real: tests/data/rankless/model_a.json.gz, a CPU MLP training step exported by a
process that never initialised torch.distributed. With one rank there is no rank to be late
against, no clock to align and no collective to wait in: the terminal, summary.json and the HTML
report leave out the straggler, clock and collective sections (decided once as data:
analysis/conclude/sections.py) and keep the per-rank breakdown, bottleneck and op table.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "rankless"


def test_one_rank_gets_no_cross_rank_sections(tmp_path: Path) -> None:
    trace = tmp_path / "model_a.json.gz"
    shutil.copy(DATA / "model_a.json.gz", trace)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankscope",
            "analyze",
            str(trace),
            "--json",
            str(tmp_path / "s.json"),
            "--html",
            str(tmp_path / "r.html"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    out = " ".join(res.stdout.split())
    for absent in ("straggler", "Clock alignment", "Collectives:", "wait ms", "slowest"):
        assert absent not in out, (absent, res.stdout)
    assert "clock:" not in res.stderr  # nor the merge's clock line
    assert "bound by" in out and "compute" in out and "Top 8 ops" in out  # what applies stays
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["sections"] == []
    assert not {"stragglers", "clock", "collectives"} & set(summary)
    assert [r["rank"] for r in summary["ranks"]] == [0] and summary["ranks"][0]["verdict"]
    assert not [f for f in summary["findings"] if f["kind"] in ("straggler", "no_straggler")]
    html = (tmp_path / "r.html").read_text()
    for absent in ("<h2>Stragglers", "<h2>Clock alignment", "<h2>Collectives", "<h2>Arrival"):
        assert absent not in html
    assert "<h2>Where the time went, per rank" in html
