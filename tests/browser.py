"""Headless Chromium as the browser tests start it (Debian's chromium, no network of its own)."""

from __future__ import annotations

import shutil
from typing import Any

#: The browser, or None (a browser test then fails, see :func:`chromium`).
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium() -> str:
    """The browser's path. Without one, the test that needs it FAILS, never skips: a machine
    set up for the tests has it (``bash examples/setup.sh --dev``, which tests/run.sh runs), and
    a skip would hide that the browser path went untested. Leave these tests out on purpose
    with ``-m "not browser"`` (``tests/run.sh --fast``)."""
    if CHROMIUM is None:
        import pytest

        pytest.fail(
            "no chromium on PATH: install it (bash examples/setup.sh --dev, or apt-get install "
            'chromium), or leave the browser tests out with -m "not browser"',
            pytrace=False,
        )
    return CHROMIUM


#: Headless, as root, and without the background services that would try to reach the network
#: (on this machine's closed network they fail many at a time and slow every start).
HEADLESS_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def unresolvable_hosts(*, except_localhost: bool = False) -> str:
    """Flag making every host name unresolvable: a page that needs the network comes out broken."""
    rule = "MAP * ~NOTFOUND, EXCLUDE localhost" if except_localhost else "MAP * ~NOTFOUND"
    return f"--host-resolver-rules={rule}"


# -- driving a page through the DevTools protocol ----------------------------------------------
# Bokeh/Panel apps arrive over a websocket into shadow DOM after the page loads, so neither
# ``--dump-dom`` nor ``--virtual-time-budget`` sees them; the tests drive Chromium instead.

#: Collects the text and canvases of the page, shadow roots included.
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


def start_chromium(profile: Any, width: int = 1400, height: int = 900) -> tuple[Any, str]:
    """Headless Chromium with DevTools on a free port; returns (process, its page's ws URL)."""
    import json
    import os
    import subprocess
    import tempfile
    import time
    import urllib.request
    import weakref

    # Chromium's own temp folders (org.chromium.Chromium.*, its singleton socket) go into a
    # short folder of ours (a Unix socket path has at most 107 bytes: not tmp_path), removed
    # with the process object, so a browser stopped by SIGKILL leaves nothing in /tmp
    scratch = tempfile.mkdtemp(prefix="rankscope-chromium-")
    proc = subprocess.Popen(
        [
            chromium(),
            *HEADLESS_FLAGS,
            unresolvable_hosts(except_localhost=True),
            f"--window-size={width},{height}",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "TMPDIR": scratch},
    )
    weakref.finalize(proc, shutil.rmtree, scratch, True)
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


class DevToolsPage:
    """One page driven through the DevTools protocol (tornado's websocket client)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._next = 0

    @classmethod
    async def connect(cls, ws_url: str, width: int = 1400, height: int = 900) -> DevToolsPage:
        from tornado.websocket import websocket_connect

        page = cls(await websocket_connect(ws_url, max_message_size=64 << 20))
        await page.call("Page.enable")
        await page.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return page

    async def call(self, method: str, **params: Any) -> Any:
        import json

        self._next += 1
        msg_id = self._next
        await self.conn.write_message(
            json.dumps({"id": msg_id, "method": method, "params": params})
        )
        while True:
            raw = await self.conn.read_message()
            assert raw is not None, "DevTools connection closed"
            reply = json.loads(raw)
            if reply.get("id") == msg_id:
                assert "error" not in reply, reply
                return reply["result"]

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of a JS expression that returns ``JSON.stringify(...)``."""
        import json

        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return json.loads(res["result"].get("value") or "null")

    async def wait_for(
        self, expression: str, ok: Any, timeout_s: float, poll_s: float = 0.5
    ) -> Any:
        """Poll ``expression`` every ``poll_s`` until ``ok(value)``; returns the last value
        (checked by the caller)."""
        import asyncio
        import time

        deadline = time.monotonic() + timeout_s
        value = None
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value is not None and ok(value):
                break
            await asyncio.sleep(poll_s)
        return value

    async def next_frames(self, frames: int = 2, timeout_s: float = 30.0) -> None:
        """Wait until the page has rendered ``frames`` more animation frames (what a paint
        produced is then on screen, and a screenshot shows it)."""
        import asyncio

        js = (
            f"new Promise((done) => {{ let n = {int(frames)}; const tick = () => (--n > 0 ? "
            "requestAnimationFrame(tick) : done('1')); requestAnimationFrame(tick); })"
        )
        try:
            await asyncio.wait_for(
                self.call("Runtime.evaluate", expression=js, awaitPromise=True), timeout_s
            )
        except TimeoutError:
            raise AssertionError(f"the page rendered no {frames} frames in {timeout_s} s") from None

    async def wait_painted(self, timeout_s: float, min_plots: int = 1) -> dict[str, Any]:
        """Wait until every displayed Bokeh plot has painted all it was asked to (PAINTED_JS),
        at least ``min_plots`` of them, and no paint follows within two more frames; returns
        the last state. Fails after ``timeout_s`` with the state that was still waiting."""
        import asyncio
        import time

        deadline = time.monotonic() + timeout_s
        state: Any = None
        while True:
            state = await self.evaluate(PAINTED_JS)
            if state["done"] and state["plots"] >= min_plots:
                await self.next_frames(2)  # paints queued for the next frame show up as pending
                again = await self.evaluate(PAINTED_JS)
                if again["done"] and again["paints"] == state["paints"]:
                    return dict(again)
                state = again
            assert time.monotonic() < deadline, f"Bokeh plots not painted in {timeout_s} s: {state}"
            await asyncio.sleep(0.1)

    async def drag(self, x0: float, y0: float, x1: float, y1: float, steps: int = 8) -> None:
        """A real mouse drag (press, moves, release) in page coordinates."""
        await self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x0, y=y0)
        await self.call(
            "Input.dispatchMouseEvent", type="mousePressed", x=x0, y=y0, button="left", clickCount=1
        )
        for i in range(1, steps + 1):
            x, y = x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps
            await self.call(
                "Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y, button="left", buttons=1
            )
        await self.call(
            "Input.dispatchMouseEvent",
            type="mouseReleased",
            x=x1,
            y=y1,
            button="left",
            clickCount=1,
        )

    async def click(self, x: float, y: float) -> None:
        """A real left click in page coordinates."""
        await self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            await self.call(
                "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
            )

    async def screenshot(self, png: Any) -> None:
        import base64

        shot = await self.call("Page.captureScreenshot", format="png")
        png.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        self.conn.close()


