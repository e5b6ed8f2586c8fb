"""examples/explore.ipynb runs top to bottom in a real Jupyter kernel and shows what it promises.

No cell may fail; the per-rank table and the straggler (rank 2) must show; both timeline cells
must return a HoloViews plot rendered as a Bokeh document, the zoomed one holding fewer events.
The notebook is executed once per module with nbclient on a copy of the straggler data set (no
``trace.h5`` yet, so the notebook's merge cell runs too), in a ``python3`` kernel started with
THIS interpreter (a kernelspec written to ``tmp_path``: the one pip installs into the venv runs
whatever ``python`` is first on PATH). Cells are found by their tag (``metadata.tags``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "explore.ipynb"
#: Seconds one cell may run (the merge and the analysis start Dask; the timeline renders twice).
CELL_TIMEOUT_S = 300
#: Data set the notebook runs on, and its straggler (tests/data/README.md).
DATA_SET = "cpu_gloo_4rank_straggler"
STRAGGLER_RANK = 2
#: Appended to the executed copy only: where the kernel's Python lives.
KERNEL_CHECK = (
    "import json, sys\nprint(json.dumps({'prefix': sys.prefix, 'executable': sys.executable}))"
)
#: Colour codes in IPython's tracebacks.
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: The title HoloViews gives the timeline: "N events" or "N of M events drawn (zoom in …)".
TITLE = re.compile(r'"text":"([\d,]+)(?: of ([\d,]+))? events')


def kernel_manager(kernel_dir: Path) -> AsyncKernelManager:
    """A kernel manager whose ``python3`` kernel is this interpreter (``sys.executable``); its
    connection file in ``kernel_dir`` (by default one more ``/tmp/tmp*.json`` per test run)."""
    spec = kernel_dir / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "Python 3 (rankscope tests)", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    specs = KernelSpecManager(kernel_dirs=[str(kernel_dir)])
    return AsyncKernelManager(
        kernel_name="python3",
        kernel_spec_manager=specs,
        connection_file=str(kernel_dir / "connection.json"),
    )


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Any:
    """The notebook after running every cell (errors kept as outputs, so tests can show them)."""
    tmp = tmp_path_factory.mktemp("notebook")
    run = tmp / "run"
    shutil.copytree(data_dir / DATA_SET, run)
    assert not (run / "trace.h5").exists()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(KERNEL_CHECK, id="kernel-check"))
    client = NotebookClient(
        nb,
        km=kernel_manager(tmp / "kernels"),
        timeout=CELL_TIMEOUT_S,
        startup_timeout=120,
        allow_errors=True,
        resources={"metadata": {"path": str(tmp)}},  # the kernel's working directory
    )
    client.execute(env={**os.environ, "RANKSCOPE_RUN": str(run)})
    return nb


def cell(nb: Any, tag: str) -> Any:
    found = [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
    assert len(found) == 1, f"expected one cell tagged {tag!r}, found {len(found)}"
    return found[0]


def cell_by_id(nb: Any, cell_id: str) -> Any:
    return next(c for c in nb.cells if c.get("id") == cell_id)


def text_of(c: Any) -> str:
    """Everything a cell printed or displayed as text (streams and text/plain)."""
    parts = []
    for out in c.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(str(out.data.get("text/plain", "")))
    return "".join(parts)


def plot_html(c: Any) -> str:
    """The HTML of the HoloViews plot a cell returned (its execute_result), checked to be Bokeh."""
    results = [o for o in c.outputs if o.output_type == "execute_result"]
    kinds = [(o.output_type, sorted(o.get("data", {}))) for o in c.outputs]
    assert len(results) == 1, f"cell {c.id!r} returned no plot; its outputs: {kinds}"
    data = results[0].data
    assert "application/vnd.holoviews_exec.v0+json" in data, sorted(data)
    html = data["text/html"]
    assert "var docs_json" in html and "Bokeh" in html, html[:500]
    return html


def events_drawn(html: str) -> tuple[int, int]:
    """(drawn, in the window) from the timeline's title."""
    m = TITLE.search(html)
    assert m, "no 'N events' title in the timeline's Bokeh document"
    drawn = int(m.group(1).replace(",", ""))
    return drawn, int((m.group(2) or m.group(1)).replace(",", ""))


def test_committed_notebook_is_clean() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None, f"cell {c.id!r} has outputs"
    assert 'os.environ.get("RANKSCOPE_RUN"' in cell(nb, "run").source


def test_every_cell_runs(executed: Any) -> None:
    errors = [
        f"cell {c.id!r}: {o.ename}: {o.evalue}\n" + ANSI.sub("", "\n".join(o.traceback))
        for c in executed.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "error"
    ]
    if errors:
        pytest.fail("\n\n".join(errors), pytrace=False)
    unrun = [c.id for c in executed.cells if c.cell_type == "code" and c.execution_count is None]
    assert not unrun


def test_kernel_is_this_python(executed: Any) -> None:
    kernel = json.loads(text_of(cell_by_id(executed, "kernel-check")))
    assert kernel["prefix"] == sys.prefix
    assert kernel["executable"] == sys.executable


def test_merge_and_open(executed: Any) -> None:
    assert "merged 4 of 4 rank(s)" in text_of(cell(executed, "merge"))
    assert "ranks=[0, 1, 2, 3]" in text_of(cell(executed, "open"))


def test_breakdown_table(executed: Any) -> None:
    shown = text_of(cell(executed, "breakdown"))
    assert "compute (ms)" in shown and "comm_exposed (ms)" in shown
    # one row per rank (pandas may wrap the columns into several blocks, each listing the ranks)
    rows = {line.split()[0] for line in shown.splitlines() if re.match(r"\d+\s+\d", line)}
    assert rows == {"0", "1", "2", "3"}


def test_stragglers(executed: Any) -> None:
    shown = text_of(cell(executed, "stragglers"))
    assert f"straggler ranks: [{STRAGGLER_RANK}]" in shown
    # the table, most significant first, starts with the straggler (index 0, then its rank)
    first = re.search(r"^0\s+(\d+)\s", shown, flags=re.MULTILINE)
    assert first and int(first.group(1)) == STRAGGLER_RANK, shown


def test_timeline_renders_with_bokeh(executed: Any) -> None:
    c = cell(executed, "timeline")
    kinds = {kind for o in c.outputs for kind in o.get("data", {})}
    assert "application/vnd.holoviews_load.v0+json" in kinds  # BokehJS loaded on first use
    html = plot_html(c)
    drawn, total = events_drawn(html)
    assert 0 < drawn <= total
    for layer in ("collective: wait", "collective: transfer", "straggler rank"):
        assert f'"{layer}"' in html, f"no {layer!r} layer in the timeline"
    # the straggler's rows carry the flag ("⚑ straggler", JSON-escaped) and only those
    flagged = set(re.findall(r'"r(\d+) [^"]*\\u2691 straggler"', html))
    assert flagged == {str(STRAGGLER_RANK)}


def test_zoom_on_one_collective(executed: Any) -> None:
    c = cell(executed, "zoom")
    shown = text_of(c)
    assert re.search(rf"waited [\d.]+ ms for rank {STRAGGLER_RANK}\b", shown), shown
    _, whole = events_drawn(plot_html(cell(executed, "timeline")))
    _, zoomed = events_drawn(plot_html(c))
    assert 0 < zoomed < whole
