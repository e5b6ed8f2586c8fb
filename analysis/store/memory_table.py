"""The memory table and its extraction rule: torch.profiler's ``[memory]`` events as rows.

``rankscope run --profile-memory`` makes every rank's profiler record one instant event per
allocation and per free (Kineto ``"ph": "i"``, ``"name": "[memory]"``, ``cat``
``cpu_instant_event``), with ``args``: ``Device Type`` (c10::DeviceType: 0 CPU, 1 CUDA),
``Device Id`` (-1 for CPU), ``Addr`` (the block's address), ``Bytes`` (negative for a free),
``Total Allocated`` and ``Total Reserved`` (the allocator's counters just after the event).

:func:`memory_rows` turns one decoded trace (its event list) into rows of :data:`MEMORY_COLUMNS`,
skipping and counting malformed events; :func:`bad_memory_field`, :func:`innermost_open`,
:func:`step_of` and :func:`device_total_memory` are the same rule in pieces, for the merge's
columnar decoder (``orchestrator/ingest/event_columns.py``, ``memory_columns.py``).

Why a module apart from ``memory.py``: this is the ingest half (what a memory event is and
which op, scope and step it belongs to), which the decoder needs without the analyses; it stays
in ``analysis`` because the analyses and the store's reader use it too and ``analysis`` may not
import ``orchestrator``. The analyses of the table are in ``memory_peaks.py`` and
``memory_leaks.py``, what the counters mean in ``memory.py``'s docstring.

Units: bytes (int64) and ns (int64).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

if TYPE_CHECKING:  # the merge's reader uses this module without pandas (file_trace.py)
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
    from rankscope.analysis.store import frames

    return frames.empty(MEMORY_COLUMNS)


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
    :func:`memory_rows`, given ``ranges`` — per thread, (start, end, name, is_user_annotation)
    of the cpu_op / user_annotation ranges other than ProfilerStep — and ``steps`` — (start,
    end, number) of ProfilerStep ranges. (The merge's decoder holds its ranges as columns and
    calls :func:`innermost_open` and :func:`step_of` on them directly.)"""
    ops, scopes = _enclosing(ts, threads, ranges)
    return ops, scopes, step_of(ts, steps)


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
    import pandas as pd

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
            "step": step_of(ts_arr, steps),
            "window": np.full(len(rows), window, np.int16),
        }
    )
    # stable: events with equal stamps keep the order the allocator reported them in
    return frame.sort_values("ts", kind="stable", ignore_index=True), skipped


def _enclosing(
    ts: np.ndarray, tids: list[Any], ranges: Mapping[Any, list[tuple[int, int, str, bool]]]
) -> tuple[list[str], list[str]]:
    """(op, scope) of each memory event (:func:`innermost_open` on its thread's ranges)."""
    ops = np.full(len(ts), "", dtype=object)
    scopes = np.full(len(ts), "", dtype=object)
    stamps = np.asarray(ts, np.int64)
    by_tid: dict[Any, list[int]] = {}
    for i, tid in enumerate(tids):
        by_tid.setdefault(tid, []).append(i)
    for tid, idx in by_tid.items():
        spans = sorted(ranges.get(tid, []), key=_push_order)
        if not spans:
            continue
        n = len(spans)
        names = np.array([s[2] for s in spans] + [""], dtype=object)  # [-1]: none
        op, scope = innermost_open(
            stamps[idx],
            np.fromiter((s[0] for s in spans), np.int64, n),
            np.fromiter((s[1] for s in spans), np.int64, n),
            named=np.fromiter((bool(s[2]) for s in spans), bool, n),
            user=np.fromiter((bool(s[3]) for s in spans), bool, n),
            plain=np.fromiter((s[2] not in ALLOCATION_OPS for s in spans), bool, n),
        )
        ops[idx] = names[op]
        scopes[idx] = names[scope]
    return ops.tolist(), scopes.tolist()


def _push_order(span: tuple[int, int, str, bool]) -> tuple[int, int]:
    """The order a sweep pushes ranges in: by start, the longer (outer) first at equal starts
    (``sorted`` keeps list order at equal keys, as ``np.lexsort((-ends, starts))`` does)."""
    return (span[0], -span[1])


def innermost_open(
    stamps: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    *,
    named: np.ndarray,
    user: np.ndarray,
    plain: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(op, scope) of memory events at ``stamps`` on one thread, as indices into its ranges
    (``starts``/``ends``, ns, both ends included, in :func:`_push_order`), -1 where none.

    The ranges open at ``t`` are those started at or before ``t`` that end at or after it; read
    from the innermost (the last in push order) out. ``op``: the innermost ``named`` range that
    is ``plain`` (not one of :data:`ALLOCATION_OPS`), else the innermost named one; ``scope``:
    the innermost named ``user`` annotation. What a sweep reads from its stack of open ranges,
    as one :func:`~rankscope.analysis.store.range_queries.last_at_least` query per event over
    the ends, all events at once (the reader's memory columns of the 54 MB
    ``df_index_resolver``, 28k memory events: 38 → 20 ms against the sweep in Python;
    docs/performance.md).
    """
    from rankscope.analysis.store.range_queries import last_at_least

    last = np.searchsorted(starts, stamps, side="right") - 1  # the last range started by then

    def innermost(mask: np.ndarray) -> np.ndarray:
        which = np.flatnonzero(mask)
        if not len(which):
            return np.full(len(stamps), -1, np.int64)
        hit = last_at_least(ends[which], np.searchsorted(which, last, side="right") - 1, stamps)
        return np.where(hit >= 0, which[np.maximum(hit, 0)], -1)

    op = innermost(named & plain)
    op = np.where(op >= 0, op, innermost(named))
    return op, innermost(named & user)


def step_of(ts: np.ndarray, steps: list[tuple[int, int, int]]) -> np.ndarray:
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
        step[idx] = step_of(out["ts"].to_numpy(np.int64)[idx], spans)
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
