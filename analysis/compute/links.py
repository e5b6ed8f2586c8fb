"""Slow links between hosts: the same transfers take longer when they cross one host pair.

A slow link (a degraded NIC port, a flapping cable, a congested switch path) leaves no trace in
any rank's own work: every rank arrives on time and then the bytes move slowly. What it changes
is the **transfer** of the collectives and sends/receives whose members sit on both hosts — the
time from the last member's arrival to the end (:mod:`rankscope.analysis.compute.collectives`' split;
waiting for a late rank is not transfer, so a slow worker never looks like a slow link).

The rule compares like with like. Transfers of one *class* — the same op, message size, number
of members and number of hosts spanned — move the same bytes over the same kind of path, so on
healthy links they take the same time up to noise (a few per cent for NCCL). For a host pair
``(a, b)`` and a class: the median transfer of the instances whose members include both hosts,
over the median of the class's other instances. The pair's **slowdown** is the median of those
ratios over the classes that have both sides (each class weighted by its instances crossing the
pair), and the pair is slow when it is at least :data:`SLOW_LINK_RATIO` — unless the host sets
that make it look slow are explained by a more specific pair, and pairs the job cannot tell
apart are named together (:func:`_name_groups`).

Limits: a pair is only judged where the job has the same transfers *without* it — in a job of
two hosts, or one whose every cross-host collective spans all hosts (flat data parallel), there
is nothing to compare with, and nothing is said (the hosts' bus bandwidth is then the place to
look). A slow NIC makes every pair of its host slow: the finding lists those pairs.

Times are int64 ns on the aligned clock; the table's figures say their unit.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from rankscope.analysis.compute.whatif_scenarios import Scenario

#: A pair whose transfers take at least this many times the same transfers elsewhere is slow.
#: Same-class transfers on healthy links differ by a few per cent (NCCL's own bandwidth varies
#: ~5 % run to run); a link at half its speed doubles them. 1.5 is far above the noise and
#: below every degradation that costs a job much (a link at 2/3 of its speed).
SLOW_LINK_RATIO = 1.5
#: Instances needed on each side (crossing the pair, not crossing it) for a class to count: a
#: median of fewer says little.
MIN_INSTANCES = 3
#: Host-set pairs a class may spread into before it is left out (bounds the work: a class of
#: many distinct groups that each span many hosts).
MAX_PAIRS_PER_CLASS = 200_000

#: What makes two instances' transfers comparable (a *class*): the same op, message size,
#: number of members and number of hosts spanned.
CLASS_COLUMNS = ["op", "bytes", "members", "n_hosts"]

#: Columns of :func:`instance_transfers`: one row per collective / send-recv instance.
INSTANCE_COLUMNS: dict[str, str] = {
    "coll": "int64",
    "op": "str",
    "bytes": "int64",
    "members": "int64",  # ranks of the instance in the store
    "n_hosts": "int64",  # hosts its members sit on
    "hosts": "object",  # tuple of those hosts' names, sorted
    "transfer_ns": "int64",  # last end - last arrival, >= 0
}

#: Columns of :func:`link_table`: one row per host pair with comparable transfers.
LINK_COLUMNS: dict[str, str] = {
    "host_a": "str",
    "host_b": "str",
    "instances": "int64",  # instances crossing the pair in classes that have both sides
    "transfer_ms": "float64",  # median transfer of those, ms
    "typical_ms": "float64",  # median of the same classes' instances not crossing it, ms
    "slowdown": "float64",  # weighted median over classes of crossing / not crossing
    "extra_s": "float64",  # sum over crossing instances of transfer - its class's typical, s
    "group": "int64",  # pairs the job cannot tell apart share one (a finding each); -1: not slow
    "is_slow": "bool",  # named slow (group >= 0): slowdown >= SLOW_LINK_RATIO, not explained away
}


def instance_transfers(colls: pd.DataFrame, hosts: Mapping[int, str]) -> pd.DataFrame:
    """Each instance's transfer (INSTANCE_COLUMNS) from ``Store.collectives()`` rows and each
    rank's host: ``max(end) − max(start)`` over its members (a small NCCL send that returns
    early does not shorten it), instances of one member left out.

    Vectorised (tens of thousands of instances in a large job): an instance's host set is keyed
    by the sum, modulo 2**64, of one random 64-bit number per host (two different sets of a job's
    few hundred hosts collide with probability ~2**-64); the tuple of names is built once per
    distinct set."""
    if not len(colls):
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in INSTANCE_COLUMNS.items()})
    host = colls["rank"].astype(int).map(dict(hosts)).fillna("?").astype(str)
    codes, names = pd.factorize(host)
    g = colls.groupby("coll", sort=True)
    out = pd.DataFrame(
        {
            "op": g["op"].first().astype(str),
            "bytes": g["bytes"].first().astype(np.int64),
            "members": g["rank"].size().astype(np.int64),
            "transfer_ns": (g["end"].max() - g["start"].max()).clip(lower=0).astype(np.int64),
        }
    )
    member = pd.DataFrame({"coll": colls["coll"].to_numpy(np.int64), "h": codes})
    member = member.drop_duplicates().sort_values(["coll", "h"], kind="stable")
    coll, h = member["coll"].to_numpy(), member["h"].to_numpy()
    starts = np.flatnonzero(np.r_[True, coll[1:] != coll[:-1]])
    weight = np.random.default_rng(0x51D).integers(1, 2**63, len(names), dtype=np.uint64)
    key = np.add.reduceat(weight[h], starts)  # uint64 sums wrap: modulo 2**64
    width = np.diff(np.r_[starts, len(coll)])
    _, first = np.unique(key, return_index=True)
    names_of = {
        int(key[i]): tuple(sorted(names[h[starts[i] : starts[i] + width[i]]])) for i in first
    }
    out["n_hosts"] = pd.Series(width, index=coll[starts]).astype(np.int64)
    out["hosts"] = pd.Series([names_of[int(k)] for k in key], index=coll[starts], dtype=object)
    out = out[out["members"] >= 2]
    return out.reset_index()[list(INSTANCE_COLUMNS)].astype(
        {c: d for c, d in INSTANCE_COLUMNS.items() if d != "object"}
    )


#: One class of comparable transfers and one host set of its instances: ((op, bytes, members,
#: hosts spanned), the hosts) — the unit of evidence a pair's slowness rests on.
SetKey = tuple[tuple[object, ...], tuple[str, ...]]


@dataclasses.dataclass
class _Evidence:
    """What one host pair's transfers say, class by class."""

    ratios: list[float] = dataclasses.field(default_factory=list)  # per class: with / without
    weights: list[int] = dataclasses.field(default_factory=list)  # per class: instances with
    inside: list[np.ndarray] = dataclasses.field(default_factory=list)  # transfers crossing it
    typical: list[float] = dataclasses.field(default_factory=list)  # per class: without, ns
    slow_sets: set[SetKey] = dataclasses.field(default_factory=set)  # its slow host sets


