"""Slow links between hosts (analysis/compute/links.py): which host pairs are named, on instance tables
whose truth is known — one pair the groups isolate, pairs the groups cannot tell apart, pairs
explained away by a more specific one, noise — and the what-if's factors."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from rankscope.analysis.compute.links import INSTANCE_COLUMNS, link_fix_factors, link_table
from rankscope.analysis.conclude.findings import FindingKind, _link_findings

MS = 1_000_000


def _instances(spec: list[tuple[str, int, tuple[str, ...], float, int]]) -> pd.DataFrame:
    """(op, members, hosts, transfer ms, how many) → an instance table (INSTANCE_COLUMNS)."""
    rows = []
    for op, members, hosts, ms, n in spec:
        for _ in range(n):
            rows.append((len(rows), op, 1 << 20, members, len(hosts), hosts, int(ms * MS)))
    return pd.DataFrame(rows, columns=list(INSTANCE_COLUMNS))


def _named(table: pd.DataFrame) -> list[list[tuple[str, str]]]:
    slow = table[table["is_slow"]]
    return [
        sorted(zip(g["host_a"], g["host_b"], strict=True))
        for _, g in slow.groupby("group", sort=True)
    ]


class _Holder:
    """What ``findings._link_findings`` reads of an analysis."""

    def __init__(self, links: pd.DataFrame) -> None:
        self.links = links


#: Data-parallel groups of 2 hosts each: 0-1 slow (x4), the others healthy.
TWO_HOST_GROUPS = [
    ("allreduce", 8, ("h0", "h1"), 4.0, 6),
    ("allreduce", 8, ("h2", "h3"), 1.0, 6),
    ("allreduce", 8, ("h0", "h2"), 1.0, 6),
    ("allreduce", 8, ("h1", "h3"), 1.0, 6),
]
#: Groups of 4 hosts: the one holding hosts 0-3 slow.
FOUR_HOST_GROUPS = [
    ("reducescatter", 16, ("h0", "h1", "h2", "h3"), 4.0, 6),
    ("reducescatter", 16, ("h4", "h5", "h6", "h7"), 1.0, 6),
]


def test_the_pair_the_groups_isolate_is_named_alone() -> None:
    table = link_table(_instances(TWO_HOST_GROUPS))
    assert _named(table) == [[("h0", "h1")]]
    row = table.iloc[0]
    assert (row["host_a"], row["host_b"]) == ("h0", "h1")
    assert row["slowdown"] == pytest.approx(4.0) and row["instances"] == 6
    assert row["transfer_ms"] == pytest.approx(4.0) and row["typical_ms"] == pytest.approx(1.0)
    assert row["extra_s"] == pytest.approx(6 * 3.0e-3)
    (f,) = _link_findings(_Holder(table))  # type: ignore[arg-type]
    assert f.kind == FindingKind.SLOW_LINK and f.headline == "Slow link: h0 ↔ h1"
    assert f.cause == "link" and f.figures["pairs"] == 1 and "cannot tell" not in f.evidence


def test_pairs_the_groups_cannot_tell_apart_are_named_together() -> None:
    """Every transfer crossing 0-1 also spans 0-2, 0-3, 1-2, 1-3 and 2-3: the six pairs are one
    finding naming the four hosts, and it says the pair cannot be told."""
    table = link_table(_instances(FOUR_HOST_GROUPS))
    expected = sorted(itertools.combinations(("h0", "h1", "h2", "h3"), 2))
    assert _named(table) == [expected]
    (f,) = _link_findings(_Holder(table))  # type: ignore[arg-type]
    assert f.headline == "Slow link among h0, h1, h2, h3" and f.figures["pairs"] == 6
    assert "cannot tell" in f.evidence


def test_a_more_specific_pair_explains_the_wider_groups_away() -> None:
    """The 4-host groups are slow too, but the 2-host groups isolate 0-1: only 0-1 is named."""
    table = link_table(_instances(TWO_HOST_GROUPS + FOUR_HOST_GROUPS))
    assert _named(table) == [[("h0", "h1")]]
    wide = table.set_index(["host_a", "host_b"]).loc[("h2", "h3")]
    assert not wide["is_slow"] and wide["group"] == -1


def test_noise_names_nothing() -> None:
    """Healthy links: every transfer 1 ms ± 3 % (lognormal), 30 per host set."""
    rng = np.random.default_rng(7)
    spec = [(op, m, hs, 1.0, 1) for op, m, hs, _, _ in TWO_HOST_GROUPS + FOUR_HOST_GROUPS]
    inst = _instances([s for s in spec for _ in range(30)])
    inst["transfer_ns"] = (inst["transfer_ns"] * rng.lognormal(0, 0.03, len(inst))).astype(int)
    table = link_table(inst)
    assert len(table) and not table["is_slow"].any()
    assert table["slowdown"].between(0.9, 1.1).all()


def test_nothing_to_compare_says_nothing() -> None:
    """Two hosts: every cross-host transfer crosses the one pair; nothing to compare with."""
    inst = _instances([("allreduce", 8, ("h0", "h1"), 4.0, 6), ("allreduce", 8, ("h0",), 1, 6)])
    assert link_table(inst).empty


def test_the_what_if_brings_the_slow_pairs_transfers_to_their_peers() -> None:
    inst = _instances(TWO_HOST_GROUPS)
    factors = link_fix_factors(inst, link_table(inst))
    slow = set(inst.loc[inst["hosts"] == ("h0", "h1"), "coll"])
    assert set(factors) == slow and all(f == pytest.approx(0.25) for f in factors.values())


def test_instance_transfers_equal_a_plain_groupby() -> None:
    """The vectorised host sets and transfers against a plain pandas groupby on 2,000 random
    instances (1 to 6 members on 16 ranks over 4 hosts; singletons left out)."""
    from rankscope.analysis.compute.links import instance_transfers

    rng = np.random.default_rng(3)
    rows = []
    for coll in range(2000):
        ranks = rng.choice(16, size=int(rng.integers(1, 7)), replace=False)
        for r in ranks:
            start = int(rng.integers(0, 10_000))
            rows.append((coll, "allreduce", 64, int(r), start, start + int(rng.integers(0, 5_000))))
    colls = pd.DataFrame(rows, columns=["coll", "op", "bytes", "rank", "start", "end"])
    hosts = {r: f"host{r // 4}" for r in range(16)}
    got = instance_transfers(colls, hosts).set_index("coll")
    g = colls.assign(host=colls["rank"].map(hosts)).groupby("coll")
    want = pd.DataFrame(
        {
            "members": g.size(),
            "hosts": g["host"].agg(lambda h: tuple(sorted(set(h)))),
            "transfer_ns": (g["end"].max() - g["start"].max()).clip(lower=0),
        }
    )
    want = want[want["members"] >= 2]
    assert list(got.index) == list(want.index)
    assert got["hosts"].tolist() == want["hosts"].tolist()
    assert (got["n_hosts"] == want["hosts"].map(len)).all()
    assert (got["transfer_ns"] == want["transfer_ns"]).all()
    assert (got["members"] == want["members"]).all()
