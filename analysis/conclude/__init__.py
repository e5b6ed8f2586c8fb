"""Conclusions of a whole analysis: its findings worded once, its KPIs, run comparison.

:mod:`.findings` (with :mod:`.memory_findings` and :mod:`.rootcause_findings`) turns an
:class:`~rankscope.analysis.engine.driver.Analysis` into
:class:`~rankscope.analysis.compute.finding.Finding`s with their evidence sentences;
:mod:`.kpis` gives its key figures and :mod:`.compare` (with its model, tables and gate) sets
two runs' side by side. It may import ``store``, ``compute`` and ``engine``; the renderers read
its output.
"""
