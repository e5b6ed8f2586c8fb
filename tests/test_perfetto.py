"""`rankscope export --perfetto`: a complete, exact, linked Chrome trace of a merged store."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from analysis_frames import merged
from rankscope.analysis.render.perfetto import export_perfetto, us_text
from rankscope.analysis.store.reader import open_store
from rankscope.analysis.views.timeline import step_window
from rankscope.orchestrator.cli import main as cli

SETS = ("cpu_gloo_4rank_straggler", "param_dlrm_8rank")


@pytest.fixture(scope="module")
def stores(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("perfetto")
    return {name: merged(data_dir, name, out) for name in SETS}


def _raw(path: Path) -> bytes:
    """The file's JSON bytes (decompressed when gzip)."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def _load(path: Path) -> dict[str, Any]:
    return json.loads(_raw(path), parse_float=Decimal)  # exact: no float rounding of epoch µs


def _export(store: Path, out: Path, *extra: str) -> dict[str, Any]:
    assert cli(["export", str(store), "--perfetto", str(out), *extra]) == 0
    return _load(out)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_every_event_once_with_exact_times(
    name: str, suffix: str, stores: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / f"merged{suffix}"
    trace = _export(stores[name], out)
    if suffix.endswith(".gz"):
        assert out.read_bytes()[:2] == b"\x1f\x8b", "gzip-compressed"
    assert list(tmp_path.iterdir()) == [out], "no temporary file left behind"
    events = trace["traceEvents"]
    with open_store(stores[name]) as store:
        by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            if e["ph"] == "X":
                by_pid[e["pid"]].append(e)
        assert sorted(by_pid) == store.ranks, "one process per rank"
        for rank in store.ranks:
            ev = store.events(rank)
            got = by_pid[rank]
            assert len(got) == len(ev), f"rank {rank}: every event exactly once"
            assert [e["ts"] for e in got] == [Decimal(int(t)) / 1000 for t in ev["ts"]]
            assert [e["dur"] for e in got] == [Decimal(int(d)) / 1000 for d in ev["dur"]]
            assert [e["tid"] for e in got] == [int(x) for x in ev["lane"]]
            assert [e["name"] for e in got] == [str(x) for x in ev["name"]]
        # the µs text keeps 3 decimals exactly
        raw = _raw(out).decode()
        first = store.events(store.ranks[0], columns=["ts"])["ts"].iloc[0]
        assert f'"ts":{int(first) // 1000}.{int(first) % 1000:03d}' in raw


def test_process_and_thread_metadata(stores: dict[str, Path], tmp_path: Path) -> None:
    trace = _export(stores["param_dlrm_8rank"], tmp_path / "t.json")
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    with open_store(stores["param_dlrm_8rank"]) as store:
        names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
        assert sorted(names) == store.ranks
        assert all(names[r].startswith(f"rank {r}") for r in store.ranks)
        assert Counter(e["pid"] for e in meta if e["name"] == "process_name") == dict.fromkeys(
            store.ranks, 1
        )
        for rank in store.ranks:
            threads = {
                e["tid"]: e["args"]["name"]
                for e in meta
                if e["name"] == "thread_name" and e["pid"] == rank
            }
            lanes = store.lanes(rank)
            assert threads == dict(zip(lanes["lane"].tolist(), lanes["name"].tolist(), strict=True))
        labels = {e["pid"]: e["args"]["labels"] for e in meta if e["name"] == "process_labels"}
        assert set(labels) == set(store.ranks) and "clock offset" in labels[1]
        clock = trace["otherData"]["clock_alignment"]
        ref = store.clock()
        assert [c["rank"] for c in clock] == ref["rank"].tolist()
        assert [c["offset_ns"] for c in clock] == ref["offset_ns"].tolist()
        assert [c["method"] for c in clock] == ref["method"].tolist()


@pytest.mark.parametrize("name", SETS)
def test_flows_link_each_collective_across_ranks(
    name: str, stores: dict[str, Path], tmp_path: Path
) -> None:
    trace = _export(stores[name], tmp_path / "t.json")
    events = trace["traceEvents"]
    slices = {
        (e["pid"], e["tid"], e["ts"]): e
        for e in events
        if e["ph"] == "X" and "collective" in e["args"]
    }
    flows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ph"] in ("s", "t", "f"):
            flows[e["id"]].append(e)
    with open_store(stores[name]) as store:
        colls = store.collectives()
        multi = colls.groupby("coll")["rank"].apply(set)
        multi = multi[multi.apply(len) >= 2]
        assert len(multi) > 0
        assert set(flows) == set(multi.index), "every multi-rank collective is linked"
        for coll, chain in flows.items():
            assert {e["pid"] for e in chain} == multi[coll], f"collective {coll}: all its ranks"
            phases = [e["ph"] for e in chain]
            assert phases[0] == "s" and phases[-1] == "f" and set(phases[1:-1]) <= {"t"}
            assert [e["ts"] for e in chain] == sorted(e["ts"] for e in chain)
            for e in chain:  # each flow point sits at the start of that rank's collective slice
                hit = slices.get((e["pid"], e["tid"], e["ts"]))
                assert hit is not None and hit["args"]["collective"] == coll
                assert "wait_us" in hit["args"] and "transfer_us" in hit["args"]


def test_collective_slices_carry_wait_and_transfer(stores: dict[str, Path], tmp_path: Path) -> None:
    from rankscope.analysis.compute.collectives import collective_waits

    trace = _export(stores["cpu_gloo_4rank_straggler"], tmp_path / "t.json")
    with open_store(stores["cpu_gloo_4rank_straggler"]) as store:
        waits = collective_waits(store.collectives(), store.clock())
    got = {
        (e["args"]["collective"], e["pid"]): (e["args"]["wait_us"], e["args"]["transfer_us"])
        for e in trace["traceEvents"]
        if e["ph"] == "X" and "wait_us" in e.get("args", {})
    }
    for r in waits.itertuples():
        assert got[(r.coll, r.rank)] == (
            Decimal(us_text(int(r.wait_ns))),
            Decimal(us_text(int(r.transfer_ns))),
        )


def test_ranks_and_step_window(stores: dict[str, Path], tmp_path: Path) -> None:
    path = stores["cpu_gloo_4rank_straggler"]
    trace = _export(path, tmp_path / "t.json.gz", "--ranks", "0,2", "--window-steps", "3:4")
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in x} == {0, 2}
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 2}
    with open_store(path) as store:
        window = step_window(store, 3, 4)
        for rank in (0, 2):
            want = store.events(rank, columns=["ts"], window=window)
            got = [e["ts"] for e in x if e["pid"] == rank]
            assert got == [Decimal(int(t)) / 1000 for t in want["ts"]]
            assert len(got) < len(store.events(rank, columns=["ts"]))
    flow_pids = {e["pid"] for e in trace["traceEvents"] if e["ph"] in "stf"}
    assert flow_pids <= {0, 2}


