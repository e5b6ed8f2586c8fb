"""Runs the analyses over a store's ranks: the driver, the schedulers and their workers.

:mod:`.driver` (:func:`analyze`, :class:`Analysis`) fans one :mod:`.rank_task` per rank out
through :mod:`.scheduler` (in-process, threads, forked processes, Dask, Slurm workers) and
combines the per-rank results with ``compute``'s functions; :mod:`.overview` and
:mod:`.whatif` are the other entry points that need every rank. It may import ``store`` and
``compute``.
"""
