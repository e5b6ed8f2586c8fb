"""What each rank recorded about its steps beyond its events — samples and FLOPs per step, the
device's name — read from its store attributes and meta.json (:func:`rank_facts`), for the KPIs
(:mod:`rankscope.analysis.conclude.kpis`, which re-exports these names) and the run's step KPIs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.analysis.engine.driver import Analysis

#: Keys of a rank's or the store's attributes read when a run recorded them (constants: samples
#: and FLOPs per step, the device's marketing name).
SAMPLES_KEY = "samples_per_step"
FLOPS_KEY = "flops_per_step"
DEVICE_NAME_KEY = "device_name"
#: Keys of a rank's meta.json (the store's rank attribute ``meta``) written by the runtime
#: (docs/runtime.md): per recorded step (the step number as text), the samples given to
#: ``rankscope.step(samples=N)`` and the FLOPs torch counted (``--with-flops``).
STEP_SAMPLES_KEY = "step_samples"
STEP_FLOPS_KEY = "step_flops"


@dataclasses.dataclass
class RankFacts:
    """What one rank recorded beyond its events (its store attributes and meta.json)."""

    samples_per_step: float | None = None
    """The constant samples per step (``--samples-per-step``), if any."""
    step_samples: dict[int, float] = dataclasses.field(default_factory=dict)
    """Samples per profiled step (``rankscope.step(samples=N)``)."""
    flops_per_step: float | None = None
    """A constant FLOPs per step recorded in the rank's attributes, if any."""
    step_flops: dict[int, float] = dataclasses.field(default_factory=dict)
    """FLOPs per profiled step counted by torch (``--with-flops``)."""
    device_name: str | None = None
    """The device's name (``torch.cuda.get_device_name``; ``cpu`` on CPU)."""


def _per_step(value: Any, zero_ok: bool = False) -> dict[int, float]:
    """``{"12": 32, …}`` as ``{12: 32.0}``; keys that are not step numbers and values that are
    not finite numbers > 0 (>= 0 with ``zero_ok``) are left out."""
    out: dict[int, float] = {}
    if not isinstance(value, dict):
        return out
    for key, v in value.items():
        try:
            step = int(key)
            number = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number) and (number > 0 or (zero_ok and number == 0)):
            out[step] = number
    return out


def _read_rank_meta(path: Any) -> dict[int, dict[str, Any]] | None:
    """Every rank's attributes of the store at ``path`` (None when it cannot be read)."""
    from rankscope.analysis.store.reader import open_store
    from rankscope.errors import RankscopeError

    try:
        with open_store(path) as store:
            return {r: store.rank_meta(r) for r in store.ranks}
    except (OSError, ValueError, KeyError, RankscopeError):
        return None


def rank_facts(a: Analysis) -> dict[int, RankFacts]:
    """:class:`RankFacts` of every rank of the analysed store (empty when it cannot be read):
    from the attributes the analysis kept (``Analysis.rank_meta``), else read from the store."""
    out: dict[int, RankFacts] = {}
    attrs = a.rank_meta if a.rank_meta is not None else _read_rank_meta(a.path)
    if attrs is None:
        return out
    for rank, at in attrs.items():
        meta = at.get("meta")
        meta = meta if isinstance(meta, dict) else {}
        profiler = meta.get("profiler")
        profiler = profiler if isinstance(profiler, dict) else {}
        name = at.get(DEVICE_NAME_KEY) or at.get("device") or meta.get("device")
        out[int(rank)] = RankFacts(
            samples_per_step=_number(at.get(SAMPLES_KEY))
            or _number(profiler.get("samples_per_step")),
            step_samples=_per_step(meta.get(STEP_SAMPLES_KEY)),
            flops_per_step=_number(at.get(FLOPS_KEY)),
            step_flops=_per_step(meta.get(STEP_FLOPS_KEY), zero_ok=True),
            device_name=str(name) if name else None,
        )
    return out


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None
