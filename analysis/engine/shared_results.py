"""A forked worker's arrays handed to this process through memory both share, not a pipe.

Why: a ``ProcessPoolExecutor`` sends each result back pickled through a pipe: the worker
copies every array into the pickle, the pipe moves it 64 KiB at a time (a switch between the
two processes each time), and this process copies it again. For the read-ahead of one 54 MB
rank (``orchestrator/ingest/source_reads.py``: 8 MB of columns) that took ~20 ms, between the
end of the parse and the merge's first write, with nothing else to do meanwhile (measured).
Here the worker copies each array of its result once into an anonymous shared mapping made by
this process before the fork, and the result goes through the pipe with each array replaced by
where it lies (:class:`SharedArray`: a few bytes); this process' arrays are views of the
mapping (no copy): ~5 ms. Nothing is unpickled here: the pipe's pickle is the pool's own, as
for any result, and the mapping holds only the arrays' raw bytes.

What is swapped: numeric numpy arrays (no objects, no records) anywhere in dicts, lists, tuples
and dataclass instances; anything else travels in the pickle as usual. One writer: the worker
forked from this process (a pool of one). The mapping's pages cost nothing until written; a
result whose arrays do not fit in what is left goes through the pipe whole
(:meth:`SharedResults.pack` returns it unchanged). The mapping lives as long as any array that
views it.
"""

from __future__ import annotations

import copy
import dataclasses
import mmap
from collections.abc import Callable
from typing import Any

import numpy as np

#: Byte alignment of each array in the mapping (a cache line).
ALIGN = 64
#: dtype kinds of the arrays that go through the mapping: bool, integers, floats, complex,
#: times (raw bytes with a fixed size per value).
SHARED_KINDS = "biufcmM"


@dataclasses.dataclass(frozen=True)
class SharedArray:
    """Where one array of a packed result lies in the mapping."""

    offset: int
    """bytes from the mapping's start"""
    dtype: str
    """the array's dtype (``np.dtype.str``: kind, size and byte order)"""
    shape: tuple[int, ...]
    """the array's shape (C order)"""


@dataclasses.dataclass(frozen=True)
class Packed:
    """A result as the worker hands it over: its arrays replaced by :class:`SharedArray`."""

    value: Any


class SharedResults:
    """An anonymous mapping shared with the worker forked after it is made (module docstring)."""

    def __init__(self, nbytes: int) -> None:
        """``nbytes``: the mapping's size (address space only until written)."""
        self._map = mmap.mmap(-1, max(nbytes, mmap.PAGESIZE))  # MAP_SHARED | MAP_ANONYMOUS
        self._used = 0  # bytes the worker wrote (its own count: it is the only writer)

    def pack(self, value: Any) -> Any:
        """In the worker: ``value`` as a :class:`Packed` whose arrays were copied into the
        mapping, or ``value`` itself when they do not fit in what is left (or it has none)."""
        arrays: dict[int, np.ndarray] = {}
        _rebuilt(value, lambda leaf: _note(leaf, arrays))
        need = sum(_aligned(a.nbytes) for a in arrays.values())
        if not arrays or self._used + need > len(self._map):
            return value
        places: dict[int, SharedArray] = {}
        for key, array in arrays.items():
            start = self._used
            flat = np.ascontiguousarray(array).reshape(-1)
            self._map[start : start + array.nbytes] = flat.view(np.uint8).data
            places[key] = SharedArray(start, array.dtype.str, array.shape)
            self._used = start + _aligned(array.nbytes)
        return Packed(_rebuilt(value, lambda leaf: places.get(id(leaf), leaf)))

    def unpack(self, value: Any) -> Any:
        """In this process: the result the worker packed, its arrays views of the mapping; or
        ``value`` itself when it was not packed."""
        if not isinstance(value, Packed):
            return value
        return _rebuilt(value.value, self._view)

    def _view(self, leaf: Any) -> Any:
        if not isinstance(leaf, SharedArray):
            return leaf
        dtype = np.dtype(leaf.dtype)
        count = int(np.prod(leaf.shape, dtype=np.int64))
        return np.frombuffer(self._map, dtype, count, leaf.offset).reshape(leaf.shape)


def _note(leaf: Any, arrays: dict[int, np.ndarray]) -> Any:
    """Keep ``leaf`` in ``arrays`` (by identity) when it is an array the mapping takes."""
    if (
        isinstance(leaf, np.ndarray)
        and leaf.dtype.kind in SHARED_KINDS
        and leaf.dtype.names is None
        and leaf.nbytes > 0
    ):
        arrays[id(leaf)] = leaf
    return leaf


def _rebuilt(value: Any, swap: Callable[[Any], Any]) -> Any:
    """``value`` with ``swap`` applied to every part: what ``swap`` replaces is replaced; in a
    dict, list, tuple or dataclass instance it left alone, the parts are, the container rebuilt
    around them (a dataclass instance copied, its fields replaced; the originals untouched)."""
    swapped = swap(value)
    if swapped is not value:
        return swapped
    kind = type(value)
    if kind is dict:
        return {k: _rebuilt(v, swap) for k, v in value.items()}
    if kind is list:
        return [_rebuilt(v, swap) for v in value]
    if kind is tuple:
        return tuple(_rebuilt(v, swap) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        new = copy.copy(value)
        for field in dataclasses.fields(value):
            object.__setattr__(new, field.name, _rebuilt(getattr(value, field.name), swap))
        return new
    return value


def _aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-nbytes // ALIGN) * ALIGN
