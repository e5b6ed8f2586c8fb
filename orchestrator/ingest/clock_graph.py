"""Clock offsets of whole clocks, over the graph that collectives and sends/receives make.

Stage 2 of the clock alignment (``orchestrator/ingest/clock.py``) for ranks without runtime samples
(foreign traces, ``rankscope synth``). All times ns, all pure functions on numpy / pandas.

**Groups.** Ranks that read one clock share one unknown: a clock domain (meta.json), else a
host (processes on one host share CLOCK_REALTIME), else the rank alone. Group 0 is the
reference's: the reference, the ranks that share its clock and those with runtime samples
(already on it). A rank whose own collectives with its host mates break causality at a common
offset (libfaketime) is split off and fitted alone (:func:`split_inconsistent`).

**What connects two groups** (issue 24: in tensor × pipeline × data parallel jobs most
collectives stay inside a host; only sub-group collectives whose members span hosts, a world
all-reduce and pipeline sends/receives cross):

* *End agreement*: the members of a synchronizing collective end together (NCCL kernels within
  µs). Each collective whose members lie in several groups measures ``o_g - o_h`` for its
  groups g and h as ``end_h - end_g`` (the median end of each group's members). A collective
  inside one group measures nothing about offsets — fitting a rank to the median over all its
  collectives, as the per-rank fit did, let intra-host TP/DP collectives outvote the few that
  cross hosts (root cause of issue 24, item 4).
* *Causality* (hard): no member ends a collective before its last member started it, and a
  receive cannot end before its send started: ``o_q - o_r <= end_r - start_q``. A send is NOT
  taken to end after its receive was posted: NCCL may return once the data is in flight (NCCL
  maintainers, NVIDIA/nccl#1252), gloo returns once buffered. Sends in both directions between
  two groups (activations forward, gradients back) bound their offset on both sides.

**Fit.** Per pair of groups (each collective links its lowest group to each of its others, so
the rows grow with the members, not their square) a line ``o_b - o_a = c + s (t - t_ref)``,
its slope by least squares, kept only when it lies ``SPREAD_FACTOR`` standard errors from 0
and is one a clock can have (:func:`fit_line`; else the median: no drift); its bound is the residuals' band (``spread_of``). A group's offset is the
sum along the path from group 0 with the smallest summed bound (Dijkstra); its uncertainty
that sum (+ the runtime bound of group 0's sampled ranks, if any), capped by the causality
interval of the group (shortest paths over all constraints, after the drift) into which the
offset is clipped. A group that no end agreement reaches but causality bounds on both sides
(sends/receives only) takes the interval's middle, its half-width the uncertainty. Neither:
absent (the rank stays raw).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

#: Causality constraints of collectives of one size are built together while their matrices
#: hold at most this many elements (memory, ~8 bytes each); larger ones one by one.
BATCH_ELEMENTS = 1 << 22

#: Below this many measurements a band is their largest deviation (too few for a robust spread).
FEW_COLLECTIVES = 20
#: With more, it is this many robust standard deviations (1.4826·MAD) of them.
SPREAD_FACTOR = 3.0
#: The reference's group.
ROOT = 0
#: Fastest drift (ns per ns) a fitted line may show: 500 ppm, the most the Linux/NTP clock
#: discipline corrects (``MAXFREQ``, include/linux/timex.h); a steeper slope is scatter.
MAX_DRIFT = 500e-6


@dataclass(frozen=True)
class Edge:
    """End agreement between groups ``a`` < ``b``: ``o_b - o_a = offset + drift·(t - t_ref)``."""

    a: int
    b: int
    offset_ns: float
    """``o_b - o_a`` (ns) at the common reference time"""
    drift_ppb: float
    """its change per second (ns/s)"""
    bound_ns: float
    """half-width of the residual band (ns); inf from a single collective (no scatter known)"""
    count: int
    """collectives measured"""


@dataclass(frozen=True)
class GroupFit:
    """One group's clock: add ``offset_ns + drift_ppb·(raw - t_ref_ns)/1e9`` to its raw time."""

    offset_ns: float
    """ns, at raw time ``t_ref_ns`` of the group's clock"""
    drift_ppb: float
    """ns/s; 0 when no significant drift"""
    t_ref_ns: int
    """raw time (ns) at which ``offset_ns`` holds; 0 without drift"""
    uncertainty_ns: float
    """half-width (ns) of the bound on the offset; -1 unknown"""
    by_causality_only: bool
    """True: no end agreement reached the group; the middle of its causality interval"""