def test_api_accepts_a_path(stores: dict[str, Path], tmp_path: Path) -> None:
    stats = export_perfetto(stores["cpu_gloo_4rank_straggler"], tmp_path / "a.json")
    with open_store(stores["cpu_gloo_4rank_straggler"]) as store:
        assert stats.events == {r: len(store.events(r, columns=["ts"])) for r in store.ranks}
    assert stats.flows == 3 and stats.path == tmp_path / "a.json"


def _one_line_error(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    for word in words:
        assert word in err[0]


def test_missing_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.json"
    rc = cli(["export", str(tmp_path / "none.h5"), "--perfetto", str(out)])
    assert rc != 0
    _one_line_error(capsys, "none.h5")
    assert not out.exists()


def test_not_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.h5"
    bad.write_text("not hdf5")
    rc = cli(["export", str(bad), "--perfetto", str(tmp_path / "o.json")])
    assert rc != 0
    _one_line_error(capsys, "bad.h5")


def test_unwritable_output(
    stores: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = cli(
        ["export", str(stores["cpu_gloo_4rank_straggler"]), "--perfetto", str(blocker / "o.json")]
    )
    assert rc != 0
    _one_line_error(capsys, "o.json")
    rc = cli(["export", str(stores["cpu_gloo_4rank_straggler"]), "--perfetto", str(tmp_path)])
    assert rc != 0
    _one_line_error(capsys, "directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"], "nothing half-written"


@pytest.mark.parametrize(
    ("flag", "value", "word"),
    [
        ("--ranks", "0,9", "9"),
        ("--ranks", "a,b", "--ranks"),
        ("--window-steps", "7:2", "before"),
        ("--window-steps", "50", "steps"),
    ],
)
def test_bad_selection(
    flag: str,
    value: str,
    word: str,
    stores: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "o.json"
    rc = cli(
        ["export", str(stores["cpu_gloo_4rank_straggler"]), "--perfetto", str(out), flag, value]
    )
    assert rc == 2
    _one_line_error(capsys, word)
    assert not out.exists()


def test_existing_output_replaced_whole(stores: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    out.write_text("old")
    trace = _export(stores["cpu_gloo_4rank_straggler"], out)
    assert trace["traceEvents"]
    assert oct(out.stat().st_mode & 0o777) == oct(0o644)


def test_run_directory_is_merged_first(data_dir: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(data_dir / "cpu_gloo_4rank_skew", run)
    out = tmp_path / "merged.json.gz"
    trace = _export(run, out)
    assert (run / "trace.h5").exists(), "the run directory got its store"
    with open_store(run / "trace.h5") as store:
        x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        assert len(x) == sum(len(store.events(r, columns=["ts"])) for r in store.ranks)
