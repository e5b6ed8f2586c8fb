"""One findings model: every renderer shows the same sentences, and summary.json does not drift.

The findings (``rankscope.analysis.conclude.findings``) are worded once; the terminal summary, the HTML
report, the Panel app's findings column and summary.json's ``findings[]`` only render them. The
golden files pin summary.json on the real test stores, so that a refactor cannot change a result
without a deliberate update of the files.
"""

from __future__ import annotations

import dataclasses
import html
import io
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from analysis_frames import merged
from rankscope.analysis.conclude.findings import (
    PIPELINE_KINDS,
    Finding,
    FindingKind,
    Severity,
    findings,
)
from rankscope.analysis.engine.driver import Analysis, ClusterSpec, analyze
from rankscope.analysis.render.report import print_summary, render_html, render_json
from rankscope.analysis.views.app import findings_markdown
from rich.console import Console

#: Stores whose renderings are compared finding by finding: a straggler, a pipeline bottleneck
#: (and "no straggler"), a GPU job with neither.
RENDERED = ("cpu_gloo_4rank_straggler", "cpu_gloo_4rank_pipeline", "param_dlrm_8rank")
#: Stores pinned by a golden summary.json (the above, and two DDP buckets in flight together).
GOLDEN = (*RENDERED, "cpu_gloo_4rank_ddp_buckets")
#: tests/data/golden/summary-<name>.json
GOLDEN_DIR = Path(__file__).parent / "data" / "golden"
#: Set to 1 to rewrite the golden files from the current code instead of checking them.
REGEN_ENV = "RANKSCOPE_REGEN_GOLDEN"


@pytest.fixture(scope="module")
def analyses(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Analysis]:
    out = tmp_path_factory.mktemp("findings")
    return {
        name: analyze(merged(data_dir, name, out), ClusterSpec(scheduler="synchronous"))
        for name in GOLDEN
    }


def _terminal(a: Analysis) -> str:
    """The terminal summary as plain text, whitespace collapsed (rich wraps long lines)."""
    buf = io.StringIO()
    print_summary(a, Console(file=buf, width=200))
    return " ".join(buf.getvalue().split())


def _flat(text: str) -> str:
    return " ".join(text.split())


