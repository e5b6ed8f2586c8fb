"""Owns the store schema and everything that reads it: breakdowns, collectives, stragglers, reports, views.

Every analysis is a function of a store (or of its DataFrames) returning a DataFrame; the names
below are importable from ``rankscope.analysis`` and load their module on first use, so importing
this package stays instant::

    from rankscope.analysis import analyze, open_store
    result = analyze("RUN/trace.h5")          # all analyses, Dask per rank
    result.stragglers; result.breakdown       # DataFrames
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module (inside rankscope.analysis) that defines it
_EXPORTS: dict[str, str] = {
    "open_store": "store",
    "Store": "store",
    "analyze": "pipeline",
    "Analysis": "pipeline",
    "ClusterSpec": "scheduler",
    "rank_breakdown": "breakdown",
    "hta_temporal_breakdown": "breakdown",
    "collective_waits": "collectives",
    "wait_totals": "collectives",
    "collective_summary": "collectives",
    "arrival_points": "stragglers",
    "arrival_windows": "stragglers",
    "find_stragglers": "stragglers",
    "p2p_roots": "bottleneck",
    "pipeline_stages": "bottleneck",
    "Cause": "stragglers",
    "verdicts": "verdict",
    "Verdict": "verdict",
    "op_stats": "ops",
    "annotation_stats": "ops",
    "across_ranks": "ops",
    # the function findings() is not listed: importing the module rankscope.analysis.findings
    # binds that name on this package to the module, so the export would depend on import order
    "Finding": "findings",
    "FindingKind": "findings",
    "Severity": "findings",
    "summary": "report",
    "render_html": "report",
    "render_json": "report",
    "print_summary": "report",
    "breakdown_table": "pipeline",
    "waits_table": "pipeline",
    "stragglers_table": "pipeline",
    "verdict_table": "pipeline",
    "ops_table": "pipeline",
    "annotations_table": "pipeline",
    "analysis_of": "pipeline",
    "timeline": "timeline",
    "export_perfetto": "perfetto",
    "what_if": "whatif",
    "Scenario": "whatif",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rankscope.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rankscope.analysis.{module}"), name)
    globals()[name] = value
    return value
