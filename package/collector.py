"""The cyclic garbage collector's pace during one analysis.

Python's collector runs a young-generation pass every 700 net allocations of container objects
(``gc.get_threshold()[0]``). An analysis builds hundreds of thousands of short-lived containers
(pandas frames and indexes, dicts of rows), almost none of them in reference cycles, so on a
small job (``param_dlrm_8rank``, 8 ranks) the default pace ran ~340 young, ~31 middle and 2 full
passes: ~0.16 s of CPU, 5 % of ``rankscope analyze FOLDER``, to free a few thousand objects.
With :data:`YOUNG_THRESHOLD` the same analysis runs ~3 young passes and no full one (~0.04 s).
The collector is only paced, never switched off: cycles are still freed, and memory stays
bounded by the threshold's worth of young objects (a few MB). The outputs do not depend on it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: Net container allocations between two young-generation passes during an analysis (Python's
#: default is 700). 50,000 small containers are a few MB.
YOUNG_THRESHOLD = 50_000
#: Young passes per middle pass and middle passes per full pass (Python's defaults).
OLDER_THRESHOLDS = (10, 10)
#: Whether the pace stays in force until the process ends (:func:`keep_pace_to_exit`).
_KEPT: list[bool] = [False]


def keep_pace_to_exit() -> None:
    """Leave the pace of :func:`paced_collector` in force when its block ends, for the rest of
    this process: the console script's (``orchestrator.cli.main`` as the process), which ends
    through ``os._exit`` right after its command.

    Why: putting Python's threshold back made the collector pass at once over the young
    generation the command had left (up to :data:`YOUNG_THRESHOLD` objects): 12-15 ms at the
    end of ``rankscope merge`` of the 54 MB rank, paid moments before the process ended anyway.
    A library caller (a notebook) never calls this, and gets its thresholds back."""
    _KEPT[0] = True


@contextlib.contextmanager
def paced_collector() -> Iterator[None]:
    """Run the body with the young generation collected every :data:`YOUNG_THRESHOLD`
    allocations; the caller's thresholds are restored on the way out, error or not. A caller
    that already collects less often (a higher threshold, or 0: collection off) is left as is."""
    old = gc.get_threshold()
    if old[0] == 0 or old[0] >= YOUNG_THRESHOLD:
        yield
        return
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    try:
        yield
    finally:
        if not _KEPT[0]:
            gc.set_threshold(*old)
