"""A rank's files parsed here or ahead in a forked process (``orchestrator/ingest/source_reads.py``).

The read-ahead must change nothing but when the parsing happens: its parses equal this process'
own, a merge that takes them writes the same store, and every way it can fail (a parse not
begun, a process that died, one that takes too long, a source parsed ahead as another) falls
back to parsing here, leaving no process. (That the reader and the rank's build need neither
pandas nor h5py is ``test_reader_imports.py``.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from mapping_views import views_a_mapping
from rankscope.analysis.engine import scheduler
from rankscope.analysis.engine.scheduler import AUTO, ClusterSpec
from rankscope.orchestrator.ingest.comm_kernels import DEFAULT_VOCABULARY, CommVocabulary
from rankscope.orchestrator.ingest.discovery import RankSource, discover
from rankscope.orchestrator.ingest.rank_columns import RankResult, parse_source
from rankscope.orchestrator.ingest.rank_selection import hint_ranks
from rankscope.orchestrator.ingest.source_reads import ReadAhead
from rankscope.orchestrator.workflow import merge_is_due

from tests.store_compare import same_store

DATA = Path(__file__).parent / "data"
DLRM = DATA / "param_dlrm_8rank"


def _same_columns(a: dict[str, np.ndarray] | None, b: dict[str, np.ndarray] | None) -> None:
    """Two tables as columns equal: names in order, dtypes and values."""
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def _same_rank(a: RankResult, b: RankResult) -> None:
    """Every field of two parses of one source equal (tables column by column, exactly)."""
    for f in dataclasses.fields(RankResult):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in ("columns", "lanes", "comm", "steps", "memory", "step_log"):
            _same_columns(x, y)
        else:
            assert x == y, f.name


def test_the_tables_are_typed_as_the_merge_holds_them() -> None:
    """A real NCCL rank's tables: the comm table in its documented columns and dtypes (text as
    objects), the lanes' and the steps' too, with rows in each."""
    from rankscope.analysis.store.schema import LANE_COLUMNS
    from rankscope.orchestrator.ingest.comm_links import RANK_COMM_COLUMNS

    res = parse_source(discover([DLRM])[0][0])
    assert res.comm is not None and res.lanes is not None and res.steps is not None
    assert tuple(res.comm) == RANK_COMM_COLUMNS and len(res.comm["event"]) > 0
    assert {k: v.dtype.kind for k, v in res.comm.items()} == {
        "event": "i", "op": "O", "group": "O", "seq": "i", "bytes": "i",
        "step": "i", "start": "i", "end": "i", "gpu": "b", "peer": "i",
    }  # fmt: skip
    assert tuple(res.lanes) == tuple(LANE_COLUMNS) and len(res.lanes["lane"]) > 0
    assert res.lanes["pid"].dtype == object and res.lanes["kind"].dtype == np.int64
    assert list(res.steps) == ["step", "start", "end"] and len(res.steps["step"]) > 0
    assert all(v.dtype == np.int64 for v in res.steps.values())


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-ahead's rule on any machine: it needs a second core."""
    monkeypatch.setattr(scheduler, "cores", lambda: 2)


def _no_children_left(before: set[multiprocessing.process.BaseProcess]) -> None:
    assert set(multiprocessing.active_children()) <= before


def test_parses_taken_from_ahead_equal_parses_here(two_cores: None) -> None:
    sources, _, _ = discover([DLRM])
    before = set(multiprocessing.active_children())
    ahead = ReadAhead.start([DLRM], ClusterSpec(scheduler=AUTO), DEFAULT_VOCABULARY)
    assert ahead is not None
    with contextlib.closing(ahead):
        for source in sources:
            got = ahead.take(source, DEFAULT_VOCABULARY)
            assert got is not None and got.source is source  # the merge's own source
            _same_rank(got, parse_source(source))
        assert ahead.taken == len(sources)
        # taken once: a second take parses here
        assert ahead.take(sources[0], DEFAULT_VOCABULARY) is None
    _no_children_left(before)


