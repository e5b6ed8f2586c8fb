"""torchrun as every backend drives it: the rank command line, its environment, its failure report.

The local backend runs this command as a child process; the Slurm backend runs it once per node
inside the job. Keeping it here means both launch the same per-rank runtime and read torchrun's
end-of-run failure summary the same way.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from rankscope.launchers import rundir
from rankscope.launchers.hang_probe import NCCL_WATCHDOG_RE
from rankscope.launchers.spec import RunSpec

#: The per-rank entry module every rank runs.
RANK_MODULE = "rankscope.launchers.rank"

#: OpenMP's thread count. torchrun sets it to :data:`TORCHRUN_OMP_THREADS` for a node of several
#: ranks when it is unset, and prints a five-line banner saying so in every run; setting the same
#: value ourselves keeps the ranks' behaviour and drops the banner (a value the user set is kept).
OMP_THREADS_ENV = "OMP_NUM_THREADS"
TORCHRUN_OMP_THREADS = "1"

#: torchrun's folder for each rank's ``error.json`` (a failed rank's traceback), under the run's
#: ``logs/``: left to itself torchrun makes a ``/tmp/torchelastic_*`` folder per run and never
#: removes it (1,233 of them after a day of this suite). On Slurm each node task has its own
#: folder inside (``slurm_node.ELASTIC_NODE_FORMAT``).
TORCHELASTIC_DIR = "torchelastic"
#: torchrun's own ways to name that folder: a flag the user passed, or its environment variable.
LOG_DIR_FLAGS = ("--log-dir", "--log_dir")
LOG_DIR_ENV = "PET_LOG_DIR"

#: Heading of torchrun's summary entry for the first failure it observed.
ROOT_CAUSE_MARKER = "Root Cause (first observed failure)"
#: torchrun's failure summary: "rank : 2 (local_rank: 2)" then "exitcode : -9 (pid: 123)".
_FAILURE_RE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)"
    r"(?:[^\n]*\n){0,2}?\s*traceback\s*:\s*(?P<tb>[^\n]*)",
)


def rank_argv(spec: RunSpec) -> list[str]:
    """What torchrun runs in every rank: the rank module, then the user's script and arguments."""
    module_flag = ["--module"] if spec.module else []
    return ["-m", RANK_MODULE, *module_flag, spec.script, *spec.script_args]


def rank_command(spec: RunSpec, run_dir: Path) -> list[str]:
    """The full command line: torchrun with its flags, the rank module, script and arguments."""
    log_dir = log_dir_args(spec.torchrun_args, run_dir / rundir.LOGS_DIR / TORCHELASTIC_DIR)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *log_dir,
        *spec.torchrun_args,
        *rank_argv(spec),
    ]


def flag_value(tokens: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the first of ``names`` in ``tokens`` (``--flag=value`` or ``--flag value``)."""
    for i, tok in enumerate(tokens):
        flag, has_value, value = tok.partition("=")
        if flag in names:
            if has_value:
                return value
            return tokens[i + 1] if i + 1 < len(tokens) else None
    return None


def log_dir_args(torchrun_args: list[str], folder: Path) -> list[str]:
    """``--log-dir=folder`` unless the user named torchrun's log folder (flag or environment)."""
    if flag_value(torchrun_args, LOG_DIR_FLAGS) is not None or os.environ.get(LOG_DIR_ENV):
        return []
    return [f"--log-dir={folder}"]


def prune_empty_dirs(folder: Path) -> None:
    """Remove ``folder`` and the folders under it that hold no file (deepest first): torchrun
    makes one per attempt and rank, and only a failed rank writes its ``error.json`` there."""
    if not folder.is_dir():
        return
    below = [p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink()]
    for d in [*sorted(below, key=lambda p: len(p.parts), reverse=True), folder]:
        with contextlib.suppress(OSError):  # not empty, or gone: either way nothing to do
            d.rmdir()


def rank_settings_env(spec: RunSpec, run_dir: Path) -> dict[str, str]:
    """The variables every rank needs: the user's extra ones, the run folder, the profiler, and
    PyTorch's Flight Recorder on (unless the user sized it: then theirs) — the collectives each
    rank entered and completed, read when the job hangs (``launchers/hang_probe.py``)."""
    from rankscope.launchers.hang_probe import FLIGHT_RECORDER_ENTRIES, FLIGHT_RECORDER_ENV

    recorder = {}
    if FLIGHT_RECORDER_ENV not in os.environ and FLIGHT_RECORDER_ENV not in spec.env:
        recorder[FLIGHT_RECORDER_ENV] = FLIGHT_RECORDER_ENTRIES
    return {
        **recorder,
        **spec.env,
        rundir.ENV_RUN_DIR: str(run_dir),
        rundir.ENV_PROFILER: spec.profiler.to_json(),
    }


def rank_env(spec: RunSpec, run_dir: Path) -> dict[str, str]:
    """Environment of the job: the run directory and profiler settings for every rank."""
    env = {**os.environ, **rank_settings_env(spec, run_dir)}
    env.setdefault("PYTHONUNBUFFERED", "1")
    if OMP_THREADS_ENV not in env and (spec.nproc_per_node or 0) > 1:
        # torchrun's own rule (several ranks per node, variable unset), so the ranks get the
        # value they always got; ``auto``/``gpu`` (None here) are left to torchrun.
        env[OMP_THREADS_ENV] = TORCHRUN_OMP_THREADS
    return env


def torchrun_failures(log_text: str) -> list[dict[str, Any]]:
    """Failed ranks from torchrun's end-of-run summary (e.g. killed by a signal)."""
    failures = []
    for m in _FAILURE_RE.finditer(log_text):
        code = int(m["code"])
        tb = m["tb"].strip()
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            error = f"killed by {name}"
        else:
            error = tb if tb and not tb.startswith("To enable traceback") else f"exit code {code}"
        failures.append({"rank": int(m["rank"]), "error": error, "exit_code": code})
    # NCCL's watchdog ends a rank whose collective timed out (SIGABRT): its log line says why
    watchdog = {int(w["rank"]): w[0] for w in NCCL_WATCHDOG_RE.finditer(log_text)}
    for f in failures:
        if f["rank"] in watchdog:
            f["error"] = watchdog[f["rank"]].strip()
    _, marker, root = log_text.rpartition(ROOT_CAUSE_MARKER)
    first = _FAILURE_RE.search(root) if marker else None
    for f in failures:
        if first is not None and f["rank"] == int(first["rank"]):
            f["root_cause"] = True
    return failures
