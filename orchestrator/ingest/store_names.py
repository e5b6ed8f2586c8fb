"""Where the store of a merge goes when the user names none: the one naming rule.

A folder (a run directory or any folder of traces) has one store, ``FOLDER/trace.h5``
(``rundir.STORE_NAME``): its ranks are merged together. One trace file has a store of its own,
named after it and beside it: ``a.json.gz`` → ``a.rankscope.h5`` (:data:`TRACE_STORE_SUFFIX`), so
two traces of one folder (a baseline and a variant) never share one. Where the trace's folder
cannot be written (a read-only data set), the store goes to the user's cache instead,
``$XDG_CACHE_HOME/rankscope/stores/`` (``~/.cache/…``), named after the trace and a digest of its
absolute path, so it is found again the same way. ``rankscope merge``, ``analyze``, ``view``,
``compare`` and ``export`` all ask :func:`store_for` (docs/run-directory.md, "Where the store
goes").
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rankscope import user_cache
from rankscope.launchers import rundir

#: The store of one trace file: its name without ``.json`` / ``.json.gz``, then this suffix.
TRACE_STORE_SUFFIX = ".rankscope.h5"
#: Trace name endings dropped before :data:`TRACE_STORE_SUFFIX` is added (longest first).
TRACE_ENDINGS = (".json.gz", ".json", ".gz")
#: Folder, under the user's cache, of the stores of traces in folders that cannot be written.
CACHE_SUBDIR = Path(user_cache.FOLDER) / "stores"
#: Hex digits of the trace's path digest in a cached store's name (collisions: 16^-12).
DIGEST_CHARS = 12


def trace_store_name(trace: Path) -> str:
    """``a.json.gz`` → ``a.rankscope.h5`` (any other name keeps its whole name)."""
    name = trace.name
    for ending in TRACE_ENDINGS:
        if name.endswith(ending) and len(name) > len(ending):
            name = name[: -len(ending)]
            break
    return name + TRACE_STORE_SUFFIX


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rankscope/stores`` (``~/.cache/rankscope/stores`` without it)."""
    return user_cache.cache_home() / CACHE_SUBDIR


def cached_store(trace: Path) -> Path:
    """The store of ``trace`` in the user's cache (for a trace whose folder is read-only)."""
    digest = hashlib.sha256(str(trace.resolve()).encode()).hexdigest()[:DIGEST_CHARS]
    name = trace_store_name(trace)
    return cache_dir() / f"{name[: -len(TRACE_STORE_SUFFIX)]}-{digest}{TRACE_STORE_SUFFIX}"


def store_for(path: Path) -> Path:
    """The store a merge of ``path`` writes, and every command reads, when none is named.

    A folder: ``path/trace.h5``. A trace file: ``a.rankscope.h5`` beside it when that store
    exists or its folder can be written, else :func:`cached_store`.
    """
    if path.is_dir():
        return path / rundir.STORE_NAME
    beside = path.parent / trace_store_name(path)
    if beside.exists() or os.access(path.parent, os.W_OK):
        return beside
    return cached_store(path)
