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
from rankscope.orchestrator.ingest.column_tables import (
    Columns,
    distinct,
    group_max,
    group_min,
    mapped,
    median,
)

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
    return SPREAD_FACTOR * 1.4826 * median(dev)


def fit_line(x: np.ndarray, d: np.ndarray) -> tuple[float, float, float]:
    """(value at x = 0, slope, bound): ``d`` (ns) against ``x`` (ns from the reference time).

    The median (slope 0) unless a drift is told apart from the scatter: the least-squares slope
    is taken when it lies more than ``SPREAD_FACTOR`` standard errors from 0 (four measurements
    or more, so that the residuals estimate the scatter), is one a clock can have
    (``MAX_DRIFT``) and narrows the residual band; the value at 0 is then the median of
    ``d - slope·x``. The bound is the band (``spread_of``) of the chosen model's residuals.
    """
    c0 = median(d)
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
    c1 = median(d - slope * x)
    b1 = spread_of(d - c1 - slope * x)
    return (c1, slope, b1) if b1 < b0 else (c0, 0.0, b0)


def split_inconsistent(sync: Columns, group_of: dict[int, int]) -> dict[int, int]:
    """Split off ranks that cannot share their group's clock: in their collectives with group
    mates one ends before another started (on their own raw clocks). Greedy: the rank in the
    most such collectives leaves first (a faked clock breaks causality with every mate; on a
    tie the first of them in ``sync``'s rows), until no group has any; each leaver becomes a
    group of its own. Returns the new rank -> group."""
    out = dict(group_of)
    rank = np.asarray(sync["rank"]).astype(np.int64)
    if not len(rank):
        return out
    mine = np.isin(rank, list(out))
    rank = rank[mine]
    coll = np.asarray(sync["coll"]).astype(np.int64)[mine]
    start = np.asarray(sync["start"]).astype(np.int64)[mine]
    end = np.asarray(sync["end"]).astype(np.int64)[mine]
    next_id = max(out.values(), default=ROOT) + 1
    while True:
        g = mapped(rank, out)
        sel = g != ROOT
        if not sel.any():
            return out
        at, pair_coll, _ = _pairs(coll[sel], g[sel])
        hi = group_max(at, start[sel], len(pair_coll))[at]
        lo = group_min(at, end[sel], len(pair_coll))[at]
        bad = (lo < hi) & ((end[sel] < hi) | (start[sel] > lo))
        if not bad.any():
            return out
        out[_most_frequent(rank[sel][bad])] = next_id
        next_id += 1


def _most_frequent(values: np.ndarray) -> int:
    """The most frequent value, the first seen of equally frequent ones (pandas'
    ``value_counts().idxmax()``: counts in first-seen order, sorted stably)."""
    uniq, first, counts = np.unique(values, return_index=True, return_counts=True)
    seen = np.argsort(first)
    return int(uniq[seen][np.argmax(counts[seen])])


