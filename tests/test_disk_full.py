"""Write paths on a real small file system: a full disk, a read-only one (docs/reliability.md).

Each test mounts its own tmpfs of a given size (root only; skipped otherwise) and unmounts it in
teardown. What every fault must look like: ONE line naming the file and the cause, a non-zero
exit, the previous good file untouched, no temporary file left, no crash; and the training job
never harmed by a profiling write.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from needs import unavailable
from rankscope.errors import OutputError

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
#: A small run folder (4 ranks, ~100 KB of traces): a previous good store.
SMALL = DATA / "cpu_gloo_4rank_pipeline"
#: A larger one (8 ranks, ~7 MB): more than the small file systems hold.
LARGE = DATA / "param_dlrm_8rank"

Mount = Callable[[int], Path]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Mount]:
    """``mount(size_bytes)`` → a fresh tmpfs of that size (unmounted in teardown)."""
    if os.geteuid() != 0:
        unavailable("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        done = _run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)])
        if done.returncode != 0:
            unavailable(f"cannot mount a tmpfs: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        if _run(["umount", str(where)]).returncode != 0:
            _run(["umount", "-l", str(where)])


def _read_only(where: Path) -> None:
    done = _run(["mount", "-o", "remount,ro", str(where)])
    assert done.returncode == 0, done.stderr


def _fill(where: Path) -> None:
    """Fill the file system to the last byte."""
    with (where / "filler").open("wb", buffering=0) as fh:
        try:
            while fh.write(b"\0" * 4096):
                pass
        except OSError:
            pass


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listing(where: Path) -> list[str]:
    return sorted(str(p.relative_to(where)) for p in where.rglob("*"))


def _rankscope(*args: str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "rankscope.orchestrator.cli", *map(str, args)])


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ": error: " in line]


def _assert_one_line(done: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 1, no traceback, exactly one error line holding ``words``; returns it."""
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = _error_lines(done.stderr)
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# ----------------------------------------------------------------------- atomic output


def test_atomic_write_disk_full_keeps_previous_file(tiny_fs: Mount) -> None:
    from rankscope.launchers import rundir

    fs = tiny_fs(64 * 1024)
    target = fs / "run.json"
    rundir.write_json_atomic(target, {"state": "running"})
    before = target.read_bytes()
    with pytest.raises(OutputError) as info:
        rundir.write_bytes_atomic(target, b"x" * (1 << 20))
    message = str(info.value)
    assert message == (
        f"{target}: cannot write (no space left on device); the previous run.json is untouched"
    )
    assert isinstance(info.value, OSError)  # the runtime's `except OSError` still holds
    assert target.read_bytes() == before
    assert _listing(fs) == ["run.json"]


def test_atomic_write_read_only(tiny_fs: Mount) -> None:
    from rankscope.launchers import rundir

    fs = tiny_fs(64 * 1024)
    target = fs / "summary.json"
    rundir.write_json_atomic(target, {"a": 1})
    _read_only(fs)
    with pytest.raises(OutputError, match=r"summary\.json: cannot write \(read-only file system\)"):
        rundir.write_json_atomic(target, {"a": 2})
    assert rundir.read_json(target) == {"a": 1}


def test_atomic_write_honours_umask(tiny_fs: Mount) -> None:
    from rankscope.launchers import rundir

    fs = tiny_fs(64 * 1024)
    old = os.umask(0o027)
    try:
        rundir.write_bytes_atomic(fs / "meta.json", b"{}")
    finally:
        os.umask(old)
    assert (fs / "meta.json").stat().st_mode & 0o777 == 0o640


def test_update_run_disk_full(tiny_fs: Mount) -> None:
    from rankscope.launchers import rundir

    fs = tiny_fs(64 * 1024)
    rundir.write_json_atomic(fs / rundir.RUN_JSON, {"state": "running"})
    before = (fs / rundir.RUN_JSON).read_bytes()
    _fill(fs)
    with pytest.raises(OutputError, match=r"run\.json: cannot write \(no space left on device\)"):
        rundir.update_run(fs, state="completed", failures=[{"error": "x" * 8192}])
    assert (fs / rundir.RUN_JSON).read_bytes() == before
    assert _listing(fs) == ["filler", "run.json"]


# ----------------------------------------------------------------------- the store


