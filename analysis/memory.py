"""Memory across ranks: torch.profiler's ``[memory]`` events as a table, and pure analyses of it.

``rankscope run --profile-memory`` makes every rank's profiler record one instant event per
allocation and per free (Kineto ``"ph": "i"``, ``"name": "[memory]"``, ``cat``
``cpu_instant_event``), with ``args``: ``Device Type`` (c10::DeviceType: 0 CPU, 1 CUDA),
``Device Id`` (-1 for CPU), ``Addr`` (the block's address), ``Bytes`` (negative for a free),
``Total Allocated`` and ``Total Reserved`` (the allocator's counters just after the event).

:func:`memory_rows` turns one decoded trace (its event list) into rows of :data:`MEMORY_COLUMNS`,
skipping and counting malformed events. The analyses are pure functions from such a frame to
frames: :func:`peaks`, :func:`step_peaks`, :func:`leaks`, :func:`imbalance`,
:func:`holders_at_peak`, :func:`headroom`. :func:`rankscope.analysis.memory_findings.memory_findings`
words their conclusions.

What the counters mean (measured on torch 2.x; it decides how the analyses read them):

* **CUDA**: ``Total Allocated`` / ``Total Reserved`` are the caching allocator's device-wide
  statistics, true whether or not the profiler saw the allocations: comparable across steps and
  windows.
* **CPU**: the CPU allocator counts only blocks it saw allocated while memory profiling was on;
  blocks from before, and frees that happen between profiler windows, are never subtracted. The
  counter therefore restarts near 0 in the first window, drifts between windows, and the first
  step of each window differs from the rest (it replaces blocks from before the window by
  counted ones). ``Total Reserved`` is 0. :func:`leaks` compares CPU steps only within a window
  and leaves out each window's first step.
* Traces are exported per profiler window: a block allocated before its window shows only its
  free, or nothing. Such frees are not an error; :func:`holders_at_peak` counts only the
  allocations it saw in the peak's window and reports the rest as unattributed.

Units: bytes (int64) and ns (int64); ``MiB`` in words means 2**20 bytes.

Why one module of ~940 lines: the extraction rule the decoder shares and the pure memory
analyses with their per-rank and cross-rank halves read together; the renderings live in
report_memory.py.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeGuard

import numpy as np
import pandas as pd

#: Columns of the memory table (one row per ``[memory]`` event), in order, with their dtypes.
MEMORY_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "ts": "int64",  # ns; the aligned clock in the store (memory_rows: the rank's raw clock)
    "device_type": "int8",  # DeviceType (c10::DeviceType value as written)
    "device_id": "int16",  # device index (CUDA: local GPU index, matches deviceProperties id); -1 CPU
    "addr": "uint64",  # address of the block (matches an allocation with its free)
    "bytes": "int64",  # > 0 allocation, < 0 free, bytes
    "total_allocated": "int64",  # allocator's allocated bytes just after the event
    "total_reserved": "int64",  # allocator's reserved bytes just after the event (CPU: 0)
    "op": "str",  # the op that asked for the memory (see memory_rows), "" when none
    "scope": "str",  # innermost record_function range around it (not ProfilerStep), or ""
    "step": "int32",  # ProfilerStep number the event falls in, -1 outside any
    "window": "int16",  # profiler window (trace file) of the event
}

#: A device is (device_type, device_id); every per-rank result is keyed by these three columns.
DEVICE_KEY = ["rank", "device_type", "device_id"]

#: The message of a store without memory events (renderers show it instead of zeros).
NO_MEMORY_EVENTS = "no memory events (run with --profile-memory)"

#: Ops that only provide memory for the op around them: an allocation is credited to the
#: innermost enclosing op that is NOT one of these (``aten::ones`` → ``aten::empty``: aten::ones).
ALLOCATION_OPS = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::resize_",
    }
)

#: Family-wise false-positive rate of :func:`leaks` over all (rank, device) series of one analysis.
LEAK_ALPHA = 0.01
#: A significant slope is a leak when it would add the device's peak within this many steps.
LEAK_MATERIAL_STEPS = 1000
#: :func:`imbalance`: a rank's peak must exceed the other ranks' median by this share of it...
IMBALANCE_MIN_SHARE = 0.10
#: ...by at least this much (a difference below 1 MiB never matters)...
IMBALANCE_MIN_BYTES = 2**20
#: ...and by this many robust standard deviations (1.4826 x MAD) of the other ranks' peaks.
IMBALANCE_Z = 3.5
#: :func:`headroom`: reserved memory above this share of the GPU's total memory is low headroom.
HEADROOM_LOW_SHARE = 0.10


class DeviceType(enum.IntEnum):
    """``Device Type`` of a memory event: c10::DeviceType values (others are kept as written)."""

    CPU = 0
    CUDA = 1


def device_name(device_type: int, device_id: int) -> str:
    """``cpu`` or ``cuda:3`` (``type7:0`` for a device type without a name here)."""
    if device_type == DeviceType.CPU:
        return "cpu"
    label = "cuda" if device_type == DeviceType.CUDA else f"type{device_type}"
    return f"{label}:{device_id}"


def empty_memory() -> pd.DataFrame:
    """A memory table without rows, with the dtypes of :data:`MEMORY_COLUMNS`."""
    return pd.DataFrame({c: pd.Series([], dtype=d) for c, d in MEMORY_COLUMNS.items()})


# -- from a decoded trace ----------------------------------------------------------------------


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` for a mapping, else the attribute (msgspec structs); None when absent."""
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float | Decimal)) and math.isfinite(v)


