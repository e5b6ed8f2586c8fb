"""Many ranks in the terminal: summarised tables that aggregate every rank and name the flagged
ones (issue 15), on a synthetic job with two known stragglers."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

RANKS = 40
STRAGGLERS = (5, 33)


@pytest.fixture(scope="module")
def analysis(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from analysis_frames import synthetic_store
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    store = synthetic_store(
        tmp_path_factory.mktemp("many"),
        ranks=RANKS,
        seed=4,
        stragglers=[(STRAGGLERS[0], 3.0, 1.0), (STRAGGLERS[1], 2.0, 1.0)],
    )
    return analyze(store, ClusterSpec(scheduler=SYNCHRONOUS))


def _terminal(a: Any, **kw: Any) -> str:
    from rankscope.analysis.render.report import print_summary
    from rich.console import Console

    buf = io.StringIO()
    print_summary(a, Console(file=buf, width=160), **kw)
    return buf.getvalue()


def _rank_table(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "bound by" in line) + 2
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return lines[start:end]


def test_many_ranks_are_summarised_and_the_stragglers_named(analysis: Any) -> None:
    assert sorted(analysis.straggler_ranks()) == list(STRAGGLERS)
    text = _terminal(analysis)
    rows = _rank_table(text)
    labels = [row.split()[0] for row in rows]
    assert labels[:3] == ["median", "p90", "max"]
    flagged = [row for row in rows if "flagged" in row]
    assert sorted(int(row.split()[0]) for row in flagged) == list(STRAGGLERS)
    assert len(rows) <= 3 + len(STRAGGLERS) + 2  # the distribution, flagged, most time / wait
    assert "--all-ranks lists every rank" in " ".join(text.split())
    assert f"Clock alignment: {RANKS} ranks on 5 host(s)" in " ".join(text.split())
    # the max row aggregates every rank: it equals the largest total over all ranks
    totals = [r["total_s"] for r in _summary(analysis)["ranks"]]
    max_row = next(row for row in rows if row.split()[0] == "max")
    assert f"{max(totals) * 1e3:.1f}" in max_row


def test_all_ranks_lists_every_rank(analysis: Any) -> None:
    rows = _rank_table(_terminal(analysis, all_ranks=True))
    assert [int(row.split()[0]) for row in rows] == list(range(RANKS))


def _summary(a: Any) -> dict[str, Any]:
    from rankscope.analysis.render.report import summary

    return summary(a)


def test_all_ranks_flag_reaches_the_command(tmp_path: Path) -> None:
    from rankscope.orchestrator.cli import build_parser

    args = build_parser().parse_args(["analyze", str(tmp_path), "--all-ranks"])
    assert args.all_ranks is True


def test_html_report_summarises_many_ranks_and_aggregates_hosts(analysis: Any) -> None:
    """The HTML report lists the distribution and the flagged ranks, draws one bar per host
    (each host's ranks added up: no rank dropped), and --all-ranks restores every rank."""
    import re

    from rankscope.analysis.render.report import render_html

    html = render_html(analysis)
    assert f"median of {RANKS} ranks" in html  # the steps table aggregates every rank
    for rank in STRAGGLERS:
        assert f"{rank} flagged" in html
    hosts = re.findall(r">(node\d+) \((\d+)\)<", html)
    assert len(hosts) == 5 and sum(int(n) for _, n in hosts) == RANKS
    assert "--all-ranks" in html
    full = render_html(analysis, all_ranks=True)
    assert all(f"<th class='l'>rank {r}</th>" in full for r in range(RANKS))
    # no summary rows (the overview's caption may still say "flagged")
    assert not re.search(r">\d+ flagged<", full)
    assert len(html) < len(full)


def test_html_report_adds_up_many_hosts(tmp_path: Path) -> None:
    """More hosts than MANY_HOSTS: the flagged ranks' hosts and the worst hosts get a bar each,
    every other host is added up in one bar, so each rank's time is in exactly one bar."""
    import re

    from analysis_frames import synthetic_store
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze
    from rankscope.analysis.render.report import MANY_HOSTS, WORST_HOSTS, render_html

    ranks, per_host = 2 * (MANY_HOSTS + 4), 2
    store = synthetic_store(
        tmp_path, ranks=ranks, ranks_per_host=per_host, steps=2, seed=3, stragglers=[(7, 3.0, 1.0)]
    )
    a = analyze(store, ClusterSpec(scheduler=SYNCHRONOUS))
    assert a.flagged_ranks()[:1] == [7]
    html = render_html(a)
    bars = re.findall(r"font-size='12'>(⚑ )?(node\d+) \((\d+)\)<", html)
    other = re.search(r"the other (\d+) hosts \((\d+) ranks\)", html)
    assert other
    assert ("⚑ ", "node003", str(per_host)) in bars  # rank 7's host, marked
    assert len(bars) <= 1 + 2 * WORST_HOSTS
    assert len(bars) + int(other.group(1)) == ranks // per_host
    assert sum(int(n) for _, _, n in bars) + int(other.group(2)) == ranks
