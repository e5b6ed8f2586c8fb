"""``rankscope merge`` imports pandas without pyarrow where every worker shares its interpreter
(``orchestrator/merge.py``, ``pandas_without_arrow``), and writes the same store as a merge whose
pandas has pyarrow (this test process').

Each probe runs in a fresh interpreter (``sys.executable -c``): what pandas saw at its import is
settled once per process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from rankscope.orchestrator.ingest.merge import merge_run_dir
from rankscope.pandas_strings import object_strings

DATA = Path(__file__).parent / "data"
#: A real job with collectives and point-to-point rows (gloo pipeline, 4 ranks).
CASE = DATA / "cpu_gloo_4rank_pipeline"
#: Root attributes that differ between two merges of the same input: the creation time.
VARYING_ATTRS = frozenset({"created"})


def _probe(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; it prints one JSON line last, returned here."""
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout.splitlines()[-1]))


def _contents(path: Path) -> dict[str, Any]:
    """Every group's and dataset's attributes, and every dataset's dtype, shape and values."""
    out: dict[str, Any] = {}
    with h5py.File(path, "r") as f:

        def visit(name: str, obj: Any) -> None:
            attrs = {k: v for k, v in obj.attrs.items() if k not in VARYING_ATTRS}
            data = (obj.dtype, obj.shape, obj[()]) if isinstance(obj, h5py.Dataset) else None
            out[name] = (attrs, data)

        visit("/", f)
        f.visititems(visit)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b))
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def test_merge_command_skips_pyarrow_and_writes_the_same_store(tmp_path: Path) -> None:
    out = tmp_path / "command.h5"
    seen = _probe(
        f"""
        import json, sys
        from rankscope.orchestrator import cli
        assert cli.main(["merge", {str(CASE)!r}, "-o", {str(out)!r}, "-q"]) == 0
        from pandas.compat.pyarrow import HAS_PYARROW
        imported = "pyarrow" in sys.modules
        import pyarrow  # hidden from pandas' import only
        print(json.dumps({{"imported": imported, "pandas_has_it": HAS_PYARROW}}))
        """
    )
    assert seen == {"imported": False, "pandas_has_it": False}
    import pandas.compat.pyarrow

    assert pandas.compat.pyarrow.HAS_PYARROW  # this process: pandas with pyarrow
    here = tmp_path / "in_process.h5"
    with object_strings():  # as the command runs it
        merge_run_dir(CASE, output=here, quiet=True)
    a, b = _contents(out), _contents(here)
    assert a.keys() == b.keys() and len(a) > 50
    for name in a:
        assert _same(a[name], b[name]), name


@pytest.mark.parametrize("spec", ["scheduler='local'", "slurm_workers=2"])
def test_pandas_keeps_pyarrow_where_workers_have_their_own_interpreter(spec: str) -> None:
    """A LocalCluster's or Slurm's workers send back what their pandas (with pyarrow) made."""
    seen = _probe(
        f"""
        import json, sys
        from rankscope.analysis.engine.scheduler import ClusterSpec
        from rankscope.orchestrator.merge import pandas_without_arrow
        pandas_without_arrow(ClusterSpec({spec}))
        from pandas.compat.pyarrow import HAS_PYARROW
        print(json.dumps({{"pandas_has_it": HAS_PYARROW, "imported": "pyarrow" in sys.modules}}))
        """
    )
    assert seen == {"pandas_has_it": True, "imported": True}


