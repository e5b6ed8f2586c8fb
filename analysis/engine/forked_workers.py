"""Worker processes forked from this one: the ``processes`` scheduler's pool.

Forked rather than spawned (Dask's LocalCluster) or started from a fork server: a forked worker
starts in milliseconds with every module of the parent already imported, and it never re-runs
``__main__`` — so it pays on a 2-core laptop (docs/performance.md) and is safe from a plain
script. What a fork inherits that it must not use is handled here: the standard streams (a
parent thread may hold their locks at the fork) and Ctrl-C (the parent ends its workers).
Linux only (``scheduler.can_fork``).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Executor, ProcessPoolExecutor

    from rankscope.analysis.engine.shared_results import SharedResults

#: What a task returns.
Result = TypeVar("Result")
#: Seconds to wait for a forked worker to end once it was told to (terminate, then kill).
FORK_STOP_S = 5.0


def run_forked(
    func: Callable[..., Result], calls: Sequence[tuple[Any, ...]], workers: int, limit: int
) -> Iterator[Result]:
    """Yield ``func(*args)`` for each of ``calls`` from ``workers`` forked processes, as each
    finishes, ``limit`` calls in flight.

    Forked, not spawned: nothing is imported again and ``__main__`` is not re-run, so this is
    safe from a plain script. Each worker starts with fresh standard streams and ignores Ctrl-C
    (:func:`_forked_worker_start`); the parent answers Ctrl-C, an error or an early close by
    ending the workers itself (terminate, then kill, each wait bounded by :data:`FORK_STOP_S`).
    A worker that dies (the kernel's out-of-memory killer, a crash in a C library) raises
    ``BrokenProcessPool`` (the scheduler says it in one line); a task's own exception reaches
    the caller as raised.
    """
    pool, before = forked_pool(workers)
    finished = False
    try:
        yield from in_flight(pool, func, calls, limit)
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:
            stop_pool(pool, before)


def forked_pool(
    workers: int, *, heap_pad: int = 0, shared: SharedResults | None = None
) -> tuple[ProcessPoolExecutor, set[Any]]:
    """A pool of ``workers`` processes forked from this one (each begins with
    :func:`_forked_worker_start`), and the children this process had before it (for
    :func:`stop_pool`). The workers are forked at the first submit. ``heap_pad``: bytes each
    worker's heap keeps beyond its use (:func:`_pad_heap`; 0: the C library's default).
    ``shared``: where the results of calls submitted through :func:`shared_call` are handed
    over (one worker only: it is the mapping's one writer)."""
    if shared is not None and workers != 1:
        raise ValueError("shared results need a pool of one worker")
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_forked_worker_start,
        initargs=(os.getpid(), heap_pad, shared),
    )
    return pool, before


def stop_pool(pool: ProcessPoolExecutor, before: set[Any]) -> None:
    """End a :func:`forked_pool` now: calls not started are cancelled, its workers terminated,
    then killed (each wait bounded by :data:`FORK_STOP_S`)."""

    # the pool's manager thread also ends and reaps the workers once one died: it is joined
    # (bounded) too, or a worker it is still reaping would look alive to the caller for a
    # moment (a reaped pid is never seen again by another waitpid)
    manager: threading.Thread | None = getattr(pool, "_executor_manager_thread", None)
    results = getattr(pool, "_result_queue", None)  # shutdown() forgets it
    pool.shutdown(wait=False, cancel_futures=True)
    _end(_workers(before))
    _cut_results(results)
    if manager is not None:
        manager.join(FORK_STOP_S)


def _cut_results(results: Any) -> None:
    """Close this process' write end of a pool's result pipe (``results``: the pool's result
    queue, or None), once its workers are gone.

    Why: a worker ended while it was sending a result (a parse ahead that a failed merge
    stops: its ~MB of columns) leaves the pool's manager thread reading the rest of it forever.
    No end of file comes, as this process holds the pipe's write end too (every worker is
    forked from it), and at exit the interpreter joins that thread without a bound: the
    process hung (reproduced: ``tests/test_forked_workers.py``). Closed, the read ends at once,
    the manager thread counts the pool as broken and ends; nothing else writes there."""
    writer = getattr(results, "_writer", None)
    if writer is not None:
        writer.close()


