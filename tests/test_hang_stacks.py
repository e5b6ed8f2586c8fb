"""A rank whose Python threads cannot answer (C code holding the GIL) is placed by the text its
faulthandler and py-spy wrote: real files of a real hung job (tests/data/hang_stacks/README.md
says how they were made), checked against what that job's script did."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from rankscope.analysis.compute.hang import RankState, diagnose
from rankscope.analysis.compute.stack_text import parse_faulthandler, parse_py_spy
from rankscope.launchers import rundir
from rankscope.launchers.hang_watch import HangNotice, RankProgress
from rankscope.orchestrator.hang import say_who_and_where, text_stacks

DATA = Path(__file__).resolve().parent / "data" / "hang_stacks"
SCRIPT = DATA / "gil_hang.py"
FAULTHANDLER = (DATA / "rank1-stacks.txt").read_text()
PY_SPY = (DATA / "rank1-native-stacks.txt").read_text()
ANSWER = json.loads((DATA / "rank0-hang.json").read_text())
#: The hang's notice time (the token of rank 0's answer).
NOTICED_NS = int(ANSWER["token"])


def _line(text: str) -> int:
    """The line of the script that holds ``text``."""
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


STUCK_LINE = _line("STUCK.match(")


def test_faulthandler_text_gives_the_main_threads_frames() -> None:
    threads = parse_faulthandler(FAULTHANDLER)
    assert len(threads) == 3  # the main thread, the probe's, a gloo thread with no Python frame
    main = threads[0]
    assert main["name"] == "MainThread"  # faulthandler names none: the one threading did not start
    innermost = main["frames"][-1]
    assert (Path(innermost["file"]).name, innermost["line"], innermost["function"]) == (
        "gil_hang.py",
        STUCK_LINE,
        "stuck_in_c",
    )
    assert main["frames"][-2]["line"] == _line("  stuck_in_c()")  # the call, not the def
    # every signal appends a dump: a thread's latest block stands, not one thread per dump
    assert len(parse_faulthandler(FAULTHANDLER + "\n" + FAULTHANDLER)) == 3


def test_py_spy_text_gives_python_and_native_frames() -> None:
    threads = parse_py_spy(PY_SPY)
    assert [t["name"] for t in threads][:2] == ["MainThread", "rankscope-hang-probe"]
    frames = threads[0]["frames"]
    assert [f["function"] for f in frames[-2:]] == ["_sre_SRE_Pattern_match", "sre_ucs1_match"]
    assert all(f["native"] for f in frames[-2:])
    python = [f for f in frames if not f["native"]]
    assert (Path(python[-1]["file"]).name, python[-1]["line"]) == ("gil_hang.py", STUCK_LINE)
    # py-spy's unnamed native addresses say nothing: left out
    assert not any(f["function"].startswith("0x") for t in threads for f in t["frames"])


def _run(tmp_path: Path, *files: str) -> Path:
    """A run folder with rank 0's answer and rank 1's text stacks, written after the notice."""
    run = tmp_path / "run"
    _rank(run, 0)
    rundir.write_json_atomic(run / rundir.RUN_JSON, {"state": "running", "world_size": 2})
    shutil.copy(DATA / "rank0-hang.json", _rank(run, 0) / rundir.HANG_DUMP)
    for name in files:
        path = _rank(run, 1) / name
        shutil.copy(DATA / f"rank1-{name}", path)
        os.utime(path, ns=(NOTICED_NS + 5 * 10**9, NOTICED_NS + 5 * 10**9))
    return run


def _rank(run: Path, rank: int) -> Path:
    path = rundir.rank_dir(run, rank)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize(
    ("files", "source", "inside"),
    [
        (
            (rundir.NATIVE_STACKS_FILE, rundir.STACKS_FILE),
            "py-spy stacks, native-stacks.txt",
            "libpython3.11.so.1.0:_sre_SRE_Pattern_match … libpython3.11.so.1.0:sre_ucs1_match",
        ),
        ((rundir.STACKS_FILE,), "faulthandler stacks, stacks.txt", ""),
    ],
)
def test_a_rank_that_could_not_answer_is_placed_by_its_text_stacks(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    files: tuple[str, ...],
    source: str,
    inside: str,
) -> None:
    run = _run(tmp_path, *files)
    stacks = text_stacks(run, [1], NOTICED_NS)
    assert stacks[1]["stacks_from"] == source
    diag = diagnose({0: ANSWER}, 2, stacks=stacks)
    assert diag.culprits == [1] and diag.collective is not None
    rank1 = next(p for p in diag.places if p.rank == 1)
    assert rank1.state == RankState.SILENT and rank1.user_frame is not None
    assert (Path(rank1.user_frame.file).name, rank1.user_frame.line) == ("gil_hang.py", STUCK_LINE)
    assert rank1.inside == inside
    # the launcher's whole path: the paragraph and report/hang.json name it with its line
    notice = HangNotice(
        idle_s=11.0,
        threshold_s=10.0,
        before_first_step=False,
        ranks=[
            RankProgress(0, None, 3, NOTICED_NS - 11 * 10**9),
            RankProgress(1, None, 1, NOTICED_NS - 11 * 10**9),
        ],
        noticed_ns=NOTICED_NS,
    )
    say_who_and_where(run, notice)
    said = capsys.readouterr().err
    assert (
        f"rank 1: did not answer (placed by its {source}), in gil_hang.py:{STUCK_LINE} (stuck_in_c)"
        in said
    )
    report = json.loads((run / rundir.REPORT_DIR / rundir.HANG_REPORT).read_text())
    rank1_doc = next(r for r in report["ranks"] if r["rank"] == 1)
    assert rank1_doc["line"] == STUCK_LINE and rank1_doc["stacks_from"] == source


def test_text_stacks_of_an_earlier_hang_are_not_read(tmp_path: Path) -> None:
    run = _run(tmp_path, rundir.STACKS_FILE)
    later = NOTICED_NS + 60 * 10**9  # a second hang, after the rank resumed: these are stale
    assert text_stacks(run, [1], later) == {}
    diag = diagnose({0: ANSWER}, 2, stacks=text_stacks(run, [1], later))
    rank1 = next(p for p in diag.places if p.rank == 1)
    assert rank1.state == RankState.SILENT and rank1.user_frame is None


SCANCELLED = Path(__file__).parent / "data" / "hang_ended_by_scancel"


def test_errors_the_hangs_ending_made_do_not_make_a_rank_dead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real files of a Slurm job ended by scancel after both ranks answered: the SIGTERM that
    killed each rank's data-loader worker made torch raise in the rank (its meta.json's error,
    after the notice). The culprit is the rank that never arrived, placed by its answer; dying
    of the ending is not the rank's own death (it was called dead once in CI)."""
    run = tmp_path / "run"
    shutil.copytree(SCANCELLED, run)
    noticed = json.loads((run / rundir.RUN_JSON).read_text())["hang"]["noticed_ns"]
    for rank in (0, 1):  # the premise: each rank has the ending's error, made after the notice
        error = json.loads((rundir.rank_dir(run, rank) / rundir.META_JSON).read_text())["error"]
        assert "killed by signal: Terminated" in error["message"] and not error["interrupted"]
        assert error["time_ns"] > noticed
    notice = HangNotice(
        idle_s=10.5,
        threshold_s=10.0,
        before_first_step=False,
        ranks=[RankProgress(r, None, 4, noticed - 10 * 10**9) for r in (0, 1)],
        noticed_ns=noticed,
    )
    say_who_and_where(run, notice)
    said = capsys.readouterr().err
    assert "the others wait for rank 1" in said and "dead" not in said
    report = json.loads((run / rundir.REPORT_DIR / rundir.HANG_REPORT).read_text())
    assert report["culprits"] == [1] and report["collective"]["op"] == "all_reduce"
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert ranks[1]["state"] == "missing" and ranks[1]["line"] == 152
    assert ranks[0]["state"] == "waiting"