STORE_SCRIPT = """
import sys
import numpy as np, pandas as pd
from pathlib import Path
from rankscope.analysis.store import schema
from rankscope.analysis.store.reader import StoreWriter
from rankscope.errors import OutputError

tmp, target = Path(sys.argv[1]), Path(sys.argv[2])
rng = np.random.default_rng(0)
lanes = pd.DataFrame({c: [] for c in schema.LANE_COLUMNS})
try:
    with StoreWriter(tmp, attrs={"run_id": "x"}, target=target) as w:
        for rank in range(8):
            events = {c: rng.integers(0, 1000, 100_000) for c in schema.EVENT_COLUMNS}
            w.intern(["a"])
            w.write_rank(rank, events, lanes, {})
except OutputError as exc:
    print(exc)
    tmp.unlink()
"""


def test_store_writer_disk_full_no_crash(tiny_fs: Mount) -> None:
    """HDF5 on a full disk: one error from the first failed write, a clean close, no SIGSEGV
    (h5py 3.x crashed closing a file whose writes had failed, after hundreds of tracebacks)."""
    fs = tiny_fs(100 * 1024)
    done = _run([sys.executable, "-c", STORE_SCRIPT, str(fs / ".t.tmp"), str(fs / "trace.h5")])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""
    assert done.stdout.strip() == (
        f"{fs / 'trace.h5'}: cannot write (no space left on device); nothing was written"
    )
    assert _listing(fs) == []


#: Ranks with string lanes written into each of several small file systems until one fills,
#: with the freed heap full of a non-zero pattern (what stale memory looks like to HDF5).
FILLING_SCRIPT = """
import sys
import numpy as np, pandas as pd
from pathlib import Path
from rankscope.analysis.store.writer import StoreWriter
from rankscope.errors import OutputError

pattern = np.full(4096, 0xB300000001, dtype=np.int64)
def stale_heap():
    keep = []
    for n in (64, 256, 1024, 4096, 16384):
        for _ in range(100):
            keep.append(np.tile(pattern, n // 4096 + 1)[:n].copy())
            keep.append(pattern[: n // 8 + 1].tobytes())
    del keep
n = 3000
events = {c: np.arange(n, dtype=np.int64) for c in ("ts", "dur", "corr", "coll")}
events.update({c: np.zeros(n, np.int32) for c in ("name", "cat", "lane", "step")})
events.update(kind=np.zeros(n, np.int8), window=np.zeros(n, np.int16))
lanes = pd.DataFrame({"lane": np.arange(60, dtype=np.int32), "kind": np.zeros(60, np.int8),
                      "pid": [f"pid {i}" for i in range(60)], "tid": [f"tid {i}" for i in range(60)],
                      "name": [f"thread name number {i} of the rank" for i in range(60)]})
for where in map(Path, sys.argv[1:]):
    stale_heap()
    try:
        with StoreWriter(where / "s.h5", attrs={"run_id": "x"}) as w:
            for r in range(400):
                stale_heap()
                w.write_rank(r, dict(events, ts=events["ts"] * (r + 1)), lanes, {})
        print("fitted")
    except OutputError as exc:
        print(exc)
"""


def test_a_store_filling_the_disk_never_crashes(tiny_fs: Mount) -> None:
    """Ranks written until the disk is full, on 40 file systems of 100-139 KiB: each ends in
    the one disk-full line, none in a crash. Before HDF5 read back its own writes after a failed
    one (``_GuardedFile``'s pages), it read stale bytes as string heap references and freed a
    garbage pointer (SIGSEGV in ``H5T__conv_vlen``; here at the sixth size)."""
    mounts = [tiny_fs(k * 1024) for k in range(100, 140)]
    done = _run([sys.executable, "-c", FILLING_SCRIPT, *map(str, mounts)])
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    lines = done.stdout.splitlines()
    assert len(lines) == len(mounts)
    for where, line in zip(mounts, lines, strict=True):
        assert line == (
            f"{where / 's.h5'}: cannot write (no space left on device); "
            "the previous s.h5 is untouched"
        )


