"""The finding model: one conclusion of the analysis as data (:class:`Finding`), its kind and
severity.

Kept apart from the sentences (``findings.py``, ``memory_findings.py``, ``rootcause_findings.py``,
``attention.py``, ``links.py``) so that each of those imports the model, never each other: the
driver that gathers every finding (``findings.findings``) sits above them all.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

#: Between a finding's headline and its evidence in the one-line form (:attr:`Finding.text`)...
HEADLINE_SEPARATOR = ": "
#: ...unless the headline has a colon of its own ("Pipeline bottleneck: rank 1 — …").
NAMED_SEPARATOR = " — "
#: Before the cause, when a finding has one.
CAUSE_ARROW = " → "


class Cause(enum.StrEnum):
    """Why a rank arrived late (a straggler's cause: ``compute/stragglers.py``; here, with the
    model, so that the sentences can test for one without importing the analysis)."""

    OWN_COMPUTE = "own compute"
    INPUT = "input"
    HOST = "host"
    GC = "GC pauses"
    """Python garbage collections (torch's ``Python GC`` events, analysis/compute/gc_pauses.py): the
    part of a rank's extra host time they account for; without them in the trace it is HOST."""
    PROPAGATED = "propagated"
    CPU_CONTENTION = "CPU taken by other processes"
    """A system cause: the rank's main thread was runnable but waited for a core (its run-queue
    delay, recorded per step by the runtime) — other processes on the node took its CPU. Named
    only when significant after correcting for the choice among the ranks (p <= ALPHA / ranks):
    the scheduler starves some rank in every step of a busy node, and three steps of one rank
    (p = 1/64 for 4 ranks) are within what that lottery draws (4/64)."""
    UNKNOWN = "unknown"


class FindingKind(enum.StrEnum):
    """What a finding is about; summary.json's ``findings[].kind``.

    One member per conclusion a renderer shows; a reader filters on these rather than on the
    wording of the sentences, which may improve.
    """

    STRAGGLER = "straggler"
    NO_STRAGGLER = "no_straggler"
    PIPELINE_BOTTLENECK = "pipeline_bottleneck"
    NO_PIPELINE_BOTTLENECK = "no_pipeline_bottleneck"
    UNPAIRED_P2P = "unpaired_p2p"
    INPUT_PROBLEMS = "input_problems"
    MEMORY_LEAK = "memory_leak"
    NO_MEMORY_LEAK = "no_memory_leak"
    MEMORY_IMBALANCE = "memory_imbalance"
    LOW_MEMORY_HEADROOM = "low_memory_headroom"
    NO_MEMORY_EVENTS = "no_memory_events"
    WHAT_IF = "what_if"
    STAGE_IMBALANCE = "stage_imbalance"
    DATA_IMBALANCE = "data_imbalance"
    SDPA_MATH_FALLBACK = "sdpa_math_fallback"
    SLOW_LINK = "slow_link"
    UNMATCHED_COMM = "unmatched_comm"


#: The kinds about memory (rankscope.analysis.compute.memory); none without ``--profile-memory``.
MEMORY_KINDS = frozenset(
    {
        FindingKind.MEMORY_LEAK,
        FindingKind.NO_MEMORY_LEAK,
        FindingKind.MEMORY_IMBALANCE,
        FindingKind.LOW_MEMORY_HEADROOM,
        FindingKind.NO_MEMORY_EVENTS,
    }
)

#: The kinds that answer "is there a pipeline bottleneck?" (at most one of them per analysis).
PIPELINE_KINDS = frozenset(
    {
        FindingKind.PIPELINE_BOTTLENECK,
        FindingKind.NO_PIPELINE_BOTTLENECK,
        FindingKind.UNPAIRED_P2P,
    }
)


#: Replay error (largest |replayed − measured| step time, %) above which the what-if figures
#: say it: the unmodified replay did not give the measured steps back (docs/analysis.md, 7).
WHAT_IF_ERROR_PCT = 1.0
#: The minus of a saving ("−24.7 %"), as the terminal and the docs print it.
MINUS = "\u2212"


class Severity(enum.StrEnum):
    """How a renderer should weigh a finding (the terminal colours by it)."""

    PROBLEM = "problem"
    """Something slows the job down and has a rank to blame: a straggler, a bottleneck."""
    OK = "ok"
    """A check that came out clean: no straggler, no bottleneck."""
    NOTE = "note"
    """Worth knowing, not a verdict on the job: unpaired send/recv, unreadable input files."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One conclusion of the analysis, in plain text and figures (no markup of any renderer)."""

    kind: FindingKind
    """What it is about; renderers and readers select on this, never on the text."""
    severity: Severity
    """How to weigh it; renderers style by it so that every renderer agrees on what is bad."""
    rank: int | None
    """The rank it names (the straggler, the bottleneck stage); None when it names none."""
    masked_by: int = -1
    """For a masked straggler, the straggler that hid it (docs/analysis.md); -1 otherwise."""
    headline: str = ""
    """Short plain text that names it ("Straggler: rank 2"): what a reader scans for."""
    evidence: str = ""
    """The sentence that supports it, plain text, ms: the one wording every renderer shows."""
    cause: str = ""
    """Why (a :class:`~rankscope.analysis.compute.stragglers.Cause` value), or "" when it has none."""
    figures: dict[str, float] = dataclasses.field(default_factory=dict)
    """The numbers behind it, units in the keys (``_s``, ``_ms``, ``_share``; counts and p-values
    bare), so that tools need not parse the evidence sentence."""

    @property
    def tail(self) -> str:
        """Everything after the headline in the one-line form: ": evidence → cause"."""
        sep = NAMED_SEPARATOR if ":" in self.headline else HEADLINE_SEPARATOR
        arrow = f"{CAUSE_ARROW}{self.cause}" if self.cause else ""
        return f"{sep}{self.evidence}{arrow}"

    @property
    def text(self) -> str:
        """The finding as one plain line; renderers that style the headline use :attr:`tail`."""
        return self.headline + self.tail

    def as_json(self) -> dict[str, Any]:
        """summary.json's ``findings[]`` entry (docs/summary.md)."""
        return {
            "kind": str(self.kind),
            "severity": str(self.severity),
            "rank": self.rank,
            "masked_by": self.masked_by,
            "headline": self.headline,
            "evidence": self.evidence,
            "cause": self.cause,
            "figures": dict(self.figures),
        }