def spread_of(resid: Any) -> float:
    """Half-width (ns) of the band of residuals ``resid`` (ns, centred by their median): the
    largest deviation below ``FEW_COLLECTIVES``, ``SPREAD_FACTOR``·1.4826·MAD from there on;
    inf for fewer than two (one measurement says nothing of its scatter)."""
    dev = np.abs(np.asarray(resid, dtype=np.float64))
    if len(dev) < 2:
        return float("inf")
    if len(dev) < FEW_COLLECTIVES:
        return float(dev.max())
    return SPREAD_FACTOR * 1.4826 * float(np.median(dev))


def fit_line(x: np.ndarray, d: np.ndarray) -> tuple[float, float, float]:
    """(value at x = 0, slope, bound): ``d`` (ns) against ``x`` (ns from the reference time).

    The median (slope 0) unless a drift is told apart from the scatter: the least-squares slope
    is taken when it lies more than ``SPREAD_FACTOR`` standard errors from 0 (four measurements
    or more, so that the residuals estimate the scatter), is one a clock can have
    (``MAX_DRIFT``) and narrows the residual band; the value at 0 is then the median of
    ``d - slope·x``. The bound is the band (``spread_of``) of the chosen model's residuals.
    """
    c0 = float(np.median(d))
    b0 = spread_of(d - c0)
    n = len(x)
    if n < 4:
        return c0, 0.0, b0
    xc = x - x.mean()
    sxx = float(xc @ xc)
    if sxx <= 0:
        return c0, 0.0, b0
    slope = float(xc @ (d - d.mean())) / sxx
    resid = d - d.mean() - slope * xc
    stderr = float(np.sqrt(resid @ resid / (n - 2) / sxx))
    if abs(slope) <= SPREAD_FACTOR * stderr or abs(slope) > MAX_DRIFT:
        return c0, 0.0, b0
    c1 = float(np.median(d - slope * x))
    b1 = spread_of(d - c1 - slope * x)
    return (c1, slope, b1) if b1 < b0 else (c0, 0.0, b0)


def split_inconsistent(sync: pd.DataFrame, group_of: dict[int, int]) -> dict[int, int]:
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


def _group_ends(sync: pd.DataFrame, group_of: dict[int, int], base: int) -> pd.DataFrame:
    """Per (collective, group): the median end (ns from ``base``, float) of its members, only
    for collectives spanning two groups or more."""
    e = sync[["coll", "rank", "end"]].copy()
    e["g"] = e["rank"].map(group_of)
    e = e.dropna(subset=["g"])
    e["g"] = e["g"].astype(np.int64)
    e["y"] = (e["end"] - base).astype(np.float64)
    y = e.groupby(["coll", "g"], sort=False)["y"].median().reset_index()
    return y[y.groupby("coll")["g"].transform("nunique") >= 2]


def end_edges(ends: pd.DataFrame, rough: dict[int, float], t_ref: float) -> list[Edge]:
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


def tree_offsets(edges: list[Edge], groups: list[int]) -> dict[int, tuple[float, float, float]]:
    """Per group reached from ``ROOT``: (offset ns at the reference time, drift ppb, bound ns)
    summed along the path of smallest summed bound (paths through an unbounded edge last)."""
    adj: dict[int, list[tuple[int, Edge, float]]] = {g: [] for g in groups}
    for e in edges:
        adj.setdefault(e.a, []).append((e.b, e, 1.0))
        adj.setdefault(e.b, []).append((e.a, e, -1.0))
    best: dict[int, tuple[int, float]] = {ROOT: (0, 0.0)}
    value: dict[int, tuple[float, float, float]] = {ROOT: (0.0, 0.0, 0.0)}
    heap: list[tuple[int, float, int]] = [(0, 0.0, ROOT)]
    done: set[int] = set()
    while heap:
        unbounded, cost, g = heapq.heappop(heap)
        if g in done:
            continue
        done.add(g)
        off, dr, bound = value[g]
        for h, e, sign in adj.get(g, []):
            inf = e.bound_ns == float("inf")
            key = (unbounded + int(inf), cost + (0.0 if inf else e.bound_ns))
            if h not in done and (h not in best or key < best[h]):
                best[h] = key
                value[h] = (off + sign * e.offset_ns, dr + sign * e.drift_ppb, bound + e.bound_ns)
                heapq.heappush(heap, (key[0], key[1], h))
    return value