#: args key → column; a memory event with a field missing or out of range is skipped, counted.
_ARG_FIELDS: tuple[tuple[str, str], ...] = (
    ("Device Type", "device_type"),
    ("Device Id", "device_id"),
    ("Addr", "addr"),
    ("Bytes", "bytes"),
    ("Total Allocated", "total_allocated"),
    ("Total Reserved", "total_reserved"),
)
#: The ``args`` keys of a memory event, in the order :func:`bad_memory_field` takes their values.
ARG_KEYS: tuple[str, ...] = tuple(key for key, _ in _ARG_FIELDS)
_LIMITS = {
    "device_type": (-128, 127),
    "device_id": (-1, 2**15 - 1),
    "addr": (0, 2**64 - 1),
    "bytes": (-(2**63), 2**63 - 1),
    "total_allocated": (0, 2**63 - 1),
    "total_reserved": (0, 2**63 - 1),
}


def _us_to_ns(us: float | int | Decimal) -> int:
    """Kineto µs (≤ 3 decimals) → int ns, exact for integers and for decimals below 2**43 µs."""
    if isinstance(us, int):
        return us * 1000
    if isinstance(us, Decimal):
        return int((us * 1000).to_integral_value())
    whole = math.floor(us)
    return int(whole) * 1000 + round((us - whole) * 1000)


def memory_field_limits() -> dict[str, tuple[int, int]]:
    """Inclusive (low, high) of each integer column of a memory event (a copy)."""
    return dict(_LIMITS)


def bad_memory_field(ts: Any, values: Sequence[Any] | None) -> str:
    """The first missing or wrong-typed field of a memory event (``"ts"``, ``"args"``, or an
    ``args`` key such as ``"Addr"``), ``""`` when it is well formed. ``values``: the six ``args``
    values in the order of :data:`ARG_KEYS` (None when ``args`` is not an object)."""
    if not _is_number(ts):
        return "ts"
    if values is None:
        return "args"
    for (key, col), v in zip(_ARG_FIELDS, values, strict=True):
        lo, hi = _LIMITS[col]
        if not _is_int(v) or not lo <= v <= hi:
            return key
    return ""


def skip_reason(bad: str) -> str:
    """Why a memory event was skipped (the key of :func:`memory_rows`' count and the problem)."""
    return f"memory event: missing or bad {bad!r}"


def attribute(
    ts: np.ndarray,
    threads: list[Any],
    ranges: Mapping[Any, list[tuple[int, int, str, bool]]],
    steps: list[tuple[int, int, int]],
) -> tuple[list[str], list[str], np.ndarray]:
    """(op, scope, step) of memory events at ``ts`` (ns) on ``threads``: the rule of
    :func:`memory_rows`, shared with the merge's decoder (which builds ``ranges`` — per thread,
    (start, end, name, is_user_annotation) of the cpu_op / user_annotation ranges other than
    ProfilerStep — and ``steps`` — (start, end, number) of ProfilerStep ranges — from its
    columns)."""
    ops, scopes = _enclosing(ts, threads, ranges)
    return ops, scopes, _step_of(ts, steps)


