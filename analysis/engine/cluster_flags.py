"""The command-line flags of where per-rank tasks run, spelled once for ``merge`` and ``analyze``.

``--scheduler WHERE | --slurm-workers N [--slurm-partition NAME]`` (:func:`add_cluster_flags`)
and their :class:`~rankscope.analysis.engine.scheduler.ClusterSpec` (:func:`cluster_spec_from_args`):
one word means the same for both commands, with the same help and the same one-line errors. The
flags are generated from the fields that declare one (:mod:`rankscope.config_flags`, the project's
one flag generator); this module adds the rule that ties two of them together. Import-light:
argparse only, so ``rankscope --help`` stays fast.
"""

from __future__ import annotations

import argparse

from rankscope.analysis.engine.scheduler import ClusterSpec
from rankscope.config_flags import Flags
from rankscope.errors import UsageError

#: The flags of :class:`ClusterSpec`'s flagged fields (``--scheduler`` and ``--slurm-workers``
#: exclude each other).
CLUSTER_FLAGS = Flags(ClusterSpec)


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """``--scheduler WHERE`` | ``--slurm-workers N`` [``--slurm-partition NAME``]: where the
    per-rank tasks run, spelled once for every command that fans out per rank (``merge``,
    ``analyze``); :func:`cluster_spec_from_args` reads them back. Import-light."""
    CLUSTER_FLAGS.add(parser)


def cluster_spec_from_args(
    args: argparse.Namespace, *, main_is_guarded: bool = True
) -> ClusterSpec:
    """The :class:`ClusterSpec` of :func:`add_cluster_flags`' flags (one-line UsageError when they
    do not fit together). ``main_is_guarded``: rankscope's own CLI is safe to re-import."""
    given = CLUSTER_FLAGS.given(args)
    if "slurm_partition" in given and "slurm_workers" not in given:
        raise UsageError("--slurm-partition needs --slurm-workers N")
    try:
        return ClusterSpec(**given, main_is_guarded=main_is_guarded)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
