"""The cross-rank timeline: rows, rectangles per window, decimation, collectives, Bokeh rendering."""

from __future__ import annotations

from pathlib import Path

import holoviews as hv
import numpy as np
import pytest
from analysis_frames import merged
from rankscope.analysis.compute.collectives import collective_waits
from rankscope.analysis.engine.driver import SYNCHRONOUS, Analysis, ClusterSpec, analyze
from rankscope.analysis.store.reader import Store, open_store
from rankscope.analysis.store.schema import EventKind
from rankscope.analysis.views.timeline import (
    NS_PER_MS,
    step_window,
    store_extent,
    timeline,
    timeline_overlay,
    timeline_rows,
)

#: Overlay layers that are not events of the store (and the lane coverage's, "coverage: …").
EXTRA = {"collective: wait", "collective: transfer", "last to arrive", "straggler rank"}


def _is_event_layer(label: str) -> bool:
    return label not in EXTRA and not label.startswith("coverage: ")


@pytest.fixture(scope="module")
def stores(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("timeline")
    return {
        name: merged(data_dir, name, out)
        for name in ("cpu_gloo_4rank_straggler", "param_dlrm_8rank")
    }


@pytest.fixture(scope="module")
def cpu(stores: dict[str, Path]) -> Store:
    return open_store(stores["cpu_gloo_4rank_straggler"])


@pytest.fixture(scope="module")
def gpu(stores: dict[str, Path]) -> Store:
    return open_store(stores["param_dlrm_8rank"])


@pytest.fixture(scope="module")
def cpu_analysis(stores: dict[str, Path]) -> Analysis:
    return analyze(stores["cpu_gloo_4rank_straggler"], ClusterSpec(scheduler=SYNCHRONOUS))


def _events(overlay: hv.Overlay) -> int:
    return sum(len(el) for el in overlay if _is_event_layer(el.label))


def _layer(overlay: hv.Overlay, label: str) -> hv.Element:
    return next(el for el in overlay if el.label == label)


def test_one_row_per_rank_and_lane(gpu: Store) -> None:
    rows = timeline_rows(gpu)
    expected = [(r, lane) for r in gpu.ranks for lane in gpu.lanes(r)["lane"]]
    assert [(row.rank, row.lane) for row in rows] == expected
    assert len(rows) == sum(len(gpu.lanes(r)) for r in gpu.ranks)
    assert any(row.label == "r3 stream 84" for row in rows), "GPU streams get their own row"
    assert len({row.label for row in rows}) == len(rows), "labels tell rows apart"
    assert any(row.label.startswith("r0 python3 [") for row in rows), "same-name threads: + tid"
    ov = timeline(gpu)[()]
    ticks = ov.opts.get().kwargs["yticks"]
    assert [label for _, label in ticks] == [row.label for row in rows]


def test_small_window_draws_every_event_in_it(cpu: Store) -> None:
    """A 300 µs window around the first collective: every overlapping event is one rectangle."""
    coll = cpu.collectives()
    start = int(coll["start"].min())
    window = (start - 100_000, start + 200_000)
    origin = store_extent(cpu).start_ns
    ov = timeline_overlay(cpu, window, origin_ns=origin, width=100_000)  # 1.5 ns per px
    expected = sum(len(cpu.events(r, columns=["ts"], window=window)) for r in cpu.ranks)
    assert expected > 0
    assert _events(ov) == expected
    # rectangles sit on their (rank, lane) row and span exactly the event, in ms since origin
    rows = timeline_rows(cpu)
    ev = cpu.events(1, window=window)
    rects = _layer(ov, "cpu op").dframe()
    mine = rects[rects["rank"] == 1].sort_values("x0")
    ops = ev[ev["kind"] == int(EventKind.CPU_OP)].sort_values("ts", kind="stable")
    np.testing.assert_allclose(mine["x0"].to_numpy(), (ops["ts"].to_numpy() - origin) / NS_PER_MS)
    np.testing.assert_allclose(
        (mine["x1"] - mine["x0"]).to_numpy(), ops["dur"].to_numpy() / NS_PER_MS, atol=1e-9
    )
    row_ids = {(r.rank, r.lane): i for i, r in enumerate(rows)}
    want_rows = sorted(row_ids[(1, int(lane))] for lane in ops["lane"])
    assert sorted(np.floor(mine["y0"]).astype(int)) == want_rows


def test_wide_view_decimates_and_zoom_restores(cpu: Store) -> None:
    total = sum(len(cpu.events(r, columns=["ts"])) for r in cpu.ranks)
    dm = timeline(cpu, width=600)
    wide = dm[()]
    assert 0 < _events(wide) < total, "sub-pixel events are left out of the wide view"
    assert f"of {total:,} events drawn" in wide.opts.get().kwargs["title"]
    # zoom to 1 ms: everything in that window is drawn
    extent = store_extent(cpu)
    first = int(cpu.collectives()["start"].min())
    lo = (first - extent.start_ns) / NS_PER_MS
    dm.event(x_range=(lo, lo + 1.0))
    zoomed = dm[()]
    window = (first, first + NS_PER_MS)
    in_window = [cpu.events(r, columns=["dur"], window=window) for r in cpu.ranks]
    visible = sum(int((e["dur"] >= NS_PER_MS // 1200).sum()) for e in in_window)
    assert _events(zoomed) == visible
    assert [el.label for el in zoomed] == [el.label for el in wide], "same layers at every zoom"


def test_max_events_keeps_the_longest(cpu: Store) -> None:
    ext = store_extent(cpu)
    ov = timeline_overlay(
        cpu, (ext.start_ns, ext.end_ns), origin_ns=ext.start_ns, width=10**9, max_events=50
    )
    assert _events(ov) == 50
    durs = np.concatenate([cpu.events(r, columns=["dur"])["dur"].to_numpy() for r in cpu.ranks])
    shortest_kept = min(
        float((el.dframe()["x1"] - el.dframe()["x0"]).min())
        for el in ov
        if _is_event_layer(el.label) and len(el)
    )
    assert shortest_kept * NS_PER_MS >= np.sort(durs)[-50] - 1


def test_collectives_split_into_wait_and_transfer(cpu: Store) -> None:
    ext = store_extent(cpu)
    ov = timeline(cpu)[()]
    waits = collective_waits(cpu.collectives(), cpu.clock())
    wait = _layer(ov, "collective: wait").dframe()
    transfer = _layer(ov, "collective: transfer").dframe()
    assert len(wait) == len(transfer) == len(waits)
    w = wait.sort_values(["coll", "rank"]).reset_index(drop=True)
    t = transfer.sort_values(["coll", "rank"]).reset_index(drop=True)
    ref = waits.sort_values(["coll", "rank"]).reset_index(drop=True)
    np.testing.assert_allclose((w["x1"] - w["x0"]) * NS_PER_MS, ref["wait_ns"], atol=1.0)
    np.testing.assert_allclose((t["x1"] - t["x0"]) * NS_PER_MS, ref["transfer_ns"], atol=1.0)
    np.testing.assert_allclose(w["x0"], (ref["arrival"] - ext.start_ns) / NS_PER_MS)
    np.testing.assert_allclose(w["x1"], t["x0"])
    last = _layer(ov, "last to arrive")
    assert len(last) == waits["coll"].nunique(), "one last-arrival marker per collective"


def test_stragglers_marked_from_the_analysis(cpu: Store, cpu_analysis: Analysis) -> None:
    assert cpu_analysis.straggler_ranks() == [2]
    ov = timeline(cpu, analysis=cpu_analysis)[()]
    ticks = [label for _, label in ov.opts.get().kwargs["yticks"]]
    marked = [label for label in ticks if "straggler" in label]
    assert marked and all(label.startswith("r2 ") for label in marked)
    assert len(marked) == len(cpu.lanes(2))
    shade = _layer(ov, "straggler rank")
    assert len(shade) == len(cpu.lanes(2))
    plain = timeline(cpu)[()]
    assert not any("straggler" in label for _, label in plain.opts.get().kwargs["yticks"])


def test_filters_and_steps(stores: dict[str, Path], cpu: Store) -> None:
    dm = timeline(
        str(stores["cpu_gloo_4rank_straggler"]),
        ranks=[0, 2],
        kinds=[EventKind.COMM_CPU],
        steps=(3, 3),
    )
    ov = dm[()]
    labels = [el.label for el in ov]
    assert "comm cpu" in labels and "cpu op" not in labels
    rects = _layer(ov, "comm cpu").dframe()
    assert set(rects["rank"]) <= {0, 2} and len(rects) > 0
    lo, hi = step_window(cpu, 3, 3)
    xlim = ov.opts.get().kwargs["xlim"]
    origin = store_extent(cpu, [0, 2]).start_ns
    assert xlim == pytest.approx(((lo - origin) / NS_PER_MS, (hi - origin) / NS_PER_MS))
    with pytest.raises(KeyError, match="steps"):
        step_window(cpu, 99)


@pytest.mark.parametrize("which", ["cpu", "gpu"])
def test_renders_to_bokeh(which: str, request: pytest.FixtureRequest) -> None:
    from bokeh.models import HoverTool

    store: Store = request.getfixturevalue(which)
    fig = hv.render(timeline(store), backend="bokeh")
    assert type(fig).__name__ == "figure"
    hovers = [t for t in fig.tools if isinstance(t, HoverTool)]
    assert hovers, "hover tooltips are attached"
    tips = {name for h in hovers for name, _ in h.tooltips}
    assert {"name", "rank", "start", "duration"} <= tips
    assert fig.yaxis[0].major_label_overrides, "rows are labelled rank + lane"
    # time written in the unit of the visible span, by the browser at every zoom
    assert type(fig.xaxis[0].formatter).__name__ == "CustomJSTickFormatter"
    assert fig.xaxis[0].formatter.args["xr"] is fig.x_range
    assert type(fig.xaxis[0].ticker).__name__ == "CompositeTicker"
    assert "(ms" not in fig.xaxis[0].axis_label


def test_no_event_is_dropped_from_the_wide_view(gpu: Store) -> None:
    """A 200-px view of the whole GPU run: each event is drawn or in the lane coverage, once."""
    from rankscope.analysis.views.lane_coverage import bin_edges, lane_coverage
    from rankscope.analysis.views.timeline import timeline_frame

    ext = store_extent(gpu)
    window = (ext.start_ns, ext.end_ns)
    total = sum(len(gpu.events(r, columns=["ts"], window=window)) for r in gpu.ranks)
    frame, left_out = timeline_frame(
        gpu, window, origin_ns=ext.start_ns, min_dur_ns=(window[1] - window[0]) // 400
    )
    assert len(frame) > 0 and len(left_out) > 0
    assert len(frame) + len(left_out) == total
    cov = lane_coverage(left_out, bin_edges(window, 100))
    assert int(cov["events"].sum()) == len(left_out)
    ov = timeline_overlay(gpu, window, origin_ns=ext.start_ns, width=200)
    title = ov.opts.get().kwargs["title"]
    assert title.startswith(f"{len(frame):,} of {total:,} events drawn, {len(left_out):,} as ")
    assert "coverage per" in title
    bars = sum(len(el) for el in ov if el.label.startswith("coverage: "))
    assert bars > 0, "what is not drawn one by one is drawn as coverage"


def test_a_busy_lane_is_as_busy_in_its_coverage(gpu: Store) -> None:
    """Nothing drawn one by one (max_events=0): each lane's coverage over the run is the union
    of its events (sorted and merged here by hand), the busiest GPU stream included."""
    from rankscope.analysis.views.lane_coverage import bin_edges, lane_coverage
    from rankscope.analysis.views.timeline import timeline_frame

    ext = store_extent(gpu)
    window = (ext.start_ns, ext.end_ns)
    frame, left_out = timeline_frame(gpu, window, origin_ns=ext.start_ns, ranks=[0], max_events=0)
    assert len(frame) == 0
    cov = lane_coverage(left_out, bin_edges(window, 300))
    busiest = 0.0
    for lane, ev in gpu.events(0, columns=["ts", "dur", "lane"]).groupby("lane"):
        union, end = 0, -(2**62)
        for t, d in sorted(zip(ev["ts"].tolist(), ev["dur"].tolist(), strict=True)):
            lo, hi = max(t, end), t + d
            union += max(hi - lo, 0)
            end = max(end, hi)
        got = int(cov.loc[cov["lane"] == lane, "busy_ns"].sum())
        assert got == union, lane
        busiest = max(busiest, union / (window[1] - window[0]))
    assert busiest > 0.3, "a busy stream"


def test_app_controls_drive_the_timeline(cpu: Store, cpu_analysis: Analysis) -> None:
    """The Panel app (what `rankscope view` serves): each control changes the timeline shown."""
    import panel as pn
    from rankscope.analysis.views.app import build_app

    app = build_app(cpu, cpu_analysis)
    controls, middle, findings = app[1]
    by_label = {getattr(w, "label", None): w for w in controls}
    ranks_w, step_w, kinds_w = by_label["Ranks"], by_label["Zoom to step"], by_label["Event kinds"]
    plot = middle[-1]  # under the overview, its selection line and its read-out
    plot._replace_pane(force=True)  # the lanes load once the page has (defer_load): do it here
    assert ranks_w.value == cpu.ranks
    shown = plot._pane.object[()]
    assert _events(shown) > 0
    step_w.value = "step 3"
    zoomed = plot._pane.object[()]
    lo, hi = step_window(cpu, 3, 3)
    origin = cpu_analysis.overview.grid.origin_ns  # the app's axis is the overview's
    assert zoomed.opts.get().kwargs["xlim"] == pytest.approx(
        ((lo - origin) / NS_PER_MS, (hi - origin) / NS_PER_MS)
    )
    ranks_w.value = [2]
    one = plot._pane.object[()]
    assert {int(r) for el in one if el.label not in EXTRA for r in el.dframe()["rank"]} == {2}
    kinds_w.value = ["comm cpu"]
    only = plot._pane.object[()]
    assert [el.label for el in only if _is_event_layer(el.label)] == ["comm cpu"]
    # the coverage layers are those of the kinds chosen
    assert [el.label for el in only if el.label.startswith("coverage: ")] == [
        "coverage: communication"
    ]
    ranks_w.value = []
    assert isinstance(plot._pane, pn.pane.Markdown)
    assert "Select at least one rank" in plot._pane.object
    html = findings[2].object
    assert 'class="straggler"' in html and html.count("<tr") == len(cpu.ranks) + 1
    assert "rank 2" in findings[4].object


def test_app_says_what_to_do_first(cpu: Store, cpu_analysis: Analysis) -> None:
    """The app's findings column starts with the report's "What to do": the same items, in the
    same order, each with its evidence, fix and gain (docs/advice.md)."""
    from rankscope.analysis.conclude.advice import advice
    from rankscope.analysis.views.app import advice_markdown, build_app

    items = advice(cpu_analysis)
    assert items, "the straggler job has something to do"
    first = build_app(cpu, cpu_analysis)[1][2][0].object
    assert first.startswith("### What to do\n")
    flat = " ".join(first.replace("\\", "").split())
    at = [flat.index(" ".join(i.headline.split())) for i in items]
    assert at == sorted(at), "most valuable first, as in the report"
    for n, i in enumerate(items, 1):
        assert f"{n}. **" in first
        assert " ".join(i.fix.split())[:40].replace("_", "") in flat.replace("_", "")
        assert i.gain.split(",")[0] in flat
    assert advice_markdown([]).endswith(
        "Nothing a rule acts on in this trace (the rules: docs/advice.md)."
    )


def test_app_without_analysis(cpu: Store) -> None:
    """`rankscope view --no-analysis`: the timeline still shows waits (from the store), no findings."""
    from rankscope.analysis.views.app import build_app

    app = build_app(cpu)
    _, middle, findings = app[1]
    plot = middle[-1]
    assert len(findings) == 0
    ov = plot._pane.object[()]
    assert len(_layer(ov, "collective: wait")) == len(cpu.collectives())
    assert "straggler rank" not in [el.label for el in ov]


def test_app_without_analysis_still_has_the_overview(cpu: Store) -> None:
    """`rankscope view --no-analysis` computes the overview alone: it is drawn, ordered by host or
    rank only (no stragglers to sort by), and nothing is flagged."""
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec
    from rankscope.analysis.engine.overview import RankOrder, overview_of
    from rankscope.analysis.views.app import build_app

    ov = overview_of(cpu, ClusterSpec(scheduler=SYNCHRONOUS))
    assert ov is not None and list(ov.ranks) == list(cpu.ranks)
    app = build_app(cpu, None, ov)
    controls, middle, findings = app[1]
    order = next(w for w in controls if getattr(w, "label", "") == "Overview: order ranks by")
    assert order.options == [RankOrder.HOST.value, RankOrder.RANK.value]
    button = next(w for w in controls if type(w).__name__ == "Button")
    assert button.disabled
    overview = middle[0]._pane.object  # the overview's DynamicMap
    shown = overview[()]
    assert "4 ranks" in shown.opts.get().kwargs["title"]
    assert len(findings) == 0
