"""Renderers: the terminal summary, summary.json, the HTML report, the comparison, Perfetto.

They only render what ``conclude`` concluded and ``compute`` measured (no analysis here). They
may import every floor below them (``store``, ``compute``, ``engine``, ``conclude``). The HTML
pages' markup and CSS are Jinja2 templates in ``templates/`` (package data), rendered by
``templating.py``.
"""
