"""pandas' object strings during a merge and an analysis (rankscope.pandas_strings): the same
store, summary and report as with pandas 3's Arrow-backed strings, on real traces."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pandas as pd
import pytest
from rankscope.launchers import rundir
from rankscope.orchestrator.workflow import Workflow, _merge_analyse_report, merge_analyse_report
from rankscope.pandas_strings import INFER_STRING_OPTION, object_strings
from store_compare import same_store

DATA = Path(__file__).parent / "data"

#: Real jobs of three kinds: NCCL data parallel, gloo pipeline (point-to-point), NVSHMEM.
CASES = ("param_dlrm_8rank", "cpu_gloo_4rank_pipeline", "deepep_nvshmem_8rank")
#: Analysis frames compared value by value.
FRAMES = ("breakdown", "hta", "waits", "windows", "stragglers", "verdicts", "op_stats", "ops")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    INFER_DEFAULT = pd.get_option(INFER_STRING_OPTION)  # pandas < 4 (pyproject.toml)


def _infers() -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(pd.get_option(INFER_STRING_OPTION))


def _infer(value: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pd.set_option(INFER_STRING_OPTION, value)


def test_object_strings_for_the_body_only() -> None:
    for caller in (True, False):
        _infer(caller)
        try:
            with object_strings():
                assert pd.Series(["a", "b"]).dtype == object
                assert pd.Index(["x"]).dtype == object
            assert _infers() is caller
            with pytest.raises(ZeroDivisionError), object_strings():
                _ = 1 / 0
            assert _infers() is caller
        finally:
            _infer(bool(INFER_DEFAULT))


def _outputs(folder: Path) -> tuple[dict[str, object], str]:
    report = folder / rundir.REPORT_DIR
    summary = json.loads((report / rundir.SUMMARY_JSON).read_text())
    return summary, (report / rundir.REPORT_HTML).read_text()


@pytest.mark.parametrize("case", CASES)
def test_same_results_as_arrow_strings(case: str, tmp_path: Path) -> None:
    """``analyze FOLDER`` as the command runs it (object strings) and the same with pandas'
    Arrow-backed strings: equal stores, summaries, reports and analysis frames."""
    folder = tmp_path / "run"
    shutil.copytree(DATA / case, folder)
    wf = Workflow(progress=False)
    _infer(True)
    try:
        arrow = _merge_analyse_report(folder, wf)
        arrow_out = _outputs(folder)
        (folder / rundir.STORE_NAME).rename(tmp_path / "arrow.h5")
        shutil.rmtree(folder / rundir.REPORT_DIR)
        plain = merge_analyse_report(folder, wf)
        assert _infers() is True  # restored
    finally:
        _infer(bool(INFER_DEFAULT))
    assert _outputs(folder) == arrow_out
    same_store(tmp_path / "arrow.h5", folder / rundir.STORE_NAME)
    strings = 0
    for name in FRAMES:
        a, b = getattr(arrow, name), getattr(plain, name)
        pd.testing.assert_frame_equal(
            a,
            b,
            check_exact=True,
            check_dtype=False,
            check_index_type=False,
            check_column_type=False,
            obj=name,
        )
        for col in a.columns:
            if isinstance(a[col].dtype, pd.StringDtype):
                strings += 1
                assert b[col].dtype == object, (name, col)  # what the command's option does
    assert strings  # the frames do hold strings
