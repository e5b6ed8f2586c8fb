"""One-line errors of the CLI, rankscope's own outputs never merged, and the merge's lock file.

Each CLI case runs the real command (``python -m rankscope …``) and checks everything it printed
(stdout and stderr together) and its exit status.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rankscope.analysis.store.reader import open_store
from rankscope.orchestrator.cli import COMMANDS, build_parser
from rankscope.orchestrator.cli import main as cli
from rankscope.orchestrator.ingest.staging import LOCK_FORMAT, output_lock

DATA = Path(__file__).parent / "data" / "cpu_gloo_4rank_straggler"
TRACE = "rank2.step5.pt.trace.json"
SYNC = ("--scheduler", "synchronous")


def _rankscope(*args: str, cwd: Path | None = None) -> tuple[int, list[str]]:
    """Run ``python -m rankscope ARGS``; (exit status, non-empty... and empty output lines)."""
    proc = subprocess.run(
        [sys.executable, "-m", "rankscope", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


def _leftovers(folder: Path) -> list[str]:
    """Lock files and temporaries a merge may have left in ``folder``."""
    return sorted(
        p.name for p in folder.iterdir() if p.name.endswith((".lock", ".tmp")) or ".tmp" in p.name
    )


# ------------------------------------------------------------------ item 4: own outputs skipped
def test_remerge_after_analyze_and_export_takes_only_the_traces(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    assert cli(["analyze", str(run), *SYNC]) == 0
    assert (run / "report" / "summary.json").is_file()
    assert (run / "report" / "report.html").is_file()
    export = run / "merged.json.gz"
    assert cli(["export", str(run), "--perfetto", str(export)]) == 0
    plain = run / "merged-copy.json"  # an uncompressed export, and one in a sub-folder
    assert cli(["export", str(run), "--perfetto", str(plain)]) == 0
    (run / "exports").mkdir()
    shutil.copy2(export, run / "exports" / "rank0-export.json.gz")
    (run / "notes.json").write_text('{"lr": 0.1}')  # somebody's JSON, not a trace
    rc = cli(["merge", str(run), *SYNC, "-q", "--strict"])
    assert rc == 0, "no input problem: rankscope's own files are not inputs"
    with open_store(run / "trace.h5") as store:
        assert store.ranks == [0, 1, 2, 3]
        assert store.problems().empty
        files = [f for r in store.ranks for f in store.rank_meta(r).get("files", [])]
    assert all(Path(f).name.endswith(".pt.trace.json") for f in files), files
    assert _leftovers(run) == []


def test_broken_trace_named_like_a_trace_is_still_reported(tmp_path: Path) -> None:
    """A truncated tensorboard_trace_handler file (no rank in its name) is a problem, not skipped."""
    folder = tmp_path / "in"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy2(DATA / f"rank{r}.step5.pt.trace.json", folder)
    bad = folder / "host_1234.1700000000.pt.trace.json"
    bad.write_bytes((DATA / TRACE).read_bytes()[:-5000])
    assert cli(["merge", str(folder), *SYNC, "-q"]) == 0
    with open_store(folder / "trace.h5") as store:
        assert str(bad) in store.problems()["file"].tolist()


# ---------------------------------------------------------------------------- item 8: errors
def test_analyze_empty_folder_is_one_analyze_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, lines = _rankscope("analyze", str(empty), *SYNC)
    assert rc != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("rankscope analyze: error: ")
    assert str(empty) in lines[0] and "no Kineto trace files" in lines[0]
    assert list(empty.iterdir()) == [], "no lock file, no store left behind"


def test_merge_empty_folder_is_one_line(tmp_path: Path) -> None:
    rc, lines = _rankscope("merge", str(tmp_path), *SYNC)
    assert rc == 1 and len(lines) == 1, lines
    assert lines[0].startswith("rankscope merge: error: ") and str(tmp_path) in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_analyze_a_text_file_is_one_line(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    rc, lines = _rankscope("analyze", str(notes), *SYNC)
    assert rc != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("rankscope analyze: error: ")
    assert str(notes) in lines[0] and "neither" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_analyze_a_rankscope_export_is_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    export = tmp_path / "merged.json.gz"
    assert cli(["merge", str(run), *SYNC, "-q"]) == 0
    assert cli(["export", str(run), "--perfetto", str(export)]) == 0
    rc, lines = _rankscope("analyze", str(export), *SYNC)
    assert rc != 0 and len(lines) == 1, lines
    assert str(export) in lines[0] and "export" in lines[0]


def test_failed_and_successful_merges_leave_no_lock_or_temporary(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(b"")  # nothing mergeable: the merge fails
    rc, lines = _rankscope("merge", str(folder), *SYNC)
    assert rc == 1 and "no rank could be merged" in lines[-1]
    assert _leftovers(folder) == [] and not (folder / "trace.h5").exists()
    shutil.copy2(DATA / TRACE, folder)
    rc, _ = _rankscope("merge", str(folder), *SYNC, "-q")
    assert rc == 0 and (folder / "trace.h5").is_file()
    assert _leftovers(folder) == []


def test_lock_is_removed_and_a_late_waiter_retries_on_the_live_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge that locks the inode the previous holder just unlinked must not proceed on it."""
    out = tmp_path / "trace.h5"
    lock = tmp_path / LOCK_FORMAT.format(name=out.name)
    real_flock = fcntl.flock
    calls = []

    def flock(fd: int, op: int) -> None:
        if not calls and op & fcntl.LOCK_EX:
            lock.unlink()  # the holder finished between our open() and our flock()
        calls.append(op)
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with output_lock(out):
        monkeypatch.setattr(fcntl, "flock", real_flock)
        assert lock.exists(), "the lock we hold is the one at the path"
        with lock.open("a+") as other, pytest.raises(BlockingIOError):
            real_flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert not lock.exists()
    assert list(tmp_path.iterdir()) == []


