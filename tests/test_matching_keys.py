"""``matching.rank_keys`` (one Python pass) gives the keys of its plain pandas form: string
columns joined with ``+`` and ``groupby(...).cumcount()`` in time order, kept here as the
reference, on the comm tables of real merges and on random tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rankscope.analysis.store.schema import P2P_OPS
from rankscope.orchestrator.ingest import matching
from rankscope.orchestrator.ingest.matching import UNKNOWN_PEER_PREFIX, rank_keys

DATA = Path(__file__).parent / "data"


def reference_keys(comm: pd.DataFrame, rank: int) -> pd.Series:
    """The keys as pandas column operations build them (rank_keys' form before issue 31)."""
    if comm.empty:
        return pd.Series([], dtype=object)
    frame = comm.sort_values("start", kind="stable")
    keys = pd.Series(index=frame.index, dtype=object)
    p2p = frame["op"].isin(P2P_OPS)
    if p2p.any():
        sub = frame[p2p]
        peer = sub["peer"].to_numpy(np.int64)
        sending = (sub["op"] == "send").to_numpy()
        src = np.where(sending, rank, peer).astype(str)
        dst = np.where(sending, peer, rank).astype(str)
        pair = pd.Series(np.char.add(np.char.add(src, ">"), dst), index=sub.index)
        known = pd.Series(peer >= 0, index=sub.index)
        k = sub.groupby([pair, sub["step"]], sort=False).cumcount().astype(str)
        step = sub["step"].astype(str)
        keys[p2p] = np.where(
            known,
            "p2p|" + pair + "|p=" + step + "|k=" + k,
            f"{UNKNOWN_PEER_PREFIX}r={rank}|o=" + sub["op"] + "|p=" + step + "|k=" + k,
        )
        frame = frame[~p2p]
    has_seq = frame["seq"] >= 0
    keys.loc[frame.index[has_seq]] = (
        "g=" + frame.loc[has_seq, "group"] + "|s=" + frame.loc[has_seq, "seq"].astype(str)
    )
    rest = frame[~has_seq]
    if not rest.empty:
        k = rest.groupby(["group", "op", "step"], sort=False).cumcount()
        keys.loc[rest.index] = (
            "g=" + rest["group"] + "|o=" + rest["op"] + "|p=" + rest["step"].astype(str)
            + "|k=" + k.astype(str)
        )  # fmt: skip
    return keys.reindex(comm.index)


def _same(comm: pd.DataFrame, rank: int) -> None:
    _same_keys(rank_keys(comm, rank), comm, rank)


def _same_keys(got: np.ndarray, comm: pd.DataFrame, rank: int) -> None:
    want = reference_keys(comm, rank)
    assert got.dtype == object and len(got) == len(want)
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize(
    "job",
    ["cpu_gloo_4rank_pipeline", "param_dlrm_8rank", "deepep_nvshmem_8rank", "cpu_gloo_4rank_skew"],
)
def test_keys_of_real_merges(job: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank's comm table as the merge hands it to ``match`` (send / recv with and
    without ``Seq``, collectives with ``Seq``, gloo ops without)."""
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    seen: list[dict[int, pd.DataFrame]] = []
    real = matching.match

    def capture(per_rank: dict[int, dict[str, np.ndarray]]) -> Any:
        seen.append({r: pd.DataFrame(c) for r, c in per_rank.items()})
        return real(per_rank)

    monkeypatch.setattr(matching, "match", capture)
    merge_run_dir(DATA / job, output=tmp_path / "t.h5", scheduler="synchronous", quiet=True)
    (per_rank,) = seen
    assert sum(len(c) for c in per_rank.values()) > 0
    for rank, comm in per_rank.items():
        _same(comm, rank)
        _same_keys(rank_keys({c: comm[c].to_numpy() for c in comm}, rank), comm, rank)


def test_keys_of_random_tables() -> None:
    """Ties on start, unknown peers, steps outside the profiled ones (-1), several groups, ops
    with and without ``Seq``; text columns as objects and as pandas' ``str``."""
    rng = np.random.default_rng(31)
    ops = np.array(["send", "recv", "allreduce", "broadcast", "allgather"], dtype=object)
    for trial in range(300):
        n = int(rng.integers(0, 60))
        comm = pd.DataFrame(
            {
                "event": np.arange(n, dtype=np.int64),
                "op": rng.choice(ops, n),
                "group": np.array(rng.choice(["0", "1", "stream#0", "gloo"], n), dtype=object),
                "seq": np.where(rng.random(n) < 0.5, -1, rng.integers(0, 5, n)).astype(np.int64),
                "bytes": rng.integers(-1, 100, n).astype(np.int64),
                "step": rng.integers(-1, 3, n).astype(np.int32),
                "start": rng.integers(0, 8, n).astype(np.int64),  # many ties
                "end": rng.integers(8, 16, n).astype(np.int64),
                "gpu": rng.random(n) < 0.5,
                "peer": rng.integers(-1, 4, n).astype(np.int64),
            },
            index=pd.RangeIndex(n) if trial % 2 else pd.Index(rng.permutation(n) * 7),
        )
        comm = comm.astype({"op": object, "group": object})  # as the merge holds them
        assert comm["op"].dtype == object and comm["group"].dtype == object
        assert comm["op"].notna().all() and comm["group"].notna().all()
        rank = int(rng.integers(0, 4))
        _same(comm, rank)
        if n:
            text = comm.astype({"op": "str", "group": "str"})
            _same(text, rank)
