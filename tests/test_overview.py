"""The rank × time overview (issue 15): an exact partition per bin, aggregated without loss.

Ground truth: the synthetic generator's per-rank compute and exposed communication (truth.json),
the time breakdown (which partitions the same way), and hand-built cells whose every sum is known.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

RANKS = 24
STRAGGLERS = (5, 18)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    from analysis_frames import synthetic_store
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    out = tmp_path_factory.mktemp("overview")
    store = synthetic_store(
        out, ranks=RANKS, seed=11, stragglers=[(STRAGGLERS[0], 3.0, 1.0), (STRAGGLERS[1], 2.0, 1.0)]
    )
    truth = json.loads((out / "truth.json").read_text())
    return analyze(store, ClusterSpec(scheduler=SYNCHRONOUS)), truth


def _overview(cells: np.ndarray, bin_ns: int = 1000, hosts: list[str] | None = None) -> Any:
    from rankscope.analysis.engine.overview import Grid, Overview

    n = cells.shape[0]
    return Overview(Grid(0, bin_ns), 0, np.arange(n), hosts or ["h"] * n, cells)


def _random_cells(rng: np.random.Generator, ranks: int, bins: int, bin_ns: int) -> np.ndarray:
    from rankscope.analysis.engine.overview import N_CATEGORIES

    raw = rng.random((ranks, bins, N_CATEGORIES)) ** 4  # many near-empty categories
    return (raw / raw.sum(axis=2, keepdims=True) * bin_ns).astype(np.float32)


# -- the partition, against the generator's truth and the breakdown ------------------------------


def test_overview_partitions_every_bin_and_matches_the_truth(job: tuple[Any, Any]) -> None:
    from rankscope.analysis.engine.overview import Category

    a, truth = job
    ov = a.overview
    assert ov is not None and len(ov.ranks) == RANKS
    # every bin is split exactly: the categories sum to the bin's width
    sums = ov.cells.astype(np.float64).sum(axis=2)
    assert np.allclose(sums, ov.grid.bin_ns, rtol=1e-6)
    tot = ov.totals().set_index("rank")
    for r in truth["ranks"]:
        rank = int(r["rank"])
        # compute and exposed communication, summed over the bins, are the generator's
        assert abs(tot.loc[rank, "compute"] - r["compute_ns"]) <= 1e-6 * r["compute_ns"] + 64
        exposed = tot.loc[rank, "wait"] + tot.loc[rank, "transfer"]
        assert abs(exposed - r["exposed_comm_ns"]) <= 1e-6 * r["exposed_comm_ns"] + 64
        # exposed waiting is part of the waiting the generator summed over collectives
        assert tot.loc[rank, "wait"] <= r["wait_ns"] * (1 + 1e-6) + 64
    # the slowest straggler arrives last: it waits (almost) never; the second (2 ms slow) waits
    # for the first (3 ms slow) only; everybody else waits for both
    median_wait = float(tot["wait"].median())
    assert median_wait > 1e6  # ns: the others waited more than 1 ms over the run
    first, second = STRAGGLERS
    assert tot.loc[first, "wait"] < 0.05 * median_wait
    assert (
        tot.loc[first, "wait"] < tot.loc[second, "wait"] < tot["wait"].drop(list(STRAGGLERS)).min()
    )
    assert int(Category.UNPROFILED) == ov.cells.shape[2] - 1


def test_overview_totals_equal_the_breakdown(job: tuple[Any, Any]) -> None:
    a, _ = job
    tot = a.overview.totals().set_index("rank")
    whole = a.whole().set_index("rank")
    profiled = tot.drop(columns="unprofiled").sum(axis=1)
    assert np.allclose(profiled, whole["total_ns"], rtol=1e-6)
    assert np.allclose(tot["compute"], whole["compute_ns"], rtol=1e-6)
    assert np.allclose(tot["wait"] + tot["transfer"], whole["comm_exposed_ns"], rtol=1e-6)
    assert np.allclose(tot["other"], whole["memory_ns"] + whole["other_ns"], rtol=1e-6)
    assert np.allclose(tot["input"] + tot["idle"], whole["idle_ns"], rtol=1e-6)


def test_overview_of_a_cpu_run_partitions_like_its_breakdown(
    data_dir: Path, tmp_path: Path
) -> None:
    from analysis_frames import merged
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze
    from rankscope.analysis.engine.overview import overview_of

    store = merged(data_dir, "cpu_gloo_4rank_straggler", tmp_path)
    a = analyze(store, ClusterSpec(scheduler=SYNCHRONOUS))
    tot = a.overview.totals().set_index("rank")
    whole = a.whole().set_index("rank")
    assert (whole["device"] == "cpu").all()
    assert np.allclose(tot["compute"], whole["compute_ns"], rtol=1e-6)
    assert np.allclose(tot["wait"] + tot["transfer"], whole["comm_exposed_ns"], rtol=1e-6)
    assert np.allclose(tot["input"], whole["input_ns"], rtol=1e-6)
    assert np.allclose(tot["idle"], whole["idle_ns"], rtol=1e-6)
    assert (tot["other"] == 0).all()
    # the standalone pass (rankscope view --no-analysis) gives the same cells
    alone = overview_of(store, ClusterSpec(scheduler=SYNCHRONOUS))
    assert alone is not None
    assert np.array_equal(alone.cells, a.overview.cells) and alone.first_bin == a.overview.first_bin


def test_wait_intervals_end_when_the_last_rank_arrived() -> None:
    import pandas as pd
    from rankscope.analysis.engine.overview import wait_intervals

    rows = pd.DataFrame(
        {
            "start": [100, 150, 500, 900],
            "end": [300, 260, 600, 950],
            "last_start": [200, 240, 500, 2000],  # arrived last at the third; fourth clipped
        }
    )
    s, e = wait_intervals(rows)
    assert s.tolist() == [100, 900] and e.tolist() == [240, 950]


# -- aggregation into pixels ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "bins", "width", "height", "window"),
    [
        (50, 4000, 333, 20, None),  # bins and ranks summed
        (50, 4000, 333, 20, (1_234_567, 2_345_678)),  # a zoomed window, bins summed
        (7, 300, 1000, 500, (10_500, 200_000)),  # fewer bins than pixels: one bin per column
    ],
)
def test_raster_keeps_every_nanosecond(
    ranks: int, bins: int, width: int, height: int, window: tuple[int, int] | None
) -> None:
    from rankscope.analysis.engine.overview import raster

    bin_ns = 1000
    rng = np.random.default_rng(ranks + bins)
    cells = _random_cells(rng, ranks, bins, bin_ns)
    ov = _overview(cells, bin_ns)
    order = rng.permutation(ranks)
    r = raster(ov, order, window=window, width=width, height=height)
    assert r.shares.shape[1] <= width and r.shares.shape[0] <= height
    assert np.allclose(r.shares.sum(axis=2), 1.0, atol=1e-5)
    # weight each pixel's shares by its time (columns × rows it sums): the category totals of the
    # covered bins come back, so nothing was dropped or double counted
    col_ns = np.diff(r.x_edges_ns).astype(np.float64)
    row_n = (r.rows.hi - r.rows.lo).astype(np.float64)
    back = (r.shares * col_ns[None, :, None] * row_n[:, None, None]).sum(axis=(0, 1))
    i0, i1 = (int(r.x_edges_ns[0]) // bin_ns, int(r.x_edges_ns[-1]) // bin_ns)
    want = cells[:, i0:i1].astype(np.float64).sum(axis=(0, 1))
    assert np.allclose(back, want, rtol=1e-4)
    if window is not None:  # the window is covered (widened to whole bins, never cut)
        assert r.x_edges_ns[0] <= window[0] and r.x_edges_ns[-1] >= min(window[1], bins * bin_ns)


def test_one_busy_bin_among_thousands_stays_visible() -> None:
    from rankscope.analysis.engine.overview import N_CATEGORIES, Category, raster, to_rgb

    bins, bin_ns = 100_000, 100
    cells = np.zeros((3, bins, N_CATEGORIES), np.float32)
    cells[:, :, int(Category.IDLE)] = bin_ns
    cells[1, 54_321] = 0
    cells[1, 54_321, int(Category.WAIT)] = bin_ns  # 100 ns of waiting in a 10 ms run
    r = raster(_overview(cells, bin_ns), np.arange(3), width=500, height=3)
    col = int(np.searchsorted(r.x_edges_ns, 54_321 * bin_ns, side="right") - 1)
    assert r.shares[1, col, int(Category.WAIT)] > 0
    assert (r.shares[[0, 2], :, int(Category.WAIT)] == 0).all()
    rgb = to_rgb(r)
    assert tuple(rgb[1, col]) != (255, 255, 255)  # not drawn as idle white


def test_pixel_colour_is_the_share_weighted_mix() -> None:
    from rankscope.analysis.engine.overview import (
        N_CATEGORIES,
        Category,
        colors_rgb,
        raster,
        to_rgb,
    )

    cells = np.zeros((1, 2, N_CATEGORIES), np.float32)
    cells[0, 0, int(Category.COMPUTE)] = 750
    cells[0, 0, int(Category.IDLE)] = 250
    cells[0, 1, int(Category.WAIT)] = 1000
    rgb = to_rgb(raster(_overview(cells), np.arange(1), width=2, height=1))
    colors = colors_rgb()
    want = 0.75 * colors[int(Category.COMPUTE)] + 0.25 * colors[int(Category.IDLE)]
    assert np.abs(rgb[0, 0].astype(float) - want).max() <= 0.5
    assert tuple(rgb[0, 1]) == tuple(colors[int(Category.WAIT)].astype(np.uint8))


# -- order, selection, drawing ------------------------------------------------------------------


def test_rank_orders(job: tuple[Any, Any]) -> None:
    from rankscope.analysis.engine.overview import RankOrder, rank_order

    a, _ = job
    ov = a.overview
    by = {o: ov.ranks[rank_order(ov, a, o)].tolist() for o in RankOrder}
    assert sorted(by[RankOrder.STRAGGLER][:2]) == sorted(STRAGGLERS)
    assert by[RankOrder.STRAGGLER][:2] == a.flagged_ranks()[:2]
    assert set(by[RankOrder.LATENESS][:2]) == set(STRAGGLERS)  # the late ranks come first
    assert by[RankOrder.RANK] == sorted(by[RankOrder.RANK])
    hosts = [ov.hosts[int(np.flatnonzero(ov.ranks == r)[0])] for r in by[RankOrder.HOST]]
    assert hosts == sorted(hosts)
    for o in RankOrder:  # every order shows every rank once
        assert sorted(by[o]) == list(range(RANKS))


def test_selection_maps_to_ranks_and_a_window(job: tuple[Any, Any]) -> None:
    from rankscope.analysis.views.overview_plot import overview_plot

    a, _ = job
    p = overview_plot(a, width=400)
    assert p.ranks_between(0.2, 1.8) == p.overview.ranks[p.order[:2]].tolist()
    assert sorted(p.ranks_between(0.2, 1.8)) == sorted(STRAGGLERS)
    assert p.ranks_between(1.7, -3) == p.ranks_between(0, 1.7)
    lo, hi = p.window_between(2.0, 1.0)
    assert lo == p.origin_ns + 1_000_000 and hi == p.origin_ns + 2_000_001


def test_overview_renders_with_flagged_labels_and_reads_out_a_pixel(job: tuple[Any, Any]) -> None:
    import holoviews as hv
    from bokeh.models import GlyphRenderer, ImageRGBA
    from rankscope.analysis.engine.overview import CATEGORY_LABELS, Category
    from rankscope.analysis.views.overview_plot import overview_image, overview_plot, pixel_text

    a, _ = job
    p = overview_plot(a, width=300)
    el = overview_image(p.overview, p.order, flagged=a.flagged_ranks(), width=300)
    fig = hv.render(el, backend="bokeh")
    images = [
        r for r in fig.renderers if isinstance(r, GlyphRenderer) and isinstance(r.glyph, ImageRGBA)
    ]
    assert len(images) == 1
    img = images[0].data_source.data["image"][0]
    assert img.shape[1] <= 300 and img.shape[0] == RANKS  # one pixel row per rank
    labels = fig.yaxis[0].major_label_overrides
    flagged_labels = {v for v in labels.values() if v.startswith("⚑")}
    assert flagged_labels == {f"⚑ r{s}" for s in STRAGGLERS}
    assert f"{RANKS} ranks" in fig.title.text and "1 px =" in fig.title.text
    legend = {item.label["value"] for item in fig.legend[0].items}
    assert legend == set(CATEGORY_LABELS.values())
    top = p.overview.ranks[p.order[0]]
    text = pixel_text(p, 5.0, 0.5)
    assert text.startswith(f"**rank {top} (") and CATEGORY_LABELS[Category.COMPUTE] in text


def test_report_draws_every_rank_over_time(job: tuple[Any, Any]) -> None:
    import base64
    import io
    import re

    from PIL import Image
    from rankscope.analysis.engine.overview import CATEGORY_COLORS, FLAGGED_PX, Category
    from rankscope.analysis.render.overview_section import FLAG_RGB, RANK_PX, STRIP_PX
    from rankscope.analysis.render.report import render_html

    a, _ = job
    html = render_html(a)
    assert "<h2>Every rank over time</h2>" in html
    m = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)
    assert m
    with Image.open(io.BytesIO(base64.b64decode(m.group(1)))) as img:
        px = np.asarray(img.convert("RGB"))
    assert px.shape[0] == RANK_PX * RANKS  # the image's height: RANK_PX per rank
    # the flag strip marks the flagged ranks' rows: on top, together, each rank's at least
    # FLAGGED_PX tall (magnified), and nothing else
    flag_rows = (px[:, 0] == FLAG_RGB).all(axis=1)
    n_flag = int(flag_rows.sum())
    assert flag_rows[:n_flag].all() and n_flag >= 2 * FLAGGED_PX
    # the slowest straggler's rows hold (almost) none of the waiting red every other row has
    red = np.array([int(CATEGORY_COLORS[Category.WAIT][i : i + 2], 16) for i in (1, 3, 5)])
    body = px[:, STRIP_PX + 2 :]
    red_rows = (np.abs(body.astype(int) - red).max(axis=2) <= 2).mean(axis=1)
    first = red_rows[1 : n_flag // 2 - 1].mean()
    rest = red_rows[n_flag:]
    others = rest[: len(rest) // 8 * 8].reshape(-1, 8).mean(axis=1)
    assert first < 0.25 * others.min()
    assert "24 ranks × " in html and "Top rows: the flagged rank(s)" in html


@pytest.mark.parametrize(
    ("n", "height", "flagged"), [(1024, 512, [0, 1]), (200, 512, [3, 150]), (30, 420, [2])]
)
def test_flagged_rows_are_magnified_and_every_rank_kept(
    n: int, height: int, flagged: list[int]
) -> None:
    from rankscope.analysis.engine.overview import FLAGGED_PX, raster, row_layout

    layout = row_layout(n, height, flagged)
    assert layout.n_rows <= max(height, n + len(flagged) * FLAGGED_PX)
    # the groups partition the display rows: each rank in exactly one group, in order
    starts = np.unique(layout.lo)
    ends = np.unique(layout.hi)
    assert starts[0] == 0 and ends[-1] == n and np.array_equal(starts[1:], ends[:-1])
    px = height / layout.n_rows  # screen pixels per image row
    for f in flagged:
        mine = np.flatnonzero((layout.lo == f) & (layout.hi == f + 1))
        assert len(mine) * px >= FLAGGED_PX - 1e-9 or height / n >= FLAGGED_PX
        assert layout.rows_between(mine[0] + 0.2, mine[-1] + 0.8) == (f, f + 1)
    # aggregation over this layout still gives back every nanosecond (each group counted once)
    rng = np.random.default_rng(n)
    cells = _random_cells(rng, n, 64, 1000)
    r = raster(_overview(cells), np.arange(n), width=64, rows=layout)
    first = np.r_[True, (layout.lo[1:] != layout.lo[:-1])]
    weight = (layout.hi - layout.lo)[first].astype(float)
    back = (r.shares[first] * 1000.0 * weight[:, None, None]).sum(axis=(0, 1))
    assert np.allclose(back, cells.astype(np.float64).sum(axis=(0, 1)), rtol=1e-4)


# -- the report's PNG, written without Pillow ------------------------------------------------


@pytest.mark.parametrize(
    ("height", "width", "kind"),
    [(1, 1, "noise"), (3, 7, "noise"), (80, 912, "bands"), (512, 913, "ramp"), (64, 50, "ramp")],
)
def test_png_holds_the_image_exactly(height: int, width: int, kind: str) -> None:
    """Pillow (another decoder than the writer) reads back every pixel; each row filter wins
    somewhere (bands of colour along rows: None; each row the one above plus one: Up)."""
    import io

    from PIL import Image
    from rankscope.analysis.render.overview_section import PNG_SIGNATURE, png_rgb

    rng = np.random.default_rng(height * 1000 + width)
    if kind == "noise":
        img = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    elif kind == "ramp":  # rows of noise, each the one above + 1 (mod 256)
        img = rng.integers(0, 256, (1, width, 3), dtype=np.uint8) + np.arange(
            height, dtype=np.uint8
        ).reshape(-1, 1, 1)
    else:  # what the report draws: runs of colour along rows, rows repeated (stretched)
        row = np.repeat(rng.integers(0, 256, (width // 40 + 1, 3), dtype=np.uint8), 40, axis=0)
        img = np.repeat(row[None, :width], height, axis=0)
        img[:: max(1, height // 7)] = rng.integers(0, 256, (width, 3), dtype=np.uint8)
    data = png_rgb(img)
    assert data.startswith(PNG_SIGNATURE)
    with Image.open(io.BytesIO(data)) as back:
        back.load()  # checks every chunk's CRC and the zlib stream
        assert back.format == "PNG" and back.mode == "RGB" and back.size == (width, height)
        assert np.array_equal(np.asarray(back), img)


def test_report_is_rendered_without_pillow(job: tuple[Any, Any], tmp_path: Path) -> None:
    """The HTML report (with its overview image) is written without importing Pillow: its import
    and plugin registration were ~25 ms of every report."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import sys
        from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze
        from rankscope.analysis.render.report import render_html
        html = render_html(analyze({str(job[0].path)!r}, ClusterSpec(scheduler=SYNCHRONOUS)))
        assert "data:image/png;base64," in html
        print("PIL" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip() == "False", done.stderr[-2000:]
