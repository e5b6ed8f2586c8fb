"""rankscope — distributed profiling for PyTorch jobs.

This umbrella only re-exports the few names users type; everything lives in
``rankscope.orchestrator``, ``rankscope.launchers`` and ``rankscope.analysis``.
Imports are lazy so that ``import rankscope`` (and ``rankscope --help``) stay instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "open", "step"]

if TYPE_CHECKING:
    from rankscope.analysis.store.reader import Store


def open(path: str | Any) -> Store:
    """Open a merged ``trace.h5`` store (or a run directory holding one) for reading."""
    from rankscope.analysis.store.reader import open_store

    return open_store(path)


def step(samples: float | None = None) -> None:
    """Advance the per-rank profiler by one step (for loops without an optimizer).

    ``samples``: how many samples (or tokens) this rank processed in the step that ends; recorded
    per profiled step for the throughput KPI (docs/runtime.md). A no-op outside a rankscope run.
    """
    from rankscope.launchers.runtime import step as _step

    _step(samples)
