"""The model of a comparison of two runs: its verdict words (enums), how it is made
(:class:`CompareConfig`, :class:`GateConfig`), the column contracts of its tables
(``*_COLUMNS``), and the result (:class:`Comparison`, :class:`CompareFinding`).

Separate from the code that computes a comparison (``compare_tables.py``, ``compare_gate.py``,
``compare.py``) so that each of those and every renderer (``orchestrator/compare.py``) can import
the vocabulary without importing one another: the model imports no computation but the one
constant of the rank test it defaults to (:data:`EXACT_MAX_SAMPLES`). Every name here is also
importable from :mod:`rankscope.analysis.conclude.compare`, the entry point.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import TYPE_CHECKING, Any

from rankscope.analysis.compute.statistics import EXACT_MAX_SAMPLES
from rankscope.analysis.conclude.kpis import JOB_RANK, Kpi

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.conclude.kpis import Kpis

#: Fewest steps per side for a test (fewer: the KPI is shown, never called a change).
MIN_SAMPLES = 3
#: KPIs :func:`gate` checks with ``--fail-above`` when no per-KPI threshold is given.
HEADLINE_KPIS = (
    Kpi.STEP_TIME,
    Kpi.RUN_STEP_TIME,
    Kpi.THROUGHPUT,
    Kpi.PEAK_MEMORY,
    Kpi.FLOPS,
    Kpi.MFU,
)
#: Op kinds compared in :attr:`Comparison.ops` (communication is in ``collectives``).
OP_KINDS = frozenset({"CPU_OP", "KERNEL_COMPUTE", "MEMCPY", "MEMSET", "USER_ANNOTATION"})


class Change(enum.StrEnum):
    """The verdict on one KPI of one rank (``KPI_CHANGE_COLUMNS`` ``change``)."""

    REGRESSION = "regression"
    """Significantly worse, by at least ``min_change``."""
    IMPROVEMENT = "improvement"
    """Significantly better, by at least ``min_change``."""
    NO_CHANGE = "no change"
    """Within step-to-step noise, or smaller than ``min_change``."""
    UNTESTED = "untested"
    """Too few steps on a side (< MIN_SAMPLES), or missing in one run."""


class Family(enum.StrEnum):
    """The multiple-testing family of a test (Holm is applied within each)."""

    JOB = "job"
    RANK = "rank"


class OpChange(enum.StrEnum):
    """What happened to an op (``OP_CHANGE_COLUMNS`` ``change``)."""

    SLOWER = "slower"
    FASTER = "faster"
    SAME = "same"
    APPEARED = "appeared"
    DISAPPEARED = "disappeared"


class StragglerChange(enum.StrEnum):
    """What happened to a straggler (``STRAGGLER_CHANGE_COLUMNS`` ``change``)."""

    NEW = "new"
    GONE = "gone"
    PERSISTS = "persists"


class CompareKind(enum.StrEnum):
    """What a :class:`CompareFinding` is about (JSON ``findings[].kind``)."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    NO_CHANGE = "no_change"
    NEW_STRAGGLER = "new_straggler"
    STRAGGLER_GONE = "straggler_gone"
    OP_CHANGES = "op_changes"
    ATTENTION_MATH = "attention_math"
    NOT_COMPARABLE = "not_comparable"


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """How the two runs are compared."""

    alpha: float = 0.05
    """Family-wise false-alarm rate (split in half between the job and per-rank families)."""
    min_change: float = 0.03
    """Smallest change called a regression or improvement, as a fraction: of the KPI's BASE
    median for the job's headline KPIs, of BASE's step time for time categories (a category
    that moves the step by less is noise, however significant)."""
    top_ops: int = 10
    """Ops listed per direction (slower, faster) in the renderings."""
    exact_max_samples: int = EXACT_MAX_SAMPLES
    """Above this many steps in all, the normal approximation of the U distribution is used."""


#: The gate's default false-alarm level (GateConfig.alpha).
GATE_ALPHA = 0.01


@dataclasses.dataclass(frozen=True)
class GateConfig:
    """When ``rankscope compare`` fails a CI job (exit 1)."""

    fail_above: float | None = None
    """Relative regression (fraction, 0.05 = 5 %) above which a significant regression of a
    headline KPI (HEADLINE_KPIS, job level) fails; None: only ``thresholds`` are checked."""
    thresholds: dict[str, float] = dataclasses.field(default_factory=dict)
    """Per-KPI thresholds (Kpi value -> fraction), overriding ``fail_above`` for that KPI and
    adding KPIs it does not cover (time categories)."""
    alpha: float = GATE_ALPHA
    """False-alarm level of one gate decision (Holm over the gated KPIs). Stricter than the
    table's 0.05 because a gate is asked on every commit: at 0.05, one commit in twenty that
    changed nothing would fail its CI, and a gate that fails without cause gets switched off."""
    run_noise: float = 0.0
    """Run-to-run noise of the machine, as a fraction of the KPI's mean (0.12 = 12 %): the
    standard deviation of a run's mean step time across runs of the same job, beyond what the
    run's own step-to-step noise explains (:func:`run_noise`; ``benchmarks/compare_noise.py``
    measures it). Steps of one run share its conditions — which rank lost its core, the node,
    its temperature — so one run per side cannot show this part; 0 assumes there is none."""