def constraints(colls: pd.DataFrame, ranks: list[int]) -> tuple[np.ndarray, int]:
    """Causality as difference constraints: ``w[r, q]`` (ns) bounds ``a_q - a_r`` from above.

    ``w[r, q]`` is the smallest ``end_cr - start_cq`` over shared collectives c; no constraint is
    the returned sentinel (also on the diagonal).
    """
    n = len(ranks)
    inf = np.iinfo(np.int64).max // 4
    w = np.full((n, n), inf, dtype=np.int64)
    if colls.empty:
        return w, inf
    import pandas as pd

    # Plain arrays sorted by (coll, rank index): a pandas group per collective cost ~1 ms each
    # (13 s for the 13,600 collectives of a 32-rank TP x PP x DP job).
    ri = pd.Index(ranks).get_indexer(colls["rank"].to_numpy())
    keep = ri >= 0
    c = colls["coll"].to_numpy()[keep]
    rr_all, e_all = ri[keep], colls["end"].to_numpy(np.int64)[keep]
    s_all = colls["start"].to_numpy(np.int64)[keep]
    order = np.lexsort((rr_all, c))
    c, rr_all, e_all, s_all = c[order], rr_all[order], e_all[order], s_all[order]
    cuts = np.flatnonzero(c[1:] != c[:-1]) + 1
    first = np.concatenate(([0], cuts))
    size = np.diff(np.concatenate((first, [len(c)])))
    every = np.arange(n)
    for k in np.unique(size):
        starts = first[size == k]
        if k * k * len(starts) <= BATCH_ELEMENTS:  # small collectives of one size: at once
            rows = starts[:, None] + np.arange(k)[None, :]
            rr, e, s = rr_all[rows], e_all[rows], s_all[rows]
            cand = e[:, :, None] - s[:, None, :]  # [c, r, q]
            np.minimum.at(w, (rr[:, :, None].repeat(k, 2), rr[:, None, :].repeat(k, 1)), cand)
            continue
        for i0 in starts:
            rr, e, s = rr_all[i0 : i0 + k], e_all[i0 : i0 + k], s_all[i0 : i0 + k]
            cand = e[:, None] - s[None, :]  # [r, q]
            if k == n and np.array_equal(rr, every):  # every rank once: the whole matrix
                np.minimum(w, cand, out=w)
            elif len(np.unique(rr)) == k:  # each rank once: one block
                block = np.ix_(rr, rr)
                w[block] = np.minimum(w[block], cand)
            else:  # a rank twice in one collective: repeated indices need the unbuffered form
                np.minimum.at(w, (rr[:, None].repeat(k, 1), rr[None, :].repeat(k, 0)), cand)
    np.fill_diagonal(w, inf)
    return w, inf


def shortest_from(d: np.ndarray, src: int | None) -> np.ndarray | None:
    """Shortest path lengths from ``src`` through the weights ``d`` (``d[r, q]``: edge r -> q,
    ``inf``: none), vectorised Bellman-Ford: O(k·N²) for paths of k edges, instead of
    Floyd-Warshall's O(N³) for every pair (14.5 s of a 1,024-rank merge). ``src`` None: from a
    virtual source joined to every rank at 0 (finds a negative cycle anywhere). None when a
    negative cycle is reachable (the constraints contradict each other)."""
    n = len(d)
    if src is None:
        dist = np.zeros(n)
    else:
        dist = np.full(n, np.inf)
        dist[src] = 0.0
    for _ in range(n + 1):
        relaxed = np.minimum(dist, (dist[:, None] + d).min(axis=0))
        if np.array_equal(relaxed, dist):
            return dist
        dist = relaxed
    return None


