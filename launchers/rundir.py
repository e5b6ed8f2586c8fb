"""The run directory: one per run, the only contract between the ranks, the launcher and the merge.

Layout (all names are module constants; see docs/format.md)::

    RUN/run.json                         spec, command, launcher, world size, schedule, versions, times, state
    RUN/ranks/00003/meta.json            host, pid, local rank, device, clock-sync samples, windows written
    RUN/ranks/00003/window-000.json.gz   one Kineto trace per profiler window
    RUN/trace.h5                         the merged store
    RUN/report/                          summary.json, report.html

Every file is written to a temporary name in the same folder and renamed, so a reader never sees
a half-written file and a crash loses at most the window in progress.

``run.json`` has one type, :class:`RunRecord`: the launcher (``Launcher.launch``), the Slurm
template (``prepare``) and rank 0 under the user's own launcher all build one, so the three
writers cannot drift apart; :func:`update_run` accepts only its fields.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope import __version__
from rankscope.atomic import atomic_output, translate_write_errors
from rankscope.errors import InputFileError
from rankscope.launchers.spec import LauncherKind

if TYPE_CHECKING:
    from rankscope.launchers.spec import RunSpec

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
#: A rank's progress (steps done, when the last one ended), rewritten as it trains: how the
#: launcher notices a hang (``launchers/hang_probe.py``).
PROGRESS_FILE = "progress.json"
#: Written by the launcher when the job looks hung (its content: a token); every rank answers.
HANG_REQUEST = "hang.request"
#: A rank's answer: its threads' stacks and its Flight Recorder (``ranks/NNNNN/hang.json``).
HANG_DUMP = "hang.json"
#: A rank's answer to SIGTERM (the same content, token ``terminated``): a file of its own, so
#: that ending a hung job never overwrites the answers to the hang request that a later reader
#: (a Slurm batch job's merge job) diagnoses.
TERMINATED_DUMP = "terminated.json"
#: faulthandler's stacks of a rank whose Python threads could not answer (``ranks/NNNNN/``).
STACKS_FILE = "stacks.txt"
#: ``py-spy dump --native`` of a rank that did not answer (``ranks/NNNNN/native-stacks.txt``),
#: written by the launcher where py-spy is installed.
NATIVE_STACKS_FILE = "native-stacks.txt"
#: Changes of the step time the live monitor noticed, one JSON object per line (issue 30).
CHANGES_FILE = "changes.jsonl"
#: A request for one extra profiler window from a given step on every rank (issue 30), written
#: by the live monitor: ``{"id", "start_step", "steps", "reason"}`` (docs/live.md).
TRIGGER_FILE = "trigger.json"
#: The diagnosis of a hang (``report/hang.json``).
HANG_REPORT = "hang.json"

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
    HUNG = "hung"

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
    A full disk, a quota, a read-only file system or missing permissions raise
    :class:`~rankscope.errors.OutputError` (one line naming ``path``; an ``OSError`` too), the
    previous file untouched and no temporary file left.
    """
    with translate_write_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as fh:
        fh.write(data)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (temporary name, then rename)."""
    write_bytes_atomic(path, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode())


def read_json(path: Path) -> Any:
    """Read a JSON file written by :func:`write_json_atomic`."""
    return json.loads(path.read_text())


def utc_now() -> str:
    """Current UTC time as ISO-8601 with a ``Z`` suffix (``run.json`` timestamps)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def versions() -> dict[str, str | None]:
    """Versions recorded in ``run.json`` (torch read from metadata: no torch import here)."""
    from importlib import metadata

    try:
        torch_version: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    return {"python": platform.python_version(), "torch": torch_version, "rankscope": __version__}


#: :class:`RunRecord` fields left out of ``run.json`` while None: what one writer does not know
#: (rank 0 under the user's own launcher has no spec options, run folder path or launching host;
#: only one backend's own object is present).
OPTIONAL_RUN_KEYS = frozenset(
    {"module", "options", "run_dir", "cwd", "host", "local", "slurm", "hang"}
)


