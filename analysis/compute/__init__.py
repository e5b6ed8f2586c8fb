"""Analyses: pure functions from the store's tables (DataFrames) to tables and findings.

Breakdowns, collectives, stragglers and their root cause, pipeline bottlenecks, links, memory,
operators and what-if graphs. A module here reads DataFrames (or the
store) and returns DataFrames or :class:`~rankscope.analysis.compute.finding.Finding`s; it never
schedules work (``engine``), words a conclusion for a reader (``conclude``) or renders
(``render``, ``views``). It may import ``store`` only.
"""