@dataclasses.dataclass(frozen=True)
class CompareFinding:
    """One conclusion of a comparison, worded once for every renderer."""

    kind: CompareKind
    text: str
    kpi: str | None = None
    rank: int | None = None
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)


#: Columns of :attr:`Comparison.kpis`: one row per KPI and rank present in both runs.
KPI_CHANGE_COLUMNS: dict[str, str] = {
    "kpi": "str",
    "rank": "int32",  # JOB_RANK (-1): the job
    "unit": "str",
    "family": "str",  # Family
    "base_steps": "int64",
    "new_steps": "int64",
    "base_p50": "float64",  # percentiles of the tested samples (job: per-step means over ranks)
    "new_p50": "float64",
    "base_p90": "float64",
    "new_p90": "float64",
    "shift": "float64",  # Hodges–Lehmann NEW − BASE, in the unit
    "rel_change": "float64",  # shift / |base median|
    "step_share": "float64",  # shift / BASE step time median (time categories; else rel_change)
    "p_value": "float64",  # Mann–Whitney U, two-sided, of a change larger than min_change
    "p_adjusted": "float64",  # Holm within the family (NaN: untested)
    "change": "str",  # Change
}

#: Columns of :attr:`Comparison.ops` (times per step, s; mean over the ranks that ran the op).
OP_CHANGE_COLUMNS: dict[str, str] = {
    "name": "str",
    "kind": "str",
    "base_s": "float64",
    "new_s": "float64",
    "delta_s": "float64",
    "rel_change": "float64",  # NaN when it appeared
    "step_share": "float64",  # delta / BASE step time (job median)
    "top_rank": "int32",  # the rank whose time changed most
    "change": "str",  # OpChange
}

#: Columns of :attr:`Comparison.collectives` (per step, s; rank JOB_RANK: mean over ranks).
COLLECTIVE_CHANGE_COLUMNS: dict[str, str] = {
    "group": "str",
    "op": "str",
    "rank": "int32",
    "base_wait_s": "float64",
    "new_wait_s": "float64",
    "delta_wait_s": "float64",
    "base_transfer_s": "float64",
    "new_transfer_s": "float64",
    "delta_transfer_s": "float64",
}

#: Columns of :attr:`Comparison.stragglers`.
STRAGGLER_CHANGE_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "change": "str",  # StragglerChange
    "base_confidence": "float64",
    "new_confidence": "float64",
    "cause": "str",  # NEW's cause (BASE's when it went away)
    "wait_caused_s": "float64",  # NEW's (BASE's when it went away)
}

#: Columns of :attr:`Comparison.whatif` (one row per scenario and rank in either run).
WHATIF_CHANGE_COLUMNS: dict[str, str] = {
    "scenario": "str",
    "rank": "int32",
    "base_saving_s": "float64",  # NaN: not in BASE
    "new_saving_s": "float64",  # NaN: not in NEW
    "delta_s": "float64",
    "base_saving_pct": "float64",
    "new_saving_pct": "float64",
}


@dataclasses.dataclass
class Comparison:
    """BASE vs NEW (every DataFrame follows its ``*_COLUMNS``)."""

    base: Kpis
    """BASE's KPIs."""
    new: Kpis
    """NEW's KPIs."""
    kpis: pd.DataFrame
    """KPI_CHANGE_COLUMNS, job rows first."""
    ops: pd.DataFrame
    """OP_CHANGE_COLUMNS, largest |delta| first."""
    collectives: pd.DataFrame
    """COLLECTIVE_CHANGE_COLUMNS."""
    stragglers: pd.DataFrame
    """STRAGGLER_CHANGE_COLUMNS (ranks that are a straggler in either run)."""
    whatif: pd.DataFrame
    """WHATIF_CHANGE_COLUMNS (empty when neither run has a what-if table)."""
    notes: list[str]
    """What cannot be compared and why (one line each)."""
    findings: list[CompareFinding]
    """The conclusions, most important first."""
    config: CompareConfig
    """How it was compared."""

    @property
    def per_rank(self) -> bool:
        """Whether ranks were compared one by one (same world size)."""
        return self.base.world_size == self.new.world_size

    def regressions(self, rank: int | None = JOB_RANK) -> pd.DataFrame:
        """Rows judged a regression (``rank`` None: every rank and the job)."""
        k = self.kpis
        rows = k[k["change"] == Change.REGRESSION]
        return rows if rank is None else rows[rows["rank"] == rank]


def _pct(x: float) -> str:
    """A signed percentage as the findings word it (``+4.2%``; ``n/a`` when not finite)."""
    return f"{100 * x:+.1f}%" if math.isfinite(x) else "n/a"
