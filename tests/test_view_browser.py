"""`rankscope view` serves an app that renders in a real headless Chromium.

The app's content arrives over Bokeh's websocket after the page loads, and its widgets live in
shadow DOM, so neither ``--dump-dom`` nor ``--virtual-time-budget`` sees it (virtual time runs out
while the socket is idle). The test therefore drives Chromium through the DevTools protocol
(tests/browser.py: tornado's websocket client, no extra package): load the URL, poll until the
timeline canvas and the app's text are in the page, then take a screenshot.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from analysis_frames import merged
from browser import PROBE_JS, DevToolsPage, serve_view, start_chromium, stop

#: The command under test (the installed CLI, run by this interpreter).
VIEW = [sys.executable, "-m", "rankscope.orchestrator", "view"]
#: Seconds to wait for the server to print its URL / the page to render (generous: 2 shared cores).
SERVER_WAIT_S = 120
RENDER_WAIT_S = 90

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def store(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return merged(data_dir, "cpu_gloo_4rank_straggler", tmp_path_factory.mktemp("view"))


@pytest.fixture
def server(store: Path, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """`rankscope view STORE --port 0 --no-show` in a subprocess; yields (url, process)."""
    proc, url = serve_view(store, tmp_path / "view.log", SERVER_WAIT_S, "--no-show")
    try:
        yield url, proc
    finally:
        stop(proc)


async def _cdp_render(ws_url: str, url: str, png: Path) -> dict[str, Any]:
    """Load ``url`` in the page at ``ws_url``, wait until rendered, screenshot it to ``png``."""
    page = await DevToolsPage.connect(ws_url)
    await page.call("Page.navigate", url=url)
    found = await page.wait_for(
        PROBE_JS,
        lambda v: v.get("canvases", 0) >= 1 and "Stragglers" in v.get("text", ""),
        RENDER_WAIT_S,
    )
    await page.wait_painted(RENDER_WAIT_S)  # the timeline's canvas painted, then the shot
    await page.screenshot(png)
    page.close()
    return found or {}


@pytest.mark.timeout(400)
def test_view_renders_in_chromium(server: tuple[str, Any], tmp_path: Path) -> None:
    url, proc = server
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    browser, ws_url = start_chromium(profile)
    png = tmp_path / "view.png"
    try:
        found = asyncio.run(_cdp_render(ws_url, url, png))
    finally:
        stop(browser)
    assert found.get("title", "").startswith("rankscope timeline"), found.get("title")
    assert found.get("roots", 0) >= 1, "a Bokeh document root"
    assert found.get("canvases", 0) >= 1, "the timeline is drawn on a canvas"
    text = found.get("text", "")
    assert "rankscope timeline — cpu_gloo_4rank_straggler" in text
    assert "Stragglers" in text and "rank 2" in text, "the findings column names the straggler"
    assert "What to do" in text and "bucket_cap_mb" in text, "the advice, with its fix"
    assert text.index("What to do") < text.index("Stragglers"), "what to do first"
    assert "Zoom to step" in text and "Event kinds" in text, "the controls are present"
    from PIL import Image

    with Image.open(png) as img:
        assert img.size == (1400, 900)
        colors = img.convert("RGB").getcolors(maxcolors=1 << 20) or []
        assert len(colors) > 50, "the screenshot is not blank"
    if os.environ.get("RANKSCOPE_SCREENSHOT"):
        shutil.copy(png, os.environ["RANKSCOPE_SCREENSHOT"])
    assert proc.poll() is None, "the server keeps running until stopped"


@pytest.mark.timeout(300)
def test_view_stops_on_sigterm(server: tuple[str, Any]) -> None:
    url, proc = server
    with urllib.request.urlopen(url, timeout=60) as r:
        page = r.read().decode()
    assert "<title>rankscope timeline" in page
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_view_missing_store_is_one_line(tmp_path: Path) -> None:
    res = subprocess.run(
        [*VIEW, str(tmp_path / "nope.h5")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope.h5" in lines[0] and "Traceback" not in res.stderr


def test_view_busy_port_is_one_line(store: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run(
            [*VIEW, str(store), "--port", str(port), "--no-analysis"],
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0] and "Traceback" not in res.stderr