def causality_intervals(
    sync: pd.DataFrame,
    p2p: pd.DataFrame,
    group_of: dict[int, int],
    base: int,
    corr: dict[int, tuple[float, float]],
) -> dict[int, tuple[float, float]]:
    """Per group, [lo, hi] (ns) of its offset relative to ``ROOT`` that causality allows, after
    each group's drift correction ``corr[g] = (drift ns/ns, t_ref ns from base)``.

    Collectives: ``o_b - o_a <= min end of a's members - max start of b's`` (:func:`constraints`
    on the per-group reduction); send/recv pairs: ``o_send - o_recv <= end_recv - start_send``.
    Shortest paths from and to ``ROOT`` (:func:`shortest_from`). Empty when the constraints
    contradict each other; groups bounded on one side only are absent.
    """
    import pandas as pd

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
    d = np.where(w < inf, w.astype(np.float64), np.inf)
    np.fill_diagonal(d, 0.0)
    if shortest_from(d, None) is None:
        return {}
    from_root, to_root = shortest_from(d, ROOT), shortest_from(d.T, ROOT)
    if from_root is None or to_root is None:
        return {}
    out = {}
    for g in range(1, n):
        lo, hi = -float(to_root[g]), float(from_root[g])
        if np.isfinite(lo) and np.isfinite(hi):
            out[g] = (lo, hi)
    return out


def fit_groups(
    sync: pd.DataFrame, p2p: pd.DataFrame, group_of: dict[int, int], root_bound_ns: float = 0.0
) -> dict[int, GroupFit]:
    """Offsets of the groups other than ``ROOT`` (module docstring).

    ``sync``: synchronizing collectives (coll, rank, start, end; ns, runtime-corrected where
    samples exist); ``p2p``: paired sends/receives (the same columns + op); ``group_of``: every
    rank in them -> its group (``ROOT`` = the reference's clock); ``root_bound_ns``: how far
    ``ROOT``'s sampled members may be off (added to every uncertainty).
    """
    frames = [f for f in (sync, p2p) if not f.empty]
    if not frames:
        return {}
    base = int(min(int(f["end"].min()) for f in frames))
    groups = sorted(set(group_of.values()))
    ends = _group_ends(sync, group_of, base) if not sync.empty else sync
    t_ref = float(ends["y"].min()) if len(ends) else 0.0
    # Two passes: the drift's abscissa is the reference time, known once the offsets are.
    rough: dict[int, float] = {}
    tree: dict[int, tuple[float, float, float]] = {}
    for _ in range(2):
        tree = tree_offsets(end_edges(ends, rough, t_ref), groups)
        rough = {g: v[0] for g, v in tree.items()}
    corr = {g: (v[1] / 1e9, t_ref - v[0]) for g, v in tree.items()}
    hard = causality_intervals(sync, p2p, group_of, base, corr)
    out: dict[int, GroupFit] = {}
    for g in groups:
        if g == ROOT:
            continue
        if g in tree:
            est, drift, bound = tree[g]
            lo, hi = hard.get(g, (-np.inf, np.inf))
            clipped = float(np.clip(est, lo, hi))
            unc = abs(clipped - est) + bound + root_bound_ns
            if g in hard:
                unc = min(unc, max(clipped - lo, hi - clipped))
            only = False
        elif g in hard:
            lo, hi = hard[g]
            clipped, drift, unc, only = (lo + hi) / 2, 0.0, (hi - lo) / 2, True
        else:
            continue
        t0 = base + round(t_ref - clipped) if drift else 0
        unc = max(unc, 1.0) if np.isfinite(unc) else -1.0
        out[g] = GroupFit(clipped, drift, t0, unc, only)
    return out


def clock_groups(keys: dict[int, str], root: set[int]) -> dict[int, int]:
    """rank -> group: ``root`` ranks are ``ROOT``; the others one group per key (domain or host;
    '' = alone), numbered in order of their lowest rank."""
    out = dict.fromkeys(root, ROOT)
    ids: dict[str, int] = {}
    for r in sorted(keys):
        if r in root:
            continue
        k = keys[r] or f"rank {r}"
        ids.setdefault(k, len(ids) + 1)
        out[r] = ids[k]
    return out
