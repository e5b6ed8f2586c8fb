"""Pure analyses of a memory table at its peaks: per device and per step, across ranks, and
what holds the memory there.

:func:`peaks` and :func:`step_peaks` (per (rank, device), and per step), :func:`imbalance` (a
rank's peak against the other ranks'), :func:`holders_at_peak` (the live allocations at the
peak, by op and scope), :func:`headroom` (peak reserved against the GPU's total memory). Each is
a pure function from frames (``memory_events.MEMORY_COLUMNS`` rows, or :func:`peaks`' rows) to a
frame; ``memory.py`` puts them together per rank and across ranks for the pipeline.

Why a module apart from ``memory.py``: these are the analyses proper, which the leak test
(``memory_leaks.py``) builds on and the pipeline's halves in ``memory.py`` assemble; apart, each
reads on its own and none of them grows past 500 lines.

Units: bytes (int64) and ns (int64); ``MiB`` in words means 2**20 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.store.memory_table import DEVICE_KEY, DeviceType, assign_steps

#: :func:`imbalance`: a rank's peak must exceed the other ranks' median by this share of it...
IMBALANCE_MIN_SHARE = 0.10
#: ...by at least this much (a difference below 1 MiB never matters)...
IMBALANCE_MIN_BYTES = 2**20
#: ...and by this many robust standard deviations (1.4826 x MAD) of the other ranks' peaks.
IMBALANCE_Z = 3.5
#: :func:`headroom`: reserved memory above this share of the GPU's total memory is low headroom.
HEADROOM_LOW_SHARE = 0.10


# -- peaks per device and per step --------------------------------------------------------------


def _in_order(mem: pd.DataFrame) -> pd.DataFrame:
    """Events per device in time order (ties keep their order), with a running ``order``."""
    out = mem.sort_values([*DEVICE_KEY, "ts"], kind="stable", ignore_index=True)
    out["order"] = np.arange(len(out), dtype=np.int64)
    return out


def peaks(mem: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Peak allocated and peak reserved of every (rank, device), with where they happened.

    Columns: rank, device_type, device_id, events, peak_allocated (the maximum ``Total
    Allocated`` of the device's events: exact), peak_allocated_ts, peak_allocated_step,
    peak_allocated_window, peak_reserved, peak_reserved_ts, peak_reserved_step (the first event
    reaching each maximum). ``steps`` (``Store.steps()``) re-assigns events to steps when given.
    """
    cols = [
        *DEVICE_KEY,
        "events",
        "peak_allocated",
        "peak_allocated_ts",
        "peak_allocated_step",
        "peak_allocated_window",
        "peak_reserved",
        "peak_reserved_ts",
        "peak_reserved_step",
    ]
    if not len(mem):
        return pd.DataFrame({c: pd.Series([], dtype="int64") for c in cols})
    if steps is not None:
        mem = assign_steps(mem, steps)
    m = _in_order(mem)
    g = m.groupby(DEVICE_KEY, sort=True)
    a = m.loc[g["total_allocated"].idxmax()]
    r = m.loc[g["total_reserved"].idxmax()]
    out = pd.DataFrame(
        {
            "rank": a["rank"].to_numpy(np.int32),
            "device_type": a["device_type"].to_numpy(np.int8),
            "device_id": a["device_id"].to_numpy(np.int16),
            "events": g.size().to_numpy(np.int64),
            "peak_allocated": a["total_allocated"].to_numpy(np.int64),
            "peak_allocated_ts": a["ts"].to_numpy(np.int64),
            "peak_allocated_step": a["step"].to_numpy(np.int32),
            "peak_allocated_window": a["window"].to_numpy(np.int16),
            "peak_reserved": r["total_reserved"].to_numpy(np.int64),
            "peak_reserved_ts": r["ts"].to_numpy(np.int64),
            "peak_reserved_step": r["step"].to_numpy(np.int32),
        }
    )
    return out[cols]


