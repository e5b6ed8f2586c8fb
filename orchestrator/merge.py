"""``rankscope merge``: its arguments, its ``main``, and Ctrl-C during it reported as an interrupt.

The command only; the merge itself (per-rank traces → one HDF5 store with aligned clocks) is
:func:`rankscope.orchestrator.ingest.merge.merge_run_dir`. Import-light on purpose:
``rankscope --help`` and ``rankscope analyze`` (which takes ``--rank-from`` too,
:func:`add_rank_from`) build their parsers without loading the driver.

The command's process (and ``rankscope analyze``'s) imports pandas without pyarrow
(:func:`pandas_without_arrow`) where no worker of another interpreter takes part: pandas imports pyarrow eagerly (~0.1 s of CPU on this
project's machine, a tenth of the 54 MB rank's whole merge) and the merge never uses it, its
strings being Python objects (:func:`rankscope.pandas_strings.object_strings`).

``rankscope merge`` of other tools' traces imports no pandas at all: the merge is numpy but
where it reads what only a ``rankscope run`` folder holds (its clock samples, fitted by
``clock.fit_samples``, and refined by GPU collectives; its step changes), ~0.17 s of a small
job's ~0.45 s merge. A run folder's merge imports pandas at once, while the traces are read
ahead (``source_reads.py``), as before; without a read-ahead, any input but one trace file
does.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.config_flags import Flags
from rankscope.errors import UsageError
from rankscope.orchestrator.ingest.comm_kernels import (
    CommKernelSettings,
    CommVocabulary,
    vocabulary,
)

if TYPE_CHECKING:
    from rankscope.analysis.engine.scheduler import ClusterSpec
    from rankscope.orchestrator.ingest.source_reads import ReadAhead

#: ``--comm-kernel REGEX`` from :class:`CommKernelSettings`'s field.
COMM_FLAGS = Flags(CommKernelSettings, repeat_note=" (repeatable)")
#: The module pandas imports at its own import when installed, and the merge never needs.
ARROW_MODULE = "pyarrow"


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
        help="store to write (default: trace.h5 in the run directory / folder; for one trace "
        "file a.json[.gz], a.rankscope.h5 beside it; for several files, trace.h5 beside the first)",
    )
    add_cluster_flags(parser)  # --scheduler | --slurm-workers N [--slurm-partition], as analyze
    parser.add_argument(
        "--strict", action="store_true", help="exit non-zero when any input problem was found"
    )
    add_rank_from(parser)
    add_comm_kernel(parser)
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


def add_comm_kernel(parser: argparse.ArgumentParser) -> None:
    """``--comm-kernel REGEX`` (repeatable; merge, and analyze when it merges)."""
    COMM_FLAGS.add(parser)


def comm_from_args(args: argparse.Namespace) -> CommVocabulary:
    """The communication kernels of this merge: built-in, the config file's, the flags'."""
    return vocabulary(COMM_FLAGS.build(args))


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


def pandas_without_arrow(spec: ClusterSpec) -> None:
    """Import pandas with pyarrow hidden from it, when nothing of the merge runs in another
    interpreter (module docstring); a no-op once pandas is imported.

    Why only then: pandas decides at its import whether pyarrow is there (``HAS_PYARROW``), so
    this process' pandas never makes or reads an Arrow-backed column. The merge itself makes
    none (object strings), and forked workers share this process' pandas; but a LocalCluster's,
    a Dask scheduler's or Slurm's workers start their own interpreters, whose pandas has pyarrow,
    and this process must read what they send back. pyarrow is hidden during pandas' import
    only: a later ``import pyarrow`` (by Dask, say) finds it as usual.
    """
    from rankscope.analysis.engine.scheduler import (
        AUTO,
        PROCESSES,
        SYNCHRONOUS,
        THREADS,
        can_fork,
    )

    # "auto" picks a LocalCluster for a large job where this process cannot fork (scheduler.choose)
    in_this_process = spec.slurm_workers is None and (
        spec.scheduler in (PROCESSES, SYNCHRONOUS, THREADS)
        or (spec.scheduler == AUTO and can_fork())
    )
    if "pandas" in sys.modules or ARROW_MODULE in sys.modules or not in_this_process:
        return
    sys.modules[ARROW_MODULE] = None  # type: ignore[assignment]  # Python's "not installed"
    try:
        import pandas
    except ImportError:
        # a pandas that cannot do without pyarrow: forget the half-imported one, import as usual
        for name in [m for m in sys.modules if m == "pandas" or m.startswith("pandas.")]:
            del sys.modules[name]
    finally:
        del sys.modules[ARROW_MODULE]
    import pandas  # noqa: F401  (imported already, or now with pyarrow)


def main(args: argparse.Namespace) -> int:
    """Run ``rankscope merge``; returns the exit status."""
    paths = [Path(p) for p in args.inputs]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise UsageError(f"{missing[0]}: no such file or directory")
    from rankscope.analysis.engine.cluster_flags import cluster_spec_from_args
    from rankscope.collector import paced_collector

    cluster = cluster_spec_from_args(args, main_is_guarded=True)
    comm = comm_from_args(args)
    # Paced from the imports on: at Python's pace, importing numpy, pandas and h5py ran ~140
    # young passes, ~13 middle ones and a full one, 0.05-0.08 s of CPU (one 54 MB rank's merge).
    with paced_collector(), read_ahead(paths, cluster, comm, args.rank_from) as ahead:
        # pandas where the merge will use it: a rankscope run's folder (module docstring)
        eager = ahead.run_dir if ahead is not None else not (len(paths) == 1 and paths[0].is_file())
        if eager:
            pandas_without_arrow(cluster)  # while the traces are read (source_reads.py)
        from rankscope.orchestrator.ingest.merge import merge_run_dir
        from rankscope.pandas_strings import object_strings

        # the pace and the strings of an analysis (workflow.merge_analyse_report): same store
        with interrupt_wins(), object_strings(if_imported=True):
            merge_run_dir(
                paths[0],
                output=args.output,
                cluster=cluster,
                quiet=args.quiet,
                strict=args.strict,
                extra_inputs=paths[1:],
                main_is_guarded=True,
                rank_from=args.rank_from,
                comm=comm,
                read_ahead=ahead,
            )
    return 0


@contextlib.contextmanager
def read_ahead(
    inputs: list[Path], cluster: ClusterSpec, comm: CommVocabulary, rank_from: str | None = None
) -> Iterator[ReadAhead | None]:
    """The traces of ``inputs`` parsed in a forked process from now on, where that pays
    (``source_reads.ReadAhead.start``; None where not), ended when the block ends.
    ``rank_from``: ``--rank-from``'s expression (None without)."""
    from rankscope.orchestrator.ingest.source_reads import ReadAhead

    ahead = ReadAhead.start(inputs, cluster, comm, rank_from) if inputs else None
    try:
        yield ahead
    finally:
        if ahead is not None:
            ahead.close()