#: Every Bokeh plot on the page: its title, its frame (the data area) in page coordinates, its
#: ranges and the labels of its left axis (row labels).
PLOTS_JS = """
(() => {
  const out = [];
  const seen = new Set();
  const walk = (v) => {
    if (!v || seen.has(v)) return; seen.add(v);
    if (v.frame && v.canvas_view && v.model.title) {
      const r = v.canvas_view.el.getBoundingClientRect();
      const f = v.frame.bbox;
      const ax = (v.model.left || [])[0];
      let labels = [];
      if (ax && ax.major_label_overrides) {
        const o = ax.major_label_overrides;
        labels = (o instanceof Map ? [...o.values()] : Object.values(o)).map(String);
      }
      out.push({title: v.model.title.text || '', left: r.left + f.left, top: r.top + f.top,
                width: f.width, height: f.height, labels,
                y_start: v.frame.y_range.start, y_end: v.frame.y_range.end,
                x_start: v.frame.x_range.start, x_end: v.frame.x_range.end});
    }
    try { for (const c of v.children()) walk(c); } catch (e) {}
  };
  for (const r of (window.Bokeh ? Bokeh.index : [])) walk(r);
  return JSON.stringify(out);
})()
"""


#: Whether the page's Bokeh plots have painted: the documents idle (every view built, the data
#: of every renderer in), no level-of-detail repaint to come after an interaction, and each
#: displayed plot painted at least once with no paint requested since its last one. Reads
#: PlotView's own bookkeeping (Bokeh 3: ``_render_count``, ``_needs_paint``, ``_invalidate_all``,
#: ``_invalidated_painters``); a Bokeh without them is reported, never taken as painted.
#: ``paints``: each plot's paint count, to tell a settled page from one still repainting.
PAINTED_JS = """
(() => {
  if (!window.Bokeh || !Bokeh.documents || !Bokeh.documents.length)
    return JSON.stringify({done: false, plots: 0, paints: [], why: 'no Bokeh document yet'});
  const idle = Bokeh.documents.every((d) => d.is_idle);
  const interacting = Bokeh.documents.some((d) => d.interactive_duration() >= 0);
  const paints = [], waiting = [], unknown = [];
  const seen = new Set();
  const walk = (v) => {
    if (!v || seen.has(v)) return; seen.add(v);
    if (v.frame && v.canvas_view && v.model && v.model.title !== undefined && v.is_displayed) {
      const name = (v.model.title && v.model.title.text) || v.model.id;
      if (typeof v._render_count != 'number' || !(v._invalidated_painters instanceof Set)) {
        unknown.push(name);
      } else {
        paints.push(v._render_count);
        if (v._render_count == 0 || v._needs_paint || v._invalidate_all
            || v._invalidated_painters.size > 0 || !v.has_finished())
          waiting.push(name);
      }
    }
    try { for (const c of v.children()) walk(c); } catch (e) {}
  };
  for (const r of Bokeh.index) walk(r);
  const done = idle && !interacting && waiting.length == 0 && unknown.length == 0;
  return JSON.stringify({done, plots: paints.length, paints, idle, interacting, waiting,
                         unknown: unknown.length ? unknown.concat(['(no paint bookkeeping)']) : []});
})()
"""


def click_button_js(text: str) -> str:
    """JS clicking the first button (shadow roots included) whose text contains ``text``;
    returns '1' when one was clicked."""
    import json

    return (
        "(() => { const roots = [document]; const walk = (n) => { if (n.shadowRoot) {"
        " roots.push(n.shadowRoot); n.shadowRoot.querySelectorAll('*').forEach(walk); } };"
        " document.querySelectorAll('*').forEach(walk);"
        " for (const r of roots) for (const b of r.querySelectorAll('button'))"
        f"   if (b.textContent.includes({json.dumps(text)})) {{ b.click(); return '1'; }}"
        " return '0'; })()"
    )


def serve_view(store: Any, log: Any, wait_s: float, *extra: str) -> tuple[Any, str]:
    """``rankscope view STORE --port 0`` in a subprocess (output to ``log``); returns it and
    the URL it printed (fails after ``wait_s`` seconds without one)."""
    import re
    import subprocess
    import sys
    import time

    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rankscope.orchestrator",
                "view",
                str(store),
                "--port",
                "0",
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and proc.poll() is None:
        m = re.search(r"serving (http://\S+)", log.read_text())
        if m:
            return proc, m.group(1)
        time.sleep(0.3)
    stop(proc)
    raise AssertionError(f"rankscope view printed no URL: {log.read_text()}")


def stop(proc: Any) -> None:
    """Stop a process we started, by its PID (SIGTERM, then SIGKILL)."""
    import os
    import signal
    import subprocess

    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