@dataclass(kw_only=True)
class RunRecord:
    """``run.json`` (docs/run-directory.md): what ran, where, how it ended.

    The field order is the key order on disk. Fields in :data:`OPTIONAL_RUN_KEYS` are written
    only when set. ``local`` and ``slurm`` are the backends' own objects, kept as plain dicts
    (each backend owns its keys: docs/slurm.md for ``slurm``).
    """

    rankscope_version: str = __version__
    """Version of rankscope that wrote the record."""
    run_id: str
    """The run folder's name."""
    name: str
    """Human name of the run."""
    launcher: LauncherKind
    """Which backend placed the ranks."""
    command: list[str]
    """The command line as the user typed it."""
    torchrun_args: list[str]
    """torchrun's flags (each node's, on Slurm)."""
    script: str
    """The training script (or module)."""
    script_args: list[str]
    """Arguments of the script."""
    module: bool | None = None
    """The script is a module name (torchrun ``-m``)."""
    world_size: int | None
    """Total ranks, when known."""
    nnodes: int | None
    """Nodes, when known."""
    nproc_per_node: int | None
    """Ranks per node, when known."""
    profiler: dict[str, Any]
    """The profiler settings (``ProfilerSettings.to_dict``)."""
    options: dict[str, Any] | None = None
    """Backend options of the spec."""
    run_dir: str | None = None
    """Absolute run folder."""
    cwd: str | None = None
    """Working directory of the launching process."""
    host: str | None = None
    """Host of the launching process."""
    versions: dict[str, str | None] = field(default_factory=versions)
    """Python, torch and rankscope versions."""
    state: RunState
    """Life of the run."""
    exit_code: int | None = None
    """The job's exit status (None while it runs)."""
    started_at: str = field(default_factory=utc_now)
    """When the record was created (ISO-8601 UTC)."""
    ended_at: str | None = None
    """When the run ended."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    """What failed: ``rank``, ``error``, ``exit_code`` …"""
    hang: dict[str, Any] | None = None
    """When the job hung: when it was noticed, the collective it is stuck in, the ranks that did
    not arrive and where they are (``report/hang.json`` has the whole diagnosis)."""
    local: dict[str, Any] | None = None
    """Local backend: torchrun's pid and log."""
    slurm: dict[str, Any] | None = None
    """Slurm backend: job ids, Slurm's state, tasks, the merge job."""

    @classmethod
    def of_spec(
        cls,
        spec: RunSpec,
        run_dir: Path,
        *,
        launcher: LauncherKind,
        state: RunState,
        host: str | None = None,
        **fields: Any,
    ) -> RunRecord:
        """The record of a run that ``launcher`` starts from ``spec`` in ``run_dir``."""
        return cls(
            run_id=run_dir.name,
            **{**spec.to_record(), "launcher": launcher},
            run_dir=str(run_dir),
            cwd=str(Path.cwd()),
            host=platform.node() if host is None else host,
            state=state,
            **fields,
        )

    def to_json(self) -> dict[str, Any]:
        """The ``run.json`` object (enums as their words, unset optional keys left out)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in OPTIONAL_RUN_KEYS:
                continue
            out[f.name] = str(value) if isinstance(value, enum.Enum) else value
        return out

    def write(self, run_dir: Path) -> None:
        """Write ``run_dir/run.json`` atomically."""
        write_json_atomic(Path(run_dir) / RUN_JSON, self.to_json())


#: The keys :func:`update_run` may change: :class:`RunRecord`'s fields.
RUN_KEYS = frozenset(f.name for f in dataclasses.fields(RunRecord))


def load_run(run_dir: Path | str) -> dict[str, Any]:
    """Read ``run_dir/run.json``; InputFileError naming the file when missing or invalid.

    The JSON object as written (a dict, not a :class:`RunRecord`): readers take the keys they
    know and keep the others, so a record written by a newer rankscope survives an update.
    """
    path = Path(run_dir) / RUN_JSON
    try:
        data = read_json(path)
    except FileNotFoundError as exc:
        raise InputFileError(f"{path}: not found (is {run_dir} a rankscope run folder?)") from exc
    except (OSError, ValueError) as exc:
        raise InputFileError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or "state" not in data:
        raise InputFileError(f"{path}: not a rankscope run.json (no 'state')")
    return data


def update_run(run_dir: Path | str, **changes: Any) -> dict[str, Any]:
    """Merge ``changes`` (:class:`RunRecord` fields) into ``run.json`` and rewrite it atomically;
    return the new record. A failed write raises :class:`~rankscope.errors.OutputError`, the
    previous ``run.json`` untouched."""
    unknown = sorted(set(changes) - RUN_KEYS)
    if unknown:
        raise TypeError(f"update_run: {', '.join(unknown)} not RunRecord field(s)")
    record = load_run(run_dir)
    record.update(changes)
    write_json_atomic(Path(run_dir) / RUN_JSON, record)
    return record
