"""Views of one rank's events computed once per rank task: :func:`shared_views`, :func:`rank_view`.

Why: a rank task (``analysis/engine/rank_task.py``) runs about twenty analyses on the same
events and lanes, and several start from the same derived arrays: which events are GPU events
in HTA's sense (``breakdown.gpu_event_mask``, asked 12 times per rank) and HTA's view of the
events (``breakdown.hta_view``: rounded stamps and its kept events, asked by each of HTA's five
analyses). Inside :func:`shared_views` each is computed once per (function, frames, arguments)
and handed out again; outside it (a notebook calling an analysis itself, on frames it may edit
between calls) nothing is kept and every call computes afresh.

Safe by construction: a view is found only for the very same frame objects (``is``, not an id
that a dead frame's successor could reuse: the memo holds the frames until the scope ends), the
frames of a rank task are never edited in place (the analyses are pure), and the arrays handed
out are read-only, so a caller that tried to edit one would fail loudly instead of changing what
the next analysis gets. The memo is per thread (the ``threads`` scheduler runs rank tasks side
by side).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

import numpy as np

#: What a view function returns.
View = TypeVar("View")

_LOCAL = threading.local()


@contextlib.contextmanager
def shared_views() -> Iterator[None]:
    """Within: :func:`shared` keeps each view for the rest of the scope (nested scopes share
    the outer one's)."""
    outer: dict[Hashable, tuple[tuple[Any, ...], Any]] | None = getattr(_LOCAL, "memo", None)
    _LOCAL.memo = {} if outer is None else outer
    try:
        yield
    finally:
        _LOCAL.memo = outer


def shared(
    name: str, frames: tuple[Any, ...], args: tuple[Hashable, ...], compute: Callable[[], View]
) -> View:
    """``compute()``, or what it returned for the same ``name``, the same ``frames`` (the very
    objects) and equal ``args`` earlier in this :func:`shared_views` scope. Arrays in the result
    (itself or the items of a tuple) are made read-only when kept."""
    memo: dict[Hashable, tuple[tuple[Any, ...], Any]] | None = getattr(_LOCAL, "memo", None)
    if memo is None:
        return compute()
    key = (name, tuple(id(f) for f in frames), args)
    hit = memo.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], frames, strict=True)):
        out: View = hit[1]
        return out
    value = compute()
    for item in value if isinstance(value, tuple) else (value,):
        if isinstance(item, np.ndarray):
            item.flags.writeable = False
    memo[key] = (frames, value)
    return value


def rank_view(frames: int) -> Callable[[Callable[..., View]], Callable[..., View]]:
    """Decorator: the function (positional arguments only: its first ``frames`` the rank's
    frames, the others hashable) is a view :func:`shared` inside :func:`shared_views`."""

    def decorate(func: Callable[..., View]) -> Callable[..., View]:
        @functools.wraps(func)
        def view(*args: Any) -> View:
            return shared(func.__qualname__, args[:frames], args[frames:], lambda: func(*args))

        return view

    return decorate