def step_peaks(mem: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, device, step): peak allocated and reserved, when, and allocated at step start.

    Columns: rank, device_type, device_id, step, window, events, start_allocated (``Total
    Allocated`` just before the step's first event: its value minus the event's bytes),
    peak_allocated, peak_allocated_ts, peak_reserved. Events outside any step are left out.
    """
    m = _in_order(mem[mem["step"] >= 0])
    key = [*DEVICE_KEY, "step", "window"]
    cols = [*key, "events", "start_allocated", "peak_allocated", "peak_allocated_ts"]
    cols.append("peak_reserved")
    if not len(m):
        return pd.DataFrame({c: pd.Series([], dtype="int64") for c in cols})
    g = m.groupby(key, sort=True)
    first = m.loc[g["order"].idxmin()]
    top = m.loc[g["total_allocated"].idxmax()]
    out = first[key].reset_index(drop=True)
    out["events"] = g.size().to_numpy(np.int64)
    out["start_allocated"] = (first["total_allocated"] - first["bytes"]).to_numpy(np.int64)
    out["peak_allocated"] = top["total_allocated"].to_numpy(np.int64)
    out["peak_allocated_ts"] = top["ts"].to_numpy(np.int64)
    out["peak_reserved"] = g["total_reserved"].max().to_numpy(np.int64)
    return out[cols]


# -- imbalance: a rank's peak against the other ranks' ---------------------------------------


def imbalance(
    peak_rows: pd.DataFrame,
    *,
    min_share: float = IMBALANCE_MIN_SHARE,
    min_bytes: int = IMBALANCE_MIN_BYTES,
    z: float = IMBALANCE_Z,
) -> pd.DataFrame:
    """Ranks whose peak allocated is well above the other ranks' on the same kind of device.

    Each rank is compared with the median of the OTHER ranks (same device type): a rank is never
    its own baseline, and one high rank (a leaker) does not drag the baseline of another up as it
    would drag the median of all (4 ranks: the median of all is the mean of the middle two). The
    spread is 1.4826 x MAD of the other ranks (a normal σ when they are normal; unmoved by a few
    outliers). Imbalanced: excess > ``z`` spreads (Iglewicz–Hoaglin's 3.5: not noise) AND excess
    ≥ ``min_share`` of the median AND ≥ ``min_bytes`` (material: with equal ranks the MAD is 0
    and any byte would count).

    Columns: rank, device_type, device_id, peak_allocated, median_others, excess_bytes,
    excess_share (of median_others), robust_z (inf when the others agree exactly),
    is_imbalanced. Needs 2 ranks or more of a device type (none otherwise).
    """
    cols = [*DEVICE_KEY, "peak_allocated", "median_others", "excess_bytes", "excess_share"]
    cols += ["robust_z", "is_imbalanced"]
    rows = []
    for _dtype, g in peak_rows.groupby("device_type", sort=True):
        # one value per rank: the largest device of that type on the rank
        per_rank = g.sort_values("peak_allocated").drop_duplicates("rank", keep="last")
        values = per_rank["peak_allocated"].to_numpy(np.float64)
        if len(values) < 2:
            continue
        for i, row in enumerate(per_rank.itertuples(index=False)):
            others = np.delete(values, i)
            med = float(np.median(others))
            spread = 1.4826 * float(np.median(np.abs(others - med)))
            excess = float(row.peak_allocated) - med
            if spread > 0:
                rz = excess / spread
            else:
                rz = math.inf if excess > 0 else (-math.inf if excess < 0 else 0.0)
            share = excess / med if med > 0 else (math.inf if excess > 0 else 0.0)
            flagged = rz > z and share >= min_share and excess >= min_bytes
            rows.append(
                (
                    row.rank,
                    row.device_type,
                    row.device_id,
                    int(row.peak_allocated),
                    med,
                    excess,
                    share,
                    rz,
                    bool(flagged),
                )
            )
    return pd.DataFrame(rows, columns=cols)


# -- what holds the memory at the peak --------------------------------------------------------


def holders_at_peak(mem: pd.DataFrame, peak_rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """The live allocations at each device's peak, grouped by the op (and scope) that made them.

    The peak instant is the first event of the device reaching its maximum ``Total Allocated``
    (:func:`peaks`). Live: an allocation in the peak's window, at or before the peak event, with
    no later event at the same address up to the peak (a free, or a new allocation there: its
    free was not seen). Allocations of earlier windows are not counted (their frees may have
    fallen between windows); frees without an allocation are ignored.

    Columns: rank, device_type, device_id, op, scope, bytes, allocations, share (of the peak's
    ``Total Allocated``; the live bytes seen when larger, so shares sum to ≤ 1), peak_allocated.
    One more row per device with op ``""`` and scope ``"(not seen allocated)"`` holds what the
    counter has but no seen allocation explains (allocated before the window). Largest first.
    """
    cols = [*DEVICE_KEY, "op", "scope", "bytes", "allocations", "share", "peak_allocated"]
    if not len(mem):
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
    pk = peaks(mem) if peak_rows is None else peak_rows
    m = _in_order(mem)
    out = []
    for (rank, dtype, did), d in m.groupby(DEVICE_KEY, sort=True):
        p = pk[(pk["rank"] == rank) & (pk["device_type"] == dtype) & (pk["device_id"] == did)]
        if not len(p):
            continue
        peak_ts = int(p["peak_allocated_ts"].iloc[0])
        peak_val = int(p["peak_allocated"].iloc[0])
        hit = d[(d["ts"] == peak_ts) & (d["total_allocated"] == peak_val)]
        if not len(hit):
            continue
        peak_order = int(hit["order"].iloc[0])
        window = int(hit["window"].iloc[0])
        w = d[(d["window"] == window) & (d["order"] <= peak_order)]
        last = w.groupby("addr", sort=False)["order"].transform("max")
        live = w[(w["bytes"] > 0) & (w["order"] == last)]
        seen = int(live["bytes"].sum())
        total = max(peak_val, seen, 1)
        g = (
            live.groupby(["op", "scope"], observed=True, sort=False)["bytes"]
            .agg(["sum", "size"])
            .reset_index()
        )
        for row in g.itertuples(index=False):
            nbytes, count = int(row[2]), int(row[3])
            share = nbytes / total
            out.append(
                (rank, dtype, did, str(row.op), str(row.scope), nbytes, count, share, peak_val)
            )
        rest = peak_val - seen
        if rest > 0:
            out.append(
                (rank, dtype, did, "", "(not seen allocated)", rest, 0, rest / total, peak_val)
            )
    res = pd.DataFrame(out, columns=cols)
    return res.sort_values([*DEVICE_KEY, "bytes"], ascending=[True, True, True, False]).reset_index(
        drop=True
    )


# -- headroom ----------------------------------------------------------------------------------


def headroom(
    peak_rows: pd.DataFrame,
    device_total_bytes: Mapping[tuple[int, int], int] | Mapping[int, int],
    *,
    low_share: float = HEADROOM_LOW_SHARE,
) -> pd.DataFrame:
    """Peak reserved memory of every GPU against its total memory.

    ``device_total_bytes``: ``(rank, device_id) → bytes`` or ``device_id → bytes`` (all ranks
    alike), e.g. from :func:`~rankscope.analysis.store.memory_table.device_total_memory`. Reserved,
    not allocated: the caching allocator's reserve is what the device has given away. Low: less
    than ``low_share`` of the device left at the peak. GPUs without a known total are left out;
    CPU devices have no headroom here (the host's memory is shared with everything else on it).

    Columns: rank, device_type, device_id, peak_reserved, total_bytes, headroom_bytes,
    headroom_share, is_low.
    """
    cols = [*DEVICE_KEY, "peak_reserved", "total_bytes", "headroom_bytes", "headroom_share"]
    cols.append("is_low")
    rows = []
    gpus = peak_rows[peak_rows["device_type"] == DeviceType.CUDA]
    totals: Mapping[Any, int] = device_total_bytes
    for row in gpus.itertuples(index=False):
        total = totals.get((int(row.rank), int(row.device_id)), totals.get(int(row.device_id)))
        if not total:
            continue
        left = int(total) - int(row.peak_reserved)
        share = left / int(total)
        low = bool(share < low_share)
        reserved = int(row.peak_reserved)
        rows.append(
            (row.rank, row.device_type, row.device_id, reserved, int(total), left, share, low)
        )
    return pd.DataFrame(rows, columns=cols)
