"""Hostile input: a gzip bomb, foreign and hostile stores, and the fuzzers' regression inputs.

docs/reliability.md ("Bad input", "Foreign and hostile stores") lists what the user sees for
each; docs/security.md the promise that nothing outside a store is read.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from rankscope.analysis.store import schema
from rankscope.analysis.store.reader import open_store
from rankscope.errors import InputFileError
from rankscope.orchestrator.cli import main as cli
from rankscope.orchestrator.ingest import kineto_json
from rankscope.orchestrator.ingest.decode import read_trace
from rankscope.orchestrator.ingest.kineto_json import TraceReadError
from rankscope.orchestrator.ingest.merge import merge_run_dir

DATA = Path(__file__).parent / "data"
STRAGGLER = DATA / "cpu_gloo_4rank_straggler"
WINDOW = DATA / "cpu_gloo_4rank_pipeline" / "ranks" / "00000" / "window-000.json.gz"


# -- gzip bomb ------------------------------------------------------------------------------------


#: Size of the bomb, expanded: 4x the most a trace of its compressed size may expand to
#: (kineto_json.GZIP_FREE_BYTES = 64 MiB), so a reader that decompressed it whole would exceed the
#: test's memory bound; more only costs time (1 GiB took 18 s to write per test).
BOMB_BYTES = 4 * kineto_json.GZIP_FREE_BYTES


def _gzip_bomb(path: Path, expanded: int = BOMB_BYTES) -> None:
    """``expanded`` bytes of zeros gzipped (~1 MiB per GiB), streamed: never held in memory."""
    comp = zlib.compressobj(9, zlib.DEFLATED, kineto_json.GZIP_WBITS)
    zeros = bytes(1 << 20)
    with path.open("wb") as fh:
        fh.write(comp.compress(b'{"traceEvents": [' + b" " * 100))
        for _ in range(expanded >> 20):
            fh.write(comp.compress(zeros))
        fh.write(comp.flush())


def test_gzip_bomb_is_refused_with_bounded_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "rank0.json.gz"
    _gzip_bomb(bomb)
    assert bomb.stat().st_size < 2 << 20
    limit = max(kineto_json.GZIP_FREE_BYTES, kineto_json.GZIP_MAX_RATIO * bomb.stat().st_size)
    assert 3 * limit < BOMB_BYTES  # a reader that expanded it whole would fail the bound below
    tracemalloc.start()
    try:
        with pytest.raises(TraceReadError, match="gzip bomb"):
            read_trace(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * limit, f"peak {peak >> 20} MiB for a limit of {limit >> 20} MiB"


def test_gzip_bomb_among_ranks_is_one_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy2(STRAGGLER / "rank0.step5.pt.trace.json", tmp_path)
    _gzip_bomb(tmp_path / "rank1.json.gz")
    assert cli(["merge", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "rank1.json.gz: refused: the gzip expands" in captured.out + captured.err
    with open_store(tmp_path / "trace.h5") as store:
        assert store.ranks == [0]
        assert store.problems()["problem"].str.contains("gzip bomb").any()


def test_a_real_trace_is_far_below_the_gzip_ratio() -> None:
    ratio = len(gzip.decompress(WINDOW.read_bytes())) / WINDOW.stat().st_size
    assert ratio < kineto_json.GZIP_MAX_RATIO / 4


# -- regression inputs found by tests/test_fuzz.py -------------------------------------------------


@pytest.mark.parametrize("where", ["top", "args"])
def test_regression_deeply_nested_json_is_a_problem_not_a_recursion_error(
    tmp_path: Path, where: str
) -> None:
    """Found by test_fuzz_trace_reader_deep_nesting: msgspec raised RecursionError."""
    deep = b"[" * 100_000 + b"]" * 100_000
    text = gzip.decompress(WINDOW.read_bytes())
    cut = text.find(b'"traceEvents"')
    if where == "top":
        text = text[:cut] + b'"junk": ' + deep + b",\n" + text[cut:]
    else:
        text = text.replace(b'"args": {', b'"args": {"deep": ' + deep + b", ", 1)
    path = tmp_path / "w.json"
    path.write_bytes(text)
    with pytest.raises(TraceReadError, match="nested too deeply"):
        read_trace(path)


def _mutated(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    doc = json.loads((STRAGGLER / "rank0.step5.pt.trace.json").read_text())
    mutate(doc)
    path = tmp_path / "rank0.step5.pt.trace.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


def _first_x(doc: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in doc["traceEvents"] if e.get("ph") == "X")


def test_regression_base_time_out_of_int64_is_a_problem(tmp_path: Path) -> None:
    """Was OverflowError (np.int64(base))."""
    path = _mutated(tmp_path, lambda d: d.__setitem__("baseTimeNanoseconds", 2**64))
    with pytest.raises(TraceReadError, match="baseTimeNanoseconds out of range"):
        read_trace(path)


@pytest.mark.parametrize("field", ["ts", "dur"])
@pytest.mark.parametrize("value", [1e308, -1e308, 2**70])
def test_regression_stamps_out_of_range_are_dropped_and_counted(
    tmp_path: Path, field: str, value: float
) -> None:
    """Was OverflowError (exact decoding) or silently wrapped int64 stamps."""
    if field == "dur" and value < 0:
        value = -value
    path = _mutated(tmp_path, lambda d: _first_x(d).__setitem__(field, value))
    trace = read_trace(path)
    assert trace.dropped == {"events with timestamps out of range": 1}


def test_regression_correlation_out_of_int64_is_unknown(tmp_path: Path) -> None:
    """Was OverflowError (np.fromiter into int64)."""
    path = _mutated(
        tmp_path, lambda d: _first_x(d).setdefault("args", {}).__setitem__("correlation", 2**70)
    )
    assert len(read_trace(path).columns["corr"])


@pytest.mark.parametrize("key", ["rank", "world_size"])
def test_regression_huge_rank_or_world_size_is_a_problem_with_bounded_memory(
    tmp_path: Path, key: str
) -> None:
    """rank 2**70 made the merge list 2**70 missing ranks (killed for memory); a world size of
    2**70 crashed the store writer (no HDF5 type for the int)."""
    _mutated(tmp_path, lambda d: d["distributedInfo"].__setitem__(key, 2**70))
    shutil.copy2(STRAGGLER / "rank1.step5.pt.trace.json", tmp_path)
    out = merge_run_dir(tmp_path, quiet=True, scheduler="synchronous")
    with open_store(out) as store:
        assert 1 in store.ranks and store.world_size <= 4


def test_regression_rank_beyond_max_ranks_in_a_name(tmp_path: Path) -> None:
    shutil.copy2(STRAGGLER / "rank1.step5.pt.trace.json", tmp_path)
    doc = json.loads((STRAGGLER / "rank0.step5.pt.trace.json").read_text())
    del doc["distributedInfo"]
    (tmp_path / f"rank{2**70}.json").write_text(json.dumps(doc))
    out = merge_run_dir(tmp_path, quiet=True, scheduler="synchronous", rank_from=r"rank(\d+)")
    with open_store(out) as store:
        assert store.problems()["problem"].str.contains("out of range").any()


# -- foreign and hostile stores --------------------------------------------------------------------


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("good")
    for trace in sorted((DATA / "param_dlrm_8rank").glob("worker[01]_*.json")):
        shutil.copy2(trace, folder)  # enough events per rank for chunked, compressed columns
    return merge_run_dir(folder, quiet=True, scheduler="synchronous")


def _copy(store_path: Path, tmp_path: Path) -> Path:
    out = tmp_path / "trace.h5"
    shutil.copy2(store_path, out)
    return out


def _refused(path: Path, match: str) -> str:
    with pytest.raises(InputFileError, match=match) as info, open_store(path) as store:
        for r in store.ranks:
            store.events(r)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_foreign_hdf5_file_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(10))
    _refused(path, "not a rankscope store")


def test_a_store_from_a_newer_rankscope_says_so(store_path: Path, tmp_path: Path) -> None:
    path = _copy(store_path, tmp_path)
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = schema.SCHEMA_VERSION + 1
    _refused(path, "written by a newer rankscope .*upgrade rankscope")


def test_a_store_with_a_nonsense_schema_version(store_path: Path, tmp_path: Path) -> None:
    path = _copy(store_path, tmp_path)
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = "one"
    _refused(path, "not a rankscope store")


def test_bytes_flipped_inside_a_compressed_dataset(store_path: Path, tmp_path: Path) -> None:
    path = _copy(store_path, tmp_path)
    with h5py.File(path, "r") as f:
        ds = f["ranks/00000/events/ts"]
        assert ds.compression == "gzip", "the test needs a compressed (chunked) column"
        info = ds.id.get_chunk_info(0)
    with path.open("r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        block = bytearray(fh.read(64))
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes(b ^ 0x5A for b in block))
    message = _refused(path, "damaged store .*merge the run again")
    assert str(path) in message


def test_a_truncated_store(store_path: Path, tmp_path: Path) -> None:
    path = _copy(store_path, tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    _refused(path, "damaged store|not a readable HDF5 store")


def test_damage_is_one_line_in_the_cli(
    store_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _copy(store_path, tmp_path)
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = schema.SCHEMA_VERSION + 1
    assert cli(["analyze", str(path)]) == 1
    err = capsys.readouterr().err
    assert "written by a newer rankscope" in err
    assert "Traceback" not in err


def _outside(tmp_path: Path) -> Path:
    """A file outside the store that a hostile store points at; reading it would be a breach."""
    secret = tmp_path / "outside" / "secret.h5"
    secret.parent.mkdir()
    with h5py.File(secret, "w") as f:
        f.create_dataset("ts", data=np.arange(100, dtype=np.int64))
    return secret


def test_an_external_link_is_refused_without_being_followed(
    store_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _copy(store_path, tmp_path)
    secret = _outside(tmp_path)
    with h5py.File(path, "r+") as f:
        del f["ranks/00000/events/ts"]
        f["ranks/00000/events/ts"] = h5py.ExternalLink(str(secret), "/ts")
    opened: list[str] = []
    real = h5py.File.__init__

    def spy(self: h5py.File, name: object, *args: object, **kwargs: object) -> None:
        if isinstance(name, str | Path):
            opened.append(str(name))
        real(self, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(h5py.File, "__init__", spy)
    _refused(path, "external link")
    assert opened == [str(path)]
    secret.unlink()  # HDF5 would have opened it through the link: it is never needed
    _refused(path, "external link")


def test_a_store_merged_here_is_not_walked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge's own output (``rankscope analyze FOLDER`` analyses the store it merged): this
    process wrote it, hard links and plain datasets only, so opening it walks nothing."""
    from rankscope.analysis.store import hdf5_links

    walks: list[Path] = []
    real = hdf5_links.refuse_outside_references

    def spy(path: Path, root: h5py.Group) -> None:
        walks.append(path)
        real(path, root)

    monkeypatch.setattr(hdf5_links, "refuse_outside_references", spy)
    folder = tmp_path / "run"
    folder.mkdir()
    for trace in sorted((DATA / "param_dlrm_8rank").glob("worker[01]_*.json")):
        shutil.copy2(trace, folder)
    out = merge_run_dir(folder, quiet=True, scheduler="synchronous")
    with open_store(out) as store:
        assert store.ranks == [0, 1]
    assert walks == []
    # the same bytes copied by someone else: another file, walked
    other = tmp_path / "copy.h5"
    shutil.copy2(out, other)
    with open_store(other):
        pass
    assert walks == [other]