def test_after_a_failed_write_hdf5_reads_back_what_it_wrote(tiny_fs: Mount) -> None:
    """The guarded file after a failed write: nothing more reaches the disk, and every read
    returns what was written last at that place (a write that failed halfway whole), the
    disk's bytes elsewhere, zeros where nothing was ever written."""
    import errno

    from rankscope.analysis.store.writer import _GuardedFile

    fs = tiny_fs(64 * 1024)
    f = _GuardedFile(fs / "x.h5")
    try:
        first = bytes(range(256)) * 16  # 4 KiB that reach the disk
        assert f.write(first) == len(first) and f.error is None
        _fill(fs)
        half = b"H" * 10_000  # fails: the disk is full
        assert f.write(half) == len(half)
        assert f.error is not None and f.error.errno == errno.ENOSPC
        f.seek(20_000)
        late = b"L" * 70_000  # spans pages
        f.write(late)
        f.seek(1000)
        f.write(b"patch")
        assert f.tell() == 1005
        assert f.seek(0, os.SEEK_END) == 90_000

        def read(at: int, n: int) -> bytes:
            f.seek(at)
            buffer = bytearray(n)
            assert f.readinto(buffer) == n
            return bytes(buffer)

        assert read(0, 4096) == first[:1000] + b"patch" + first[1005:]
        assert read(4096, 10_000) == half
        assert read(14_096, 5904) == bytes(5904)  # never written
        assert read(20_000, 70_000) == late
        assert read(89_990, 20) == late[-10:] + bytes(10)
        assert os.path.getsize(fs / "x.h5") <= 4096 + 10_000  # nothing after the failure
    finally:
        f.close()


def _small_store(fs: Path) -> str:
    """Merge the small run into ``fs/trace.h5`` (a previous good store); its digest."""
    done = _rankscope("merge", SMALL, "-o", fs / "trace.h5", "-q")
    assert done.returncode == 0, done.stderr
    return _digest(fs / "trace.h5")


def test_merge_disk_full_while_parking_ranks(tiny_fs: Mount) -> None:
    fs = tiny_fs(400 * 1024)
    previous = _small_store(fs)
    done = _rankscope("merge", LARGE, "-o", fs / "trace.h5")
    line = _assert_one_line(done, "no space left on device", "while parking the parsed ranks")
    assert line.startswith(f"rankscope merge: error: {fs / 'trace.h5'}: cannot write (")
    assert line.endswith("the previous trace.h5 is untouched")
    assert _listing(fs) == ["trace.h5"]
    assert _digest(fs / "trace.h5") == previous


def test_merge_disk_full_while_writing_store(tiny_fs: Mount, capsys: pytest.CaptureFixture[str]):
    """The store itself meets the full disk (the parked ranks fitted): find such a size by
    bisection between one too small to park the ranks and one that holds the whole merge."""
    from rankscope.orchestrator.cli import main

    def attempt(size_k: int) -> tuple[int, str, Path]:
        fs = tiny_fs(size_k * 1024)
        code = main(["merge", str(LARGE), "-o", str(fs / "trace.h5"), "-q"])
        err = capsys.readouterr().err
        listing = _listing(fs)
        assert listing == (["trace.h5"] if code == 0 else []), (size_k, listing, err)
        if code:
            assert code == 1 and len(err.strip().splitlines()) == 1, err
            assert "no space left on device" in err, err
        return code, err, fs

    lo, hi = 300, 1600  # KiB: parking fails / everything fits
    assert attempt(lo)[0] == 1 and attempt(hi)[0] == 0
    found = None
    while hi - lo > 4:
        mid = (lo + hi) // 2
        code, err, fs = attempt(mid)
        if code == 0:
            hi = mid
        elif "parking" in err:
            lo = mid
        else:
            found = mid
            break
    assert found is not None, f"no size between {lo} and {hi} KiB fails in the store"
    # the same, as a user sees it (the CLI, its exit status, a previous store beside)
    done = _rankscope("merge", LARGE, "-o", fs / "trace.h5")
    _assert_one_line(done, f"{fs / 'trace.h5'}: cannot write (no space left on device)")
    assert "parking" not in done.stderr
    assert _listing(fs) == []


def test_merge_read_only_keeps_previous_store(tiny_fs: Mount) -> None:
    fs = tiny_fs(1024 * 1024)
    previous = _small_store(fs)
    _read_only(fs)
    done = _rankscope("merge", SMALL, "-o", fs / "trace.h5")
    _assert_one_line(done, f"{fs / 'trace.h5'}: cannot write (read-only file system")
    assert _digest(fs / "trace.h5") == previous