def link_table(inst: pd.DataFrame) -> pd.DataFrame:
    """Per host pair judged (LINK_COLUMNS), slowest first: see the module's rule, then
    :func:`_name_groups` for which pairs are named."""
    evidence: dict[tuple[str, str], _Evidence] = {}
    crossing = inst[inst["n_hosts"] >= 2]
    for key, cls in crossing.groupby(CLASS_COLUMNS, sort=False):
        sets = {h: part["transfer_ns"].to_numpy(np.int64) for h, part in cls.groupby("hosts")}
        if len(sets) < 2:
            continue  # every instance spans the same hosts: nothing to compare with
        width = len(next(iter(sets)))
        if len(sets) * width * (width - 1) // 2 > MAX_PAIRS_PER_CLASS:
            continue
        pairs: dict[tuple[str, str], list[tuple[str, ...]]] = {}
        for hs in sets:
            for pair in itertools.combinations(hs, 2):
                pairs.setdefault(pair, []).append(hs)
        for pair, with_sets in pairs.items():
            inside = np.concatenate([sets[h] for h in with_sets])
            others = [sets[h] for h in sets if h not in with_sets]
            if not others:
                continue
            outside = np.concatenate(others)
            if len(inside) < MIN_INSTANCES or len(outside) < MIN_INSTANCES:
                continue
            typical = float(np.median(outside))
            if typical <= 0:
                continue
            ev = evidence.setdefault(pair, _Evidence())
            ev.ratios.append(float(np.median(inside)) / typical)
            ev.weights.append(len(inside))
            ev.inside.append(inside)
            ev.typical.append(typical)
            ev.slow_sets.update(
                (tuple(key), h) for h in with_sets
                if float(np.median(sets[h])) >= SLOW_LINK_RATIO * typical
            )  # fmt: skip
    slowdown = {
        p: _weighted_median(np.array(ev.ratios), np.array(ev.weights, np.float64))
        for p, ev in evidence.items()
    }
    group = _name_groups({p: evidence[p].slow_sets for p in evidence}, slowdown)
    rows = []
    for (a, b), ev in evidence.items():
        inside = np.concatenate(ev.inside)
        extra = sum(float(np.clip(x - t, 0, None).sum()) for x, t in zip(ev.inside, ev.typical,
                                                                        strict=True))  # fmt: skip
        typical = float(np.median(np.repeat(ev.typical, [len(x) for x in ev.inside])))
        g = group.get((a, b), -1)
        rows.append(
            (a, b, len(inside), float(np.median(inside)) / 1e6, typical / 1e6,
             slowdown[(a, b)], extra / 1e9, g, g >= 0)
        )  # fmt: skip
    table = pd.DataFrame(rows, columns=list(LINK_COLUMNS)).astype(LINK_COLUMNS)
    return table.sort_values(["slowdown", "host_a", "host_b"], ascending=[False, True, True],
                             ignore_index=True)  # fmt: skip


