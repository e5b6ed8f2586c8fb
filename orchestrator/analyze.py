"""``rankscope analyze RUN_DIR_or_trace.h5``: breakdown, collectives, stragglers, verdicts.

Prints the terminal summary and writes ``summary.json`` / ``report.html`` (atomically). For a run
directory both go to ``RUN/report/`` unless ``--json`` / ``--html`` say otherwise; a run directory
without ``trace.h5`` is merged first. The command only reads its flags: the merge → analyse →
report path is :func:`rankscope.orchestrator.workflow.merge_analyse_report`, which ``rankscope
run`` and a Slurm run's merge job take too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rankscope.orchestrator.workflow import TOP_OPS


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope analyze`` (import-light)."""
    parser.add_argument(
        "path",
        type=Path,
        help="a run directory, a folder of Kineto traces, one trace file, or a merged trace.h5",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write summary.json here")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write the HTML report here")
    from rankscope.analysis.engine.cluster_flags import add_cluster_flags

    add_cluster_flags(parser)  # the merge's flags too: a merge analyze runs first uses them
    parser.add_argument(
        "--top-ops",
        type=int,
        default=TOP_OPS,
        metavar="N",
        help=f"ops shown in the terminal (default {TOP_OPS})",
    )
    parser.add_argument(
        "--all-ranks",
        action="store_true",
        help="list every rank in the terminal tables (above 16 ranks they are summarised)",
    )
    from rankscope.orchestrator.merge import add_comm_kernel, add_rank_from

    add_rank_from(parser)
    add_comm_kernel(parser)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope analyze``."""
    from rankscope.analysis.engine.cluster_flags import cluster_spec_from_args
    from rankscope.collector import paced_collector
    from rankscope.orchestrator.merge import comm_from_args, pandas_without_arrow, read_ahead
    from rankscope.orchestrator.workflow import merge_is_due

    # One spec for both: a merge that must run first uses the same workers (its own "auto"
    # choice, for its own size, when none were asked for).
    cluster = cluster_spec_from_args(args, main_is_guarded=True)
    comm = comm_from_args(args)
    # a merge due first begins reading while this process imports (source_reads.py)
    inputs = [args.path] if merge_is_due(args.path) else []
    with read_ahead(inputs, cluster, comm, getattr(args, "rank_from", None)) as ahead:
        with paced_collector():  # the imports at an analysis' pace too (as rankscope merge)
            pandas_without_arrow(cluster)  # where every worker shares this interpreter
            from rankscope.orchestrator.workflow import Workflow, merge_analyse_report

        merge_analyse_report(
            args.path,
            Workflow(
                cluster=cluster,
                rank_from=getattr(args, "rank_from", None),
                comm=comm,
                json_path=args.json,
                html_path=args.html,
                top_ops=args.top_ops,
                all_ranks=getattr(args, "all_ranks", False),
                read_ahead=ahead,
            ),
        )
    return 0