def _groups_of(frame: Columns, group_of: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(rows of ``frame`` whose rank has a group, their groups): ``rank.map(group_of)`` with
    the rows of ranks outside it dropped."""
    groups = mapped(frame["rank"], group_of)  # groups are ROOT (0) and up
    rows = np.flatnonzero(groups >= 0)
    return rows, groups[rows]


def _pairs(coll: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's (coll, g) pair as a number ``0..k-1`` in order of the pairs' first rows
    (a ``groupby([coll, g], sort=False)``), and each pair's coll and g."""
    _, first, at = np.unique(np.stack([coll, g]), axis=1, return_index=True, return_inverse=True)
    at = at.reshape(-1)
    order = np.argsort(first, kind="stable")
    renum = np.empty(len(order), dtype=np.int64)
    renum[order] = np.arange(len(order))
    rows = first[order]
    return renum[at], coll[rows], g[rows]


def _group_ends(sync: Columns, group_of: dict[int, int], base: int) -> Columns:
    """Per (collective, group): the median end (ns from ``base``, float) of its members, only
    for collectives spanning two groups or more; columns coll, g, y, in order of each pair's
    first row."""
    rows, g = _groups_of(sync, group_of)
    coll = np.asarray(sync["coll"]).astype(np.int64)[rows]
    y = (np.asarray(sync["end"]).astype(np.int64)[rows] - base).astype(np.float64)
    pair, p_coll, p_g = _pairs(coll, g)
    # the median of each pair's ends: the middle one, or the mean of the two middle ones
    order = np.lexsort((y, pair))
    count = np.bincount(pair, minlength=len(p_coll))
    first = np.concatenate(([0], np.cumsum(count)[:-1])).astype(np.int64)
    ys = y[order]
    med = (ys[first + (count - 1) // 2] + ys[first + count // 2]) / 2
    keep = _spanning(p_coll)
    return {"coll": p_coll[keep], "g": p_g[keep], "y": med[keep]}


def _spanning(pair_coll: np.ndarray) -> np.ndarray:
    """Which (collective, group) pairs (each pair's collective, :func:`_pairs`) belong to a
    collective of two groups or more."""
    at = np.unique(pair_coll, return_inverse=True)[1].reshape(-1)
    return np.bincount(at)[at] >= 2


def end_edges(ends: Columns, rough: dict[int, float], t_ref: float) -> list[Edge]:
    """End-agreement edges from :func:`_group_ends`: each collective links its lowest group to
    each of its others; ``rough`` (ns) puts the hub's ends on the reference time for the drift
    fit (x = end + rough offset - ``t_ref``). Edges in (a, b) order, each fitted on its rows in
    table order."""
    coll, g, y = ends["coll"], ends["g"], ends["y"]
    if not len(coll):
        return []
    ids, at = np.unique(coll, return_inverse=True)
    at = at.reshape(-1)
    hub_g = group_min(at, g, len(ids))
    is_hub = g == hub_g[at]
    hub_y = np.empty(len(ids), dtype=np.float64)
    hub_y[at[is_hub]] = y[is_hub]
    rows = np.flatnonzero(~is_hub)
    a = hub_g[at[rows]]
    y_hub = hub_y[at[rows]]
    d = y_hub - y[rows]
    x = y_hub + np.array([rough.get(int(k), 0.0) for k in a.tolist()], dtype=np.float64) - t_ref
    out = []
    b = g[rows]
    for ab in sorted(set(zip(a.tolist(), b.tolist(), strict=True))):
        mine = (a == ab[0]) & (b == ab[1])
        c, slope, bound = fit_line(x[mine], d[mine])
        out.append(Edge(ab[0], ab[1], c, slope * 1e9, bound, int(mine.sum())))
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


def constraints(colls: Columns | pd.DataFrame, ranks: list[int]) -> tuple[np.ndarray, int]:
    """Causality as difference constraints: ``w[r, q]`` (ns) bounds ``a_q - a_r`` from above.

    ``w[r, q]`` is the smallest ``end_cr - start_cq`` over shared collectives c; no constraint is
    the returned sentinel (also on the diagonal).
    """
    n = len(ranks)
    inf = np.iinfo(np.int64).max // 4
    w = np.full((n, n), inf, dtype=np.int64)
    if not len(colls["coll"]):
        return w, inf
    # Plain arrays sorted by (coll, rank index): a pandas group per collective cost ~1 ms each
    # (13 s for the 13,600 collectives of a 32-rank TP x PP x DP job).
    ri = mapped(colls["rank"], {r: i for i, r in enumerate(ranks)})
    keep = ri >= 0
    c = np.asarray(colls["coll"])[keep]
    rr_all, e_all = ri[keep], np.asarray(colls["end"]).astype(np.int64)[keep]
    s_all = np.asarray(colls["start"]).astype(np.int64)[keep]
    order = np.lexsort((rr_all, c))
    c, rr_all, e_all, s_all = c[order], rr_all[order], e_all[order], s_all[order]
    cuts = np.flatnonzero(c[1:] != c[:-1]) + 1
    first = np.concatenate(([0], cuts))
    size = np.diff(np.concatenate((first, [len(c)])))
    every = np.arange(n)
    for k in distinct(size):
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
            elif len(distinct(rr)) == k:  # each rank once: one block
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
    sync: Columns,
    p2p: Columns,
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
    n = max(group_of.values(), default=ROOT) + 1
    if n < 2:
        return {}
    drift = np.array([corr.get(k, (0.0, 0.0))[0] for k in range(n)])
    t_ref = np.array([corr.get(k, (0.0, 0.0))[1] for k in range(n)])

    def reduced(frame: Columns) -> tuple[np.ndarray, Columns]:
        """The rows whose rank has a group, their start and end corrected, with their group."""
        rows, g = _groups_of(frame, group_of)
        out = {"coll": np.asarray(frame["coll"]).astype(np.int64)[rows], "g": g}
        for col in ("start", "end"):
            x = (np.asarray(frame[col]).astype(np.int64)[rows] - base).astype(np.float64)
            out[col] = np.rint(x + drift[g] * (x - t_ref[g])).astype(np.int64)
        return rows, out

    cols: Columns = {"coll": np.zeros(0, np.int64), "rank": np.zeros(0, np.int64)}
    cols["start"] = cols["end"] = np.zeros(0, np.int64)
    if len(sync["coll"]):
        _, s = reduced(sync)
        pair, p_coll, p_g = _pairs(s["coll"], s["g"])
        start = group_max(pair, s["start"], len(p_coll))
        end = group_min(pair, s["end"], len(p_coll))
        keep = _spanning(p_coll)
        cols = {"coll": p_coll[keep], "rank": p_g[keep], "start": start[keep], "end": end[keep]}
    w, inf = constraints(cols, list(range(n)))
    if len(p2p["coll"]):
        rows, p = reduced(p2p)
        op = np.asarray(p2p["op"], dtype=object)[rows]
        sides = []
        for kind in ("send", "recv"):  # each collective's first send and first recv
            mine = np.flatnonzero(op == kind)
            ids, first = np.unique(p["coll"][mine], return_index=True)
            sides.append((ids, mine[first]))
        _, i_send, i_recv = np.intersect1d(sides[0][0], sides[1][0], return_indices=True)
        snd, rcv = sides[0][1][i_send], sides[1][1][i_recv]
        gs, gr = p["g"][snd], p["g"][rcv]
        val = p["end"][rcv] - p["start"][snd]
        keep = gs != gr
        np.minimum.at(w, (gr[keep], gs[keep]), val[keep])
    return intervals_from(w, inf, ROOT)


def intervals_from(w: np.ndarray, inf: int, src: int) -> dict[int, tuple[float, float]]:
    """Per index other than ``src``, the interval [lo, hi] (ns) of its offset relative to
    ``src`` that the difference constraints ``w`` allow (``inf``: none): shortest paths from
    and to ``src`` (:func:`shortest_from`). Indices bounded on one side only are absent, and
    every index when the constraints contradict each other (a negative cycle anywhere)."""
    d = np.where(w < inf, w.astype(np.float64), np.inf)
    np.fill_diagonal(d, 0.0)
    if shortest_from(d, None) is None:
        return {}
    from_src, to_src = shortest_from(d, src), shortest_from(d.T, src)
    if from_src is None or to_src is None:
        return {}
    out = {}
    for i in range(len(w)):
        lo, hi = -float(to_src[i]), float(from_src[i])
        if i != src and np.isfinite(lo) and np.isfinite(hi):
            out[i] = (lo, hi)
    return out


def fit_groups(
    sync: Columns, p2p: Columns, group_of: dict[int, int], root_bound_ns: float = 0.0
) -> dict[int, GroupFit]:
    """Offsets of the groups other than ``ROOT`` (module docstring).

    ``sync``: synchronizing collectives (coll, rank, start, end; ns, runtime-corrected where
    samples exist); ``p2p``: paired sends/receives (the same columns + op); ``group_of``: every
    rank in them -> its group (``ROOT`` = the reference's clock); ``root_bound_ns``: how far
    ``ROOT``'s sampled members may be off (added to every uncertainty).
    """
    frames = [f for f in (sync, p2p) if len(f["coll"])]
    if not frames:
        return {}
    base = int(min(int(np.min(f["end"])) for f in frames))
    groups = sorted(set(group_of.values()))
    ends: Columns = {"coll": np.zeros(0, np.int64), "g": np.zeros(0, np.int64)}
    ends["y"] = np.zeros(0, np.float64)
    if len(sync["coll"]):
        ends = _group_ends(sync, group_of, base)
    t_ref = float(ends["y"].min()) if len(ends["y"]) else 0.0
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
