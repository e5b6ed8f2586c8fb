"""How fast the rank × time overview draws at many ranks (prints figures; not a test).

    python benchmarks/overview_render.py STORE                 # in-process figures
    python benchmarks/overview_render.py STORE --browser       # plus rankscope view in Chromium
    python benchmarks/overview_render.py STORE --screenshots docs/overview-1024   # and keep shots

**in-process**: the analysis once (it computes the overview's bins), then, median of ``--repeat``:
the first render of the whole run (row order, aggregation, HoloViews element, Bokeh model and its
JSON: what the server sends) and the re-render of a zoomed window (4× and 64×).

**browser**: the whole thing where people feel it: ``rankscope view STORE --port 0`` as a
subprocess, headless Chromium driven through the DevTools protocol (tests/browser.py). Figures:
server start until its URL is printed (this includes the analysis), page load until the overview
is painted, and a mouse-wheel zoom on the overview until the browser shows the re-aggregated
image (its title, which states the resolution, has changed), median of ``--repeat`` zooms that
alternate in and out (a zoom below one bin per pixel would leave the title as it is). The first
zoom also waits for the lanes, which load after the page (deferred).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the DevTools driver the browser tests use

#: The overview's title contains this (its plot is found by it).
OVERVIEW_MARK = "each pixel: share of its time"
#: How often the page is polled while timing, s (the timings are this precise).
POLL_S = 0.05


def in_process(store: Path, repeat: int) -> dict[str, Any]:
    import holoviews as hv
    from bokeh.embed import json_item
    from rankscope.analysis.engine.driver import ClusterSpec, analyze
    from rankscope.analysis.engine.overview import RankOrder, rank_order
    from rankscope.analysis.views.overview_plot import overview_image

    t = time.perf_counter()
    a = analyze(store, ClusterSpec(main_is_guarded=True))
    analyze_s = time.perf_counter() - t
    ov = a.overview
    assert ov is not None, "no profiled steps"
    span = ov.end_ns - ov.start_ns

    def render(window: tuple[int, int] | None) -> float:
        t0 = time.perf_counter()
        order = rank_order(ov, a, RankOrder.STRAGGLER)
        el = overview_image(ov, order, window=window, flagged=a.flagged_ranks(), width=620)
        json_item(hv.render(el, backend="bokeh"))
        return time.perf_counter() - t0

    render(None)  # imports and first-use costs, as the server pays them at start
    mid = ov.start_ns + span // 2
    out: dict[str, Any] = {
        "ranks": len(ov.ranks),
        "bins": ov.n_bins,
        "cells_mb": ov.cells.nbytes / 1e6,
        "analyze_s": analyze_s,
        "flagged": a.flagged_ranks(),
    }
    out["first_s"] = statistics.median(render(None) for _ in range(repeat))
    for k in (4, 64):
        w = (mid - span // (2 * k), mid + span // (2 * k))
        out[f"zoom{k}_s"] = statistics.median(render(w) for _ in range(repeat))
    return out


async def _browser_session(url: str, repeat: int, shots: str | None) -> dict[str, Any]:
    from browser import PLOTS_JS, DevToolsPage, click_button_js, start_chromium

    out: dict[str, Any] = {}
    profile = Path(tempfile.mkdtemp(prefix="rs-bench-chromium-"))
    proc, ws = start_chromium(profile)
    try:
        page = await DevToolsPage.connect(ws)
        t = time.perf_counter()
        await page.call("Page.navigate", url=url)
        plots = await page.wait_for(
            PLOTS_JS, lambda v: any(OVERVIEW_MARK in p["title"] for p in v), 600, POLL_S
        )
        out["page_to_overview_s"] = time.perf_counter() - t
        ov = next(p for p in plots if OVERVIEW_MARK in p["title"])
        if shots:
            await asyncio.sleep(3)
            await page.screenshot(Path(f"{shots}.png"))
        zooms = []
        for i in range(repeat):
            before = ov["title"]
            x = ov["left"] + ov["width"] * (0.3 + 0.05 * i)
            t = time.perf_counter()
            await page.call(
                "Input.dispatchMouseEvent",
                type="mouseWheel",
                x=x,
                y=ov["top"] + ov["height"] / 2,
                deltaX=0,
                deltaY=-240 if i % 2 == 0 else 240,  # in, out, in, ...: the title changes
            )
            plots = await page.wait_for(
                PLOTS_JS,
                lambda v, b=before: any(OVERVIEW_MARK in p["title"] and p["title"] != b for p in v),
                60,
                POLL_S,
            )
            zooms.append(time.perf_counter() - t)
            ov = next(p for p in plots if OVERVIEW_MARK in p["title"])
            await asyncio.sleep(0.5)
        out["zoom_s"] = statistics.median(zooms)
        out["zooms"] = zooms
        out["last_title"] = ov["title"]
        if shots:
            # open the flagged ranks (the button), to show their lanes
            await page.evaluate(click_button_js("flagged rank"))
            await asyncio.sleep(8)
            await page.screenshot(Path(f"{shots}-selected.png"))
        page.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return out


def in_browser(store: Path, repeat: int, shots: str | None) -> dict[str, Any]:
    from browser import serve_view, stop

    log = Path(tempfile.mkstemp(prefix="rs-bench-view-", suffix=".log")[1])
    t = time.perf_counter()
    server, url = serve_view(store, log, 3600)
    try:
        out = {"server_start_s": time.perf_counter() - t}
        out.update(asyncio.run(_browser_session(url, repeat, shots)))
        return out
    finally:
        stop(server)
        log.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store", type=Path, help="a merged trace.h5 or a run directory")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--browser", action="store_true", help="also time rankscope view in Chromium")
    ap.add_argument("--screenshots", metavar="PREFIX", help="save PREFIX.png, PREFIX-selected.png")
    ap.add_argument("--browser-only", action="store_true", help="skip the in-process figures")
    args = ap.parse_args()
    if not args.browser_only:
        _print_in_process(in_process(args.store, args.repeat))
    if args.browser or args.screenshots or args.browser_only:
        _print_browser(in_browser(args.store, args.repeat, args.screenshots))


def _print_in_process(got: dict[str, Any]) -> None:
    print(
        f"{got['ranks']:,} ranks, {got['bins']:,} bins ({got['cells_mb']:.0f} MB of cells); "
        f"analysis {got['analyze_s']:.1f} s; flagged {got['flagged']}"
    )
    print("| render (in-process: aggregate + Bokeh model + JSON) | median s |")
    print("|---|---|")
    print(f"| whole run (first render) | {got['first_s']:.3f} |")
    print(f"| zoom 4× | {got['zoom4_s']:.3f} |")
    print(f"| zoom 64× | {got['zoom64_s']:.3f} |")


def _print_browser(b: dict[str, Any]) -> None:
    print("| rankscope view in Chromium | s |")
    print("|---|---|")
    print(f"| server start, analysis included (until the URL) | {b['server_start_s']:.1f} |")
    print(f"| page load until the overview is painted | {b['page_to_overview_s']:.2f} |")
    print(
        f"| wheel zoom until the re-aggregated image shows (median of {len(b['zooms'])}) | "
        f"{b['zoom_s']:.2f} |"
    )
    print(f"(zooms: {', '.join(f'{z:.2f}' for z in b['zooms'])}; last title: {b['last_title']})")


if __name__ == "__main__":
    main()
