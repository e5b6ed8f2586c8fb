"""Time each step spends blocked in collectives, where that is cheap to know (the step log's
``wait_ns``, issue 30).

In a synchronous job every rank's step ENDS at about the same time (each collective waits for
the slowest rank), so end times alone do not say which rank the others wait for: the one that
waits least does. The runtime therefore wraps the blocking collectives of ``torch.distributed``
that Python code calls (:data:`WRAPPED`: ``all_reduce``, ``barrier``, …, and through them the
``*_object`` helpers) and sums, per step, the ns the calling thread spent inside them: the time
it waited for the later ranks plus the transfer itself (about the same on every rank, so the
differences between ranks are waits). Outside the profiler windows the wrapper costs two clock
reads (~0.2 µs) per collective call.

What it cannot see, and then says :data:`~rankscope.launchers.step_log.UNKNOWN` (-1) for the step:

* a step without any wrapped call — DDP's gradient all-reduce runs in its C++ ``Reducer`` and
  FSDP's collectives in C++ too, outside Python's reach;
* a step with an ``async_op=True`` call: its wait happens later in ``Work.wait()`` (C++).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from rankscope.launchers.step_log import UNKNOWN

#: The blocking collectives of ``torch.distributed`` whose time is counted (each wrapped in both
#: ``torch.distributed`` and ``distributed_c10d``, whose own helpers call them by global name).
WRAPPED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
)


class WaitClock:
    """The ns spent in wrapped collectives since the last :meth:`take` (one per process)."""

    def __init__(self) -> None:
        self.ns = 0
        self.seen = False
        """A blocking wrapped call ran in this step."""
        self.unseen = False
        """An ``async_op=True`` call ran in this step: its wait is not seen here."""
        self._depth = threading.local()

    def take(self) -> int:
        """The step that ends now: its wait in ns, or UNKNOWN; the counters restart."""
        wait = self.ns if self.seen and not self.unseen else UNKNOWN
        self.ns, self.seen, self.unseen = 0, False, False
        return wait

    def wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original`` timed: only the outermost wrapped call counts (a helper calling
        another one is one wait)."""
        clock = self
        perf = time.perf_counter_ns
        local = self._depth

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("async_op"):
                clock.unseen = True
                return original(*args, **kwargs)
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            t0 = perf()
            try:
                return original(*args, **kwargs)
            finally:
                local.depth = depth
                if depth == 0:
                    clock.ns += perf() - t0
                    clock.seen = True

        wrapper._rankscope_wrapped = True  # type: ignore[attr-defined]
        return wrapper


CLOCK = WaitClock()
"""This process's clock (the runtime takes it at every step end)."""


def install() -> bool:
    """Wrap :data:`WRAPPED` in ``torch.distributed`` (idempotent); False without it."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    from torch.distributed import distributed_c10d as c10d

    for name in WRAPPED:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_rankscope_wrapped", False):
            continue
        wrapper = CLOCK.wrap(original)
        setattr(c10d, name, wrapper)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapper)
    return True
