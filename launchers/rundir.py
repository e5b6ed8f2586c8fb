"""The run directory: one per run, the only contract between the ranks, the launcher and the merge.

Layout (all names are module constants; see docs/format.md)::

    RUN/run.json                         spec, command, launcher, world size, schedule, versions, times, state
    RUN/ranks/00003/meta.json            host, pid, local rank, device, clock-sync samples, windows written
    RUN/ranks/00003/window-000.json.gz   one Kineto trace per profiler window
    RUN/trace.h5                         the merged store
    RUN/report/                          summary.json, report.html

Every file is written to a temporary name in the same folder and renamed, so a reader never sees
a half-written file and a crash loses at most the window in progress.
"""

from __future__ import annotations

import enum
import json
import re
from pathlib import Path
from typing import Any

from rankscope.atomic import atomic_output

RUN_JSON = "run.json"
RANKS_DIR = "ranks"
RANK_DIR_FORMAT = "{rank:05d}"
META_JSON = "meta.json"
WINDOW_FORMAT = "window-{window:03d}.json.gz"
WINDOW_GLOB = "window-*.json.gz"
STORE_NAME = "trace.h5"
REPORT_DIR = "report"
SUMMARY_JSON = "summary.json"
REPORT_HTML = "report.html"
LOGS_DIR = "logs"

#: Name of the annotation (``record_function``) the rank runtime puts around every isend / irecv
#: (and so around send / recv / batch_isend_irecv), naming the peer's GLOBAL rank: Kineto traces
#: of gloo carry no peer at all, and NCCL's ``record_param_comms`` none either. Part of what a run
#: directory's traces hold (written by the launchers' runtime, read by the merge).
P2P_ANNOTATION_FORMAT = "rankscope::p2p {op} peer={peer}"
#: Parses :data:`P2P_ANNOTATION_FORMAT` (groups: op, peer).
P2P_ANNOTATION_PATTERN = re.compile(r"rankscope::p2p (send|recv) peer=(\d+)")

#: Environment variable that tells the per-rank runtime where the run directory is.
ENV_RUN_DIR = "RANKSCOPE_RUN_DIR"
#: Environment variable holding the JSON-encoded profiler settings for the ranks.
ENV_PROFILER = "RANKSCOPE_PROFILER"


class RunState(enum.StrEnum):
    """Life of a run, as recorded in ``run.json`` (``state``)."""

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"

    @property
    def finished(self) -> bool:
        """True once the run can no longer change (traces are final and can be merged)."""
        return self not in (RunState.PENDING, RunState.QUEUED, RunState.RUNNING)


def rank_dir(run_dir: Path, rank: int) -> Path:
    """Folder of one rank's files inside ``run_dir``."""
    return run_dir / RANKS_DIR / RANK_DIR_FORMAT.format(rank=rank)


def window_path(run_dir: Path, rank: int, window: int) -> Path:
    """Path of the Kineto trace of profiler window ``window`` of ``rank``."""
    return rank_dir(run_dir, rank) / WINDOW_FORMAT.format(window=window)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    Permissions follow the umask (0644 under 022), so teammates can read a shared run folder.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as fh:
        fh.write(data)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (temporary name, then rename)."""
    write_bytes_atomic(path, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode())


def read_json(path: Path) -> Any:
    """Read a JSON file written by :func:`write_json_atomic`."""
    return json.loads(path.read_text())
