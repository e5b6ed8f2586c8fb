"""Bad input: every readable rank is still merged, each problem is recorded and printed."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from rankscope.analysis.store.reader import open_store
from rankscope.orchestrator.cli import main as cli

DATA = Path(__file__).parent / "data" / "cpu_gloo_4rank_straggler"


def _good(folder: Path) -> None:
    """Ranks 0 and 1: real, valid traces."""
    for r in (0, 1):
        shutil.copy2(DATA / f"rank{r}.step5.pt.trace.json", folder / f"rank{r}.step5.pt.trace.json")


def _truncated_gzip(folder: Path) -> Path:
    data = gzip.compress((DATA / "rank2.step5.pt.trace.json").read_bytes())
    path = folder / "rank2.json.gz"
    path.write_bytes(data[: len(data) // 2])
    return path


def _invalid_json(folder: Path) -> Path:
    path = folder / "rank2.step5.pt.trace.json"
    path.write_bytes((DATA / "rank2.step5.pt.trace.json").read_bytes()[:-5000])
    return path


def _empty(folder: Path) -> Path:
    path = folder / "rank2.json"
    path.write_bytes(b"")
    return path


def _not_a_trace(folder: Path) -> Path:
    path = folder / "rank2.results.json"
    path.write_text(json.dumps({"loss": [0.5, 0.4], "rank": 2}))
    return path


def _duplicate_rank(folder: Path) -> Path:
    """A second file claiming rank 1 (distributedInfo says 1): the first by name wins."""
    path = folder / "rank9-copy.json"  # the name says 9, distributedInfo says 1 (it wins)
    shutil.copy2(DATA / "rank1.step5.pt.trace.json", path)
    return path


def _other_job(folder: Path) -> Path:
    doc = json.loads((DATA / "rank2.step5.pt.trace.json").read_text())
    doc["distributedInfo"]["world_size"] = 16
    path = folder / "rank2.step5.pt.trace.json"
    path.write_text(json.dumps(doc))
    return path


def _other_job_by_time(folder: Path) -> Path:
    """Same world size but recorded days later: not the same job."""
    doc = json.loads((DATA / "rank2.step5.pt.trace.json").read_text())
    doc["baseTimeNanoseconds"] += 3 * 86400 * 10**9
    path = folder / "rank2.step5.pt.trace.json"
    path.write_text(json.dumps(doc))
    return path


def _bad_durations(folder: Path) -> Path:
    doc = json.loads((DATA / "rank2.step5.pt.trace.json").read_text())
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    xs[3]["dur"] = -1.0
    xs[4]["dur"] = float("nan")
    path = folder / "rank2.step5.pt.trace.json"
    path.write_text(json.dumps(doc))
    return path


CASES: dict[str, tuple[Callable[[Path], Path], str, list[int]]] = {
    # name: (make the bad file, words of the problem, ranks merged)
    "truncated-gzip": (_truncated_gzip, "truncated or corrupt gzip", [0, 1]),
    "invalid-json": (_invalid_json, "invalid JSON", [0, 1]),
    "empty-file": (_empty, "empty file", [0, 1]),
    "not-a-trace": (_not_a_trace, "not a Kineto trace", [0, 1]),
    "duplicate-rank": (_duplicate_rank, "rank 1 also claimed by", [0, 1]),
    "other-job-world-size": (_other_job, "another job: world size 16", [0, 1]),
    "other-job-time": (_other_job_by_time, "another job: recorded 72 h apart", [0, 1]),
    "bad-durations": (
        _bad_durations,
        "2 events with negative, NaN or missing durations",
        [0, 1, 2],
    ),
}


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_file_is_reported_and_other_ranks_kept(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make, words, ranks = CASES[case]
    inputs = tmp_path / "in"
    inputs.mkdir()
    _good(inputs)
    bad = make(inputs)
    before = _digest(inputs)
    out = tmp_path / "trace.h5"
    rc = cli(["merge", str(inputs), "-o", str(out), "--scheduler", "synchronous"])
    assert rc == 0, "some ranks merged: success"
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if str(bad) in line and words in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    with open_store(out) as store:
        assert store.ranks == ranks
        problems = store.problems()
        mine = problems[problems["file"] == str(bad)]
        assert len(mine) == 1 and words in mine["problem"].iloc[0]
    assert _digest(inputs) == before, "input files are never modified or deleted"
    # --strict: the same input fails (the store is still written for inspection).
    assert (
        cli(["merge", str(inputs), "-o", str(out), "--scheduler", "synchronous", "-q", "--strict"])
        == 1
    )


def test_missing_ranks_are_one_problem(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    _good(inputs)
    shutil.copy2(DATA / "rank3.step5.pt.trace.json", inputs / "rank3.json")
    out = tmp_path / "trace.h5"
    assert cli(["merge", str(inputs), "-o", str(out), "--scheduler", "synchronous", "-q"]) == 0
    with open_store(out) as store:
        assert store.ranks == [0, 1, 3]
        assert store.world_size == 4
        (problem,) = store.problems()["problem"]
        assert problem == "1 of 4 rank(s) missing (no trace): 2"


def test_nothing_mergeable_fails_without_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    _empty(inputs)
    _not_a_trace(inputs)
    out = tmp_path / "trace.h5"
    rc = cli(["merge", str(inputs), "-o", str(out), "--scheduler", "synchronous"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "no rank could be merged" in err.splitlines()[-1]
    assert "Traceback" not in err
    assert not out.exists()
    assert not list(tmp_path.glob(".trace.h5.*")) or all(
        p.name.endswith(".lock") for p in tmp_path.glob(".trace.h5.*")
    )


def test_folder_without_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    rc = cli(["merge", str(tmp_path), "--scheduler", "synchronous"])
    assert rc == 1
    assert "no Kineto trace files" in capsys.readouterr().err


def test_nonexistent_path_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope" / "rank0.json"
    rc = cli(["merge", str(DATA), str(missing), "-o", str(tmp_path / "t.h5")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rankscope merge: error: {missing}: no such file or directory"]
    assert not (tmp_path / "t.h5").exists()


def test_meta_json_beside_traces_is_not_a_problem(tmp_path: Path) -> None:
    """The recording script's rankN.meta.json files are skipped by name, not reported."""
    out = tmp_path / "trace.h5"
    assert (
        cli(["merge", str(DATA), "-o", str(out), "--scheduler", "synchronous", "-q", "--strict"])
        == 0
    )


