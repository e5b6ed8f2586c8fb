"""The merge's cross-rank tables in numpy (``matching.match``, ``matching.renumber``,
``clock.count_violations``, ``matching.shared_rows``) give what their pandas forms gave, kept here
as the reference (issue 31: a merge whose clocks need no fit imports no pandas), on random
tables built to hit the ties, the collectives without ``Seq``, the keys seen twice and the
empty cases, and on the comm tables of real merges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rankscope.analysis.store.schema import P2P_OPS
from rankscope.orchestrator.ingest import clock, matching
from rankscope.orchestrator.ingest.comm_links import RANK_COMM_COLUMNS
from rankscope.orchestrator.ingest.matching import MATCHED_COLUMNS, match, rank_keys, renumber

DATA = Path(__file__).parent / "data"


def reference_match(per_rank: dict[int, pd.DataFrame]) -> pd.DataFrame:
    """``matching.match`` as pandas built it before issue 31's thirteenth pass."""
    frames = []
    for rank, comm in sorted(per_rank.items()):
        if comm.empty:
            continue
        f = comm.loc[:, list(RANK_COMM_COLUMNS)].copy()
        f["key"] = rank_keys(comm, rank)
        f["rank"] = np.int32(rank)
        frames.append(f)
    columns = list(MATCHED_COLUMNS)
    if not frames:
        return pd.DataFrame({c: [] for c in columns})
    allc = pd.concat(frames, ignore_index=True)
    allc = allc.drop_duplicates(["key", "rank"], keep="first")
    first = allc.groupby("key")["start"].min().sort_values(kind="stable")
    ids = pd.Series(np.arange(len(first), dtype=np.int64), index=first.index)
    allc["coll"] = ids.loc[allc["key"]].to_numpy()
    no_seq = allc.groupby("coll")["seq"].transform("max") < 0
    if no_seq.any():
        per_coll = (
            allc.loc[no_seq].groupby("coll").agg(group=("group", "first"), op=("op", "first"))
        )
        per_coll = per_coll.sort_index()
        per_coll["order"] = per_coll.groupby(["group", "op"]).cumcount()
        allc.loc[no_seq, "seq"] = per_coll["order"].loc[allc.loc[no_seq, "coll"]].to_numpy()
    else:
        allc["seq"] = allc.groupby("coll")["seq"].transform("max")
    allc["bytes"] = allc.groupby("coll")["bytes"].transform("max")
    return allc.loc[:, columns].sort_values(["coll", "rank"], kind="stable").reset_index(drop=True)


def reference_renumber(colls: pd.DataFrame) -> pd.DataFrame:
    if colls.empty:
        return colls
    first = colls.groupby("coll")["start"].min().sort_values(kind="stable")
    mapping = pd.Series(np.arange(len(first), dtype=np.int64), index=first.index)
    out = colls.copy()
    out["coll"] = mapping.loc[out["coll"]].to_numpy()
    return out.sort_values(["coll", "rank"], kind="stable").reset_index(drop=True)


def reference_violations(colls: pd.DataFrame) -> dict[int, int]:
    if colls.empty:
        return {}
    c = colls[["coll", "rank", "start", "end"]]
    last_start = c.groupby("coll")["start"].transform("max")
    bad = c["end"] < last_start
    return {int(r): int(v) for r, v in bad.groupby(c["rank"]).sum().items()}


def reference_shared(colls: pd.DataFrame, ops: Any, exactly: bool) -> pd.DataFrame:
    rows = colls[colls["op"].isin(ops)] if not colls.empty else colls
    if rows.empty:
        return rows
    n = rows.groupby("coll")["rank"].transform("nunique")
    return rows[n == 2] if exactly else rows[n >= 2]


def _same_table(got: dict[str, np.ndarray], want: pd.DataFrame) -> None:
    """Columns, order and values equal (the store keeps the schema's dtypes: values decide)."""
    assert list(got) == list(want.columns)
    for c in got:
        assert len(got[c]) == len(want), c
        assert np.asarray(got[c]).tolist() == want[c].tolist(), c


def _random_ranks(rng: np.random.Generator) -> dict[int, dict[str, np.ndarray]]:
    """Per rank, a comm table as ``rank_columns._comm_table`` makes one: keys that meet across
    ranks (few groups, seqs and steps), ties on start, some ops without ``Seq``, duplicates."""
    ops = np.array(["send", "recv", "allreduce", "broadcast", "allgather"], dtype=object)
    out = {}
    for rank in rng.choice(8, int(rng.integers(0, 5)), replace=False).tolist():
        n = int(rng.integers(0, 25))
        no_seq = rng.random() < 0.5
        out[rank] = {
            "event": np.arange(n, dtype=np.int64),
            "op": rng.choice(ops, n),
            "group": np.array(rng.choice(["0", "1", "stream#0"], n), dtype=object),
            "seq": np.full(n, -1, np.int64) if no_seq else rng.integers(-1, 4, n).astype(np.int64),
            "bytes": rng.integers(-1, 100, n).astype(np.int64),
            "step": rng.integers(-1, 2, n).astype(np.int32),
            "start": rng.integers(0, 6, n).astype(np.int64),
            "end": rng.integers(6, 12, n).astype(np.int64),
            "gpu": rng.random(n) < 0.5,
            "peer": rng.integers(-1, 8, n).astype(np.int64),
        }
    return out


def test_match_and_renumber_equal_their_pandas_form_on_random_tables() -> None:
    rng = np.random.default_rng(13)
    matched = 0
    for _ in range(400):
        per_rank = _random_ranks(rng)
        got = match(per_rank)
        want = reference_match({r: pd.DataFrame(c) for r, c in per_rank.items()})
        _same_table(got, want)
        matched += len(want)
        moved = dict(got, start=got["start"] + rng.integers(-3, 4, len(got["start"])))
        _same_table(renumber(moved), reference_renumber(pd.DataFrame(moved)))
    assert matched > 1000


def test_violations_and_shared_rows_equal_their_pandas_form() -> None:
    rng = np.random.default_rng(14)
    for _ in range(300):
        colls = match(_random_ranks(rng))
        frame = pd.DataFrame(colls)
        assert clock.count_violations(colls) == reference_violations(frame)
        for ops, exactly in ((matching.SYNCHRONIZING_OPS, False), (P2P_OPS, True)):
            mask = matching.shared_rows(colls, ops, 2, exactly=exactly)
            want = reference_shared(frame, ops, exactly)
            assert np.flatnonzero(mask).tolist() == want.index.tolist()


@pytest.mark.parametrize(
    "job", ["cpu_gloo_4rank_pipeline", "param_dlrm_8rank", "deepep_nvshmem_8rank"]
)
def test_match_of_real_merges(job: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks' comm tables as the merge hands them to ``match``: its table equals the
    pandas form's, and the merge's clock fit sees the same rows."""
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    seen: list[tuple[dict[int, Any], dict[str, np.ndarray]]] = []
    real = matching.match

    def capture(per_rank: dict[int, dict[str, np.ndarray]]) -> Any:
        out = real(per_rank)
        seen.append((per_rank, out))
        return out

    monkeypatch.setattr(matching, "match", capture)
    merge_run_dir(DATA / job, output=tmp_path / "t.h5", scheduler="synchronous", quiet=True)
    ((per_rank, got),) = seen
    assert len(got["coll"]) > 0
    _same_table(got, reference_match({r: pd.DataFrame(c) for r, c in per_rank.items()}))
