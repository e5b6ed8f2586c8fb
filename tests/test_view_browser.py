"""`rankscope view` serves an app that renders in a real headless Chromium.

The app's content arrives over Bokeh's websocket after the page loads, and its widgets live in
shadow DOM, so neither ``--dump-dom`` nor ``--virtual-time-budget`` sees it (virtual time runs out
while the socket is idle). The test therefore drives Chromium through the DevTools protocol
(tornado's websocket client, no extra package): load the URL, poll until the timeline canvas
and the app's text are in the page, then take a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from analysis_frames import merged
from browser import CHROMIUM, HEADLESS_FLAGS, unresolvable_hosts

FLAGS = [
    *HEADLESS_FLAGS,
    unresolvable_hosts(except_localhost=True),
    "--window-size=1400,900",
    "--remote-debugging-port=0",
]
#: The command under test (the installed CLI, run by this interpreter).
VIEW = [sys.executable, "-m", "rankscope.orchestrator", "view"]
#: What the page must show once rendered (collected from every shadow root).
PROBE_JS = """
(() => {
  const roots = [document];
  const walk = (node) => {
    if (node.shadowRoot) { roots.push(node.shadowRoot); node.shadowRoot.querySelectorAll('*').forEach(walk); }
  };
  document.querySelectorAll('*').forEach(walk);
  let canvases = 0, text = '';
  for (const r of roots) {
    canvases += r.querySelectorAll('canvas').length;
    text += ' ' + (r.textContent || '');
  }
  return JSON.stringify({canvases, text, title: document.title,
                         roots: document.querySelectorAll('[data-root-id]').length});
})()
"""
#: Seconds to wait for the server to print its URL / the page to render (generous: 2 shared cores).
SERVER_WAIT_S = 120
RENDER_WAIT_S = 90

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def store(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return merged(data_dir, "cpu_gloo_4rank_straggler", tmp_path_factory.mktemp("view"))


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop a process we started, by its PID (SIGTERM, then SIGKILL)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


@pytest.fixture
def server(store: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`rankscope view STORE --port 0 --no-show` in a subprocess; yields (url, process)."""
    log = tmp_path / "view.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*VIEW, str(store), "--port", "0", "--no-show"],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        deadline = time.monotonic() + SERVER_WAIT_S
        url = None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"serving (http://\S+)", log.read_text())
            url = m.group(1) if m else None
            time.sleep(0.5)
        assert url is not None, f"no URL printed: {log.read_text()}"
        yield url, proc
    finally:
        _stop(proc)


async def _cdp_render(ws_url: str, url: str, png: Path) -> dict[str, Any]:
    """Load ``url`` in the page at ``ws_url``, wait until rendered, screenshot it to ``png``."""
    from tornado.websocket import websocket_connect

    conn = await websocket_connect(ws_url, max_message_size=64 << 20)
    ids = iter(range(1, 1 << 30))

    async def call(method: str, **params: Any) -> Any:
        msg_id = next(ids)
        await conn.write_message(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            raw = await conn.read_message()
            assert raw is not None, "DevTools connection closed"
            reply = json.loads(raw)
            if reply.get("id") == msg_id:
                assert "error" not in reply, reply
                return reply["result"]

    await call("Page.enable")
    await call(
        "Emulation.setDeviceMetricsOverride",
        width=1400,
        height=900,
        deviceScaleFactor=1,
        mobile=False,
    )
    await call("Page.navigate", url=url)
    deadline = time.monotonic() + RENDER_WAIT_S
    found: dict[str, Any] = {}
    while time.monotonic() < deadline:
        res = await call("Runtime.evaluate", expression=PROBE_JS, returnByValue=True)
        found = json.loads(res["result"].get("value") or "{}")
        if found.get("canvases", 0) >= 1 and "Stragglers" in found.get("text", ""):
            break
        await asyncio.sleep(1.0)
    await asyncio.sleep(2.0)  # let the canvas finish painting before the screenshot
    shot = await call("Page.captureScreenshot", format="png")
    png.write_bytes(base64.b64decode(shot["data"]))
    conn.close()
    return found


def _chromium_page(profile: Path) -> tuple[subprocess.Popen[str], str]:
    """Start headless Chromium with DevTools on a free port; return it and its page's ws URL."""
    proc = subprocess.Popen(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None, "Chromium did not start"
        time.sleep(0.2)
    port = int(port_file.read_text().split()[0])
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                pages = [p for p in json.load(r) if p.get("type") == "page"]
            if pages:
                return proc, pages[0]["webSocketDebuggerUrl"]
        except OSError:
            pass
        assert time.monotonic() < deadline, "no DevTools page"
        time.sleep(0.2)


@pytest.mark.timeout(400)
def test_view_renders_in_chromium(
    server: tuple[str, subprocess.Popen[str]], tmp_path: Path
) -> None:
    url, proc = server
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    browser, ws_url = _chromium_page(profile)
    png = tmp_path / "view.png"
    try:
        found = asyncio.run(_cdp_render(ws_url, url, png))
    finally:
        _stop(browser)
    assert found.get("title", "").startswith("rankscope timeline"), found.get("title")
    assert found.get("roots", 0) >= 1, "a Bokeh document root"
    assert found.get("canvases", 0) >= 1, "the timeline is drawn on a canvas"
    text = found.get("text", "")
    assert "rankscope timeline — cpu_gloo_4rank_straggler" in text
    assert "Stragglers" in text and "rank 2" in text, "the findings column names the straggler"
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
def test_view_stops_on_sigterm(server: tuple[str, subprocess.Popen[str]]) -> None:
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