def _normalised(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """summary.json without what depends on where the test runs (the store's path)."""
    return {**doc, "store": f"{name}.h5"}


@pytest.mark.parametrize("name", RENDERED)
def test_every_renderer_shows_the_same_findings(analyses: dict[str, Analysis], name: str) -> None:
    a = analyses[name]
    found = findings(a)
    assert found, "every analysis has at least the straggler question answered"
    term = _terminal(a)
    report = render_html(a)
    doc = json.loads(render_json(a))
    app = findings_markdown(found)
    # summary.json's findings[] is the model, entry for entry
    assert doc["findings"] == [f.as_json() for f in found]
    for f, entry in zip(found, doc["findings"], strict=True):
        assert entry["evidence"] == f.evidence and f.evidence
        assert _flat(f.text) in term, f"terminal lacks: {f.text}"
        assert html.escape(f.headline) in report and html.escape(f.evidence) in report
        assert f.headline in app and f.evidence in app
    # the findings agree with the tables they summarise
    stragglers = [f for f in found if f.kind == FindingKind.STRAGGLER]
    assert [f.rank for f in stragglers] == [s["rank"] for s in doc["stragglers"]]
    assert [f.masked_by for f in stragglers] == [s["masked_by"] for s in doc["stragglers"]]
    assert [f.cause for f in stragglers] == [s["cause"] for s in doc["stragglers"]]
    for f, s in zip(stragglers, doc["stragglers"], strict=True):
        assert f.severity == Severity.PROBLEM
        assert f.figures["wait_caused_s"] == s["wait_caused_s"]
        assert f.figures["wait_share"] == s["wait_share"]
    kinds = [f.kind for f in found]
    assert (FindingKind.NO_STRAGGLER in kinds) == (not stragglers)
    bottlenecks = [f for f in found if f.kind == FindingKind.PIPELINE_BOTTLENECK]
    assert [f.rank for f in bottlenecks] == [b["rank"] for b in doc["pipeline"]["bottlenecks"]]
    assert (doc["pipeline"]["pairs"] > 0) == any(k in PIPELINE_KINDS for k in kinds)


def _verdicts(a: Analysis) -> list[Finding]:
    """The findings less the what-if ones (tested on their own below)."""
    return [f for f in findings(a) if f.kind != FindingKind.WHAT_IF]


def test_the_known_findings_of_the_test_stores(analyses: dict[str, Analysis]) -> None:
    """tests/data/README.md: rank 2 sleeps in the straggler set; stage 1 is slow in the pipeline."""
    (strag,) = _verdicts(analyses["cpu_gloo_4rank_straggler"])
    assert strag.kind == FindingKind.STRAGGLER and strag.rank == 2 and strag.masked_by == -1
    assert strag.headline == "Straggler: rank 2" and strag.cause == "own compute"
    assert strag.evidence.startswith("last at 3 of 3 collectives")
    no_strag, pipe = _verdicts(analyses["cpu_gloo_4rank_pipeline"])
    assert no_strag.kind == FindingKind.NO_STRAGGLER and no_strag.severity == Severity.OK
    assert pipe.kind == FindingKind.PIPELINE_BOTTLENECK and pipe.rank == 1
    assert pipe.text.startswith("Pipeline bottleneck: rank 1 — 21 receivers' waits")
    assert pipe.figures["pairs"] == 36 and pipe.figures["root_pairs"] == 21
    assert [f.kind for f in _verdicts(analyses["param_dlrm_8rank"])] == [FindingKind.NO_STRAGGLER]


def test_what_if_follows_the_rank_it_fixes_then_the_job_wide_block(
    analyses: dict[str, Analysis],
) -> None:
    """Each straggler / bottleneck is followed by what fixing it saves; the job-wide scenarios
    close the straggler part; the terminal prints the line under the finding and the block."""
    from rankscope.analysis.engine import whatif as wi

    for name, kind, rank in (
        ("cpu_gloo_4rank_ddp_buckets", FindingKind.STRAGGLER, 2),
        ("cpu_gloo_4rank_pipeline", FindingKind.PIPELINE_BOTTLENECK, 1),
    ):
        a = analyses[name]
        found = findings(a)
        at = next(i for i, f in enumerate(found) if f.kind == kind)
        fix = found[at + 1]
        assert fix.kind == FindingKind.WHAT_IF and fix.rank == rank
        assert fix.headline == f"if rank {rank} ran like the median rank"
        assert fix.evidence.startswith("step ") and fix.evidence.endswith(" %)")
        row = a.whatif[a.whatif["rank"] == rank].iloc[0]
        assert fix.figures["saving_s"] == round(row["saving_ns"] / 1e9, 6)
        job = [f for f in found if f.kind == FindingKind.WHAT_IF and f.rank is None]
        assert [f.headline for f in job] == [
            wi.ALL_LIKE_MEDIAN,
            wi.COMM_OVERLAPPED,
            wi.NO_INPUT_STALL,
        ]
        term = _terminal(a)
        assert f"{fix.text} What if (per step, mean over profiled steps) " in term
        doc = json.loads(render_json(a))["what_if"]
        assert [s["rank"] for s in doc["scenarios"]] == [rank, None, None, None]
        assert doc["scenarios"][0]["saving_s"] == fix.figures["saving_s"]
    # the quickstart store: rank 2 waits 20 ms per step (43.0 -> 26.3 ms)
    (fix,) = [f for f in findings(analyses["cpu_gloo_4rank_ddp_buckets"]) if f.rank == 2][1:]
    assert fix.text == "if rank 2 ran like the median rank: step 43.0 → 26.3 ms (−38.7 %)"


def test_no_what_if_without_a_replay(analyses: dict[str, Analysis]) -> None:
    """An analysis without a what-if table (one rank, no steps, no collectives) shows no block
    and has no ``what_if`` key."""
    from rankscope.analysis.engine.driver import _no_whatif

    a = dataclasses.replace(analyses["cpu_gloo_4rank_straggler"], whatif=_no_whatif())
    assert not [f for f in findings(a) if f.kind == FindingKind.WHAT_IF]
    assert "what_if" not in json.loads(render_json(a))
    assert "What if" not in _terminal(a) and "What if" not in render_html(a)


def test_figures_carry_their_units(analyses: dict[str, Analysis]) -> None:
    """Keys say their unit; counts and p-values are bare; everything is a finite JSON number."""
    bare = {"times_last", "collectives", "expected_last", "p_value", "score", "confidence"}
    bare |= {"root_pairs", "pairs", "unmatched", "problems"}
    for a in analyses.values():
        for f in findings(a):
            for key, value in f.figures.items():
                assert key in bare or key.endswith(("_s", "_ms", "_share")), key
                assert isinstance(value, int | float) and value == value, (key, value)


def test_input_problems_are_escaped_in_every_renderer(analyses: dict[str, Analysis]) -> None:
    """An input problem's message is user text: markup in it is shown, never interpreted."""
    message = "rank_1.json: [bold]not JSON[/bold] <b>"
    problems = pd.DataFrame({"file": ["rank_1.json"], "rank": [-1], "problem": [message]})
    a = dataclasses.replace(analyses["param_dlrm_8rank"], problems=problems)
    found = findings(a)
    (f,) = [f for f in found if f.kind == FindingKind.INPUT_PROBLEMS]
    assert f.severity == Severity.NOTE and f.figures == {"problems": 1}
    assert f.evidence == f"1 input problem(s) recorded by the merge (first: {message})."
    assert _flat(f.text) in _terminal(a)
    report = render_html(a)
    assert html.escape(f.evidence) in report and message not in report
    app = findings_markdown(found)
    assert "rank\\_1.json: \\[bold\\]not JSON\\[/bold\\] \\<b\\>" in app
    assert json.loads(render_json(a))["findings"][-1]["evidence"] == f.evidence


def test_finding_is_plain_data() -> None:
    f = Finding(FindingKind.NO_STRAGGLER, Severity.OK, None, headline="No straggler", evidence="e.")
    assert f.text == "No straggler: e." and f.as_json()["kind"] == "no_straggler"
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.rank = 1  # type: ignore[misc]


@pytest.mark.parametrize("name", GOLDEN)
def test_summary_json_equals_the_golden_file(analyses: dict[str, Analysis], name: str) -> None:
    """summary.json, less the ``findings`` key, equals tests/data/golden/summary-<name>.json.

    The golden files were written before the findings model existed, from
    ``rankscope.analysis.render.summary_json.render_json`` with ``store`` set to ``<name>.h5``. When a result
    changes ON PURPOSE (a better analysis, a new field), regenerate them and review the diff:

        RANKSCOPE_REGEN_GOLDEN=1 python -m pytest tests/test_findings.py -k golden
        git diff tests/data/golden/

    A new summary.json field makes this test fail until the files are regenerated: additive
    fields are allowed by the contract (docs/summary.md), but not silently.
    """
    doc = _normalised(json.loads(render_json(analyses[name])), name)
    path = GOLDEN_DIR / f"summary-{name}.json"
    if os.environ.get(REGEN_ENV) == "1":
        golden_doc = {k: v for k, v in doc.items() if k != "findings"}
        path.write_text(json.dumps(golden_doc, indent=2, ensure_ascii=False) + "\n")
        pytest.skip(f"{REGEN_ENV}=1: wrote {path}")
    assert "findings" in doc
    doc.pop("findings")
    assert doc == json.loads(path.read_text())
