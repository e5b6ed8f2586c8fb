"""The clock graph's fits in numpy (``orchestrator/ingest/clock_graph.py``: which ranks leave
their host's clock, each collective's group ends, the end-agreement edges, the causality
intervals) give what their pandas forms gave, kept here as the reference (issue 31: a merge of
other tools' traces imports no pandas), on random jobs of several clock groups with shifted,
drifting and faked clocks, ties and collectives some groups miss."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from rankscope.orchestrator.ingest import clock_graph as cg
from rankscope.orchestrator.ingest.clock_graph import (
    ROOT,
    Edge,
    constraints,
    fit_line,
    intervals_from,
)


def ref_split_inconsistent(sync: pd.DataFrame, group_of: dict[int, int]) -> dict[int, int]:
    """Split off ranks that cannot share their group's clock: in their collectives with group
    mates one ends before another started (on their own raw clocks). Greedy: the rank in the
    most such collectives leaves first (a faked clock breaks causality with every mate), until
    no group has any; each leaver becomes a group of its own. Returns the new rank -> group."""
    out = dict(group_of)
    if sync.empty:
        return out
    base = sync[sync["rank"].isin(out)][["coll", "rank", "start", "end"]]
    next_id = max(out.values(), default=ROOT) + 1
    while True:
        s = base.assign(g=base["rank"].map(out))
        s = s[s["g"] != ROOT]
        if s.empty:
            return out
        key = [s["coll"], s["g"]]
        max_start = s.groupby(key)["start"].transform("max")
        min_end = s.groupby(key)["end"].transform("min")
        bad = s[(min_end < max_start) & ((s["end"] < max_start) | (s["start"] > min_end))]
        if bad.empty:
            return out
        out[int(bad["rank"].value_counts().idxmax())] = next_id
        next_id += 1


def ref_group_ends(sync: pd.DataFrame, group_of: dict[int, int], base: int) -> pd.DataFrame:
    """Per (collective, group): the median end (ns from ``base``, float) of its members, only
    for collectives spanning two groups or more."""
    e = sync[["coll", "rank", "end"]].copy()
    e["g"] = e["rank"].map(group_of)
    e = e.dropna(subset=["g"])
    e["g"] = e["g"].astype(np.int64)
    e["y"] = (e["end"] - base).astype(np.float64)
    y = e.groupby(["coll", "g"], sort=False)["y"].median().reset_index()
    return y[y.groupby("coll")["g"].transform("nunique") >= 2]


def ref_end_edges(ends: pd.DataFrame, rough: dict[int, float], t_ref: float) -> list[Edge]:
    """End-agreement edges from :func:`_group_ends`: each collective links its lowest group to
    each of its others; ``rough`` (ns) puts the hub's ends on the reference time for the drift
    fit (x = end + rough offset - ``t_ref``)."""
    if ends.empty:
        return []
    hub_g = ends.groupby("coll")["g"].transform("min")
    hub = ends[ends["g"] == hub_g].set_index("coll")["y"]
    rows = ends[ends["g"] != hub_g].copy()
    rows["a"] = hub_g[rows.index]
    y_hub = hub.loc[rows["coll"]].to_numpy(np.float64)
    rows["d"] = y_hub - rows["y"].to_numpy(np.float64)
    rows["x"] = y_hub + rows["a"].map(lambda g: rough.get(int(g), 0.0)).to_numpy() - t_ref
    out = []
    for (a, b), g in rows.groupby(["a", "g"]):
        c, slope, bound = fit_line(g["x"].to_numpy(np.float64), g["d"].to_numpy(np.float64))
        out.append(Edge(int(a), int(b), c, slope * 1e9, bound, len(g)))
    return out


def ref_causality_intervals(
    sync: pd.DataFrame,
    p2p: pd.DataFrame,
    group_of: dict[int, int],
    base: int,
    corr: dict[int, tuple[float, float]],
) -> dict[int, tuple[float, float]]:
    """``clock_graph.causality_intervals`` as pandas computed it (what it computes: its own
    docstring); the reductions per group are DataFrame group-bys here."""
    n = max(group_of.values(), default=ROOT) + 1
    if n < 2:
        return {}

    def reduced(frame: pd.DataFrame) -> pd.DataFrame:
        f = frame[["coll", "rank", "start", "end"]].copy()
        f["g"] = f["rank"].map(group_of)
        f = f.dropna(subset=["g"])
        g = f["g"].astype(np.int64).to_numpy()
        dr = np.array([corr.get(int(k), (0.0, 0.0))[0] for k in range(n)])[g]
        t0 = np.array([corr.get(int(k), (0.0, 0.0))[1] for k in range(n)])[g]
        for col in ("start", "end"):
            x = (f[col] - base).to_numpy(np.float64)
            f[col] = np.rint(x + dr * (x - t0)).astype(np.int64)
        f["g"] = g
        return f

    parts = []
    if not sync.empty:
        s = reduced(sync)
        red = s.groupby(["coll", "g"], sort=False).agg(start=("start", "max"), end=("end", "min"))
        red = red.reset_index().rename(columns={"g": "rank"})
        parts.append(red[red.groupby("coll")["rank"].transform("size") >= 2])
    groups = list(range(n))
    cols = pd.concat(parts) if parts else pd.DataFrame(columns=["coll", "rank", "start", "end"])
    w, inf = constraints(cols, groups)
    if not p2p.empty:
        p = reduced(p2p)
        p["op"] = p2p.loc[p.index, "op"].to_numpy()
        send = p[p["op"] == "send"].drop_duplicates("coll").set_index("coll")
        recv = p[p["op"] == "recv"].drop_duplicates("coll").set_index("coll")
        both = send.index.intersection(recv.index)
        gs = send.loc[both, "g"].to_numpy(np.int64)
        gr = recv.loc[both, "g"].to_numpy(np.int64)
        val = recv.loc[both, "end"].to_numpy(np.int64) - send.loc[both, "start"].to_numpy(np.int64)
        keep = gs != gr
        np.minimum.at(w, (gr[keep], gs[keep]), val[keep])
    return intervals_from(w, inf, ROOT)  # numpy then as now (Floyd-Warshall: test_clock.py)


def _job(rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[int, int]]:
    """Collectives of up to 8 ranks in up to 4 clock groups (each shifted, one drifting, one rank
    faked ahead), some collectives on a few ranks only, some rows of ranks outside the groups;
    columns coll, rank, op (send/recv pairs among them), start, end (ns)."""
    ranks = int(rng.integers(2, 9))
    groups = int(rng.integers(1, 5))
    group_of = {r: int(rng.integers(0, groups)) if r else ROOT for r in range(ranks)}
    shift = {g: int(rng.integers(-5, 6)) * 1_000_000 * (g != ROOT) for g in range(groups)}
    faked = int(rng.integers(0, ranks)) if rng.random() < 0.3 else -1
    rows = []
    for c in range(int(rng.integers(1, 30))):
        t = 10**15 + c * 10_000_000
        members = rng.choice(ranks, int(rng.integers(1, ranks + 1)), replace=False)
        op = "allreduce" if len(members) != 2 or rng.random() < 0.5 else "send"
        for i, r in enumerate(members.tolist()):
            end = t + shift[group_of[r]] + int(rng.integers(0, 3)) * 1_000
            end += 40_000_000 * (r == faked) + (c * 7 if group_of[r] == 1 else 0)
            kind = op if op != "send" else ("send" if i == 0 else "recv")
            rows.append((c, r, kind, end - int(rng.integers(1, 5)) * 100_000, end))
    if rng.random() < 0.3:
        rows.append((0, ranks + 3, "allreduce", 10**15, 10**15 + 1))  # a rank of no group
    coll, rank, op, start, end = (list(v) for v in zip(*rows, strict=True))
    return {
        "coll": np.array(coll, np.int64), "rank": np.array(rank, np.int32),
        "op": np.array(op, dtype=object), "start": np.array(start, np.int64),
        "end": np.array(end, np.int64),
    }, group_of  # fmt: skip


def _edges(edges: list[Edge]) -> list[Any]:
    return [(e.a, e.b, e.offset_ns, e.drift_ppb, e.bound_ns, e.count) for e in edges]


def test_the_graph_fits_equal_their_pandas_form_on_random_jobs() -> None:
    rng = np.random.default_rng(24)
    split = edges = bounded = 0
    for _ in range(400):
        job, group_of = _job(rng)
        frame = pd.DataFrame(job)
        split_here = cg.split_inconsistent(job, group_of)
        assert split_here == ref_split_inconsistent(frame, group_of)
        split += split_here != group_of
        base = int(job["end"].min())
        ends = cg._group_ends(job, split_here, base)
        want = ref_group_ends(frame, split_here, base).reset_index(drop=True)
        assert [list(map(float, v)) for v in ends.values()] == [
            want[c].astype(float).tolist() for c in ("coll", "g", "y")
        ]
        rough = {g: float(rng.integers(-3, 4)) * 1e6 for g in set(split_here.values())}
        t_ref = float(ends["y"].min()) if len(ends["y"]) else 0.0
        got_edges = cg.end_edges(ends, rough, t_ref)
        assert _edges(got_edges) == _edges(ref_end_edges(want, rough, t_ref))
        edges += len(got_edges)
        p2p = {c: v[job["op"] != "allreduce"] for c, v in job.items()}
        sync = {c: v[job["op"] == "allreduce"] for c, v in job.items()}
        corr = {
            g: (float(rng.integers(-2, 3)) * 1e-5, float(rng.integers(0, 10**6))) for g in range(4)
        }
        got = cg.causality_intervals(sync, p2p, split_here, base, corr)
        assert got == ref_causality_intervals(
            pd.DataFrame(sync), pd.DataFrame(p2p), split_here, base, corr
        )
        bounded += len(got)
        assert (
            constraints(job, list(range(8)))[0].tolist()
            == constraints(frame, list(range(8)))[0].tolist()
        )
    assert split > 10 and edges > 200 and bounded > 100, (split, edges, bounded)