def test_merge_command_paces_the_collector_from_its_imports_on(tmp_path: Path) -> None:
    """No collector pass at Python's own pace from the command's import of pandas to the end of
    its work (``paced_collector`` around the imports as well as the merge). A pass as the pace
    is restored is not counted: restoring Python's threshold starts one at once when more
    containers than that were made since the last pass, which depends on the interpreter's own
    allocations (it failed this test on one venv and not on another with the same code)."""
    out = tmp_path / "paced.h5"
    seen = _probe(
        f"""
        import contextlib, gc, json, sys
        from rankscope import collector
        from rankscope.orchestrator import cli
        assert "pandas" not in sys.modules
        default = gc.get_threshold()[0]
        passes = []
        done = []
        real_pacing = collector.paced_collector
        @contextlib.contextmanager
        def pacing_then_note():
            with real_pacing():
                yield
                done.append(True)  # the command's work is over; the pace is restored next
        collector.paced_collector = pacing_then_note
        def note(phase, info):
            if phase == "start" and "pandas" in sys.modules and not done:
                passes.append(gc.get_threshold()[0])
        gc.callbacks.append(note)
        assert cli.main(["merge", {str(CASE)!r}, "-o", {str(out)!r}, "-q"]) == 0
        gc.callbacks.remove(note)
        print(json.dumps({{"at_default": passes.count(default), "restored": gc.get_threshold()[0] == default}}))
        """
    )
    assert seen == {"at_default": 0, "restored": True}


def test_a_pandas_that_needs_pyarrow_is_imported_with_it(tmp_path: Path) -> None:
    """Were a pandas release to need pyarrow at its import, the merge imports it as usual (the
    half-imported package forgotten) instead of failing. The stand-in is a two-module package
    named ``pandas`` whose submodule imports pyarrow, as a pandas needing it would."""
    fake = tmp_path / "pandas"
    fake.mkdir()
    (fake / "__init__.py").write_text("from pandas import needs_arrow\nFAKE = True\n")
    (fake / "needs_arrow.py").write_text("import pyarrow\n")
    got = _probe(
        f"""
        import json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from rankscope.analysis.engine.scheduler import ClusterSpec
        from rankscope.orchestrator.merge import pandas_without_arrow
        pandas_without_arrow(ClusterSpec())
        import pandas
        print(json.dumps({{"fake": getattr(pandas, "FAKE", False),
                          "arrow": pandas.needs_arrow.pyarrow.__name__}}))
        """
    )
    assert got == {"fake": True, "arrow": "pyarrow"}


def test_auto_keeps_pyarrow_where_this_process_cannot_fork() -> None:
    """``auto`` runs a large job on a LocalCluster where this process cannot fork its workers
    (a worker process itself, or not Linux: ``scheduler.can_fork``), so pandas keeps pyarrow
    there. The probe asks from a forked child, where ``can_fork`` is False."""
    seen = _probe(
        """
        import json, multiprocessing, sys
        def child(q):
            from rankscope.analysis.engine.scheduler import ClusterSpec, can_fork
            from rankscope.orchestrator.merge import pandas_without_arrow
            pandas_without_arrow(ClusterSpec())
            from pandas.compat.pyarrow import HAS_PYARROW
            q.put({"can_fork": can_fork(), "pandas_has_it": HAS_PYARROW})
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        got = q.get(timeout=120)
        p.join(timeout=60)
        print(json.dumps(got))
        """
    )
    assert seen == {"can_fork": False, "pandas_has_it": True}


def test_analyze_command_without_pyarrow_writes_the_same_summary(tmp_path: Path) -> None:
    """``rankscope analyze FOLDER`` in-process imports pandas without pyarrow, and its summary
    and report are those of the same analysis by a pandas with pyarrow (this process')."""
    from rankscope.launchers import rundir
    from rankscope.orchestrator.workflow import Workflow, merge_analyse_report

    folder = tmp_path / "run"
    shutil.copytree(CASE, folder)
    seen = _probe(
        f"""
        import json, sys
        from rankscope.orchestrator import cli
        assert cli.main(["analyze", {str(folder)!r}]) == 0
        from pandas.compat.pyarrow import HAS_PYARROW
        print(json.dumps({{"imported": "pyarrow" in sys.modules, "pandas_has_it": HAS_PYARROW}}))
        """
    )
    assert seen == {"imported": False, "pandas_has_it": False}
    report = folder / rundir.REPORT_DIR
    command = [(report / n).read_bytes() for n in (rundir.SUMMARY_JSON, rundir.REPORT_HTML)]
    (folder / rundir.STORE_NAME).unlink()
    shutil.rmtree(report)
    merge_analyse_report(folder, Workflow(progress=False))
    assert [(report / n).read_bytes() for n in (rundir.SUMMARY_JSON, rundir.REPORT_HTML)] == command