def memory_rows(
    events: Iterable[Any], *, rank: int, window: int = 0, base_ns: int = 0
) -> tuple[pd.DataFrame, dict[str, int]]:
    """The ``[memory]`` events of one trace as rows of :data:`MEMORY_COLUMNS`, and what was skipped.

    ``events``: the trace's ``traceEvents``, as decoded JSON dicts or objects with the same
    attributes (``ph name cat tid ts dur args``; ``args`` a mapping). ``ts`` becomes
    ``base_ns + ts µs`` in ns (the trace's ``baseTimeNanoseconds``; the store then adds the rank's
    clock offset). Pure: nothing is read or written.

    A memory event with a missing or wrong-typed field (``ts``, any of the six ``args``) is
    skipped and counted under ``"memory event: bad 'Addr'"`` etc. in the returned dict; never an
    exception. ``op`` is the innermost complete (``ph`` X) op or record_function range on the
    event's thread that contains it, passing over :data:`ALLOCATION_OPS` and ``ProfilerStep#N``
    (so ``torch.ones`` gives ``aten::ones``); ``scope`` the innermost user annotation around it
    other than ``ProfilerStep#N``; ``step`` the ``ProfilerStep#N`` range containing it (any
    thread).
    """
    skipped: dict[str, int] = {}
    rows: list[tuple[Any, ...]] = []
    ranges: dict[Any, list[tuple[int, int, str, bool]]] = {}
    steps: list[tuple[int, int, int]] = []
    for ev in events:
        name = _get(ev, "name")
        ph = _get(ev, "ph")
        if name == "[memory]" and ph in ("i", "I"):
            ts = _get(ev, "ts")
            args = _get(ev, "args")
            values = (
                [args.get(key) for key, _ in _ARG_FIELDS] if isinstance(args, Mapping) else None
            )
            bad = bad_memory_field(ts, values)
            if bad:
                reason = skip_reason(bad)
                skipped[reason] = skipped.get(reason, 0) + 1
                continue
            assert values is not None
            tid = _get(ev, "tid")
            rows.append((base_ns + _us_to_ns(ts), tid, *values))
        elif ph == "X" and isinstance(name, str):
            ts, dur = _get(ev, "ts"), _get(ev, "dur")
            if not (_is_number(ts) and _is_number(dur) and dur >= 0):
                continue  # not ours to judge: the merge drops and counts these
            start = base_ns + _us_to_ns(ts)
            end = start + _us_to_ns(dur)
            cat = _get(ev, "cat")
            if name.startswith("ProfilerStep#"):
                number = name[len("ProfilerStep#") :]
                if number.isdigit():
                    steps.append((start, end, int(number)))
                continue
            if cat in ("cpu_op", "operator", "user_annotation"):
                ranges.setdefault(_get(ev, "tid"), []).append(
                    (start, end, name, cat == "user_annotation")
                )
    if not rows:
        return empty_memory(), skipped
    cols = list(zip(*rows, strict=True))
    ts_arr = np.asarray(cols[0], dtype=np.int64)
    tids = list(cols[1])
    ops, scopes = _enclosing(ts_arr, tids, ranges)
    frame = pd.DataFrame(
        {
            "rank": np.full(len(rows), rank, np.int32),
            "ts": ts_arr,
            "device_type": np.asarray(cols[2], np.int8),
            "device_id": np.asarray(cols[3], np.int16),
            "addr": np.asarray(cols[4], np.uint64),
            "bytes": np.asarray(cols[5], np.int64),
            "total_allocated": np.asarray(cols[6], np.int64),
            "total_reserved": np.asarray(cols[7], np.int64),
            "op": pd.Series(ops, dtype="str"),
            "scope": pd.Series(scopes, dtype="str"),
            "step": _step_of(ts_arr, steps),
            "window": np.full(len(rows), window, np.int16),
        }
    )
    # stable: events with equal stamps keep the order the allocator reported them in
    return frame.sort_values("ts", kind="stable", ignore_index=True), skipped