def _name_groups(
    slow_sets: Mapping[tuple[str, str], set[SetKey]], slowdown: Mapping[tuple[str, str], float]
) -> dict[tuple[str, str], int]:
    """Which slow pairs to name, in groups of pairs the job cannot tell apart.

    A pair's evidence is the host sets (per class) whose transfers it slows. Every pair inside
    a slow set looks slow — a group spanning hosts 0–3 that crosses a slow 0–1 link also
    "crosses" 0–2 — so the pairs are taken most specific first (the smallest host set of their
    evidence, then the larger slowdown): a pair whose slow sets are all explained by pairs
    already named is explained away; pairs with the very same evidence as a named one cannot be
    told apart from it and join its group (the finding then names the hosts, not one pair).
    Returns pair → group number (0, 1, …); pairs not named are absent."""
    candidates = [p for p, s in slowdown.items() if s >= SLOW_LINK_RATIO and slow_sets[p]]
    candidates.sort(key=lambda p: (min(len(h) for _, h in slow_sets[p]), -slowdown[p], p))
    explained: set[SetKey] = set()
    groups: list[frozenset[SetKey]] = []
    out: dict[tuple[str, str], int] = {}
    for pair in candidates:
        ev = frozenset(slow_sets[pair])
        if ev in groups:
            out[pair] = groups.index(ev)
        elif not ev <= explained:
            out[pair] = len(groups)
            groups.append(ev)
            explained |= ev
    return out


def slow_links(colls: pd.DataFrame, hosts: Mapping[int, str]) -> pd.DataFrame:
    """:func:`link_table` of the store's collectives (``Store.collectives()`` rows)."""
    return link_table(instance_transfers(colls, hosts))