def test_lock_is_removed_after_an_error_inside(tmp_path: Path) -> None:
    out = tmp_path / "trace.h5"
    with pytest.raises(RuntimeError), output_lock(out):
        raise RuntimeError("merge failed")
    assert list(tmp_path.iterdir()) == []


def test_analyze_a_single_trace_file_merges_beside_it_and_reuses_the_store(
    tmp_path: Path,
) -> None:
    trace = tmp_path / TRACE
    shutil.copy2(DATA / TRACE, trace)
    old = time.time() - 3600
    os.utime(trace, (old, old))
    rc, lines = _rankscope("analyze", str(trace), *SYNC, "--json", str(tmp_path / "s.json"))
    store = tmp_path / "rank2.step5.pt.trace.rankscope.h5"
    assert rc == 0, lines
    assert store.is_file() and any(str(store) in line for line in lines), lines
    assert not any("not a readable HDF5" in line for line in lines)
    with open_store(store) as s:
        assert s.ranks == [2]
    stamp = store.stat().st_mtime_ns
    # Second time: the store is newer than the trace, so it is used as it is.
    rc, lines = _rankscope("analyze", str(trace), *SYNC)
    assert rc == 0 and store.stat().st_mtime_ns == stamp
    assert any("using" in line and str(store) in line for line in lines), lines
    # The trace changed: merged again.
    os.utime(trace, None)
    rc, lines = _rankscope("analyze", str(trace), *SYNC)
    assert rc == 0 and store.stat().st_mtime_ns != stamp
    assert _leftovers(tmp_path) == []


def test_analyze_a_trace_whose_store_holds_another_merge_is_refused(tmp_path: Path) -> None:
    """``a.json`` and ``a.json.gz`` name one store (``a.rankscope.h5``): the second never
    overwrites the first's; the folder's trace.h5 is never touched by one file's merge."""
    folder = tmp_path / "run"
    shutil.copytree(DATA, folder)
    assert cli(["merge", str(folder), *SYNC, "-q"]) == 0
    stamp = (folder / "trace.h5").stat().st_mtime_ns
    rc, lines = _rankscope("analyze", str(folder / TRACE), *SYNC)
    assert rc == 0 and (folder / "trace.h5").stat().st_mtime_ns == stamp, lines
    store = folder / "rank2.step5.pt.trace.rankscope.h5"
    import gzip

    twin = folder / f"{TRACE}.gz"
    twin.write_bytes(gzip.compress((folder / TRACE).read_bytes()))
    stamp = store.stat().st_mtime_ns
    rc, lines = _rankscope("analyze", str(twin), *SYNC)
    assert rc != 0 and len(lines) == 1, lines
    assert "-o" in lines[0] and str(store) in lines[0]
    assert store.stat().st_mtime_ns == stamp


