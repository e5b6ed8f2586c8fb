"""What a user reads: the terminal summary (rich), ``summary.json``, and an offline HTML report.

All three render an :class:`rankscope.analysis.engine.driver.Analysis` and its findings
(:func:`rankscope.analysis.conclude.findings.findings`: the conclusions and their evidence sentences, worded
once there; here they are only styled and escaped). They return text (or print to a console);
writing files (atomically) is the caller's job. The JSON contract is documented in
``docs/summary.md`` (``SUMMARY_SCHEMA`` / ``SUMMARY_VERSION``).

This module is the one entry point callers import from; each rendering lives in its own module:

- ``report_json.py``: summary.json (:func:`summary`, :func:`render_json`), which the other two
  start from;
- ``report_terminal.py``: the terminal summary (:func:`print_summary`);
- ``html_report.py``: the self-contained HTML report (:func:`render_html`), its SVG charts in
  ``html_charts.py``, its markup in ``templates/*.html.j2`` (Jinja2, via ``templating.py``);
- ``report_format.py``: what the terminal and the HTML share (name shortening, the many-rank
  digest);
- ``report_memory.py`` and ``report_overview.py``: memory's renderings and the overview image.
"""

from __future__ import annotations

from rankscope.analysis.render.format import MANY_RANKS as MANY_RANKS
from rankscope.analysis.render.format import NAME_WIDTH as NAME_WIDTH
from rankscope.analysis.render.format import READING_DOC as READING_DOC
from rankscope.analysis.render.format import WHAT_IF_TITLE as WHAT_IF_TITLE
from rankscope.analysis.render.format import _disagree_hint as _disagree_hint
from rankscope.analysis.render.format import clock_digest as clock_digest
from rankscope.analysis.render.format import many_rank_rows as many_rank_rows
from rankscope.analysis.render.format import short_name as short_name
from rankscope.analysis.render.format import short_names as short_names
from rankscope.analysis.render.html_charts import BAR_PARTS as BAR_PARTS
from rankscope.analysis.render.html_charts import FLAG_COLOURS as FLAG_COLOURS
from rankscope.analysis.render.html_charts import MANY_HOSTS as MANY_HOSTS
from rankscope.analysis.render.html_charts import WORST_HOSTS as WORST_HOSTS
from rankscope.analysis.render.html_report import render_html as render_html
from rankscope.analysis.render.html_report import shown_ranks as shown_ranks
from rankscope.analysis.render.summary_json import SUMMARY_SCHEMA as SUMMARY_SCHEMA
from rankscope.analysis.render.summary_json import SUMMARY_VERSION as SUMMARY_VERSION
from rankscope.analysis.render.summary_json import attention_summary as attention_summary
from rankscope.analysis.render.summary_json import op_table_summary as op_table_summary
from rankscope.analysis.render.summary_json import render_json as render_json
from rankscope.analysis.render.summary_json import summary as summary
from rankscope.analysis.render.summary_json import what_if_summary as what_if_summary
from rankscope.analysis.render.terminal import SEVERITY_STYLE as SEVERITY_STYLE
from rankscope.analysis.render.terminal import finding_markup as finding_markup
from rankscope.analysis.render.terminal import pipeline_lines as pipeline_lines
from rankscope.analysis.render.terminal import print_attention as print_attention
from rankscope.analysis.render.terminal import print_summary as print_summary
from rankscope.analysis.render.terminal import print_what_if as print_what_if