def _enclosing(
    ts: np.ndarray, tids: list[Any], ranges: Mapping[Any, list[tuple[int, int, str, bool]]]
) -> tuple[list[str], list[str]]:
    """(op, scope) of each memory event: a sweep over each thread's properly nested ranges.

    One pass per thread: ranges are pushed as the sweep passes their start and popped once
    ended; the open ones are read from the innermost out, stopping at the first op that is not
    a pure allocation op and the first user range (a trace can hold 10^5 memory events).
    """
    ops = [""] * len(ts)
    scopes = [""] * len(ts)
    stamps = ts.tolist()
    by_tid: dict[Any, list[int]] = {}
    for i, tid in enumerate(tids):
        by_tid.setdefault(tid, []).append(i)
    alloc = ALLOCATION_OPS
    for tid, idx in by_tid.items():
        spans = sorted(ranges.get(tid, []), key=lambda r: (r[0], -r[1]))
        n_spans = len(spans)
        idx.sort(key=stamps.__getitem__)
        stack: list[tuple[int, int, str, bool]] = []
        j = 0
        for i in idx:
            t = stamps[i]
            while j < n_spans and spans[j][0] <= t:
                span = spans[j]
                while stack and stack[-1][1] < span[0]:
                    stack.pop()
                stack.append(span)
                j += 1
            while stack and stack[-1][1] < t:
                stack.pop()
            op = scope = innermost = ""
            for start_end_name_user in reversed(stack):
                if start_end_name_user[1] < t:  # not nested: an ended range under an open one
                    continue
                name = start_end_name_user[2]
                if not innermost:
                    innermost = name
                if not op and name not in alloc:
                    op = name
                if not scope and start_end_name_user[3]:
                    scope = name
                if op and scope:
                    break
            ops[i] = op or innermost
            scopes[i] = scope
    return ops, scopes


def _step_of(ts: np.ndarray, steps: list[tuple[int, int, int]]) -> np.ndarray:
    """ProfilerStep number containing each stamp (start ≤ t < end), -1 outside every step."""
    out = np.full(len(ts), -1, np.int32)
    if not steps:
        return out
    steps = sorted(steps)
    starts = np.array([s[0] for s in steps], np.int64)
    ends = np.array([s[1] for s in steps], np.int64)
    numbers = np.array([s[2] for s in steps], np.int32)
    k = np.searchsorted(starts, ts, side="right") - 1
    ok = (k >= 0) & (ts < ends[np.maximum(k, 0)])
    out[ok] = numbers[k[ok]]
    return out


