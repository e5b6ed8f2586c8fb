"""The HTML report opens offline in a real headless Chromium and shows the findings."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from analysis_frames import merged
from browser import HEADLESS_FLAGS, chromium, unresolvable_hosts
from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze
from rankscope.analysis.render.report import render_html

#: every host name unresolvable: a report that needed the network would come out broken.
FLAGS = [*HEADLESS_FLAGS, unresolvable_hosts()]

pytestmark = [pytest.mark.browser]


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as scratch:
        # the profile and Chromium's own temp folders (org.chromium.Chromium.*) both in here
        return subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={scratch}/profile", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "TMPDIR": scratch},
        )


@pytest.fixture(scope="module")
def report(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    a = analyze(
        merged(data_dir, "cpu_gloo_4rank_straggler", out), ClusterSpec(scheduler=SYNCHRONOUS)
    )
    path = out / "report.html"
    path.write_text(render_html(a))
    return path


def test_report_references_nothing_online(report: Path) -> None:
    text = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text, re.I)
    assert not re.search(r"https?://", text)
    assert "<script" not in text.lower() and "@import" not in text


@pytest.mark.timeout(300)
def test_report_renders_offline_in_chromium(report: Path, tmp_path: Path) -> None:
    dom = _chromium("--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "rankscope report" in html and "Stragglers" in html
    assert re.search(r"class=\"card bad\".*?rank 2", html, re.S)  # the straggler card
    assert html.count("<rect") >= 8 and "<circle" in html  # per-rank bars and the lateness chart
    shot = tmp_path / "report.png"
    res = _chromium("--window-size=1280,2000", f"--screenshot={shot}", report.as_uri())
    assert res.returncode == 0 and shot.stat().st_size > 20_000
