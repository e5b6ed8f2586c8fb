"""``rankscope finalize RUN``: the body of a Slurm run's merge job (hidden from ``--help``).

The launcher submits it as a one-CPU job with ``--dependency=afterany:JOB`` (``launchers/
slurm_commands.py``), so it runs however the job ended. It lives up here, not in the Slurm
launcher, because it merges and analyses: the launchers floor may not import either, and once
shelled out to ``rankscope merge`` / ``rankscope analyze`` for that alone. Here both run in this
process, while the Slurm facts (waiting for accounting's final state, the ``run.json`` ``slurm``
object, :class:`~rankscope.launchers.slurm.records.MergeState`) stay the launcher's.

Each step's exit status is recorded in ``run.json`` (``slurm.merge``: ``merge_exit_code``,
``analyze_exit_code``) and printed to the merge log (``RUN/logs/merge-JOB.out``) as the command
line would have: the status a ``rankscope merge``/``analyze`` process would have exited with.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.analysis.engine.scheduler import ClusterSpec

#: Prefix of the lines this command writes to the merge log.
LOG_PREFIX = "rankscope finalize"
#: The spec option (``run.json``'s ``options``) that says whether the run is analysed after the
#: merge: False for ``rankscope run --no-analyze`` (the merge job then only merges).
ANALYZE_OPTION = "analyze"


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope finalize`` (import-light)."""
    parser.add_argument("run_dir", type=Path, metavar="RUN", help="run directory of a Slurm run")
    parser.add_argument(
        "--hang-only",
        action="store_true",
        help="only diagnose the hang the job's first node recorded, and leave the job running "
        "(--on-hang wait; run by that node)",
    )


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope finalize`` (run by the merge job, not by people)."""
    if args.hang_only:
        return diagnose_running_hang(args.run_dir)
    return finalize(args.run_dir)


def diagnose_running_hang(run_dir: Path | str) -> int:
    """A batch job that hung and is left running (``--on-hang wait``): its first node recorded
    the notice and asked the ranks; say who and where now (the paragraph on the node's output,
    ``report/hang.json``, ``run.json``'s ``hang``), as ``rankscope run`` does for a job it
    follows — nothing ends the job soon, and ``rankscope status`` shows the hang meanwhile. The
    job stays ``running`` until it ends; ended then (``scancel``), it is ``hung``. 0 when
    diagnosed, 1 when there was no hang to diagnose."""
    from rankscope.orchestrator.hang import diagnose_recorded

    run_dir = Path(run_dir).resolve()
    if not diagnose_recorded(run_dir):
        print(f"{LOG_PREFIX}: no hang to diagnose in {run_dir}", file=sys.stderr, flush=True)
        return 1
    return 0


def finalize(run_dir: Path | str, settle_s: float | None = None) -> int:
    """Record the final state, then merge and analyse; return the merge's status.

    Waits up to ``settle_s`` seconds (default: the launcher's ``SETTLE_S``) for accounting to
    show the final state, then merges (in-process: the merge job has one CPU, so no Dask
    LocalCluster) and, when the merge succeeded, analyses. The analysis is a bonus: its failure
    leaves the merge ``completed``.
    """
    from rankscope.launchers import rundir
    from rankscope.launchers.slurm.launcher import SETTLE_S, settle_final_state
    from rankscope.launchers.slurm.records import MergeState, update_slurm

    run_dir = Path(run_dir).resolve()
    state = settle_final_state(run_dir, SETTLE_S if settle_s is None else settle_s)
    merge: dict[str, Any] = {
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "state": str(MergeState.RUNNING),
        "started_at": rundir.utc_now(),
    }
    update_slurm(run_dir, merge=merge)
    print(f"{LOG_PREFIX}: run {run_dir} is {state}", flush=True)
    if state == rundir.RunState.HUNG:
        from rankscope.orchestrator.hang import diagnose_recorded

        diagnose_recorded(run_dir)  # a batch job's hang, noticed by its first node
    if not any((run_dir / rundir.RANKS_DIR).glob(f"*/{rundir.WINDOW_GLOB}")):
        print(f"{LOG_PREFIX}: no rank wrote a profiler window: nothing to merge", flush=True)
        merge.update(state=str(MergeState.SKIPPED), ended_at=rundir.utc_now(), store=None)
        update_slurm(run_dir, merge=merge)
        return 0
    status = _step("merge", lambda: _merge(run_dir))
    merge["merge_exit_code"] = status
    if status == 0 and _analysis_wanted(run_dir):
        merge["analyze_exit_code"] = _step("analyze", lambda: _analyze(run_dir))
    elif status == 0:
        print(f"{LOG_PREFIX}: not analysed (rankscope run --no-analyze)", flush=True)
    store = run_dir / rundir.STORE_NAME
    merge.update(
        state=str(MergeState.COMPLETED if status == 0 else MergeState.FAILED),
        ended_at=rundir.utc_now(),
        store=str(store) if store.exists() else None,
    )
    update_slurm(run_dir, merge=merge)
    return status


def _analysis_wanted(run_dir: Path) -> bool:
    """The run was not started with ``--no-analyze`` (:data:`ANALYZE_OPTION`; runs recorded
    before the option existed, and the sbatch template's, are analysed)."""
    from rankscope.errors import RankscopeError
    from rankscope.launchers import rundir

    try:
        options = rundir.load_run(run_dir).get("options") or {}
    except (RankscopeError, OSError, ValueError):
        return True
    return options.get(ANALYZE_OPTION) is not False


def _merge(run_dir: Path) -> int:
    """``rankscope merge RUN --scheduler synchronous``, in this process (the workflow's merge)."""
    from rankscope.orchestrator.workflow import merge_into_store

    merge_into_store(run_dir, _in_process())
    return 0


def _analyze(run_dir: Path) -> int:
    """``rankscope analyze RUN --scheduler synchronous``, in this process (its own defaults)."""
    from rankscope.orchestrator.workflow import Workflow, merge_analyse_report

    merge_analyse_report(run_dir, Workflow(cluster=_in_process()))
    return 0


def _in_process() -> ClusterSpec:
    """The merge job has one CPU: every per-rank task in this process (no Dask LocalCluster)."""
    from rankscope.analysis.engine.scheduler import SYNCHRONOUS, ClusterSpec

    return ClusterSpec(scheduler=SYNCHRONOUS, main_is_guarded=True)


def _step(name: str, body: Callable[[], int]) -> int:
    """Run one step and return the status ``rankscope NAME`` would have exited with.

    A user-level error is one line (as the command line prints it), anything else a traceback
    and status 1 (as an uncaught exception ends a Python process): the merge job goes on to
    record the outcome either way.
    """
    from rankscope.errors import RankscopeError
    from rankscope.launchers.base import EXIT_INTERRUPTED

    try:
        status = int(body() or 0)
    except RankscopeError as exc:
        print(f"rankscope {name}: error: {exc}", file=sys.stderr)
        status = exc.exit_code
    except KeyboardInterrupt:
        print(f"rankscope {name}: interrupted", file=sys.stderr)
        status = EXIT_INTERRUPTED
    except Exception:
        traceback.print_exc()
        status = 1
    sys.stderr.flush()
    print(f"{LOG_PREFIX}: rankscope {name} exited with {status}", flush=True)
    return status