def assign_steps(mem: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``mem`` with ``step`` taken from a steps table (``Store.steps()``: rank, step, start, end,
    aligned ns) instead of the trace's own ranges; a copy."""
    out = mem.copy()
    step = np.full(len(out), -1, np.int32)
    for rank, idx in out.groupby("rank", sort=False).indices.items():
        s = steps[steps["rank"] == rank]
        spans = list(
            zip(
                s["start"].astype(int).tolist(),
                s["end"].astype(int).tolist(),
                s["step"].astype(int).tolist(),
                strict=True,
            )
        )
        step[idx] = _step_of(out["ts"].to_numpy(np.int64)[idx], spans)
    out["step"] = step
    return out


def device_total_memory(device_properties: Any) -> dict[int, int]:
    """GPU index → total bytes from a trace's ``deviceProperties`` (``id``, ``totalGlobalMem``);
    entries with missing or wrong-typed fields are left out (a CPU trace has ``[]``)."""
    out: dict[int, int] = {}
    if not isinstance(device_properties, list):
        return out
    for d in device_properties:
        if isinstance(d, Mapping):
            i, total = d.get("id"), d.get("totalGlobalMem")
            if _is_int(i) and _is_int(total) and total > 0:
                out[i] = total
    return out


# -- analyses -----------------------------------------------------------------------------------


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


# -- leak: a regression of allocated-at-step-start on the step number --------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (no scipy at run time)."""
    if math.isnan(t) or not df > 0:
        return math.nan
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t > 0 else 1.0 - tail


def slope_test(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> tuple[float, float, int, float]:
    """OLS slope of ``y`` on ``x`` with one intercept per group: (slope, standard error, degrees
    of freedom, one-sided p-value of "slope > 0"). Too few points: (nan, nan, 0, nan).

    Within-group demeaning gives the fixed-effects slope; ``df = n - groups - 1``. With
    residuals exactly 0 (the usual case of a deterministic training loop) the slope is known
    exactly: p is 0 for a positive slope, 1 otherwise.
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    g = pd.Series(groups)
    xd = x - pd.Series(x).groupby(g).transform("mean").to_numpy()
    yd = y - pd.Series(y).groupby(g).transform("mean").to_numpy()
    sxx = float(np.dot(xd, xd))
    df = len(x) - int(g.nunique()) - 1
    if sxx <= 0 or df < 1:
        return math.nan, math.nan, max(df, 0), math.nan
    slope = float(np.dot(xd, yd)) / sxx
    resid = yd - slope * xd
    sse = float(np.dot(resid, resid))
    # exact zeros come out of float arithmetic as ~1e-9 of the values: relative to y's scale
    scale = float(np.dot(yd, yd))
    if sse <= 1e-20 * max(scale, 1.0):
        return slope, 0.0, df, (0.0 if slope > 0 else 1.0)
    se = math.sqrt(sse / df / sxx)
    return slope, se, df, t_sf(slope / se, df)


def leaks(
    mem: pd.DataFrame,
    *,
    alpha: float = LEAK_ALPHA,
    material_steps: int = LEAK_MATERIAL_STEPS,
) -> pd.DataFrame:
    """Is allocated memory at step start growing, per (rank, device)?

    The measure is ``start_allocated`` of :func:`step_peaks` (the counter just before each
    step's first memory event: the same point of every step), regressed on the step number by
    least squares. CUDA counters are absolute: one intercept for the whole run. CPU counters are
    comparable only within a profiler window and settle after its first step (module
    docstring): one intercept per window, each window's first step left out.

    Statistic: the one-sided t-test of "slope > 0" (:func:`slope_test`). Under no leak, with
    step-to-step noise that is independent and roughly normal, the p-value is uniform, so the
    false-positive rate is what we choose: ``alpha`` family-wise, split evenly over the series
    tested (Bonferroni), so that a 512-rank job is not expected to show a false leak more often
    than a 2-rank one. Unlike a rank statistic (Mann–Kendall, Theil–Sen) it needs no special
    case for the ties that dominate here (most loops return to exactly the same value), and a
    perfectly linear growth is certain, not "as significant as n points allow".

    A significant slope is a leak only when it is material: at that rate the device's peak
    would be allocated again within ``material_steps`` steps (a training run takes thousands),
    i.e. ``slope ≥ peak_allocated / material_steps``. Slow growth — a cache filling up — is
    reported (slope, p) but not called a leak.

    Columns: rank, device_type, device_id, steps (points used), slope_bytes_per_step, slope_se,
    df, p_value, peak_allocated, material (bool), significant (bool), is_leak (bool), reason
    ("", "too few steps", "not significant", "not material").
    """
    return judge_leaks(leak_tests(mem), alpha=alpha, material_steps=material_steps)


#: Columns of :func:`leak_tests` (one device's regression; :func:`judge_leaks` adds the rest).
LEAK_TEST_COLUMNS = [*DEVICE_KEY, "steps", "slope_bytes_per_step", "slope_se", "df", "p_value"]
LEAK_TEST_COLUMNS.append("peak_allocated")


def leak_tests(mem: pd.DataFrame) -> pd.DataFrame:
    """The per-device half of :func:`leaks` (runs per rank): the slope test of each device,
    without the decision, which needs the number of series tested across all ranks."""
    sp = step_peaks(mem)
    if not len(sp):
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in LEAK_TEST_COLUMNS})
    pk = peaks(mem).set_index(DEVICE_KEY)["peak_allocated"]
    rows = []
    for key, s in sp.groupby(DEVICE_KEY, sort=True):
        s = s.sort_values("step")
        if int(key[1]) == DeviceType.CUDA:
            groups = np.zeros(len(s), np.int64)
        else:
            first = s.groupby("window")["step"].transform("min")
            s = s[s["step"] > first]
            groups = s["window"].to_numpy(np.int64)
        slope, se, df, p = slope_test(
            s["step"].to_numpy(np.float64), s["start_allocated"].to_numpy(np.float64), groups
        )
        rows.append((*key, len(s), slope, se, df, p, int(pk.loc[key])))
    return pd.DataFrame(rows, columns=LEAK_TEST_COLUMNS)


def judge_leaks(
    tests: pd.DataFrame,
    *,
    alpha: float = LEAK_ALPHA,
    material_steps: int = LEAK_MATERIAL_STEPS,
) -> pd.DataFrame:
    """The cross-rank half of :func:`leaks`: :func:`leak_tests` of every rank, concatenated,
    judged at ``alpha`` split over the series tested, and for materiality."""
    cols = [*LEAK_TEST_COLUMNS[:-1], "peak_allocated", "material", "significant", "is_leak"]
    cols.append("reason")
    if not len(tests):
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})
    out = tests.sort_values(DEVICE_KEY, ignore_index=True)
    tested = int(out["p_value"].notna().sum())
    level = alpha / max(tested, 1)
    out["material"] = out["slope_bytes_per_step"].fillna(0) * material_steps >= out[
        "peak_allocated"
    ].clip(lower=1)
    out["significant"] = out["p_value"].fillna(1.0) < level
    out["is_leak"] = out["material"] & out["significant"]
    out["reason"] = np.select(
        [out["p_value"].isna(), ~out["significant"], ~out["material"]],
        ["too few steps", "not significant", "not material"],
        "",
    )
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
    alike), e.g. from :func:`device_total_memory`. Reserved, not allocated: the caching
    allocator's reserve is what the device has given away. Low: less than ``low_share`` of the
    device left at the peak. GPUs without a known total are left out; CPU devices have no
    headroom here (the host's memory is shared with everything else on it).

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


# -- over time, for the figures -----------------------------------------------------------------

#: Bins per (rank, device) of :func:`memory_series` (the HTML figure is ~700 px wide).
SERIES_BINS = 400
#: Columns of :func:`memory_series`.
SERIES_COLUMNS = [*DEVICE_KEY, "t_start", "t_end", "events", "allocated_min", "allocated_max"]
SERIES_COLUMNS += ["allocated_last", "reserved_max"]


def memory_series(mem: pd.DataFrame, bins: int = SERIES_BINS) -> pd.DataFrame:
    """Allocated and reserved memory over time per (rank, device), aggregated into at most
    ``bins`` equal time bins over the device's own span: each bin keeps the minimum, maximum and
    last ``Total Allocated`` of its events and the maximum ``Total Reserved`` (so the peak is
    never lost to the aggregation; bins without events are left out: the counter holds).

    Columns: rank, device_type, device_id, t_start, t_end (ns, the bin), events, allocated_min,
    allocated_max, allocated_last, reserved_max.
    """
    if not len(mem):
        return pd.DataFrame({c: pd.Series([], dtype="int64") for c in SERIES_COLUMNS})
    frames = []
    m = mem.sort_values([*DEVICE_KEY, "ts"], kind="stable", ignore_index=True)
    for key, d in m.groupby(DEVICE_KEY, sort=True):
        ts = d["ts"].to_numpy(np.int64)
        t0, t1 = int(ts[0]), int(ts[-1])
        width = max((t1 - t0) // bins + 1, 1)
        b = (ts - t0) // width
        g = d.assign(bin=b).groupby("bin", sort=True)
        out = pd.DataFrame(
            {
                "t_start": t0 + g.size().index.to_numpy(np.int64) * width,
                "events": g.size().to_numpy(np.int64),
                "allocated_min": g["total_allocated"].min().to_numpy(np.int64),
                "allocated_max": g["total_allocated"].max().to_numpy(np.int64),
                "allocated_last": g["total_allocated"].last().to_numpy(np.int64),
                "reserved_max": g["total_reserved"].max().to_numpy(np.int64),
            }
        )
        out["t_end"] = out["t_start"] + width
        for col, value in zip(DEVICE_KEY, key, strict=True):
            out[col] = value
        frames.append(out)
    res = pd.concat(frames, ignore_index=True)
    return res.astype({"rank": "int32", "device_type": "int8", "device_id": "int16"})[
        SERIES_COLUMNS
    ]


# -- one rank's share and the cross-rank rest (analysis.pipeline) -------------------------------


def _empty(columns: Iterable[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=object) for c in columns})


@dataclasses.dataclass
class MemoryAnalysis:
    """The memory results of one store (``Analysis.memory``); every frame empty without events."""

    peaks: pd.DataFrame
    """:func:`peaks` of every rank and device."""
    step_peaks: pd.DataFrame
    """:func:`step_peaks`."""
    leaks: pd.DataFrame
    """:func:`leaks`, the level split over the devices of ALL ranks."""
    imbalance: pd.DataFrame
    """:func:`imbalance` of the peaks."""
    holders: pd.DataFrame
    """:func:`holders_at_peak`."""
    headroom: pd.DataFrame
    """:func:`headroom` against each GPU's total memory (the trace's ``deviceProperties``)."""
    series: pd.DataFrame
    """:func:`memory_series`, for the figures."""
    requested: bool = False
    """The run was recorded with ``--profile-memory`` (run.json's profiler settings)."""

    @property
    def has_events(self) -> bool:
        """The store holds memory events."""
        return bool(len(self.peaks))

    @classmethod
    def empty(cls, requested: bool = False) -> MemoryAnalysis:
        """No memory events."""
        return cls(
            peaks=peaks(empty_memory()),
            step_peaks=step_peaks(empty_memory()),
            leaks=leaks(empty_memory()),
            imbalance=_empty([*DEVICE_KEY, "peak_allocated", "is_imbalanced"]),
            holders=holders_at_peak(empty_memory()),
            headroom=_empty([*DEVICE_KEY, "peak_reserved", "total_bytes", "is_low"]),
            series=memory_series(empty_memory()),
            requested=requested,
        )


def rank_memory(store: Any, rank: int) -> dict[str, Any] | None:
    """The per-rank memory work of ``pipeline.rank_task``: reads the rank's memory table from
    the open ``store`` once and returns its peaks, step peaks, leak regressions, holders at the
    peak, series and GPU totals (small frames); None when the rank has no memory events."""
    mem = store.memory(rank)
    if not len(mem):
        return None
    pk = peaks(mem)
    return {
        "peaks": pk,
        "step_peaks": step_peaks(mem),
        "leak_tests": leak_tests(mem),
        "holders": holders_at_peak(mem, pk),
        "series": memory_series(mem),
        "totals": {(int(rank), d): b for d, b in store.device_memory(rank).items()},
    }


def across_ranks(per_rank: Iterable[dict[str, Any] | None], *, requested: bool) -> MemoryAnalysis:
    """The cross-rank memory steps on :func:`rank_memory`'s results (any order): leaks judged
    over all series, imbalance of the peaks, headroom."""
    results = [r for r in per_rank if r is not None]
    if not results:
        return MemoryAnalysis.empty(requested)

    def cat(key: str) -> pd.DataFrame:
        frames = [r[key] for r in results if len(r[key])]
        if not frames:
            return results[0][key]
        return pd.concat(frames, ignore_index=True).sort_values(DEVICE_KEY, kind="stable")

    pk = cat("peaks").reset_index(drop=True)
    totals: dict[tuple[int, int], int] = {}
    for r in results:
        totals.update(r["totals"])
    return MemoryAnalysis(
        peaks=pk,
        step_peaks=cat("step_peaks").reset_index(drop=True),
        leaks=judge_leaks(cat("leak_tests")),
        imbalance=imbalance(pk),
        holders=cat("holders").reset_index(drop=True),
        headroom=headroom(pk, totals),
        series=cat("series").reset_index(drop=True),
        requested=requested,
    )


def requested_in(meta: Mapping[str, Any]) -> bool:
    """Whether a store's root attributes say the run profiled memory (run.json's
    ``profiler.profile_memory``; False for traces merged without a run directory)."""
    run = meta.get("run")
    profiler = run.get("profiler") if isinstance(run, Mapping) else None
    return bool(isinstance(profiler, Mapping) and profiler.get("profile_memory"))
