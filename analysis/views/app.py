"""The Panel app served by ``rankscope view``: overview first, then the lanes of chosen ranks.

Left: the overview's rank order, "open the flagged ranks", rank selector, step selector (zooms to
that ProfilerStep on every rank), event-kind filter. Middle, on top: the rank × time overview
(:mod:`rankscope.analysis.views.overview_plot`: every rank, every pixel an aggregate); box-select ranks
and a time span on it to open their per-lane timeline below, click a pixel for its shares. Below:
the timeline (:func:`rankscope.analysis.views.timeline.timeline`) of the chosen ranks, re-read from the
store on every zoom. Right: "What to do" first (the advice, as in every report: docs/advice.md),
then the per-rank summary (verdict and where the time went, % of profiled time)
and the findings (stragglers with their evidence and what fixing them would save, the pipeline
finding, the what-if scenarios), from
:func:`rankscope.analysis.conclude.findings.findings` — the same sentences as the terminal and the report.

Built per browser session by :func:`build_app`; the store and the analysis are shared and
read-only (all Bokeh sessions of one server run on its single IO-loop thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.analysis.conclude.advice import Advice
    from rankscope.analysis.conclude.findings import Finding
    from rankscope.analysis.engine.driver import Analysis
    from rankscope.analysis.engine.overview import Overview
    from rankscope.analysis.store.reader import Store

#: Title of the app (page title and header).
APP_TITLE = "rankscope timeline"
#: Width of the timeline plot inside the app, px.
PLOT_WIDTH = 690
#: Width of the overview's image (its frame: the y labels come on top), px.
OVERVIEW_WIDTH = PLOT_WIDTH - 70
#: Width of the controls column, px.
SIDEBAR_WIDTH = 210
#: Width of the findings column, px.
FINDINGS_WIDTH = 380
#: With more ranks than this, the per-rank table and the lanes open at start are summarised
#: (the overview shows every rank).
DEFAULT_MAX_RANKS = 16
#: Lanes open at start with many ranks and nobody flagged.
START_RANKS = 4
#: A selection on the overview opens the lanes of at most this many ranks (the first ones).
MAX_OPEN_RANKS = 16
#: What the overview says before anything is selected.
OVERVIEW_HINT = (
    "Box-select ranks and a time span on the overview to open their lanes below; "
    "click a pixel for its shares."
)
#: Label of the step selector's "no zoom" choice.
WHOLE_RUN = "whole run"
#: Non-breaking hyphen: "communication-bound" wraps at its space, never at the hyphen.
NB_HYPHEN = "\u2011"
#: Page CSS: compact tables.
TABLE_CSS = """
table.rs-summary { border-collapse: collapse; font-size: 11px; width: 100%; }
table.rs-summary th, table.rs-summary td { padding: 2px 6px; text-align: right; }
table.rs-summary th { border-bottom: 1px solid #999; }
table.rs-summary td:nth-child(-n+2), table.rs-summary th:nth-child(-n+2) { text-align: left; }
table.rs-summary tr.straggler td { background: #FBE3E3; font-weight: 600; }
"""


def _pct(x: Any) -> str:
    return f"{100 * float(x):.0f}%"


def summary_html(analysis: Analysis, only: list[int] | None = None) -> str:
    """Per-rank table: verdict, compute / comm wait / transfer / input / idle %.

    ``only``: these ranks, preceded by the median over every rank (many ranks: the table would
    be as long as the job is wide; the overview shows every rank)."""
    from html import escape

    v = analysis.verdicts
    strag = set(analysis.flagged_ranks())
    head = (
        "<tr><th>rank</th><th>verdict</th><th>compute</th><th>wait</th>"
        "<th>transfer</th><th>input</th><th>idle</th></tr>"
    )
    body = []
    for r in v.sort_values("rank").itertuples():
        cls = ' class="straggler"' if int(r.rank) in strag else ""
        body.append(
            f"<tr{cls}><td>{int(r.rank)}</td><td>{escape(str(r.verdict)).replace('-', NB_HYPHEN)}</td>"
            f"<td>{_pct(r.compute_share)}</td>"
            f"<td>{_pct(r.comm_wait_share)}</td><td>{_pct(r.comm_transfer_share)}</td>"
            f"<td>{_pct(r.input_share)}</td><td>{_pct(r.idle_share)}</td></tr>"
        )
    if only is not None:
        keep = {int(r) for r in only}
        body = [
            row
            for row, r in zip(body, v.sort_values("rank")["rank"], strict=True)
            if int(r) in keep
        ]
        med = v.median(numeric_only=True)
        body.insert(
            0,
            f"<tr><td>median</td><td>of {len(v)} ranks</td><td>{_pct(med.compute_share)}</td>"
            f"<td>{_pct(med.comm_wait_share)}</td><td>{_pct(med.comm_transfer_share)}</td>"
            f"<td>{_pct(med.input_share)}</td><td>{_pct(med.idle_share)}</td></tr>",
        )
    return f'<table class="rs-summary">{head}{"".join(body)}</table>'


#: Characters that markdown would read as emphasis, links or HTML (backticks stay: code spans).
MARKDOWN_SPECIALS = str.maketrans({c: "\\" + c for c in "\\*_[]<>"})


def _md(text: str) -> str:
    """Plain text as markdown that shows it as is (a file name's underscores stay underscores)."""
    return text.translate(MARKDOWN_SPECIALS)


def finding_markdown(f: Finding) -> str:
    """One finding as a markdown bullet: bold headline, then the evidence and cause as everywhere
    else; a straggler adds its p-value and the wait it caused (the figures the table shows)."""
    from rankscope.analysis.conclude.findings import FindingKind

    extra = ""
    if f.kind == FindingKind.WHAT_IF and f.rank is not None:
        return f"  - *{_md(f.headline)}*{_md(f.tail)}"  # under its straggler / bottleneck
    if f.kind == FindingKind.STRAGGLER:
        g = f.figures
        extra = (
            f" (p = {g['p_value']:.2g}; made the others wait {g['wait_caused_s'] * 1e3:.1f} ms, "
            f"{g['wait_share']:.0%} of all wait)"
        )
    return f"- **{_md(f.headline)}**{_md(f.tail)}{extra}"


def findings_markdown(items: list[Finding]) -> str:
    """The findings column's text: one bullet per finding, in the order they were found."""
    return "\n".join(finding_markdown(f) for f in items)


def advice_markdown(items: list[Advice]) -> str:
    """The "What to do" section's text (docs/advice.md): the same items, in the same order, as
    the terminal and the report — per item its class, headline and evidence, the fix and the
    gain; one line saying so when no rule fired."""
    from rankscope.analysis.render.format import ADVICE_TITLE
    from rankscope.analysis.render.html_report import ADVICE_NONE

    head = f"### {ADVICE_TITLE}\n"
    if not items:
        return head + _md(ADVICE_NONE)
    return head + "\n".join(
        f"{n}. **{_md(i.headline)}** \\[{_md(str(i.bottleneck))}\\]: {_md(i.seen)}  \n"
        f"   *do:* {_md(i.fix)}  \n"
        f"   *gain:* {_md(i.gain)}"
        for n, i in enumerate(items, 1)
    )


def pipeline_markdown(analysis: Analysis) -> str:
    """The pipeline finding alone (empty without send/recv ops), as in the findings column."""
    from rankscope.analysis.conclude.findings import findings, pipeline_findings

    return findings_markdown(pipeline_findings(findings(analysis)))


def _default_ranks(store: Store, analysis: Analysis | None) -> list[int]:
    """The ranks whose lanes are open at start: all of a small job; with many ranks (the
    overview shows them all) the flagged ranks and the first rank as a reference, or the first
    ``START_RANKS`` when nobody is flagged."""
    ranks = list(store.ranks)
    if len(ranks) <= DEFAULT_MAX_RANKS:
        return ranks
    strag = analysis.flagged_ranks()[:MAX_OPEN_RANKS] if analysis is not None else []
    if strag:
        return sorted({*strag, next(r for r in ranks if r not in strag)})
    return ranks[:START_RANKS]


def selection_text(ranks: list[int], window: tuple[int, int] | None, origin_ns: int) -> str:
    """The line under the overview saying which lanes are open below."""
    shown = ranks[:MAX_OPEN_RANKS]
    text = "Lanes below: rank" + ("s " if len(shown) > 1 else " ") + ", ".join(map(str, shown))
    if len(ranks) > len(shown):
        text += f" (the first {len(shown)} of the {len(ranks)} selected)"
    if window is not None:
        from rankscope.analysis.views.time_axis import format_range

        text += f" · {format_range(window[0] - origin_ns, window[1] - origin_ns)}"
    return text


def build_app(
    store: Store, analysis: Analysis | None = None, overview: Overview | None = None
) -> Any:
    """The app for one browser session (a Panel layout); ``analysis`` adds waits, findings and
    its overview; ``overview`` (``overview.overview_of``) is the overview without an analysis."""
    import holoviews as hv
    import panel as pn
    from rankscope.analysis.engine.overview import RankOrder
    from rankscope.analysis.views.overview_plot import overview_plot, pixel_text
    from rankscope.analysis.views.timeline import present_kinds, timeline

    hv.extension("bokeh", logo=False)
    pn.extension()
    run_id = store.meta.get("run_id") or store.path.parent.name
    steps = sorted({int(s) for s in store.steps()["step"]})
    start_ranks = _default_ranks(store, analysis)
    # the kinds of the ranks shown first: every rank's would be a pass over the whole store
    kinds = present_kinds(store, start_ranks)
    ov = analysis.overview if analysis is not None else overview
    origin = ov.grid.origin_ns if ov is not None else None
    rank_w = pn.widgets.MultiChoice(
        label="Ranks",
        options=list(store.ranks),
        value=start_ranks,
        width=SIDEBAR_WIDTH - 20,
    )
    step_w = pn.widgets.Select(
        label="Zoom to step",
        options=[WHOLE_RUN, *[f"step {s}" for s in steps]],
        value=WHOLE_RUN,
        width=SIDEBAR_WIDTH - 20,
    )
    kind_names = {k.name.lower().replace("_", " "): k for k in kinds}
    kind_w = pn.widgets.CheckBoxGroup(
        label="Event kinds", options=list(kind_names), value=list(kind_names), inline=False
    )
    #: the time span chosen on the overview (aligned ns), None: the step selector decides
    window_w = pn.widgets.LiteralInput(value=None, type=(tuple, type(None)), visible=False)
    step_w.param.watch(lambda _e: setattr(window_w, "value", None), "value")

    def plot(ranks: list[int], step: str, chosen: list[str], window: Any) -> Any:
        if not ranks:
            return pn.pane.Markdown("Select at least one rank.")
        if not chosen:
            return pn.pane.Markdown("Select at least one event kind.")
        n = None if step == WHOLE_RUN else int(step.split()[1])
        return timeline(
            store,
            ranks=sorted(ranks),
            kinds=[kind_names[c] for c in chosen],
            window=tuple(window) if window is not None and n is None else None,
            steps=(n, n) if n is not None else None,
            analysis=analysis,
            width=PLOT_WIDTH,
            origin_ns=origin,
        )

    hint = pn.pane.Markdown(
        "Wheel: zoom time · drag: pan · box: zoom. Events too short to draw one by one are "
        "bars as high as the lane is busy with them per bin; zooming in draws them. "
        "Red = waiting for the last rank, cyan = transfer; ▼ = last rank to arrive.",
        styles={"font-size": "11px", "color": "#555"},
    )
    sidebar: list[Any] = []
    middle: list[Any] = []
    if ov is not None and origin is not None:
        orders = [o.value for o in RankOrder]
        order_w = pn.widgets.Select(
            label="Overview: order ranks by",
            options=orders
            if analysis is not None
            else [RankOrder.HOST.value, RankOrder.RANK.value],
            value=RankOrder.STRAGGLER.value if analysis is not None else RankOrder.HOST.value,
            width=SIDEBAR_WIDTH - 20,
        )
        flagged = analysis.flagged_ranks() if analysis is not None else []
        open_w = pn.widgets.Button(
            label=f"Open the {len(flagged)} flagged rank(s)" if flagged else "No rank flagged",
            disabled=not flagged,
            width=SIDEBAR_WIDTH - 20,
        )
        status = pn.pane.Markdown(OVERVIEW_HINT, styles={"font-size": "12px"}, margin=(0, 10))
        detail = pn.pane.Markdown("", styles={"font-size": "12px"}, margin=(0, 10))
        current: dict[str, Any] = {}

        def choose(ranks: list[int], window: tuple[int, int] | None) -> None:
            """Open ``ranks`` (at most MAX_OPEN_RANKS) over ``window``: one timeline render."""
            import param

            if not ranks:
                return
            if window is not None and step_w.value != WHOLE_RUN:
                step_w.value = WHOLE_RUN  # (renders once more: a step was shown)
            opened = ranks[:MAX_OPEN_RANKS]
            status.object = selection_text(ranks, window, origin)
            if sorted(opened) != sorted(rank_w.value):
                with param.parameterized.discard_events(window_w):
                    window_w.value = window  # read by the render the rank change triggers
                rank_w.value = opened
            else:
                window_w.value = window

        def on_bounds(bounds: Any = None, **_: Any) -> None:
            p = current.get("plot")
            if bounds is None or p is None:
                return
            x0, y0, x1, y1 = bounds
            choose(p.ranks_between(y0, y1), p.window_between(x0, x1))

        def on_tap(x: Any = None, y: Any = None, **_: Any) -> None:
            p = current.get("plot")
            if x is None or y is None or p is None:
                return
            detail.object = pixel_text(p, float(x), float(y))

        def overview_pane(order: str) -> Any:
            p = overview_plot(
                ov, analysis=analysis, order=order, width=OVERVIEW_WIDTH, origin_ns=origin
            )
            current["plot"] = p
            p.bounds.add_subscriber(lambda **kw: on_bounds(**kw))
            p.tap.add_subscriber(lambda **kw: on_tap(**kw))
            return p.dmap

        open_w.on_click(lambda _e: choose(flagged, None))
        sidebar = [order_w, open_w]
        middle = [
            pn.panel(pn.bind(overview_pane, order_w), linked_axes=False),
            status,
            detail,
        ]
    controls = pn.Column(
        *sidebar,
        rank_w,
        step_w,
        pn.pane.Markdown("**Event kinds**", margin=(10, 10, 0, 10)),
        kind_w,
        hint,
        window_w,
        width=SIDEBAR_WIDTH,
    )
    column: list[Any] = []
    if analysis is not None:
        from rankscope.analysis.conclude.advice import advice
        from rankscope.analysis.conclude.findings import findings, job_what_if
        from rankscope.analysis.render.report import WHAT_IF_TITLE

        found = findings(analysis)
        job = job_what_if(found)
        only = None if len(store.ranks) <= DEFAULT_MAX_RANKS else analysis.flagged_ranks()
        table = pn.pane.HTML(
            summary_html(analysis, only=only), width=FINDINGS_WIDTH, stylesheets=[TABLE_CSS]
        )
        column = [
            # what to do first, as in every report (docs/advice.md)
            pn.pane.Markdown(advice_markdown(advice(analysis, found)), width=FINDINGS_WIDTH),
            pn.pane.Markdown("### Per rank (% of profiled time)", margin=(0, 10)),
            table,
            pn.pane.Markdown("### Stragglers", margin=(10, 10, 0, 10)),
            pn.pane.Markdown(
                findings_markdown([f for f in found if f not in job]), width=FINDINGS_WIDTH
            ),
        ]
        if job:
            column += [
                pn.pane.Markdown(f"### {WHAT_IF_TITLE}", margin=(10, 10, 0, 10)),
                pn.pane.Markdown(findings_markdown(job), width=FINDINGS_WIDTH),
            ]
    header = pn.pane.Markdown(
        f"## {APP_TITLE} — {run_id}\n"
        f"{len(store.ranks)} of {store.world_size} ranks · times on the aligned clock · "
        f"`{store.path}`",
        margin=(0, 10),
    )
    return pn.Column(
        header,
        pn.Row(
            controls,
            pn.Column(
                *middle,
                # deferred: the page (and the overview) shows before the lanes are read
                pn.panel(
                    pn.bind(plot, rank_w, step_w, kind_w, window_w),
                    linked_axes=False,
                    defer_load=ov is not None,
                ),
            ),
            pn.Column(*column, width=FINDINGS_WIDTH),
        ),
    )
