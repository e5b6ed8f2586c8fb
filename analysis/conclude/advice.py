"""What to do: every advice rule (``advice_rules.py``) run on one analysis, most valuable first
(docs/advice.md). The model — classes, rules, :class:`Advice`, the order — is ``advice_model.py``'s,
re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankscope.analysis.conclude.advice_model import MATERIAL_SHARE as MATERIAL_SHARE
from rankscope.analysis.conclude.advice_model import MINUS as MINUS
from rankscope.analysis.conclude.advice_model import NOT_ESTIMATED as NOT_ESTIMATED
from rankscope.analysis.conclude.advice_model import Advice as Advice
from rankscope.analysis.conclude.advice_model import BottleneckClass as BottleneckClass
from rankscope.analysis.conclude.advice_model import Rule as Rule
from rankscope.analysis.conclude.advice_model import ranked

if TYPE_CHECKING:
    from rankscope.analysis.compute.finding import Finding
    from rankscope.analysis.engine.driver import Analysis

__all__ = [
    "MATERIAL_SHARE",
    "MINUS",
    "NOT_ESTIMATED",
    "Advice",
    "BottleneckClass",
    "Rule",
    "advice",
    "ranked",
]


def advice(a: Analysis, found: list[Finding] | None = None) -> list[Advice]:
    """Every advice item for ``a``, most valuable first (:func:`ranked`). ``found``: the
    analysis' findings (``findings.findings(a)``), computed when None. Pure."""
    from rankscope.analysis.conclude import advice_feed as feed
    from rankscope.analysis.conclude import advice_rules as r
    from rankscope.analysis.conclude.findings import findings

    items = findings(a) if found is None else found
    gpu = bool(a.capability)  # a GPU rank's trace names its devices' compute capability
    out: list[Advice] = []
    out += r.fp32_matmul(a.op_stats, a.capability, a.breakdown)
    out += r.dataloader_stall(a.breakdown, a.whatif)
    out += r.pageable_copies(a.op_stats, a.breakdown)
    out += feed.blocking_pinned_copies(a.gpu_feed.blocking_copies, a.breakdown)
    out += feed.launch_bound(a.gpu_feed.host_wait, a.gpu_feed.launch_summary, a.breakdown)
    out += r.gc_pauses(a.gc, a.breakdown)
    out += r.low_headroom(items)
    out += r.exposed_communication(a.breakdown, a.comm_totals, a.whatif, gpu)
    out += r.sdpa_math(items, a.breakdown)
    out += r.stragglers(items, gpu)
    return ranked(out)