def test_parses_come_through_shared_memory_and_the_process_ends_after_the_last(
    two_cores: None,
) -> None:
    """The parses ahead are handed over through memory shared with the process (their columns
    view it: ``analysis/engine/shared_results.py``), and once the last is taken the process
    ends by itself, before the read-ahead is closed (its end runs beside the merge's writes)."""
    import time

    sources, _, _ = discover([DLRM])
    before = set(multiprocessing.active_children())
    ahead = ReadAhead.start([DLRM], ClusterSpec(scheduler=AUTO), DEFAULT_VOCABULARY)
    assert ahead is not None
    with contextlib.closing(ahead):
        for i, source in enumerate(sources):
            if i == len(sources) - 1:
                assert set(multiprocessing.active_children()) - before  # still parsing
            got = ahead.take(source, DEFAULT_VOCABULARY)
            assert (
                got is not None
                and views_a_mapping(got.columns["ts"])
                and views_a_mapping(got.comm["start"])
            )
        deadline = time.monotonic() + 30
        while set(multiprocessing.active_children()) - before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not set(multiprocessing.active_children()) - before  # ended, not yet closed
    _no_children_left(before)


def test_a_source_parsed_ahead_as_another_is_parsed_here(two_cores: None, tmp_path: Path) -> None:
    """A rank hint that differs from the one parsed ahead (``--rank-from`` applied after the
    read-ahead began, say): the parse ahead is not taken; with the expression given to the
    read-ahead too, it is, with the hinted rank."""
    folder = tmp_path / "job"
    folder.mkdir()
    for name, rank in (("model_a", 7), ("model_b", 9)):  # traces without distributedInfo
        shutil.copy(DATA / "rankless" / f"{name}.json.gz", folder / f"node{rank}.json.gz")
    rx = r"node(\d+)"
    sources, _, _ = discover([folder])
    hinted = [dataclasses.replace(s) for s in sources]
    hint_ranks(hinted, re.compile(rx))
    assert [s.rank_hint for s in sources] == [None, None]
    assert [s.rank_hint for s in hinted] == [7, 9]
    with contextlib.closing(
        ReadAhead.start([folder], ClusterSpec(scheduler=AUTO), DEFAULT_VOCABULARY)
    ) as ahead:
        assert ahead is not None
        assert all(ahead.take(s, DEFAULT_VOCABULARY) is None for s in hinted)
    with contextlib.closing(
        ReadAhead.start([folder], ClusterSpec(scheduler=AUTO), DEFAULT_VOCABULARY, rx)
    ) as ahead:
        assert ahead is not None
        for source in hinted:
            got = ahead.take(source, DEFAULT_VOCABULARY)
            assert got is not None and got.rank == source.rank_hint
            _same_rank(got, parse_source(source))
    assert ReadAhead.start([folder], ClusterSpec(scheduler=AUTO), DEFAULT_VOCABULARY, "(") is None


