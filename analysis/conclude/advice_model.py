"""The advice model (what :func:`rankscope.analysis.conclude.advice.advice` returns): the
bottleneck classes, the rules' names, one :class:`Advice` item and the order of the items. Kept
apart from the driver (``advice.py``) and the rules (``advice_rules.py``) so that both import it
and not each other.

What to do: the analysis' findings turned into actions, each with its bottleneck class, the
evidence, the fix (the code change) and the expected gain (docs/advice.md).

Why: a finding says what is slow ("rank 2 stalls in the DataLoader"); a newcomer still has to
know what to change. Performance engineering sorts every slow job into five classes (compute,
memory, input/I/O, framework/software, system) and each class has its known remedies. Each rule
here reads tables the analysis already computed (pure functions: the same analysis gives the
same advice), names its class, the figures it saw (ms per profiled step, share of the step,
what they sum over) and the change to make. The gain is the what-if replay's where one of its
scenarios models the fix (docs/analysis.md, "What if"), else "not estimated".

Ordering (:func:`ranked`): the estimated ones by gain per step, largest first; then the others
by the size of their evidence (ms per step the problem costs or covers), largest first.

Every rule fires only when what it saw is *material*: at least :data:`MATERIAL_SHARE` of the
profiled step time (except the rules whose evidence is a yes/no fact of the kernels, which say
so). The rules live in ``advice_rules.py``; the lines a renderer prints in :meth:`Advice.lines`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

#: Below this share of the profiled step time (summed over the ranks it concerns) a problem is
#: not worth a code change: step times of a training job vary by about this much from step to
#: step on a quiet machine, so a smaller gain could not even be seen.
MATERIAL_SHARE = 0.01
#: What :attr:`Advice.gain` says when no what-if scenario models the fix.
NOT_ESTIMATED = "not estimated"


class BottleneckClass(enum.StrEnum):
    """The five classes of performance engineering; summary.json's ``advice[].class``."""

    COMPUTE = "compute"
    """The math itself: precision, kernels, the work one rank does more than others."""
    MEMORY = "memory"
    """Device memory: capacity (headroom) and the copies to and from it."""
    INPUT = "input/I/O"
    """Feeding the model: the DataLoader, host-to-device copies of the batch."""
    FRAMEWORK = "framework/software"
    """The software between the model and the GPU: Python pauses, launch overhead, fallbacks."""
    SYSTEM = "system"
    """Network, storage, CPU cores: communication that nothing hides, slow links."""


class Rule(enum.StrEnum):
    """Which rule produced an advice item; summary.json's ``advice[].rule``."""

    FP32_MATMUL = "fp32_matmul"
    DATALOADER_STALL = "dataloader_stall"
    PAGEABLE_COPY = "pageable_copy"
    GC_PAUSES = "gc_pauses"
    LOW_HEADROOM = "low_memory_headroom"
    EXPOSED_COMM = "exposed_communication"
    SDPA_MATH = "sdpa_math_fallback"
    STRAGGLER = "straggler"
    LAUNCH_BOUND = "launch_bound"
    BLOCKING_PINNED_COPY = "blocking_pinned_copy"


@dataclasses.dataclass(frozen=True)
class Advice:
    """One thing to do, with the evidence that calls for it and what it should buy."""

    rule: Rule
    """The rule that fired (docs/advice.md lists them)."""
    bottleneck: BottleneckClass
    """The class of the bottleneck it removes."""
    headline: str
    """What was found, short ("DataLoader stalls")."""
    seen: str
    """The evidence: figures with units and what they sum over."""
    fix: str
    """What to do: the code change."""
    ranks: tuple[int, ...] = ()
    """The ranks it concerns (empty: all, or none in particular)."""
    size_ms: float = 0.0
    """ms per profiled step the evidence covers (mean over the ranks concerned): the order of
    the items without an estimated gain."""
    gain_ms: float | None = None
    """The what-if replay's saving per step (ms, the statistic over the profiled steps), or
    None when no scenario models the fix."""
    gain_share: float | None = None
    """``gain_ms`` as a share of the replayed step (0–1), or None."""
    gain_source: str = NOT_ESTIMATED
    """The what-if scenario that estimated the gain, or :data:`NOT_ESTIMATED`."""
    figures: dict[str, float] = dataclasses.field(default_factory=dict)
    """The numbers behind :attr:`seen` (units in the keys, as :class:`Finding`'s)."""

    @property
    def gain(self) -> str:
        """'−10.2 ms per step (−7.5 %), what-if "no input stall"', or 'not estimated'."""
        if self.gain_ms is None:
            return NOT_ESTIMATED
        share = f" ({MINUS}{self.gain_share * 100:.1f} %)" if self.gain_share is not None else ""
        return f'{MINUS}{self.gain_ms:.1f} ms per step{share}, what-if "{self.gain_source}"'

    def lines(self) -> tuple[str, str, str]:
        """(what was seen, what to do, the gain) as the terminal and the HTML show them."""
        return (
            f"[{self.bottleneck}] {self.headline}: {self.seen}",
            f"do: {self.fix}",
            f"gain: {self.gain}",
        )

    def as_json(self) -> dict[str, Any]:
        """summary.json's ``advice[]`` entry (docs/summary.md)."""
        return {
            "rule": str(self.rule),
            "class": str(self.bottleneck),
            "headline": self.headline,
            "seen": self.seen,
            "fix": self.fix,
            "ranks": list(self.ranks),
            "size_ms": round(self.size_ms, 6),
            "gain_ms": None if self.gain_ms is None else round(self.gain_ms, 6),
            "gain_share": None if self.gain_share is None else round(self.gain_share, 4),
            "gain_source": self.gain_source,
            "figures": dict(self.figures),
        }


#: The minus of a saving, as the what-if findings print it.
MINUS = "\u2212"


def ranked(items: list[Advice]) -> list[Advice]:
    """Most valuable first: estimated gains, largest first; then the rest by evidence size."""
    estimated = sorted((i for i in items if i.gain_ms is not None), key=lambda i: -(i.gain_ms or 0))
    rest = sorted((i for i in items if i.gain_ms is None), key=lambda i: -i.size_ms)
    return estimated + rest
