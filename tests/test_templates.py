"""The HTML pages' Jinja2 templates (``analysis/render/templates/``, issue 25): each is in the
package and loads, one real render of the report and one of the comparison load every template, a
name a template uses that the renderer did not pass fails the render (StrictUndefined), and
user-controlled text (op names, run ids, notes, finding text) is escaped exactly once."""

from __future__ import annotations

import copy
import dataclasses
import html
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from analysis_frames import merged
from rankscope.analysis.render import compare_html, html_report, templating

TEMPLATES = Path(__file__).resolve().parents[1] / "analysis" / "render" / "templates"
#: Every character HTML gives a meaning to, and a tag.
HOSTILE = "<script>alert(\"x\")</script> & 'q' <b>"
MiB = 2**20


@pytest.fixture(scope="module")
def runs(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """The balanced pipeline run and its slow-stage twin, analysed: between them the report's
    what-if, overview, op table, stragglers and pipeline findings, and every table of the
    comparison but the stragglers'."""
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    out = tmp_path_factory.mktemp("templates")
    spec = ClusterSpec(scheduler=SYNCHRONOUS)
    base, new = (
        analyze(merged(data_dir, name, out), spec)
        for name in ("cpu_gloo_4rank_pipeline_balanced", "cpu_gloo_4rank_pipeline")
    )
    return base, new


def _comparison(runs: tuple[Any, Any]) -> tuple[Any, Any]:
    from rankscope.analysis.conclude.compare import compare, gate_checks
    from rankscope.analysis.conclude.compare_model import GateConfig

    c = compare(*runs)
    return c, gate_checks(c, GateConfig(fail_above=0.05))


def _referenced(name: str) -> set[str]:
    """``name`` and every template it imports or includes, transitively."""
    from jinja2 import meta

    env = templating.environment()
    seen: set[str] = set()
    todo = [name]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        source = env.loader.get_source(env, n)[0]  # type: ignore[union-attr]
        todo += [r for r in meta.find_referenced_templates(env.parse(source)) if r]
    return seen


def test_every_template_is_in_the_package_and_loads() -> None:
    names = templating.template_names()
    assert names == sorted(p.name for p in TEMPLATES.iterdir()), "only *.html.j2 in the folder"
    for name in names:
        templating.environment().get_template(name)  # parses
    # the pages and everything they import are in the package (a missing one fails here)
    used = _referenced(html_report.TEMPLATE) | _referenced(compare_html.TEMPLATE)
    assert used <= set(names), used - set(names)
    # and nothing in the folder is left unused by the two pages
    assert set(names) == used


def test_one_real_render_of_each_page_renders_every_template(runs: tuple[Any, Any]) -> None:
    """The report and the comparison, rendered from real runs: the two pages and the templates
    they import (each loaded, its macros run), byte for byte what the page is."""
    report = html_report.render_html(runs[1])
    assert report.startswith("<!DOCTYPE html>\n") and report.endswith("</body></html>\n")
    for section in ("<h2>Every rank over time</h2>", "<h2>What if", "<h2>Op table", "<table>"):
        assert section in report
    c, checks = _comparison(runs)
    page = compare_html.render_html(c, checks)
    assert page.startswith("<!doctype html>") and page.endswith("</body></html>\n")
    assert "<h2>Gate " in page and "<h2>KPIs, job and rank by rank</h2>" in page


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every key of every dict in ``value`` (the first of each list's dicts)."""
    out: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((*path, k))
            out += _paths(v, (*path, k))
    elif isinstance(value, list | tuple):
        first = next((i for i, v in enumerate(value) if isinstance(v, dict | list)), None)
        if first is not None:
            out += _paths(value[first], (*path, first))
    return out


def _without(context: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    out = copy.deepcopy(context)
    holder: Any = out
    for k in path[:-1]:
        holder = holder[k]
    del holder[path[-1]]
    return out


def _hostile_run(data_dir: Path, run: Path) -> Path:
    """The straggler run with HOSTILE in front of its matmul ops and record_function ranges, and
    a 1 MiB CPU allocation inside each matmul (a memory section whose top holder is hostile)."""
    shutil.copytree(data_dir / "cpu_gloo_4rank_straggler", run)
    for trace in run.glob("*.trace.json"):
        doc = json.loads(trace.read_text())
        memory = []
        for e in doc["traceEvents"]:
            name = str(e.get("name", ""))
            ranged = e.get("cat") == "user_annotation" and not name.startswith("ProfilerStep")
            if name == "aten::mm" or ranged:
                e["name"] = HOSTILE + name
            if name != "aten::mm":
                continue
            for ts, nbytes in ((e["ts"] + 0.001, MiB), (e["ts"] + e["dur"] - 0.001, -MiB)):
                args = {
                    "Total Reserved": 0,
                    "Total Allocated": MiB + max(nbytes, 0),
                    "Bytes": nbytes,
                    "Device Id": -1,
                    "Device Type": 0,
                    "Addr": 0x1000 + len(memory) // 2,
                    "finished": False,
                    "Ev Idx": 1,
                }
                memory.append({"ph": "i", "cat": "cpu_instant_event", "s": "t",
                               "name": "[memory]", "pid": e["pid"], "tid": e["tid"], "ts": ts,
                               "args": args})  # fmt: skip
        doc["traceEvents"] += memory
        trace.write_text(json.dumps(doc))
    return run


@pytest.fixture(scope="module")
def reports(
    runs: tuple[Any, Any], data_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Analyses whose reports between them hold every section: the slow pipeline stage (what
    if, overview, op table, pipeline findings), the hostile run (stragglers' table, memory),
    20 synthetic ranks (summarised: the many-rank rows and notes, the clock digest, HTA)."""
    from analysis_frames import synthetic_store
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    out = tmp_path_factory.mktemp("reports")
    spec = ClusterSpec(scheduler=SYNCHRONOUS)
    hostile = merge_run_dir(
        _hostile_run(data_dir, out / "hostile"), scheduler=SYNCHRONOUS, quiet=True
    )
    many = synthetic_store(out / "many", ranks=20, seed=4, stragglers=[(5, 3.0, 1.0)])
    return {"pipeline": runs[1], "hostile": analyze(hostile, spec), "many": analyze(many, spec)}


def test_the_reports_hold_every_optional_section(reports: dict[str, Any]) -> None:
    """The contexts below reach every optional part of the report (but attention's: see
    tests/test_attention.py, which runs the example)."""
    parts = {"overview", "stragglers", "what_if", "memory", "op_table", "hta", "many_ranks",
             "clock_summary", "pipeline_findings"}  # fmt: skip
    present = {
        k
        for a in reports.values()
        for k, v in html_report.report_context(a).items()
        if k in parts and v
    }
    assert present == parts
    assert html_report.report_context(reports["hostile"])["memory"]["has_events"]


@pytest.mark.parametrize("page", ["pipeline", "hostile", "many", "compare"])
def test_a_name_the_renderer_did_not_pass_fails_the_render(
    reports: dict[str, Any], runs: tuple[Any, Any], page: str
) -> None:
    """StrictUndefined: without any one value of a real context (a section, a table's rows, a
    figure of the overview …) the page does not render an empty gap, it fails; so every value
    the renderers pass is one the templates print or test."""
    from jinja2 import UndefinedError

    if page == "compare":
        template, context = compare_html.TEMPLATE, compare_html.compare_context(*_comparison(runs))
    else:
        template, context = html_report.TEMPLATE, html_report.report_context(reports[page])
    templating.render(template, **context)
    paths = _paths(context)
    assert len(paths) > 30
    for path in paths:
        with pytest.raises(UndefinedError):
            templating.render(template, **_without(context, path))


def _escaped_once(page: str) -> None:
    assert html.escape(HOSTILE) in page  # &lt;script&gt;alert(&quot;x&quot;) … &#x27;q&#x27;
    assert HOSTILE not in page and "<script" not in page and "<b><" not in page
    assert html.escape(html.escape(HOSTILE)) not in page and "&amp;lt;" not in page


def test_hostile_op_names_are_escaped_once_in_the_report(reports: dict[str, Any]) -> None:
    page = html_report.render_html(reports["hostile"])
    _escaped_once(page)
    # the ops' and the ranges' tables, the memory table's top holders
    assert page.count(html.escape(HOSTILE)) >= 6
    assert f"<td class=l>{html.escape(HOSTILE)}aten::mm (" in page


def test_hostile_run_ids_notes_and_findings_are_escaped_once_in_the_comparison(
    runs: tuple[Any, Any],
) -> None:
    from rankscope.analysis.conclude.compare_model import CompareFinding, CompareKind

    c, checks = _comparison(runs)
    c = dataclasses.replace(
        c,
        base=dataclasses.replace(c.base, run_id=HOSTILE),
        notes=[HOSTILE],
        findings=[CompareFinding(kind=next(iter(CompareKind)), text=HOSTILE)],
    )
    page = compare_html.render_html(c, checks)
    _escaped_once(page)
    assert page.count(html.escape(HOSTILE)) == 3


def test_commands_start_without_jinja2() -> None:
    """``rankscope --help`` (and the help of the commands that write HTML) never imports jinja2:
    the templates' environment is built on the first page rendered."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from rankscope.orchestrator.cli import main\n"
        "for argv in (['--help'], ['analyze', '--help'], ['compare', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "import rankscope.analysis.render.html_report, rankscope.analysis.render.compare_html\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jinja2', 'markupsafe')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "[]"


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh ``$XDG_CACHE_HOME`` and environment (made again on each call of the returned
    function, as a new process would), and a count of the templates Jinja2 compiles."""
    import jinja2

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    compiled: list[str] = []
    real = jinja2.Environment.compile

    def counting(self: Any, source: Any, name: Any = None, *a: Any, **kw: Any) -> Any:
        compiled.append(str(name))
        return real(self, source, name, *a, **kw)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)

    def fresh() -> list[str]:
        templating.environment.cache_clear()
        compiled.clear()
        return compiled

    yield fresh
    templating.environment.cache_clear()


def _page(reports: dict[str, Any]) -> str:
    return templating.render(
        html_report.TEMPLATE, **html_report.report_context(reports["pipeline"])
    )


def test_templates_are_compiled_once_not_in_every_process(
    reports: dict[str, Any], cache_home: Any
) -> None:
    """The report's templates compiled in one process are read from the user's cache by the
    next (a fresh environment): none is compiled again, and the page is the same."""
    compiled = cache_home()
    first = _page(reports)
    assert html_report.TEMPLATE in compiled
    assert sorted(p.name for p in templating.bytecode_dir().iterdir())  # kept in the cache
    compiled = cache_home()
    assert _page(reports) == first
    assert compiled == []


@pytest.mark.parametrize(
    "damage", ["cache home is a file", "folder replaced by a file", "garbage", "folders"]
)
def test_a_cache_that_cannot_be_used_never_fails_a_report(
    reports: dict[str, Any], cache_home: Any, tmp_path: Path, damage: str
) -> None:
    """A cache folder that cannot be made, one removed under a running process (neither read
    nor written: what a read-only or full cache makes writes raise, OSError, is skipped alike),
    entries that cannot be read (damaged) and entries that can be neither read nor replaced (a
    folder in the way): the report renders, the same page, compiled afresh."""
    cache_home()
    expected = _page(reports)
    folder = templating.bytecode_dir()
    entries = sorted(folder.iterdir())
    assert entries
    compiled = cache_home()
    if damage == "cache home is a file":
        shutil.rmtree(tmp_path / "cache")
        (tmp_path / "cache").write_text("not a folder")
    elif damage == "folder replaced by a file":
        templating.environment()  # made with its cache, then the folder goes
        shutil.rmtree(folder)
        folder.write_text("not a folder")
    for entry in entries if damage in ("garbage", "folders") else []:
        entry.unlink()
        if damage == "garbage":
            entry.write_bytes(b"j2" + bytes(range(256)) * 4)
        else:
            entry.mkdir()
    assert _page(reports) == expected
    assert html_report.TEMPLATE in compiled  # a miss, compiled afresh
    cache_home()
    assert _page(reports) == expected  # and again (garbage replaced; the rest still in the way)