def test_a_trace_in_a_read_only_folder_gets_its_store_in_the_cache(
    tiny_fs: Mount, tmp_path: Path
) -> None:
    """One trace on a read-only file system: its store goes to the user's cache (named after
    the trace and its path), where analyze and export find it again."""
    from rankscope.orchestrator.ingest.store_names import CACHE_SUBDIR

    fs = tiny_fs(1024 * 1024)
    trace = fs / "a.json.gz"
    shutil.copy2(DATA / "rankless" / "model_a.json.gz", trace)
    _read_only(fs)
    cache = tmp_path / "cache"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    cmd = [sys.executable, "-m", "rankscope.orchestrator.cli"]
    done = subprocess.run(
        [*cmd, "analyze", str(trace), "--scheduler", "synchronous"],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (store,) = (cache / CACHE_SUBDIR).glob("a-*.rankscope.h5")
    assert _listing(fs) == ["a.json.gz"]
    stamp = store.stat().st_mtime_ns
    done = subprocess.run(
        [*cmd, "export", str(trace), "--perfetto", str(tmp_path / "p.json")],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0 and f"using {store}" in done.stdout, done.stderr
    assert store.stat().st_mtime_ns == stamp


def test_export_disk_full(tiny_fs: Mount, tmp_path: Path) -> None:
    store = tmp_path / "trace.h5"
    assert _rankscope("merge", SMALL, "-o", store, "-q").returncode == 0
    fs = tiny_fs(32 * 1024)
    done = _rankscope("export", store, "--perfetto", fs / "trace.json")
    _assert_one_line(done, f"{fs / 'trace.json'}: cannot write (no space left on device)")
    assert _listing(fs) == []


# ----------------------------------------------------------------------- the ranks


def test_rank_meta_disk_full_warns_once(tiny_fs: Mount, capsys: pytest.CaptureFixture[str]):
    """meta.json on a full disk: one line per cause, never an exception into the training."""
    from rankscope.launchers.runtime import EXPORT_TMP_PREFIX, RankRuntime
    from rankscope.launchers.spec import ProfilerSettings

    fs = tiny_fs(64 * 1024)
    rt = RankRuntime(fs / "run", ProfilerSettings())
    rt.dir.mkdir(parents=True)
    rt.write_meta()
    before = (rt.dir / "meta.json").read_bytes()
    (rt.dir / f"{EXPORT_TMP_PREFIX}000.json.tmp").write_bytes(b"{")  # what Kineto leaves
    _fill(fs)
    rt.meta["steps"] = 6
    rt.meta["padding"] = "x" * 65536
    rt.write_meta()
    rt.write_meta()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"rankscope: rank 0: {rt.dir / 'meta.json'}: cannot write (no space left on device); "
        "the previous meta.json is untouched (training continues)"
    ]
    assert (rt.dir / "meta.json").read_bytes() == before
    rt._remove_exports()
    assert sorted(p.name for p in rt.dir.iterdir()) == ["meta.json"]


@pytest.mark.slow
def test_run_disk_full(tiny_fs: Mount) -> None:
    """`rankscope run` with its run folder on a 300 KB tmpfs: the training completes, the
    ranks say what they could not write, rankscope ends non-zero without a traceback, and no
    temporary file is left anywhere in the run folder."""
    fs = tiny_fs(300 * 1024)
    done = _run(
        [
            sys.executable,
            "-m",
            "rankscope.orchestrator.cli",
            "run",
            "--nproc-per-node",
            "2",
            "--out",
            str(fs),
            str(REPO / "examples" / "train_ddp.py"),
            "--steps",
            "6",
        ]
    )
    output = done.stdout + done.stderr
    assert "train_ddp: 6 steps" in output, output[-3000:]
    assert done.returncode != 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "SIGABRT" not in output and "SIGSEGV" not in output, output[-3000:]
    assert "no space left on device" in output, output[-3000:]
    # the end: run.json's own line, or the run's verdict that the profile is incomplete
    assert (
        "run.json: cannot write (no space left on device)" in done.stderr
        or "profiling output incomplete" in done.stdout
    ), output[-3000:]
    leftovers = [p for p in _listing(fs) if Path(p).name.startswith(".")]
    assert leftovers == [], leftovers


def test_a_seek_to_an_undefined_address_is_an_io_error(tmp_path: Path) -> None:
    """After a dropped write HDF5 can read garbage back and seek to 2**64 - 1 (a CI run where
    the disk filled mid-rank): that must be an OSError, which the writer turns into its one
    disk-full line, not an OverflowError escaping as a traceback."""
    from rankscope.analysis.store.writer import _GuardedFile

    f = _GuardedFile(tmp_path / "x.h5")
    try:
        with pytest.raises(OSError, match="seek to 18446744073709551615"):
            f.seek(2**64 - 1)
    finally:
        f.close()
