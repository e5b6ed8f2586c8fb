"""Arguments of ``rankscope merge``, and reporting Ctrl-C during it as an interrupt.

Import-light on purpose: ``rankscope --help`` and ``rankscope analyze`` (which takes
``--rank-from`` too, :func:`add_rank_from`) build their parsers without loading the merge's
driver. ``main`` itself stays in ``orchestrator/merge.py``, beside :func:`merge_run_dir`, which
re-exports these names; the CLI dispatcher (``orchestrator/cli.py``) finds them there.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope merge`` (import-light)."""
    from rankscope.analysis.engine.cluster_flags import add_cluster_flags

    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="PATH",
        help="a run directory, a folder of Kineto traces (searched recursively), or trace files",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="store to write (default: trace.h5 in the run directory / folder, or beside the "
        "first trace file)",
    )
    add_cluster_flags(parser)  # --scheduler | --slurm-workers N [--slurm-partition], as analyze
    parser.add_argument(
        "--strict", action="store_true", help="exit non-zero when any input problem was found"
    )
    add_rank_from(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


def add_rank_from(parser: argparse.ArgumentParser) -> None:
    """``--rank-from REGEX`` (merge, and analyze when it merges)."""
    parser.add_argument(
        "--rank-from",
        default=None,
        metavar="REGEX",
        help="for traces without distributedInfo: take the rank from the file name, the first "
        "group of REGEX (e.g. 'gpu(\\d+)'); default: such traces are ranked in the order given",
    )


@contextlib.contextmanager
def interrupt_wins() -> Iterator[None]:
    """Ctrl-C during the block is reported as an interrupt, whatever code it lands in.

    A ``KeyboardInterrupt`` raised while h5py runs Cython code can come out as another exception
    (seen in CI: a ``TypeError`` from h5py's type-conversion setup), which would print a traceback
    instead of "interrupted" (exit 130). The handler notes that SIGINT arrived; an exception that
    escapes after it becomes the ``KeyboardInterrupt`` it stands for. Only Python's default
    handler is replaced (a user who ignores SIGINT keeps that).
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        fired.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    except Exception as exc:
        if fired:
            raise KeyboardInterrupt from exc
        raise
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
