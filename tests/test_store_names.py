"""One store per trace file, by one naming rule (issue 28, item 3), tried as a new user would.

Two single traces of one folder (a baseline and a variant) used to collide in the folder's
``trace.h5``. Each now has its own store beside it (``a.json.gz`` → ``a.rankscope.h5``,
``orchestrator/ingest/store_names.py``), and merge, analyze, view, compare and export all find it;
a run folder keeps its ``trace.h5``. Real commands (``python -m rankscope …``) on real traces.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from browser import serve_view, stop
from rankscope.analysis.store.reader import open_store
from rankscope.orchestrator.ingest.store_names import (
    TRACE_STORE_SUFFIX,
    cached_store,
    store_for,
    trace_store_name,
)

DATA = Path(__file__).parent / "data"
#: Two plain single-process exports (prof.export_chrome_trace) of one model: baseline, variant.
TRACES = {"a.json.gz": DATA / "rankless" / "model_a.json.gz", "b.json.gz": DATA / "rankless" / "model_b.json.gz"}  # fmt: skip
SYNC = ("--scheduler", "synchronous")
#: Seconds ``rankscope view`` may take to print its URL on a busy machine.
VIEW_WAIT_S = 300


def _rankscope(*args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "rankscope", *args], capture_output=True, text=True, timeout=600
    )
    return proc.returncode, proc.stdout + proc.stderr


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    for name, src in TRACES.items():
        shutil.copy2(src, folder / name)
    return folder


def test_two_traces_of_one_folder_each_get_their_own_store(tmp_path: Path) -> None:
    """analyze a, analyze b, compare a b, export and view a: each finds its own store."""
    folder = _folder(tmp_path)
    a, b = folder / "a.json.gz", folder / "b.json.gz"
    sa, sb = folder / "a.rankscope.h5", folder / "b.rankscope.h5"
    rc, out = _rankscope("analyze", str(a), *SYNC)
    assert rc == 0 and sa.is_file(), out
    rc, out = _rankscope("analyze", str(b), *SYNC)
    assert rc == 0 and sb.is_file(), out
    assert "holds another merge" not in out
    for trace, store in ((a, sa), (b, sb)):
        with open_store(store) as s:
            assert s.meta["source"] == str(trace.resolve())
    assert not (folder / "trace.h5").exists()
    stamps = {p: p.stat().st_mtime_ns for p in (sa, sb)}
    rc, out = _rankscope("compare", str(a), str(b), "--json", str(tmp_path / "c.json"))
    assert rc == 0, out
    assert json.loads((tmp_path / "c.json").read_text())
    out_trace = tmp_path / "a.perfetto.json"
    rc, out = _rankscope("export", str(a), "--perfetto", str(out_trace))
    assert rc == 0 and out_trace.is_file(), out
    proc, _url = serve_view(a, tmp_path / "view.log", VIEW_WAIT_S, "--no-show", "--no-analysis")
    stop(proc)
    assert f"using {sa}" in (tmp_path / "view.log").read_text()
    # none of them merged again: the stores were found, up to date
    assert {p: p.stat().st_mtime_ns for p in (sa, sb)} == stamps
    assert sorted(p.name for p in folder.iterdir()) == sorted([*TRACES, sa.name, sb.name]), (
        "no other store, lock or temporary beside the traces"
    )


def test_merge_writes_the_store_analyze_then_uses(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    a = folder / "a.json.gz"
    rc, out = _rankscope("merge", str(a), *SYNC, "-q")
    assert rc == 0 and (folder / "a.rankscope.h5").is_file(), out
    rc, out = _rankscope("analyze", str(a), *SYNC)
    assert rc == 0 and f"using {folder / 'a.rankscope.h5'}" in out, out


def test_a_run_folder_still_uses_its_trace_h5(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(DATA / "cpu_gloo_4rank_pipeline", run)
    rc, out = _rankscope("analyze", str(run), *SYNC)
    assert rc == 0 and (run / "trace.h5").is_file(), out
    assert not list(run.rglob(f"*{TRACE_STORE_SUFFIX}"))
    stamp = (run / "trace.h5").stat().st_mtime_ns
    rc, out = _rankscope("export", str(run), "--perfetto", str(tmp_path / "p.json"))
    assert rc == 0 and (run / "trace.h5").stat().st_mtime_ns == stamp, out


def test_the_naming_rule(tmp_path: Path) -> None:
    assert trace_store_name(Path("a.json.gz")) == "a.rankscope.h5"
    assert (
        trace_store_name(Path("x/rank0.step5.pt.trace.json")) == "rank0.step5.pt.trace.rankscope.h5"
    )
    assert trace_store_name(Path("odd.trace")) == "odd.trace.rankscope.h5"
    assert store_for(tmp_path) == tmp_path / "trace.h5"
    trace = tmp_path / "a.json.gz"
    trace.write_text("{}")
    assert store_for(trace) == tmp_path / "a.rankscope.h5"
    other = tmp_path / "sub" / "a.json.gz"
    other.parent.mkdir()
    other.write_text("{}")
    # in the cache, the same trace name in two folders gets two stores
    assert cached_store(trace) != cached_store(other)
    assert cached_store(trace).name.startswith("a-") and cached_store(trace).name.endswith(
        TRACE_STORE_SUFFIX
    )
