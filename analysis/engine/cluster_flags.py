"""The command-line flags of where per-rank tasks run, spelled once for ``merge`` and ``analyze``.

``--scheduler WHERE | --slurm-workers N [--slurm-partition NAME]`` (:func:`add_cluster_flags`)
and their :class:`~rankscope.analysis.engine.scheduler.ClusterSpec` (:func:`cluster_spec_from_args`):
one word means the same for both commands, with the same help and the same one-line errors.
Import-light: argparse only, so ``rankscope --help`` stays fast.
"""

from __future__ import annotations

import argparse

from rankscope.analysis.engine.scheduler import AUTO, ClusterSpec
from rankscope.errors import UsageError


def _positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (one-line error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return value


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """``--scheduler WHERE`` | ``--slurm-workers N`` [``--slurm-partition NAME``]: where the
    per-rank tasks run, spelled once for every command that fans out per rank (``merge``,
    ``analyze``); :func:`cluster_spec_from_args` reads them back. Import-light."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--scheduler",
        default=None,
        metavar="WHERE",
        help="where the per-rank tasks run: 'auto' (default: in this process unless worker "
        "processes pay for their start-up), 'processes' (worker processes forked from this "
        "one, Linux), 'local' (a LocalCluster sized to this machine), "
        "'threads', 'synchronous' (in this process), or a Dask scheduler address "
        "(tcp://host:8786)",
    )
    where.add_argument(
        "--slurm-workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help="run the per-rank tasks on N one-core Slurm jobs (a dask-jobqueue SLURMCluster); "
        "the traces and the output must be on a filesystem the nodes share",
    )
    parser.add_argument(
        "--slurm-partition",
        default=None,
        metavar="NAME",
        help="partition of the --slurm-workers jobs (default: the cluster's)",
    )


def cluster_spec_from_args(
    args: argparse.Namespace, *, main_is_guarded: bool = True
) -> ClusterSpec:
    """The :class:`ClusterSpec` of :func:`add_cluster_flags`' flags (one-line UsageError when they
    do not fit together). ``main_is_guarded``: rankscope's own CLI is safe to re-import."""
    workers = getattr(args, "slurm_workers", None)
    partition = getattr(args, "slurm_partition", None)
    if partition is not None and workers is None:
        raise UsageError("--slurm-partition needs --slurm-workers N")
    try:
        return ClusterSpec(
            scheduler=getattr(args, "scheduler", None) or AUTO,
            slurm_workers=workers,
            slurm_partition=partition,
            main_is_guarded=main_is_guarded,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
