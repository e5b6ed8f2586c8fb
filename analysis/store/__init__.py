"""The store: one HDF5 file per run, its table schemas and the memory table's rule.

The floor every other reads: :mod:`.schema` (the columns of every table), :mod:`.layout`
(group and dataset names), :mod:`.writer` (columnar, atomic writes), :mod:`.reader`
(:class:`Store`, :func:`open_store`), :mod:`.hdf5_links` (no link leaves the file) and
:mod:`.memory_table` (torch.profiler's ``[memory]`` events as rows). It imports no other floor.
"""
