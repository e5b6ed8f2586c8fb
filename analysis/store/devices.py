"""What the traces say about each rank's GPUs beyond memory: the compute capability.

Why: whether a kernel could have run on tensor cores depends on the device (Volta, compute
capability 7.0, brought FP16 tensor cores; Ampere, 8.0, added TF32 and BF16 — NVIDIA CUDA C++
Programming Guide, "Compute Capabilities"). Kineto writes each GPU's ``computeMajor`` and
``computeMinor`` in the trace's ``deviceProperties``; the merge keeps them per rank (the rank
group's ``device_capability`` attribute, ``{"<gpu index>": [major, minor]}``) so that the advice
(analysis/conclude/advice.py) can tell an FP32 GEMM that could use tensor cores from one that
could not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

#: The rank group's attribute that holds :func:`device_capability`'s result.
CAPABILITY_ATTR = "device_capability"


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def device_capability(device_properties: Any) -> dict[int, tuple[int, int]]:
    """GPU index → (computeMajor, computeMinor) from a trace's ``deviceProperties``; entries
    with missing or wrong-typed fields are left out (a CPU trace has ``[]``)."""
    out: dict[int, tuple[int, int]] = {}
    if not isinstance(device_properties, list):
        return out
    for d in device_properties:
        if isinstance(d, Mapping):
            i, major, minor = d.get("id"), d.get("computeMajor"), d.get("computeMinor", 0)
            if _is_int(i) and _is_int(major) and _is_int(minor) and major > 0:
                out[i] = (major, minor)
    return out


def capability_attr(capability: Mapping[int, tuple[int, int]]) -> dict[str, list[int]]:
    """The attribute's value (JSON-friendly: string keys, lists)."""
    return {str(k): [int(v[0]), int(v[1])] for k, v in sorted(capability.items())}


def rank_capability(rank_meta: Mapping[str, Any]) -> tuple[int, int] | None:
    """The highest compute capability among a rank's GPUs (``Store.rank_meta``), None for a CPU
    rank or a store written before the attribute existed."""
    raw = rank_meta.get(CAPABILITY_ATTR)
    if not isinstance(raw, Mapping):
        return None
    found = [
        (int(v[0]), int(v[1]))
        for v in raw.values()
        if isinstance(v, list | tuple) and len(v) == 2 and all(_is_int(x) for x in v)
    ]
    return max(found) if found else None