def test_analyze_folder_remerges_when_a_trace_is_newer_than_its_store(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(DATA, folder)
    assert cli(["merge", str(folder), *SYNC, "-q"]) == 0
    store = folder / "trace.h5"
    old = time.time() - 3600
    os.utime(store, (old, old))
    # copytree keeps the checkout's mtimes, which may be older than that: make one trace newer
    trace = next(p for p in sorted(folder.rglob("*.json*")) if "meta" not in p.name)
    os.utime(trace, None)
    stamp = store.stat().st_mtime_ns
    assert cli(["analyze", str(folder), *SYNC]) == 0
    assert store.stat().st_mtime_ns != stamp


@pytest.mark.parametrize(
    ("args", "wrong", "right"),
    [
        (("analyze", "RUN", "--jsn", "x.json"), "--jsn", "--json"),
        (("merge", "RUN", "--stirct"), "--stirct", "--strict"),
        (("export", "RUN", "--perfeto=x.json"), "--perfeto", "--perfetto"),
        (("run", "--activ", "3", "train.py"), "--activ", "--active"),
        (("run", "--nproc-per-ndoe", "2", "train.py"), "--nproc-per-ndoe", "--nproc-per-node"),
    ],
    ids=["analyze", "merge", "export-equals", "run-ours", "run-torchrun"],
)
def test_mistyped_flag_suggests_the_right_one(
    args: tuple[str, ...], wrong: str, right: str, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    shutil.copytree(DATA, tmp_path / "RUN")
    rc, lines = _rankscope(*args, cwd=tmp_path)
    assert rc == 2
    # run hands unknown flags to torchrun, and says so
    what = "torchrun: unrecognized arguments:" if args[0] == "run" else "unknown option"
    assert lines == [f"rankscope {args[0]}: error: {what} {wrong}; did you mean {right}?"]


def test_argparse_errors_of_a_command_are_one_line(tmp_path: Path) -> None:
    rc, lines = _rankscope("export", str(tmp_path))  # --perfetto is required
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("rankscope export: error: ") and "--perfetto" in lines[0]


def test_an_interrupt_turned_into_another_error_by_library_code_is_still_an_interrupt() -> None:
    """CI saw h5py turn the KeyboardInterrupt of Ctrl-C into a TypeError (a traceback, exit 1)."""
    import signal

    from rankscope.orchestrator.merge import interrupt_wins

    def library_call() -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)  # let the handler run here
        except KeyboardInterrupt:
            raise TypeError("Operation not defined for data type class") from None

    # Python's own handler, as in a fresh `rankscope merge` (dask-jobqueue, imported by other
    # tests in this process, installs one of its own)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), interrupt_wins():
            library_call()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(TypeError), interrupt_wins():  # no interrupt: the error is the error
            raise TypeError("a real one")
    finally:
        signal.signal(signal.SIGINT, previous)


def _sub_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-parsers of ``parser`` by command name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_a_command_alone_parses_as_the_full_parser_does() -> None:
    """``build_parser(only=COMMAND)`` (what ``main`` builds) holds that command's sub-parser as the
    full parser does: same prog, help, defaults and parsed values; a name that is no command
    gets them all."""
    full = build_parser()
    subs = _sub_parsers(full)
    assert set(subs) == set(COMMANDS)
    for name in COMMANDS:
        alone = build_parser(only=name)
        assert set(_sub_parsers(alone)) == {name}
        mine, theirs = _sub_parsers(alone)[name], subs[name]
        assert mine.prog == theirs.prog
        assert mine.format_help() == theirs.format_help()
        assert mine.format_usage() == theirs.format_usage()
    for argv in (
        ["analyze", "run", "--json", "s.json", "--top-ops", "3", "--all-ranks"],
        ["merge", "a.json", "b.json", "-o", "out.h5", "--scheduler", "synchronous"],
        ["synth", "out", "--ranks", "4"],
    ):
        assert build_parser(only=argv[0]).parse_args(argv) == full.parse_args(argv)
    assert set(_sub_parsers(build_parser(only="nosuch"))) == set(COMMANDS)
    assert set(_sub_parsers(build_parser(only=None))) == set(COMMANDS)
