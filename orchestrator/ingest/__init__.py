"""Ingest: per-rank traces in, one HDF5 store with aligned clocks out (the merge).

Reading Kineto JSON (:mod:`.kineto_json`, :mod:`.decode`, :mod:`.event_columns`,
:mod:`.vocabulary`), finding and naming the ranks (:mod:`.discovery`, :mod:`.rank_selection`),
one rank's columns (:mod:`.rank_columns`, :mod:`.comm_links`), matching collectives and
point-to-point pairs across ranks (:mod:`.matching`), aligning clocks (:mod:`.clock`,
:mod:`.clock_graph`), and the merge's driver and files (:mod:`.merge`, :mod:`.staging`,
:mod:`.merge_progress`). The commands (the modules of ``orchestrator/``) call it; it never
imports them (tests/test_layering.py).
"""
