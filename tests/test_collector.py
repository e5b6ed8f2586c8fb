"""The garbage collector's pace during an analysis (``rankscope.collector``): raised inside,
the caller's restored after (error or not), and the real ``analyze`` path runs under it."""

from __future__ import annotations

import gc
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from rankscope.collector import OLDER_THRESHOLDS, YOUNG_THRESHOLD, paced_collector
from rankscope.orchestrator.workflow import Workflow, merge_analyse_report

DATA = Path(__file__).parent / "data" / "cpu_gloo_4rank_straggler"
PACED = (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)


@pytest.fixture
def default_pace() -> Iterator[tuple[int, int, int]]:
    """Python's default thresholds for the test, the caller's put back after it."""
    old = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*old)


def test_paced_inside_and_restored_after(default_pace: tuple[int, int, int]) -> None:
    with paced_collector():
        assert gc.get_threshold() == PACED
    assert gc.get_threshold() == default_pace


def test_restored_after_an_error(default_pace: tuple[int, int, int]) -> None:
    with pytest.raises(ZeroDivisionError), paced_collector():
        assert gc.get_threshold() == PACED
        _ = 1 / 0
    assert gc.get_threshold() == default_pace


@pytest.mark.parametrize("caller", [(0, 10, 10), (200_000, 5, 5)])
def test_a_caller_collecting_less_often_is_left_as_is(
    default_pace: tuple[int, int, int], caller: tuple[int, int, int]
) -> None:
    gc.set_threshold(*caller)
    with paced_collector():
        assert gc.get_threshold() == caller
    assert gc.get_threshold() == caller


def test_the_analysis_runs_paced(default_pace: tuple[int, int, int], tmp_path: Path) -> None:
    """A real ``analyze FOLDER`` merges, analyses and writes its reports under the paced
    thresholds (read as each of those steps is entered), and the caller's are back after it."""
    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    steps = {"merge_into_store", "run_analysis", "summarise", "write_reports"}
    seen: dict[str, set[tuple[int, int, int]]] = {}

    def note(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_name in steps:
            seen.setdefault(frame.f_code.co_name, set()).add(gc.get_threshold())

    sys.setprofile(note)
    try:
        merge_analyse_report(run, Workflow(progress=False))
    finally:
        sys.setprofile(None)
    assert (run / "report" / "summary.json").is_file()
    assert seen == {step: {PACED} for step in steps}
    assert gc.get_threshold() == default_pace


def test_the_console_script_keeps_the_pace_to_its_end() -> None:
    """The process of the console script (``cli.main()`` without arguments) keeps the pace after
    the command's block: putting Python's back only made a pass over the young generation
    right before the process ended. Without that call, the caller's thresholds come back."""
    import subprocess

    code = (
        "import gc\n"
        "from rankscope.collector import keep_pace_to_exit, paced_collector\n"
        "gc.set_threshold(700, 10, 10)\n"
        "with paced_collector(): pass\n"
        "print(gc.get_threshold())\n"
        "keep_pace_to_exit()\n"
        "with paced_collector(): pass\n"
        "print(gc.get_threshold())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split("\n")[:2] == [str((700, 10, 10)), str(PACED)]


def test_rankscope_merge_as_a_process_ends_at_its_pace(tmp_path: Path) -> None:
    """``rankscope merge`` as the console script: the thresholds an ``atexit`` handler sees (the
    script ends through them, then ``os._exit``) are still the pace's."""
    import subprocess

    code = (
        "import atexit, gc, sys\n"
        "from rankscope.orchestrator import cli\n"
        "atexit.register(lambda: print(gc.get_threshold()))\n"
        f"sys.argv = ['rankscope', 'merge', {str(DATA)!r}, '-o', {str(tmp_path / 't.h5')!r}, '-q']\n"
        "cli.main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(PACED)
