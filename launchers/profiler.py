"""The rank's ``torch.profiler.profile``, without importing torch's compiler when a window starts.

torch's profiler asks ``hasattr(torch, "_inductor")`` each time a window starts
(``profile.prepare_trace``) to learn whether inductor's CUDA graphs are on. ``torch._inductor``
is one of torch's lazy submodules, so the question itself imports it, and with it
``torch._dynamo``: 1.9-2.5 s of CPU on this project's 2-core machine (torch 2.13 CPU), paid by
every rank of a job that never compiles anything, inside the step where its first window starts.
That is overhead rankscope would add to the job it measures (and the largest part of a short
test job's CPU).

The answer only matters when inductor is in use, and then it was imported already (by
``torch.compile``'s first call): :class:`_NoInductorProbe` answers "no" without the import when
``torch._inductor`` is not loaded, and asks torch as before when it is. The flag is read again
when a window stops (the only place torch uses it, to turn CUPTI's lazy re-init off for CUDA
graphs), so a job that compiles for the first time inside a window is treated as torch would
treat it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.profiler import profile

#: torch's lazily imported compiler package, and its config module (``triton.cudagraphs``).
INDUCTOR = "torch._inductor"
INDUCTOR_CONFIG = "torch._inductor.config"


@contextlib.contextmanager
def _no_inductor_probe() -> Iterator[None]:
    """While inside: ``torch._inductor`` is an attribute of torch only if it is imported.

    torch resolves its lazy submodules in its module ``__getattr__`` (PEP 562), looked up in its
    ``__dict__`` at each miss; that one name is answered with AttributeError while inside, every
    other name by torch's own function."""
    import torch

    lazy: Callable[[str], Any] | None = torch.__dict__.get("__getattr__")
    if lazy is None or INDUCTOR in sys.modules:
        yield
        return

    def without_inductor(name: str) -> Any:
        if name == INDUCTOR.rpartition(".")[2]:
            raise AttributeError(name)
        return lazy(name)

    torch.__dict__["__getattr__"] = without_inductor
    try:
        yield
    finally:
        torch.__dict__["__getattr__"] = lazy


def make_profile(**kwargs: Any) -> profile:
    """A ``torch.profiler.profile(**kwargs)`` whose windows start without importing
    ``torch._inductor`` when the job has not (module docstring)."""
    from torch.profiler import profile

    class _NoInductorProbe(profile):
        def prepare_trace(self) -> None:
            with _no_inductor_probe():
                super().prepare_trace()

        def stop_trace(self) -> None:
            config = sys.modules.get(INDUCTOR_CONFIG)
            if config is not None:  # compiled since the window started: torch's own answer
                self.has_cudagraphs = bool(config.triton.cudagraphs)
            super().stop_trace()

    return _NoInductorProbe(**kwargs)
