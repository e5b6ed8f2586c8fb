"""One file holding several ranks (a merged trace) is split into its ranks, or refused.

The data (tests/data/merged_traces, made by its make.py) are the real 4-rank gloo run of
tests/data/cpu_gloo_4rank_straggler — rank 2 sleeps 20 ms per step — merged into one file the way
TraceLens's merge tool writes it (``args.rank``, pids offset by rank x 10^8), the way Composer's
trace merger writes it (a JSON array, pid = rank, ``global_rank`` metadata), and concatenated by
hand (nothing tells the ranks apart: refused). The merged files must give the verdicts of the
per-rank files: the same ranks, the same straggler, the same number of matched collectives.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parent / "data"
MERGED = DATA / "merged_traces"


def _verdicts(store: Path) -> tuple[list[int], list[int], int]:
    """(ranks, straggler ranks, matched collectives) of a store, analysed in-process."""
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze
    from rankscope.analysis.store.reader import open_store

    with open_store(store) as s:
        ranks = list(s.ranks)
        n_coll = int(s.collectives()["coll"].nunique())
    a = analyze(store, ClusterSpec(scheduler=SYNCHRONOUS))
    return ranks, a.straggler_ranks(), n_coll


def _merge(src: Path, out: Path) -> Path:
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    return merge_run_dir(src, output=out, scheduler="synchronous", quiet=True)


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[int], list[int], int]:
    """The verdicts of the four per-rank files (the truth the merged files must give)."""
    out = tmp_path_factory.mktemp("per_rank") / "trace.h5"
    got = _verdicts(_merge(DATA / "cpu_gloo_4rank_straggler", out))
    assert got == ([0, 1, 2, 3], [2], 3)  # what the data are known to hold
    return got


def _write(path: Path, doc: Any) -> Path:
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def _load(name: str) -> Any:
    return json.loads(gzip.decompress((MERGED / name).read_bytes()))


@pytest.mark.parametrize("name", ["tracelens_4rank.json.gz", "composer_4rank.json.gz"])
def test_a_merged_file_gives_the_verdicts_of_the_per_rank_files(
    name: str, per_rank: tuple[list[int], list[int], int], tmp_path: Path
) -> None:
    assert _verdicts(_merge(MERGED / name, tmp_path / "trace.h5")) == per_rank
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.h5"]  # no part left behind


def test_pid_blocks_alone_tell_the_ranks_apart(
    per_rank: tuple[list[int], list[int], int], tmp_path: Path
) -> None:
    """TraceLens's file without its args.rank: the pid offsets of 10^8 still tell the ranks."""
    doc = _load("tracelens_4rank.json.gz")
    for ev in doc["traceEvents"]:
        ev["args"].pop("rank")
    src = _write(tmp_path / "blocks.json.gz", doc)
    assert _verdicts(_merge(src, tmp_path / "trace.h5")) == per_rank


def test_process_names_tell_the_ranks_apart(
    per_rank: tuple[list[int], list[int], int], tmp_path: Path
) -> None:
    """The hand-merged file (each rank's own OS pid) with each process named "rank N"."""
    doc = _load("handmerged_4rank.json.gz")
    pids = {}
    for rank in range(4):
        trace = json.loads(
            (DATA / "cpu_gloo_4rank_straggler" / f"rank{rank}.step5.pt.trace.json").read_text()
        )
        pid = next(ev["pid"] for ev in trace["traceEvents"] if ev.get("name") == "process_name")
        pids[pid] = rank
    assert len(pids) == 4
    for ev in doc["traceEvents"]:
        if ev.get("name") == "process_name" and ev["pid"] in pids:
            ev["args"]["name"] = f"rank {pids[ev['pid']]}"
    src = _write(tmp_path / "named.json.gz", doc)
    assert _verdicts(_merge(src, tmp_path / "trace.h5")) == per_rank


def rankscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankscope", *args], capture_output=True, text=True, timeout=300
    )


def test_analyze_says_how_the_ranks_were_told_apart(tmp_path: Path) -> None:
    src = tmp_path / "merged.json.gz"
    shutil.copy(MERGED / "tracelens_4rank.json.gz", src)
    res = rankscope("analyze", str(src), "--json", str(tmp_path / "s.json"))
    assert res.returncode == 0, res.stderr
    assert "merged.json.gz holds 4 ranks (told apart by args.rank)" in res.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1, 2, 3]
    # several ranks: the sections comparing them are all there (tests/test_single_rank.py: one)
    assert summary["sections"] == ["clock", "collectives", "rank_spread", "stragglers"]
    assert [s["rank"] for s in summary["stragglers"]] == [2] and summary["collectives"][
        "count"
    ] == 3


def test_several_ranks_nothing_tells_apart_are_refused_in_one_line(tmp_path: Path) -> None:
    src = tmp_path / "merged.json.gz"
    shutil.copy(MERGED / "handmerged_4rank.json.gz", src)
    res = rankscope("analyze", str(src))
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert str(src) in lines[0] and "ProfilerStep#2 recorded 4 times" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged.json.gz"]  # nothing left


def test_a_one_rank_file_is_read_once(tmp_path: Path) -> None:
    """The one file of a merge is decoded once when it shows no sign of several ranks
    (multirank.block_signs): through a named pipe, which only one reader can drain, the merge
    still gets the rank (a check that read the file before the parse left the parse nothing)."""
    import os
    import threading

    text = (DATA / "cpu_gloo_4rank_straggler" / "rank0.step5.pt.trace.json").read_bytes()
    pipe = tmp_path / "rank0.json"
    os.mkfifo(pipe)

    def feed() -> None:
        with pipe.open("wb") as w:  # waits for the merge to open the pipe
            w.write(text)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    out = tmp_path / "trace.h5"
    code = (
        "import sys; from pathlib import Path; "
        "from rankscope.orchestrator.ingest.merge import merge_run_dir; "
        "merge_run_dir(Path(sys.argv[1]), output=Path(sys.argv[2]), scheduler='synchronous', "
        "quiet=True)"
    )
    try:
        res = subprocess.run(
            [sys.executable, "-c", code, str(pipe), str(out)],
            capture_output=True,
            text=True,
            timeout=120,  # a second read waits for a writer that never comes
        )
    finally:
        if writer.is_alive():  # never opened: let the writer's open return
            os.close(os.open(pipe, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=30)
    assert res.returncode == 0, res.stderr
    from rankscope.analysis.store.reader import open_store

    with open_store(out) as store:
        assert store.ranks == [0]
        assert len(store.events(0)) > 0
