"""Python garbage-collection pauses per profiled step, from torch's ``Python GC`` events.

Why: a collection of Python's cyclic garbage collector stops the training loop's thread for
milliseconds to seconds; in a trace without a marker it is a host gap like any other (slow
launches, a busy CPU), so the rank's extra time can only be called "host". torch.profiler marks
each collection as a complete event named ``Python GC`` (``cat`` python_function) when its
Python tracer runs (``with_stack=True``) with ``experimental_config=_ExperimentalConfig(
record_python_gc_info=True)`` (measured on torch 2.13; ``rankscope synth`` writes the same
events for its ``--gc-pause`` fault). Where a trace has them, the root cause of a slow rank can
say "GC pauses" and how much of its extra time they are.

Units: ns (int64).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: The name torch gives a garbage collection's event.
GC_EVENT_NAME = "Python GC"
#: Columns of :func:`gc_per_step` (one row per rank and profiled step with a collection).
GC_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "step": "int64",
    "gc_ns": "int64",  # summed duration of the step's Python GC events on the rank's threads
    "collections": "int64",
}


def gc_per_step(events: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One rank's garbage collections summed per profiled step (``GC_COLUMNS``; steps without
    one have no row). ``events``: ``Store.events(rank)``; a collection belongs to the step its
    event falls in (the store's ``step`` column), outside every step it is left out."""
    from rankscope.analysis.store.schema import EventKind, text_values

    kind = events["kind"].to_numpy()
    py = np.flatnonzero(kind == int(EventKind.PYTHON))
    if len(py):
        py = py[text_values(events["name"].iloc[py]) == GC_EVENT_NAME]
    step = events["step"].to_numpy(np.int64)[py]
    dur = events["dur"].to_numpy(np.int64)[py]
    keep = step >= 0
    # numpy, not a pandas groupby: this runs for every rank, and most traces have none
    steps, at = np.unique(step[keep], return_inverse=True)
    return pd.DataFrame(
        {
            "rank": np.full(len(steps), rank, np.int32),
            "step": steps.astype(np.int64),
            "gc_ns": np.bincount(at, weights=dur[keep], minlength=len(steps)).astype(np.int64),
            "collections": np.bincount(at, minlength=len(steps)).astype(np.int64),
        }
    )
