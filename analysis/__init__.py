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
    "open_store": "store.reader",
    "Store": "store.reader",
    "analyze": "engine.driver",
    "Analysis": "engine.driver",
    "ClusterSpec": "engine.scheduler",
    "rank_breakdown": "compute.breakdown",
    "hta_temporal_breakdown": "compute.breakdown",
    "collective_waits": "compute.collectives",
    "wait_totals": "compute.collectives",
    "collective_summary": "compute.collectives",
    "arrival_points": "compute.stragglers",
    "arrival_windows": "compute.stragglers",
    "find_stragglers": "compute.stragglers",
    "p2p_roots": "compute.bottleneck",
    "pipeline_stages": "compute.bottleneck",
    "Cause": "compute.stragglers",
    "verdicts": "compute.verdict",
    "Verdict": "compute.verdict",
    "op_stats": "compute.ops",
    "annotation_stats": "compute.ops",
    "across_ranks": "compute.ops",
    "findings": "conclude.findings",
    "Finding": "compute.finding",
    "FindingKind": "compute.finding",
    "Severity": "compute.finding",
    "summary": "render.report",
    "render_html": "render.report",
    "render_json": "render.report",
    "print_summary": "render.report",
    "breakdown_table": "engine.driver",
    "waits_table": "engine.driver",
    "stragglers_table": "engine.driver",
    "verdict_table": "engine.driver",
    "ops_table": "engine.driver",
    "annotations_table": "engine.driver",
    "analysis_of": "engine.driver",
    "timeline": "views.timeline",
    "export_perfetto": "render.perfetto",
    "what_if": "engine.whatif",
    "Scenario": "engine.whatif",
}

#: public module name -> the module (inside rankscope.analysis) it is: names users typed before
#: the analysis had its floors (``rankscope.analysis.schema``), kept.
_MODULES: dict[str, str] = {"schema": "store.schema"}

__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        mod = importlib.import_module(f"rankscope.analysis.{_MODULES[name]}")
        globals()[name] = mod
        return mod
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rankscope.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rankscope.analysis.{module}"), name)
    globals()[name] = value
    return value