def link_fix_factors(inst: pd.DataFrame, links: pd.DataFrame) -> dict[int, float]:
    """Per instance crossing a slow pair of ``links``: the factor (≤ 1) that brings its transfer
    to its class's median among the instances crossing no slow pair — the what-if's "slow links
    like the others" (never slower than measured)."""
    slow = {(str(r.host_a), str(r.host_b)) for r in links.itertuples() if bool(r.is_slow)}
    if not slow:
        return {}
    out: dict[int, float] = {}
    for _, cls in inst[inst["n_hosts"] >= 2].groupby(CLASS_COLUMNS, sort=False):
        sets = cls["hosts"].tolist()
        crosses = {hs: any(p in slow for p in itertools.combinations(hs, 2)) for hs in set(sets)}
        hit = np.fromiter((crosses[hs] for hs in sets), bool, len(sets))
        if not hit.any() or hit.all():
            continue
        typical = float(np.median(cls["transfer_ns"].to_numpy(np.int64)[~hit]))
        for coll, t in zip(cls["coll"].to_numpy()[hit], cls["transfer_ns"].to_numpy()[hit],
                           strict=True):  # fmt: skip
            out[int(coll)] = min(1.0, typical / float(t)) if t > 0 else 1.0
    return out


def link_scenario(factors: Mapping[int, float]) -> Scenario:
    """The what-if's ``whatif_scenarios.SLOW_LINKS_LIKE_OTHERS``: each transfer edge of a collective in ``factors`` (its
    id → a factor ≤ 1, :func:`link_fix_factors`) scaled by it."""
    from rankscope.analysis.compute.whatif_graph import TRANSFER, Model
    from rankscope.analysis.compute.whatif_scenarios import SLOW_LINKS_LIKE_OTHERS, Scenario

    def weights(m: Model) -> np.ndarray:
        e = m.edges
        w = e["w_ns"].to_numpy(np.int64).copy()
        coll = m.nodes["coll"].to_numpy(np.int64)[e["dst"].to_numpy(np.int64)]
        ids = np.fromiter(factors.keys(), np.int64, len(factors))
        scale = np.fromiter(factors.values(), np.float64, len(factors))
        order = np.argsort(ids)
        ids, scale = ids[order], scale[order]
        if not len(ids):
            return w
        pos = np.clip(np.searchsorted(ids, coll), 0, len(ids) - 1)
        hit = (e["kind"].to_numpy() == TRANSFER) & (w > 0) & (ids[pos] == coll)
        w[hit] = np.round(w[hit] * scale[pos[hit]]).astype(np.int64)
        return w

    return Scenario(SLOW_LINKS_LIKE_OTHERS, weights)


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The value below which half the weight lies (the lower one at an exact half)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2.0)])


#: Cause of a slow-link finding.
LINK_CAUSE = "link"


def link_headline(pairs: list[tuple[str, str]]) -> str:
    """'Slow link: A ↔ B', or for pairs the job cannot tell apart 'Slow link among A, B, C'."""
    if len(pairs) == 1:
        return f"Slow link: {pairs[0][0]} ↔ {pairs[0][1]}"
    return "Slow link among " + ", ".join(sorted({h for p in pairs for h in p}))


def link_evidence(row: Mapping[str, float | str | int | bool], pairs: int = 1) -> str:
    """The evidence sentence of one group of slow pairs (its slowest row of :func:`link_table`;
    ``pairs``: how many pairs the job cannot tell apart)."""
    which = (
        f"; which of these {pairs} host pairs it is, this job cannot tell (every transfer that "
        "crosses one of them spans them all)"
        if pairs > 1
        else ""
    )
    return (
        f"{int(row['instances'])} transfers crossing it take {float(row['slowdown']):.1f}× as "
        f"long as the same transfers (op, size, members, hosts spanned) between other hosts: "
        f"median {float(row['transfer_ms']):.3f} ms vs {float(row['typical_ms']):.3f} ms, "
        f"{float(row['extra_s']) * 1e3:.1f} ms more in all (summed over those transfers), "
        "counted after the last rank arrived: the bytes move slowly, nobody waits for a rank"
        f"{which}; check the hosts' NICs, cables and switch path"
    )