def test_read_ahead_only_where_the_merge_parses_here(
    two_cores: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ReadAhead.start([DLRM], ClusterSpec(scheduler="synchronous"), DEFAULT_VOCABULARY) is None
    assert ReadAhead.start([DLRM], ClusterSpec(scheduler="processes"), DEFAULT_VOCABULARY) is None
    assert ReadAhead.start([DATA / "nothing here"], ClusterSpec(), DEFAULT_VOCABULARY) is None
    monkeypatch.setattr(scheduler, "cores", lambda: 1)
    assert ReadAhead.start([DLRM], ClusterSpec(scheduler=AUTO), DEFAULT_VOCABULARY) is None


def test_other_comm_kernels_or_other_files_are_read_here(two_cores: None, tmp_path: Path) -> None:
    sources, _, _ = discover([DLRM])
    other = CommVocabulary(("my_allreduce_kernel",))
    assert other != DEFAULT_VOCABULARY
    with contextlib.closing(ReadAhead(sources[:1], DEFAULT_VOCABULARY, wait_s=60)) as ahead:
        assert ahead.take(sources[0], other) is None  # read with other kernels: not these reads
        assert ahead.take(sources[1], DEFAULT_VOCABULARY) is None  # never read ahead


@pytest.fixture
def blocked(tmp_path: Path) -> tuple[Path, list[RankSource]]:
    """Sources whose first file is a FIFO: the read-ahead process blocks in its read until the
    test writes to it (or ends the process), so which reads have begun is known."""
    fifo = tmp_path / "slow.json"
    os.mkfifo(fifo)
    files = sorted(DLRM.glob("*.json"))
    sources = [RankSource([(0, fifo)], 0)] + [
        RankSource([(0, f)], i + 1) for i, f in enumerate(files[:4])
    ]
    return fifo, sources


def _read_ahead_pid(ahead: ReadAhead) -> int:
    """The forked process' pid (the pool's only worker)."""
    procs = ahead._pool._processes  # type: ignore[union-attr]
    assert procs is not None and len(procs) == 1
    return next(iter(procs))


def test_a_read_not_begun_is_cancelled_and_done_here(
    blocked: tuple[Path, list[RankSource]],
) -> None:
    fifo, sources = blocked
    before = set(multiprocessing.active_children())
    with contextlib.closing(ReadAhead(sources, DEFAULT_VOCABULARY, wait_s=60)) as ahead:
        # the process reads the FIFO (blocked) with one more call queued: the last is not begun
        assert ahead.take(sources[-1], DEFAULT_VOCABULARY) is None
        text = sources[1].files[0][1].read_bytes()  # a DLRM trace, through the FIFO
        feeder = threading.Thread(target=fifo.write_bytes, args=(text,))
        feeder.start()
        got = ahead.take(sources[0], DEFAULT_VOCABULARY)
        feeder.join(30)
        assert got is not None and got.columns is not None and not got.problems
        assert len(got.columns["ts"]) > 0
        assert ahead.taken == 1
    _no_children_left(before)


def test_a_read_ahead_process_that_died_leaves_the_reads_here(
    blocked: tuple[Path, list[RankSource]],
) -> None:
    _, sources = blocked
    before = set(multiprocessing.active_children())
    with contextlib.closing(ReadAhead(sources, DEFAULT_VOCABULARY, wait_s=60)) as ahead:
        os.kill(_read_ahead_pid(ahead), signal.SIGKILL)  # as the out-of-memory killer would
        assert ahead.take(sources[0], DEFAULT_VOCABULARY) is None
        assert ahead.take(sources[1], DEFAULT_VOCABULARY) is None  # closed: all read here
    _no_children_left(before)


def test_a_read_taking_too_long_is_ended(blocked: tuple[Path, list[RankSource]]) -> None:
    _, sources = blocked
    before = set(multiprocessing.active_children())
    ahead = ReadAhead(sources, DEFAULT_VOCABULARY, wait_s=0.5)
    pid = _read_ahead_pid(ahead)
    assert ahead.take(sources[0], DEFAULT_VOCABULARY) is None  # blocked past wait_s
    _no_children_left(before)  # ended at once, not at close
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    ahead.close()  # closing again is harmless


def _merge(folder: Path, out: Path, *flags: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "rankscope", "merge", str(folder), "-o", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_a_merge_that_reads_ahead_writes_the_same_store(tmp_path: Path) -> None:
    """``rankscope merge`` of DLRM plus an unreadable trace and one without events: the store
    (events, lanes, collectives, clocks, steps, problems) equals a one-process merge's."""
    folder = tmp_path / "job"
    shutil.copytree(DLRM, folder)
    (folder / "worker8_step_12.pt.trace.json").write_text('{"traceEvents": [}')
    (folder / "worker9_step_12.pt.trace.json").write_text('{"traceEvents": []}')
    err = _merge(folder, tmp_path / "ahead.h5")
    assert ("its reads begun by a process forked at start-up" in err) == (scheduler.cores() >= 2), (
        err
    )
    plain = _merge(folder, tmp_path / "here.h5", "--scheduler", "synchronous")
    assert "forked" not in plain
    assert same_store(tmp_path / "ahead.h5", tmp_path / "here.h5") == list(range(8))


def test_merge_is_due_without_opening_a_store(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    shutil.copytree(DLRM, folder)
    assert merge_is_due(folder)
    _merge(folder, folder / "trace.h5", "--quiet")
    assert not merge_is_due(folder)
    trace = next(folder.glob("*.json"))
    os.utime(trace, (trace.stat().st_atime, (folder / "trace.h5").stat().st_mtime + 10))
    assert merge_is_due(folder)
    single = tmp_path / "one.json"
    shutil.copy(trace, single)
    assert merge_is_due(single)
    assert not merge_is_due(tmp_path / "absent")
    assert not merge_is_due(folder / "trace.h5")


def test_analyze_reads_ahead_only_when_it_merges(tmp_path: Path) -> None:
    """``rankscope analyze FOLDER``: a folder without its store is merged with the reads begun
    at start-up; analysed again, its store is up to date and nothing is read ahead."""
    folder = tmp_path / "job"
    shutil.copytree(DLRM, folder)

    def analyze() -> str:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "rankscope",
                "analyze",
                str(folder),
                "--json",
                str(tmp_path / "s.json"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (tmp_path / "s.json").exists()
        return proc.stderr

    first = analyze()
    assert "merge: in-process" in first
    # the rule: a second core to read on (one core: read here, as before)
    assert ("its reads begun by a process forked at start-up" in first) == (
        scheduler.cores() >= 2
    ), first
    again = analyze()
    assert "merge:" not in again and "forked at start-up" not in again