def in_flight(
    pool: Executor, func: Callable[..., Result], calls: Sequence[tuple[Any, ...]], limit: int
) -> Iterator[Result]:
    """``func(*args)`` for each of ``calls`` on ``pool`` (threads or processes), as each finishes,
    at most ``limit`` submitted and not yet handed over: finished results never pile up."""
    from concurrent.futures import FIRST_COMPLETED, Future, wait

    pending = iter(calls)
    running: set[Future[Result]] = {pool.submit(func, *a) for a in itertools.islice(pending, limit)}
    while running:
        done, running = wait(running, return_when=FIRST_COMPLETED)
        for fut in done:
            result = fut.result()
            nxt = next(pending, None)
            if nxt is not None:
                running.add(pool.submit(func, *nxt))
            yield result


#: In a worker of a pool made with ``shared``: where its results go (:func:`shared_call`).
_shared: SharedResults | None = None


def shared_call(func: Callable[..., Result], *args: Any) -> Any:
    """In a worker: ``func(*args)`` packed into the pool's shared mapping
    (``SharedResults.pack``; unchanged without one); the caller unpacks it
    (``SharedResults.unpack``)."""
    result = func(*args)
    return _shared.pack(result) if _shared is not None else result


def _forked_worker_start(
    parent: int | None = None, heap_pad: int = 0, shared: SharedResults | None = None
) -> None:
    """First thing in a forked worker: ignore Ctrl-C (the parent ends its workers), end with
    the parent, and write through stream objects of its own.

    A parent killed outright (SIGKILL, the out-of-memory killer) cannot end its workers, and one
    blocked in its task (reading a pipe, waiting on a file) would outlive it forever: the kernel
    sends it SIGTERM when the parent dies (``PR_SET_PDEATHSIG``; if the parent is already gone,
    the worker ends at once). A thread of the parent (a progress bar) may have held the lock of
    ``sys.stderr`` at the fork, which no thread of the child would ever release."""
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    sys.stdout = _own_stream(1)
    sys.stderr = _own_stream(2)
    if heap_pad:
        _pad_heap(heap_pad)
    global _shared
    _shared = shared


#: ``mallopt`` parameter (glibc): bytes the heap grows by beyond a request, and keeps free at
#: its top when it shrinks.
M_TOP_PAD = -2


def _pad_heap(nbytes: int) -> None:
    """Keep ``nbytes`` of freed memory at the top of this process' heap (glibc's ``mallopt``;
    nothing elsewhere).

    Why: a fresh process that parses a large rank frees and allocates again its text buffers
    and columns, and by default glibc gives the freed top of the heap back to the system and
    takes fresh zeroed pages again: a page fault per 4 KiB. Kept, the 54 MB
    ``df_index_resolver`` rank's parse in a forked process takes ~7,800 page faults instead of
    ~10,000 and 0.129 s instead of 0.134 s (median of 8, measured; docs/performance.md)."""
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(M_TOP_PAD, nbytes)
    except (OSError, AttributeError):
        return


#: ``prctl`` option: the signal the kernel sends this process when its parent dies (Linux).
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int | None) -> None:
    """SIGTERM to this process when its parent (pid ``parent``) dies; at once if it has."""
    import ctypes
    import signal

    try:
        # this process' own symbols, libc's among them: find_library("c") would run ldconfig
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):
        return  # not Linux' libc: the parent's own cleanup is all there is
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)  # the parent died before the request took effect


def _own_stream(fd: int) -> Any:
    """A new text stream on a duplicate of ``fd`` (the null device where ``fd`` is closed)."""
    try:
        return open(os.dup(fd), "w", closefd=True)
    except OSError:
        return open(os.devnull, "w")


def signal_workers(before: set[Any]) -> None:
    """Tell the workers of a :func:`forked_pool` to end (SIGTERM), without waiting: for a pool
    whose results are all handed over, so that the workers' ends (freeing their memory takes
    the system milliseconds) run beside this process' work; :func:`stop_pool` still ends the
    pool. ``before``: the children this process had before the pool."""
    for child in _workers(before):
        child.terminate()


def _workers(before: set[Any]) -> set[Any]:
    """This process' children that a pool forked: those alive now but ``before`` it."""
    import multiprocessing

    return set(multiprocessing.active_children()) - before


def _end(children: set[Any]) -> None:
    """Terminate forked workers, then kill those still there after :data:`FORK_STOP_S`."""
    for child in children:
        child.terminate()
    for child in children:
        child.join(FORK_STOP_S)
        if child.is_alive():
            child.kill()
            child.join(FORK_STOP_S)
