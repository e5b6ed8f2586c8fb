"""The overview in a real headless Chromium (issue 15): the late ranks show at a glance, and
selecting ranks and a time span on it (a real mouse drag) opens their lanes below.

``rankscope view`` runs as a subprocess on a synthetic 40-rank job (5 hosts) with two known
stragglers; Chromium is driven through the DevTools protocol (tests/browser.py). Set
``RANKSCOPE_SCREENSHOT=/path/prefix`` to keep the screenshots (``prefix-overview.png``,
``prefix-selected.png``).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser import (
    PAINTED_JS,
    PLOTS_JS,
    PROBE_JS,
    DevToolsPage,
    click_button_js,
    serve_view,
    start_chromium,
    stop,
)

RANKS = 40
STRAGGLERS = (5, 33)
#: Seconds to wait for the server / a render (generous: 2 shared cores).
SERVER_WAIT_S = 180
RENDER_WAIT_S = 120
#: The overview's title says this (its plot is found by it).
OVERVIEW_MARK = "each pixel: share of its time"
#: A click's read-out: the rank, its host, the pixel's span (in the unit of its width), shares.
TAP_TEXT = r"rank (\d+) \(node\d+\), [\d.,]+–[\d.,]+ (?:ns|µs|ms|s|min): ([a-z /()%\d,.]+)"
#: ms in one unit of the read-outs.
MS_PER = {"ns": 1e-6, "µs": 1e-3, "ms": 1.0, "s": 1e3, "min": 6e4}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from analysis_frames import synthetic_store

    return synthetic_store(
        tmp_path_factory.mktemp("overview-view"),
        ranks=RANKS,
        seed=4,
        stragglers=[(STRAGGLERS[0], 3.0, 1.0), (STRAGGLERS[1], 2.0, 1.0)],
    )


@pytest.fixture
def url(store: Path, tmp_path: Path) -> Iterator[str]:
    log = tmp_path / "view.log"
    proc, found = serve_view(store, log, SERVER_WAIT_S)
    try:
        yield found
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text(), log.read_text()


def _plot(plots: list[dict[str, Any]], overview: bool) -> dict[str, Any]:
    mine = [p for p in plots if (OVERVIEW_MARK in p["title"]) == overview]
    assert mine, [p["title"] for p in plots]
    return mine[0]


def _lane_ranks(plot: dict[str, Any]) -> set[int]:
    """The ranks whose lanes a timeline plot shows (its row labels start ``r<rank> ``)."""
    return {int(m.group(1)) for label in plot["labels"] if (m := re.match(r"r(\d+) ", label))}


def _red_share_per_row(png: Path, frame: dict[str, Any], rows: int) -> np.ndarray:
    """Share of 'waiting' red pixels in each rank's band of the overview's frame."""
    from PIL import Image
    from rankscope.analysis.engine.overview import CATEGORY_COLORS, Category

    red = np.array([int(CATEGORY_COLORS[Category.WAIT][i : i + 2], 16) for i in (1, 3, 5)])
    with Image.open(png) as img:
        px = np.asarray(img.convert("RGB"), dtype=float)
    top, left = round(frame["top"]), round(frame["left"])
    area = px[top : top + round(frame["height"]), left : left + round(frame["width"])]
    is_red = np.abs(area - red).max(axis=2) <= 12
    bands = np.array_split(is_red, rows, axis=0)
    return np.array([b[1:-1].mean() for b in bands])  # band edges may blend with a neighbour


async def _painted_shot(page: DevToolsPage, png: Path) -> dict[str, Any]:
    """Screenshot the painted page to ``png``; returns the overview's plot as the shot shows it.

    The lanes below load after the overview (deferred) and may move things when they arrive: a
    shot is kept only when the overview's frame and paint count are the same before and after.
    """
    import time

    deadline = time.monotonic() + RENDER_WAIT_S
    while True:
        painted = await page.wait_painted(RENDER_WAIT_S)
        before = _plot(await page.evaluate(PLOTS_JS), overview=True)
        await page.screenshot(png)
        after = _plot(await page.evaluate(PLOTS_JS), overview=True)
        if before == after and (await page.evaluate(PAINTED_JS))["paints"] == painted["paints"]:
            return after
        assert time.monotonic() < deadline, f"the overview kept changing: {before} → {after}"


async def _session(url: str, shots: Path) -> dict[str, Any]:
    profile = shots / "chromium-profile"
    profile.mkdir()
    browser, ws_url = start_chromium(profile)
    out: dict[str, Any] = {}
    try:
        page = await DevToolsPage.connect(ws_url)
        await page.call("Page.navigate", url=url)
        found = await page.wait_for(
            PROBE_JS,
            lambda v: (
                v["canvases"] >= 2 and "Stragglers" in v["text"] and "order ranks" in v["text"]
            ),
            RENDER_WAIT_S,
        )
        out["text"] = found["text"]
        await page.wait_for(
            PLOTS_JS, lambda v: any(OVERVIEW_MARK in p["title"] for p in v), RENDER_WAIT_S
        )
        out["overview"] = await _painted_shot(page, shots / "overview.png")

        # the button opens the flagged ranks' lanes
        await page.evaluate(click_button_js("flagged rank"))
        after = await page.wait_for(PROBE_JS, lambda v: "Lanes below" in v["text"], RENDER_WAIT_S)
        out["button_text"] = after["text"]
        # ... and shows them: the drag below starts on a page that has settled (the server done
        # with this render, nothing arriving mid-drag)
        opened = await page.wait_for(
            PLOTS_JS,
            lambda v: any(
                _lane_ranks(p) == set(STRAGGLERS) for p in v if OVERVIEW_MARK not in p["title"]
            ),
            RENDER_WAIT_S,
        )
        out["button_lanes"] = [_lane_ranks(p) for p in opened if OVERVIEW_MARK not in p["title"]]
        await page.wait_painted(RENDER_WAIT_S, min_plots=2)

        # a real drag over the rows of ranks 2 and 3 in straggler order, 25 %..55 % of the time
        ov = out["overview"]
        row = ov["height"] / abs(ov["y_end"] - ov["y_start"])
        x0, x1 = ov["left"] + 0.25 * ov["width"], ov["left"] + 0.55 * ov["width"]
        await page.drag(x0, ov["top"] + 2.25 * row, x1, ov["top"] + 3.75 * row)
        dragged = await page.wait_for(
            PROBE_JS,
            lambda v: re.search(r"Lanes below: ranks \d+, \d+ ·", v["text"]),
            RENDER_WAIT_S,
        )
        out["drag_text"] = dragged["text"]
        out["drag_x"] = [ov["x_start"] + f * (ov["x_end"] - ov["x_start"]) for f in (0.25, 0.55)]
        plots = await page.wait_for(
            PLOTS_JS,
            lambda v: any(
                OVERVIEW_MARK not in p["title"]
                and abs(p["x_start"] - out["drag_x"][0]) < 0.02 * (ov["x_end"] - ov["x_start"])
                for p in v
            ),
            RENDER_WAIT_S,
        )
        out["timeline"] = _plot(plots, overview=False)

        # a click on the top row reads out its pixel
        await page.click(ov["left"] + 0.5 * ov["width"], ov["top"] + 0.5 * row)
        tapped = await page.wait_for(
            PROBE_JS, lambda v: re.search(TAP_TEXT, v["text"]) is not None, RENDER_WAIT_S
        )
        out["tap_text"] = tapped["text"]
        await page.wait_painted(RENDER_WAIT_S, min_plots=2)  # the overview and the lanes
        await page.screenshot(shots / "selected.png")
        page.close()
    finally:
        browser.kill()
        browser.wait(timeout=20)
    return out


@pytest.mark.timeout(600)
def test_overview_shows_the_late_ranks_and_selection_opens_their_lanes(
    url: str, tmp_path: Path
) -> None:
    got = asyncio.run(_session(url, tmp_path))
    ov = got["overview"]
    # the overview: every rank, flagged ranks labelled and on top (straggler order by default)
    assert f"{RANKS} ranks" in ov["title"]
    assert abs(ov["y_end"] - ov["y_start"]) == RANKS
    assert ov["labels"][:2] == [f"⚑ r{s}" for s in STRAGGLERS] or sorted(
        ov["labels"][:2]
    ) == sorted(f"⚑ r{s}" for s in STRAGGLERS)
    # at a glance: the late ranks' rows hardly wait (little red), every other row does
    red = _red_share_per_row(tmp_path / "overview.png", ov, RANKS)
    others = float(np.median(red[2:]))
    assert others > 0.02, red
    assert red[0] < 0.25 * others, red
    assert red[1] < others, red
    # the button opened the flagged ranks
    m = re.search(r"Lanes below: ranks ([\d, ]+)", got["button_text"])
    assert m and sorted(int(x) for x in m.group(1).split(",")) == sorted(STRAGGLERS)
    assert set(STRAGGLERS) in got["button_lanes"], got["button_lanes"]
    # the drag opened the two rows it covered, over the time span it covered
    m = re.search(
        r"Lanes below: ranks (\d+), (\d+) · ([\d.,]+)–([\d.,]+) (ns|µs|ms|s|min)", got["drag_text"]
    )
    assert m, got["drag_text"][:500]
    picked = {int(m.group(1)), int(m.group(2))}
    assert picked.isdisjoint(STRAGGLERS)
    lo, hi = (float(m.group(i).replace(",", "")) * MS_PER[m.group(5)] for i in (3, 4))
    span = ov["x_end"] - ov["x_start"]
    assert abs(lo - got["drag_x"][0]) < 0.02 * span and abs(hi - got["drag_x"][1]) < 0.02 * span
    tl = got["timeline"]
    assert abs(tl["x_start"] - lo) < 0.02 * span and abs(tl["x_end"] - hi) < 0.02 * span
    lanes = {int(re.match(r"r(\d+) ", label).group(1)) for label in tl["labels"]}  # type: ignore[union-attr]
    assert lanes == picked, tl["labels"]
    # the click read out the top row's pixel
    m = re.search(TAP_TEXT, got["tap_text"])
    assert m and int(m.group(1)) in STRAGGLERS, got["tap_text"][:500]
    keep = os.environ.get("RANKSCOPE_SCREENSHOT")
    if keep:
        import shutil

        for name in ("overview", "selected"):
            shutil.copyfile(tmp_path / f"{name}.png", f"{keep}-{name}.png")