def test_a_store_changed_after_its_merge_here_is_walked(tmp_path: Path) -> None:
    """Written here, then edited (an external link put in): another version of the file (its
    size or modification time differ; set one second later here so that a coarse clock cannot
    hide it), refused as any other."""
    import os

    folder = tmp_path / "run"
    folder.mkdir()
    for trace in sorted((DATA / "param_dlrm_8rank").glob("worker[01]_*.json")):
        shutil.copy2(trace, folder)
    out = merge_run_dir(folder, quiet=True, scheduler="synchronous")
    before = out.stat()
    secret = _outside(tmp_path)
    with h5py.File(out, "r+") as f:
        del f["ranks/00000/events/ts"]
        f["ranks/00000/events/ts"] = h5py.ExternalLink(str(secret), "/ts")
    os.utime(out, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    _refused(out, "external link")


def test_a_virtual_dataset_is_refused(store_path: Path, tmp_path: Path) -> None:
    path = _copy(store_path, tmp_path)
    secret = _outside(tmp_path)
    layout = h5py.VirtualLayout(shape=(100,), dtype=np.int64)
    layout[:] = h5py.VirtualSource(str(secret), "ts", shape=(100,))
    with h5py.File(path, "r+") as f:
        del f["ranks/00000/events/ts"]
        f["ranks/00000/events"].create_virtual_dataset("ts", layout)
    _refused(path, "virtual dataset")


def test_external_raw_storage_is_refused(store_path: Path, tmp_path: Path) -> None:
    path = _copy(store_path, tmp_path)
    raw = tmp_path / "outside.bin"
    raw.write_bytes(bytes(800))
    with h5py.File(path, "r+") as f:
        del f["strings"]
        f.create_dataset("strings", shape=(100,), dtype=np.int64, external=[(str(raw), 0, 800)])
    _refused(path, "external file")


def test_a_soft_link_is_refused(store_path: Path, tmp_path: Path) -> None:
    path = _copy(store_path, tmp_path)
    with h5py.File(path, "r+") as f:
        f["ranks/00000/loop"] = h5py.SoftLink("/ranks")
    _refused(path, "SoftLink")


def test_groups_nested_too_deep_are_refused(store_path: Path, tmp_path: Path) -> None:
    """Nesting past MAX_GROUP_DEPTH is refused without walking it to its end."""
    from rankscope.analysis.store.hdf5_links import MAX_GROUP_DEPTH

    path = _copy(store_path, tmp_path)
    with h5py.File(path, "r+") as f:
        f.create_group("/".join(["deep"] * (MAX_GROUP_DEPTH + 2)))
    _refused(path, "nested too deep")


def test_a_group_hard_linked_into_itself_is_refused_not_walked_forever(
    store_path: Path, tmp_path: Path
) -> None:
    """A hard link makes a cycle (each link is a hard one): the walk stops at the depth bound."""
    path = _copy(store_path, tmp_path)
    with h5py.File(path, "r+") as f:
        f["ranks/00000/again"] = f["ranks"]
    _refused(path, "nested too deep")


def test_the_fast_walk_suspects_what_the_naming_walk_refuses(
    store_path: Path, tmp_path: Path
) -> None:
    """hdf5_links._suspect (HDF5's C walk) is the gate: a clean store passes it, and each store
    the naming walk refuses is suspect to it (else it would be opened unchecked)."""
    from rankscope.analysis.store import hdf5_links

    with h5py.File(store_path, "r") as f:
        assert not hdf5_links._suspect(f)
        hdf5_links._refuse(store_path, f)  # clean: no refusal
    secret = _outside(tmp_path)
    edits = {
        "external link": lambda f: f.__setitem__("x", h5py.ExternalLink(str(secret), "/ts")),
        "soft link": lambda f: f.__setitem__("ranks/00000/s", h5py.SoftLink("/ranks")),
        "external raw": lambda f: f.create_dataset(
            "raw", shape=(4,), dtype=np.int64, external=[(str(tmp_path / "r.bin"), 0, 32)]
        ),
        "deep": lambda f: f.create_group("/".join(["d"] * (hdf5_links.MAX_GROUP_DEPTH + 1))),
    }
    for what, edit in edits.items():
        path = tmp_path / f"{what.replace(' ', '_')}.h5"
        shutil.copy2(store_path, path)
        with h5py.File(path, "r+") as f:
            edit(f)
        with h5py.File(path, "r") as f:
            assert hdf5_links._suspect(f), what
            with pytest.raises(InputFileError):
                hdf5_links._refuse(path, f)
