"""Which parts of a report apply to an analysis: the cross-rank ones need two ranks or more.

Why: a single-GPU (single-rank) trace — one plain ``prof.export_chrome_trace(...)`` — has no
rank to be late against, no clock to align to another and no collective to wait in. Printing
"No straggler … (0 collectives)" and a one-row clock table there says nothing and hides what
does apply (the per-rank breakdown and bottleneck, the op table, memory, attention). The decision
is made once, here, as data (:func:`applicable`); the terminal, summary.json and the HTML report
only render what it lists (docs/summary.md, ``sections``).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rankscope.analysis.engine.driver import Analysis


class Section(enum.StrEnum):
    """A part of the report that compares ranks (summary.json's ``sections``)."""

    STRAGGLERS = "stragglers"
    """who was last at the collectives, and the lateness per collective"""
    COLLECTIVES = "collectives"
    """waits and transfers of matched collectives; the per-rank wait/transfer columns"""
    CLOCK = "clock"
    """each rank's clock offset to the reference rank"""
    RANK_SPREAD = "rank_spread"
    """an op's spread across ranks (min, max, slowest rank)"""


#: Ranks needed for a section comparing ranks to say anything.
MIN_RANKS = 2


def ranks_analysed(a: Analysis) -> int:
    """Ranks with a whole-run breakdown row (the ranks the report is about)."""
    whole = a.whole()
    return int(whole["rank"].nunique()) if len(whole) else 0


def applicable(a: Analysis) -> frozenset[Section]:
    """The cross-rank sections that apply to ``a``: all of them with two ranks or more, none
    with one (everything else of a report applies to one rank as to many)."""
    return frozenset(Section) if ranks_analysed(a) >= MIN_RANKS else frozenset()