def test_run_directory_with_a_truncated_window_keeps_the_rest(tmp_path: Path) -> None:
    """A rank killed while writing window 1: its window 0 and every other rank are merged."""
    from test_merge import make_run_dir

    run = make_run_dir(tmp_path, DATA)
    bad = run / "ranks" / "00001" / "window-001.json.gz"
    bad.write_bytes(bad.read_bytes()[:-3000])
    assert cli(["merge", str(run), "--scheduler", "synchronous", "-q"]) == 0
    with open_store(run) as store:
        assert store.ranks == [0, 1, 2, 3]
        assert set(store.events(1)["window"].unique()) == {0}
        assert set(store.events(2)["window"].unique()) == {0, 1}
        problems = store.problems()
        assert problems["file"].tolist() == [str(bad)]
        assert "gzip" in problems["problem"].iloc[0]


def test_other_json_without_a_trace_name_is_skipped(tmp_path: Path) -> None:
    """JSON found in a folder that is neither named nor shaped like a trace is not an input."""
    inputs = tmp_path / "in"
    (inputs / "cfg").mkdir(parents=True)
    _good(inputs)
    (inputs / "results.json").write_text(json.dumps({"loss": [0.5, 0.4]}))
    (inputs / "cfg" / "config.json.gz").write_bytes(gzip.compress(b'{"lr": 0.1}'))
    (inputs / "notes.json").write_bytes(b"")
    out = tmp_path / "trace.h5"
    rc = cli(["merge", str(inputs), "-o", str(out), "--scheduler", "synchronous", "-q", "--strict"])
    assert rc == 1, "only the missing ranks 2 and 3 are a problem"
    with open_store(out) as store:
        assert store.ranks == [0, 1]
        (problem,) = store.problems()["problem"]
        assert problem.startswith("2 of 4 rank(s) missing")


def test_unnamed_trace_is_found_by_its_content(tmp_path: Path) -> None:
    """A trace whose name says nothing (no rank, no .pt.trace) is still taken: its head says so."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    _good(inputs)
    shutil.copy2(DATA / "rank2.step5.pt.trace.json", inputs / "profile.json")
    out = tmp_path / "trace.h5"
    assert cli(["merge", str(inputs), "-o", str(out), "--scheduler", "synchronous", "-q"]) == 0
    with open_store(out) as store:
        assert store.ranks == [0, 1, 2]


def test_duplicate_claims_do_not_depend_on_the_order_results_arrive_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three files claim rank 1 (and a bad file beside them): worker processes hand the parsed
    files over as they finish, so every order of arrival must give the same store problems —
    each claimant left out named with the file kept (the first by name), never with a claimant
    that merely came first — and the same problems table as the in-process merge."""
    import itertools

    from rankscope.analysis.engine import scheduler

    inputs = tmp_path / "in"
    inputs.mkdir()
    _good(inputs)
    for name in ("rank9-copy.json", "rank7-copy.json"):  # distributedInfo says 1 in both
        shutil.copy2(DATA / "rank1.step5.pt.trace.json", inputs / name)
    _invalid_json(inputs)
    real = scheduler.run_each
    tables = []
    for order in itertools.permutations(range(5)):

        def permuted(func, calls, spec, n, _order=order):  # type: ignore[no-untyped-def]
            results = list(real(func, calls, spec, n))
            picked = range(len(results)) if len(results) != len(_order) else _order
            return (results[i] for i in picked)  # a generator: the merge closes it

        monkeypatch.setattr(scheduler, "run_each", permuted)
        out = tmp_path / f"{len(tables)}.h5"
        assert cli(["merge", str(inputs), "-o", str(out), "--scheduler", "synchronous", "-q"]) == 0
        with open_store(out) as store:
            tables.append(store.problems())
        out.unlink()
        if len(tables) >= 24:  # every position of the three claimants and the bad file
            break
    first = tables[0]
    claims = first[first["problem"].str.contains("also claimed")]
    assert sorted(claims["file"].map(lambda f: Path(f).name)) == [
        "rank7-copy.json",
        "rank9-copy.json",
    ]
    assert all(p.endswith(f"also claimed by {inputs / 'rank1.step5.pt.trace.json'}; ignored")
               for p in claims["problem"])  # fmt: skip
    for table in tables[1:]:
        import pandas as pd

        pd.testing.assert_frame_equal(table, first)
