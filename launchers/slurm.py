"""Slurm backend: the job goes to Slurm through submitit; a dependent job merges it when it ends.

Placement — **one submitit task per node, each running torchrun for its local ranks** with c10d
rendezvous at the first node. Chosen over one task per GPU (submitit's distributed environment)
because then every node runs exactly what a local run runs: torchrun stays the process manager,
so the per-rank runtime, ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, the user's torchrun flags
(``--max-restarts``, ``--monitor-interval`` …) and torchrun's failure report (which rank died, how)
are the same as with ``rankscope run`` on one machine; submitit's processes, pickles and logs
grow with nodes, not GPUs; and one Slurm CPU/GPU allocation per node is what torchrun expects.

Rendezvous — task 0 picks a free port *on the first node* (the submitting host cannot know which
ports are free there) and publishes ``host:port`` in ``RUN/slurm/rendezvous-JOB-RESTART.json`` on
the shared filesystem; the other tasks wait for that file. Node 0's torchrun hosts the c10d store
(``--rdzv-conf is_host=1``, the others ``is_host=0``): explicit, because torch's guess from host
names fails for emulated nodes and multi-homed hosts.

Signals — submitit always writes ``#SBATCH --signal=USR2@90`` for its checkpoint/requeue. Slurm
delivers it to every process of the step 90 s before the time limit: torchrun and the ranks would
die (USR2's default action) and submitit's handler would end task 0 early, as measured on the
local cluster. rankscope replaces it with SIGCONT (a no-op for every process), so a job that runs
out of time is ended by Slurm's own SIGTERM at the limit (ranks flush their window in progress)
and SIGKILL ``KillWait`` seconds later; its state is then ``timeout``.

Merge — right after the job, rankscope submits a second, one-CPU job with
``--dependency=afterany:JOB``: it runs whatever way the first one ended (completed, failed,
cancelled, timed out) and executes ``python -m rankscope.launchers.slurm finalize RUN``, which
records the final state from Slurm's accounting, then runs ``rankscope merge RUN`` and
``rankscope analyze RUN`` as command lines (the launchers floor imports nothing above it).

State — ``run.json`` holds ``slurm: {job_id, merge_job_id, state, exit_code, tasks, merge, …}``.
Job states come from ``sacct`` (accounting is required: without it a finished job is invisible),
falling back to ``squeue`` while the job is queued or running; per-task states come from the
records each node task writes in ``RUN/slurm/``. All of it works from another shell after the
submitting process has exited (``rankscope status RUN`` / ``rankscope cancel RUN``).

Defaults for partition, account, time, QOS and constraint: command-line flag, else environment
(:data:`ENV_DEFAULTS`), else the TOML file ``$RANKSCOPE_SLURM_CONFIG`` or
``~/.config/rankscope/slurm.toml`` (:data:`CONFIG_KEYS`), else the built-in default.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import io
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from rankscope.errors import RankscopeError, UsageError
from rankscope.launchers import rundir
from rankscope.launchers.base import (
    JobOutcome,
    Launcher,
    RunHandle,
    create_run_dir,
    load_run,
    update_run,
    utc_now,
    versions,
)
from rankscope.launchers.rundir import RunState
from rankscope.launchers.spec import LauncherKind, ProfilerSettings, RunSpec
from rankscope.launchers.torchrun import rank_argv, rank_settings_env

# ------------------------------------------------------------------------------ constants
#: Folder of the Slurm records inside the run directory (rendezvous and per-task files).
SLURM_DIR = "slurm"
#: Rendezvous address published by task 0: ``{"host": ..., "port": ...}``.
RENDEZVOUS_FORMAT = "rendezvous-{job_id}-{restart}.json"
#: Record each node task writes when it starts and when torchrun ends.
TASK_FORMAT = "task-{job_id}-{node:03d}.json"
TASK_GLOB = "task-{job_id}-*.json"
#: submitit's folder (pickles, per-task stdout/stderr) inside ``RUN/logs``; ``%j`` = job id.
SUBMITIT_FOLDER = "slurm-%j"
#: Output of each node's torchrun inside ``RUN/logs``.
TORCHRUN_LOG_FORMAT = "torchrun-{job_id}-node{node:03d}.log"
#: Output of the merge job inside ``RUN/logs`` (``%j`` = its job id).
MERGE_LOG = "merge-%j.out"
#: The file of configuration defaults, unless ``$RANKSCOPE_SLURM_CONFIG`` names another.
DEFAULT_CONFIG_PATH = Path("~/.config/rankscope/slurm.toml")
ENV_CONFIG = "RANKSCOPE_SLURM_CONFIG"
#: Prefix of the environment variables giving option defaults (``RANKSCOPE_SLURM_PARTITION``).
ENV_PREFIX = "RANKSCOPE_SLURM_"
#: Default time limit of the job, in minutes.
DEFAULT_TIME_MIN = 60
#: Time limit of the merge job, in minutes.
MERGE_TIME_MIN = 30
#: sbatch options rankscope sets itself (an extra ``--sbatch-arg`` may not change them).
RESERVED_SBATCH = frozenset(
    {
        "nodes",
        "ntasks",
        "ntasks-per-node",
        "output",
        "error",
        "signal",
        "array",
        "dependency",
        "open-mode",
        "wrap",
    }
)
#: What rankscope asks Slurm to send before the time limit instead of submitit's USR2 (see above).
TIME_LIMIT_SIGNAL = "CONT@1"
#: Dask scheduler value of ``rankscope merge/analyze`` that works in-process.
SYNCHRONOUS = "synchronous"
#: Seconds a non-zero node task waits for the rendezvous file of task 0.
RENDEZVOUS_WAIT_S = 300.0
#: Seconds a failed node waits for the other nodes' own failure reports before srun stops them.
FAILURE_GRACE_S = 30.0
#: Seconds ``finalize`` waits for Slurm's accounting to show the job's final state.
SETTLE_S = 120.0
#: Seconds between two job-state queries while following a job.
FOLLOW_POLL_S = 2.0
#: Seconds one sacct/squeue/sinfo/sbatch/scancel call may take.
COMMAND_TIMEOUT_S = 60.0
#: How to bring up a cluster, for messages about a missing one.
LOCAL_CLUSTER_HINT = (
    "start the local test cluster with `bash slurm/slurm-up.sh` and "
    "`source /tmp/rankscope-slurm/env.sh`, or run locally without --slurm"
)
#: torchrun flags rankscope sets on Slurm (flag -> takes a value); the user's copies are dropped.
RENDEZVOUS_OWNED: dict[str, bool] = {
    "--standalone": False,
    "--nnodes": True,
    "--node-rank": True,
    "--node_rank": True,
    "--rdzv-backend": True,
    "--rdzv_backend": True,
    "--rdzv-endpoint": True,
    "--rdzv_endpoint": True,
    "--rdzv-id": True,
    "--rdzv_id": True,
    "--rdzv-conf": True,
    "--rdzv_conf": True,
    "--master-addr": True,
    "--master_addr": True,
    "--master-port": True,
    "--master_port": True,
}


class SlurmError(RankscopeError):
    """Slurm is missing, unreachable, or refused the job (one line, exit status 2)."""

    exit_code = 2


class SlurmJobState(enum.StrEnum):
    """A job's state as ``sacct``/``squeue`` print it (first word; ``CANCELLED by 0`` → CANCELLED)."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    REQUEUED = "REQUEUED"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"
    RESIZING = "RESIZING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    DEADLINE = "DEADLINE"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    PREEMPTED = "PREEMPTED"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"

    @property
    def run_state(self) -> RunState:
        """The rankscope state this Slurm state means."""
        return _RUN_STATES.get(self, RunState.FAILED)


_RUN_STATES: dict[SlurmJobState, RunState] = {
    SlurmJobState.PENDING: RunState.QUEUED,
    SlurmJobState.CONFIGURING: RunState.QUEUED,
    SlurmJobState.REQUEUED: RunState.QUEUED,
    SlurmJobState.RUNNING: RunState.RUNNING,
    SlurmJobState.COMPLETING: RunState.RUNNING,
    SlurmJobState.SUSPENDED: RunState.RUNNING,
    SlurmJobState.STOPPED: RunState.RUNNING,
    SlurmJobState.RESIZING: RunState.RUNNING,
    SlurmJobState.COMPLETED: RunState.COMPLETED,
    SlurmJobState.CANCELLED: RunState.CANCELLED,
    SlurmJobState.PREEMPTED: RunState.CANCELLED,
    SlurmJobState.REVOKED: RunState.CANCELLED,
    SlurmJobState.TIMEOUT: RunState.TIMEOUT,
    SlurmJobState.DEADLINE: RunState.TIMEOUT,
}


class MergeState(enum.StrEnum):
    """Life of the dependent merge job, as recorded in ``run.json`` (``slurm.merge.state``)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    """No rank wrote a window (e.g. the job was cancelled while queued): nothing to merge."""

    @property
    def finished(self) -> bool:
        """True once the merge job can no longer change."""
        return self not in (MergeState.PENDING, MergeState.RUNNING)


# ------------------------------------------------------------------------------ options
def option(
    default: Any,
    *,
    metavar: str,
    help: str,
    config: bool = True,
    env: bool = False,
    submit: bool = True,
    flag: str | None = None,
    unit: str | None = None,
) -> Any:
    """A :class:`SlurmOptions` field: its ``rankscope run`` flag (``--name-with-dashes`` unless
    ``flag``), its place in the config file (``config``), its ``RANKSCOPE_SLURM_<NAME>`` default
    (``env``), whether it is passed on to sbatch as ``--name`` (``submit``), and the ``unit`` of a
    number (for messages): everything about
    an option is said here once, and the flags, config keys, environment defaults and sbatch
    parameters are generated from the fields."""
    meta = {"metavar": metavar, "help": help, "config": config, "env": env, "submit": submit}
    if flag:
        meta["flag"] = flag
    if unit:
        meta["unit"] = unit
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class SlurmOptions:
    """What the job asks Slurm for. Built from flags, environment and config file; validated.

    To add a Slurm option, add a field here (with :func:`option`): ``rankscope run`` gets its flag,
    the config file its key, sbatch the value (as a submitit parameter when submitit knows it,
    else as an extra ``--name=value``), and docs/slurm.md lists the fields.
    """

    nodes: int = option(
        1, metavar="N", help="nodes; one torchrun per node (1)", config=False, submit=False
    )
    """Nodes of the job; one submitit task (one torchrun) runs on each."""
    gpus_per_node: int = option(0, metavar="N", help="GPUs per node; 0 = CPU (0)", submit=False)
    """GPUs per node (``--gpus-per-node``); 0 asks Slurm for none (CPU jobs, gloo)."""
    cpus_per_task: int | None = option(
        None, metavar="N", help="CPUs per node (one per rank)", submit=False
    )
    """CPUs for each node's task (torchrun and its ranks); None: one per local rank."""
    mem: str | None = option(None, metavar="SIZE", help="memory per node, e.g. 64G")
    """Memory per node as sbatch writes it (``64G``, ``500M``); None: the partition's default."""
    partition: str | None = option(
        None, metavar="NAME", help="partition (cluster default)", env=True
    )
    """Partition to run in; None: the cluster's default partition."""
    time: int = option(
        DEFAULT_TIME_MIN,
        metavar="MIN",
        help=f"time limit in minutes ({DEFAULT_TIME_MIN})",
        env=True,
        submit=False,
        unit="minutes",
    )
    """Time limit of the job in minutes (Slurm ends it with state ``timeout`` after that)."""
    account: str | None = option(None, metavar="NAME", help="account to charge", env=True)
    """Account to charge (``--account``); None: the user's default."""
    qos: str | None = option(None, metavar="NAME", help="quality of service", env=True)
    """Quality of service (``--qos``); None: the default."""
    constraint: str | None = option(None, metavar="EXPR", help="required node features", env=True)
    """Node features required (``--constraint``, e.g. ``a100&ib``)."""
    sbatch_args: tuple[str, ...] = option(
        (),
        metavar="ARG",
        help="extra sbatch option, repeatable: --sbatch-arg=--exclusive --sbatch-arg=--reservation=r1",
        submit=False,
        flag="--sbatch-arg",
    )
    """Further sbatch options, each ``--key=value`` or ``--flag`` (e.g. ``--exclusive``)."""

    def __post_init__(self) -> None:
        for name in ("nodes", "time"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be an integer >= 1 (time in minutes), got {value!r}")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise ValueError(f"--gpus-per-node must be an integer >= 0, got {self.gpus_per_node!r}")
        if self.cpus_per_task is not None and (
            not isinstance(self.cpus_per_task, int) or self.cpus_per_task < 1
        ):
            raise ValueError(f"--cpus-per-task must be an integer >= 1, got {self.cpus_per_task!r}")
        if self.mem is not None and not re.fullmatch(r"\d+[KMGT]?B?", str(self.mem), re.IGNORECASE):
            raise ValueError(f"--mem must be a size like 64G or 500M, got {self.mem!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (
                f.type == "str | None"
                and f.name != "mem"
                and value is not None
                and (not isinstance(value, str) or not value.strip() or "\n" in value)
            ):
                raise ValueError(f"{_flag(f)} must be a non-empty word, got {value!r}")
        object.__setattr__(self, "sbatch_args", tuple(self.sbatch_args))
        for arg in self.sbatch_args:
            key = _sbatch_key(arg)
            if key in RESERVED_SBATCH:
                raise ValueError(f"--sbatch-arg {arg!r}: rankscope sets --{key} itself")

    def additional_parameters(self) -> dict[str, Any]:
        """``sbatch_args`` as submitit's ``additional_parameters`` (``--exclusive`` → True)."""
        out: dict[str, Any] = {}
        for arg in self.sbatch_args:
            key, has_value, value = arg[2:].partition("=")
            out[key.replace("-", "_")] = value if has_value else True
        return out

    def executor_parameters(self, nproc_per_node: int, job_name: str) -> dict[str, Any]:
        """submitit ``SlurmExecutor.update_parameters`` for one task per node of ``nproc_per_node`` ranks.

        No GPU is requested when ``gpus_per_node`` is 0; ``signal`` replaces submitit's USR2
        (module docstring); ``--kill-on-bad-exit`` ends all nodes when one node's torchrun fails
        (a NCCL rank would otherwise wait in a collective until the time limit).
        """
        params: dict[str, Any] = {
            "job_name": job_name,
            "nodes": self.nodes,
            "ntasks_per_node": 1,
            "cpus_per_task": self.cpus_per_task or nproc_per_node,
            "time": self.time,
            "srun_args": ["--kill-on-bad-exit=1"],
            "additional_parameters": {**self.additional_parameters(), "signal": TIME_LIMIT_SIGNAL},
        }
        if self.gpus_per_node:
            params["gpus_per_node"] = self.gpus_per_node
        known = submitit_parameters()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not f.metadata.get("submit") or value is None:
                continue
            if f.name in known:
                params[f.name] = value
            else:  # an sbatch option submitit has no parameter for: --name=value
                params["additional_parameters"][f.name] = value
        return params

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (``spec.options["slurm"]`` and ``run.json``)."""
        data = dataclasses.asdict(self)
        data["sbatch_args"] = list(self.sbatch_args)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlurmOptions:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _flag(f: dataclasses.Field[Any]) -> str:
    """The ``rankscope run`` flag of a :class:`SlurmOptions` field."""
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def submitit_parameters() -> frozenset[str]:
    """The parameters submitit's SlurmExecutor takes by name (others go as extra sbatch args)."""
    from submitit.slurm import slurm

    return frozenset(slurm._get_default_parameters())


#: Keys the TOML file may set (top level, or in a ``[slurm]`` table): fields with ``config``.
CONFIG_KEYS = frozenset(f.name for f in dataclasses.fields(SlurmOptions) if f.metadata["config"])
#: SlurmOptions field -> environment variable giving its default: fields with ``env``.
ENV_DEFAULTS: dict[str, str] = {
    f.name: ENV_PREFIX + f.name.upper()
    for f in dataclasses.fields(SlurmOptions)
    if f.metadata["env"]
}


def _sbatch_key(arg: str) -> str:
    if not isinstance(arg, str) or not re.fullmatch(
        r"--[A-Za-z][A-Za-z0-9-]*(=.*)?", arg, re.DOTALL
    ):
        raise ValueError(f"--sbatch-arg must look like --key=value or --flag, got {arg!r}")
    return arg[2:].partition("=")[0].lower()


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    """The TOML file of defaults: ``$RANKSCOPE_SLURM_CONFIG`` or ``~/.config/rankscope/slurm.toml``."""
    env = os.environ if environ is None else environ
    return Path(env.get(ENV_CONFIG) or DEFAULT_CONFIG_PATH).expanduser()


def load_defaults(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Defaults from the config file, overridden by the environment (:data:`ENV_DEFAULTS`).

    The file is TOML with keys from :data:`CONFIG_KEYS` at the top level or in ``[slurm]``::

        partition = "gpu"
        account = "my-project"
        time = 120            # minutes
    """
    env = os.environ if environ is None else environ
    path = config_path(env)
    defaults: dict[str, Any] = {}
    explicit = bool(env.get(ENV_CONFIG))
    if path.is_file() or explicit:
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError as exc:
            raise UsageError(f"{path}: Slurm config file not found (from ${ENV_CONFIG})") from exc
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: not a valid TOML file ({exc})") from exc
        table = data.get("slurm", data)
        if not isinstance(table, dict):
            raise UsageError(f"{path}: [slurm] must be a table")
        unknown = sorted(set(table) - CONFIG_KEYS - {"slurm"})
        if unknown:
            raise UsageError(
                f"{path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(CONFIG_KEYS))})"
            )
        defaults.update({k: v for k, v in table.items() if k in CONFIG_KEYS})
    fields = {f.name: f for f in dataclasses.fields(SlurmOptions)}
    for name, var in ENV_DEFAULTS.items():
        value = env.get(var)
        if value:
            if fields[name].type in ("int", "int | None"):
                unit = fields[name].metadata.get("unit")
                if not value.isdigit():
                    what = f"whole number of {unit}" if unit else "whole number"
                    raise UsageError(f"${var} must be a {what}, got {value!r}")
                defaults[name] = int(value)
            else:
                defaults[name] = value
    return defaults


# ------------------------------------------------------------------------------ command line
def _dest(f: dataclasses.Field[Any]) -> str:
    return _flag(f)[2:].replace("-", "_")


#: CLI flag dest -> SlurmOptions field (every flag's default is None: "not given").
_FLAG_FIELDS = {_dest(f): f.name for f in dataclasses.fields(SlurmOptions)}


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--slurm`` flags of ``rankscope run`` (all rankscope flags: they go before SCRIPT),
    one per :class:`SlurmOptions` field."""
    envs = "/".join(
        "_" + v.removeprefix(ENV_PREFIX) if i else v for i, v in enumerate(ENV_DEFAULTS.values())
    )
    g = parser.add_argument_group(
        f"Slurm (with --slurm; defaults from ${envs} or ~/.config/rankscope/slurm.toml)"
    )
    g.add_argument(
        "--slurm", action="store_true", help="submit to Slurm (submitit) instead of running here"
    )
    for f in dataclasses.fields(SlurmOptions):
        kwargs: dict[str, Any] = {
            "default": None,
            "metavar": f.metadata["metavar"],
            "help": f.metadata["help"],
        }
        if f.type.startswith("tuple"):
            kwargs["action"] = "append"
        elif f.type.startswith("int"):
            kwargs["type"] = int
        g.add_argument(_flag(f), **kwargs)
    g.add_argument(
        "--follow",
        action="store_true",
        help="stay until the job and its merge end, then print the summary and analysis",
    )


def slurm_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``spec.options`` for the parsed flags: ``{}`` without --slurm, else the validated options.

    Also checks that Slurm answers and the partition exists, so a mistake costs nothing
    (:class:`SlurmError`, one line, before any run directory exists).
    """
    given = {
        fld: getattr(args, dest)
        for dest, fld in _FLAG_FIELDS.items()
        if getattr(args, dest, None) is not None
    }
    if not getattr(args, "slurm", False):
        if given or getattr(args, "follow", False):
            flags = ", ".join(
                "--" + d.replace("_", "-")
                for d in _FLAG_FIELDS
                if getattr(args, d, None) is not None
            )
            raise UsageError(f"{flags or '--follow'} only apply with --slurm")
        return {}
    values = load_defaults()
    values.update(given)
    try:
        options = SlurmOptions.from_dict(values)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    check_slurm(options.partition)
    return {
        "slurm": options.to_dict(),
        "follow": bool(getattr(args, "follow", False)),
        "nodes_given": "nodes" in given,
    }


# ------------------------------------------------------------------------------ Slurm commands
def _slurm_env(slurm_conf: str | None = None) -> dict[str, str]:
    """This process's environment, with ``SLURM_CONF`` from ``run.json`` when the shell has none."""
    env = dict(os.environ)
    if slurm_conf and not env.get("SLURM_CONF"):
        env["SLURM_CONF"] = slurm_conf
    return env


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command; SlurmError when it is missing or does not answer in time."""
    if shutil.which(cmd[0], path=(env or os.environ).get("PATH")) is None:
        raise SlurmError(
            f"Slurm is not available here: `{cmd[0]}` is not on PATH; {LOCAL_CLUSTER_HINT}"
        )
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(
            f"`{cmd[0]}` did not answer within {COMMAND_TIMEOUT_S:.0f} s; is slurmctld up?"
        ) from exc


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[0]


def check_slurm(partition: str | None = None, env: dict[str, str] | None = None) -> list[str]:
    """Check that sbatch exists, the controller answers and ``partition`` exists; return partitions.

    Raises :class:`SlurmError` naming what is missing and how to get a cluster.
    """
    env = dict(os.environ) if env is None else env
    for tool in ("sbatch", "sinfo", "sacct", "squeue", "scancel"):
        if shutil.which(tool, path=env.get("PATH")) is None:
            raise SlurmError(
                f"Slurm is not available here: `{tool}` is not on PATH; {LOCAL_CLUSTER_HINT}"
            )
    res = _run(["sinfo", "--noheader", "--format=%P"], env)
    if res.returncode != 0:
        conf = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
        raise SlurmError(
            f"cannot reach the Slurm controller (SLURM_CONF={conf}): {_first_line(res.stderr)}; {LOCAL_CLUSTER_HINT}"
        )
    partitions = [p.strip() for p in res.stdout.split() if p.strip()]
    names = [p.rstrip("*") for p in partitions]
    if partition is not None and partition not in names:
        raise SlurmError(
            f"Slurm partition {partition!r} does not exist (partitions: {', '.join(partitions) or 'none'}); "
            "pick one with --partition or $RANKSCOPE_SLURM_PARTITION"
        )
    if partition is None and not any(p.endswith("*") for p in partitions):
        raise SlurmError(
            f"the cluster has no default partition; give --partition (partitions: {', '.join(names) or 'none'})"
        )
    return names


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about one job."""

    job_id: str
    """The job id."""
    state: SlurmJobState
    """Its state (first word of sacct's/squeue's)."""
    exit_code: int | None = None
    """Exit status of the batch script; 128 + N when a signal N ended it; None if unknown."""
    nodelist: str = ""
    """Nodes it ran on (Slurm's compressed form, e.g. ``n[1-2]``)."""
    elapsed: str = ""
    """Run time as Slurm prints it (``[D-]HH:MM:SS``)."""
    reason: str = ""
    """Why a pending job waits (squeue's reason), when known."""


def _parse_state(text: str) -> SlurmJobState | None:
    word = text.strip().split(" ")[0].rstrip("+")
    try:
        return SlurmJobState(word)
    except ValueError:
        return None


def query_job(job_id: str, env: dict[str, str] | None = None) -> JobInfo | None:
    """The job's state from accounting (sacct), else from the queue (squeue); None if unknown."""
    res = _run(
        [
            "sacct",
            "--allocations",
            "--noheader",
            "--parsable2",
            "--starttime=2000-01-01",
            f"--jobs={job_id}",
            "--format=JobIDRaw,State,ExitCode,NodeList,Elapsed,Reason",
        ],
        env,
    )
    if res.returncode == 0:
        for line in res.stdout.splitlines():
            parts = line.split("|")
            if len(parts) < 6 or parts[0] != str(job_id):
                continue
            state = _parse_state(parts[1])
            if state is None:
                continue
            code, _, sig = parts[2].partition(":")
            exit_code: int | None = None
            if code.isdigit():
                exit_code = int(code)
                if exit_code == 0 and sig.isdigit() and int(sig):
                    exit_code = 128 + int(sig)
            reason = parts[5] if state == SlurmJobState.PENDING and parts[5] != "None" else ""
            return JobInfo(str(job_id), state, exit_code, parts[3], parts[4], reason)
    sacct_error = "" if res.returncode == 0 else _first_line(res.stderr)
    # not in accounting yet (just submitted) or no accounting: ask the queue
    res = _run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%N|%M|%r"], env)
    if res.returncode == 0:
        for line in res.stdout.splitlines():
            parts = line.split("|")
            state = _parse_state(parts[0])
            if state is not None:
                return JobInfo(
                    str(job_id), state, None, parts[1], parts[2], parts[3] if len(parts) > 3 else ""
                )
    if sacct_error:
        if res.returncode == 0 or "invalid job id" in res.stderr.lower():
            raise SlurmError(
                f"job {job_id} has left the queue and Slurm accounting does not answer "
                f"({sacct_error}): its final state is unknown (slurmdbd is required)"
            )
        raise SlurmError(f"cannot ask Slurm about job {job_id}: {sacct_error}")
    return None


def scancel(job_id: str, env: dict[str, str] | None = None) -> None:
    """Cancel a job (Slurm sends SIGTERM to its steps, SIGKILL ``KillWait`` seconds later)."""
    res = _run(["scancel", str(job_id)], env)
    if res.returncode != 0:
        raise SlurmError(f"scancel {job_id} failed: {_first_line(res.stderr)}")


def submit_merge_job(
    run_dir: Path,
    job_id: str,
    *,
    partition: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    name: str = "rankscope-merge",
    env: dict[str, str] | None = None,
) -> str:
    """Submit the job that finalises and merges ``run_dir`` once job ``job_id`` ends (any way)."""
    command = shlex.join(
        [sys.executable, "-m", "rankscope.launchers.slurm", "finalize", str(run_dir)]
    )
    cmd = [
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        f"--dependency=afterany:{job_id}",
        "--kill-on-invalid-dep=no",
        "--nodes=1",
        "--ntasks=1",
        "--cpus-per-task=1",
        f"--time={MERGE_TIME_MIN}",
        f"--output={run_dir / rundir.LOGS_DIR / MERGE_LOG}",
        f"--chdir={run_dir}",
    ]
    for flag, value in (("partition", partition), ("account", account), ("qos", qos)):
        if value:
            cmd.append(f"--{flag}={value}")
    cmd.append(f"--wrap={command}")
    res = _run(cmd, env)
    merge_id = res.stdout.strip().split(";")[0]
    if res.returncode != 0 or not merge_id.isdigit():
        raise SlurmError(f"sbatch refused the merge job: {_first_line(res.stderr or res.stdout)}")
    return merge_id


# ------------------------------------------------------------------------------ inside the job
@dataclass(frozen=True)
class NodePlan:
    """What every node task runs (pickled by submitit, so plain data only)."""

    run_dir: str
    """Run directory on the shared filesystem."""
    cwd: str
    """Working directory of the submitting shell (the script path is relative to it)."""
    nnodes: int
    """Number of nodes (= tasks)."""
    torchrun_args: tuple[str, ...]
    """The user's torchrun flags without the rendezvous ones (rankscope sets those)."""
    rank_argv: tuple[str, ...]
    """``-m rankscope.launchers.rank [--module] SCRIPT ARGS…``."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment added for the ranks (run directory, profiler settings, the spec's env)."""


def _free_port() -> int:
    """A TCP port free on this host right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _publish_rendezvous(path: Path, host: str) -> tuple[str, int]:
    port = _free_port()
    rundir.write_json_atomic(path, {"host": host, "port": port, "written_at": utc_now()})
    return host, port


def _await_rendezvous(path: Path, timeout: float) -> tuple[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = rundir.read_json(path)
            return str(data["host"]), int(data["port"])
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no rendezvous address from node 0 in {path} after {timeout:.0f} s"
                ) from None
            time.sleep(0.2)


def _tee(src: IO[bytes], log: Path, echo: IO[bytes]) -> None:
    """Copy torchrun's output to its log file and to the task's stdout (submitit's log)."""
    with log.open("ab") as fh:
        for line in iter(src.readline, b""):
            fh.write(line)
            fh.flush()
            try:
                echo.write(line)
                echo.flush()
            except (OSError, ValueError):
                pass
    src.close()


def run_node(plan: NodePlan) -> dict[str, Any]:
    """Body of one node's submitit task: rendezvous, torchrun, record; raise when it fails.

    Runs inside the Slurm job. The task record (``RUN/slurm/task-JOB-NNN.json``) says which host
    it ran on, when, and how torchrun ended (with torchrun's per-rank failure summary).
    """
    import submitit
    from rankscope.launchers.torchrun import torchrun_failures

    job_env = submitit.JobEnvironment()
    job_id, node = str(job_env.job_id), int(job_env.node)
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    run_dir = Path(plan.run_dir)
    slurm_dir = run_dir / SLURM_DIR
    task_path = slurm_dir / TASK_FORMAT.format(job_id=job_id, node=node)
    record: dict[str, Any] = {
        "node": node,
        "host": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "pid": os.getpid(),
        "state": str(RunState.RUNNING),
        "exit_code": None,
        "started_at": utc_now(),
        "ended_at": None,
        "failures": [],
    }
    rundir.write_json_atomic(task_path, record)
    # submitit's USR2 handler would end this task early; rankscope does not requeue (see module doc)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    rdzv_path = slurm_dir / RENDEZVOUS_FORMAT.format(job_id=job_id, restart=restart)
    if node == 0:
        host, port = _publish_rendezvous(rdzv_path, job_env.hostnames[0])
    else:
        host, port = _await_rendezvous(rdzv_path, RENDEZVOUS_WAIT_S)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={plan.nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={host}:{port}",
        f"--rdzv-id=rankscope-{job_id}",
        f"--rdzv-conf=is_host={1 if node == 0 else 0}",
        *plan.torchrun_args,
        *plan.rank_argv,
    ]
    env = {**os.environ, **plan.env, "PYTHONUNBUFFERED": "1"}
    log = run_dir / rundir.LOGS_DIR / TORCHRUN_LOG_FORMAT.format(job_id=job_id, node=node)
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"rankscope: node {node}/{plan.nnodes}: {shlex.join(cmd)}", flush=True)
    proc = subprocess.Popen(
        cmd,
        cwd=plan.cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    if proc.stdout is None:  # cannot happen with stdout=PIPE; keeps the type checker honest
        raise RuntimeError("torchrun started without an output pipe")
    pump = threading.Thread(target=_tee, args=(proc.stdout, log, sys.stdout.buffer), daemon=True)
    pump.start()
    code = proc.wait()
    pump.join(timeout=10)
    failures = torchrun_failures(log.read_text(errors="replace")) if code != 0 else []
    record.update(
        state=str(RunState.COMPLETED if code == 0 else RunState.FAILED),
        exit_code=code,
        ended_at=utc_now(),
        failures=failures,
    )
    rundir.write_json_atomic(task_path, record)
    if code != 0:
        # Exiting non-zero makes srun stop the other nodes at once (--kill-on-bad-exit). First give
        # their torchruns a moment to see their own ranks fail and write the failure summary
        # (which rank died, how): a node stopped by srun only reports SIGTERM.
        _await_other_nodes(run_dir, job_id, node, plan.nnodes, FAILURE_GRACE_S)
        raise RuntimeError(f"torchrun on node {node} exited with {code} (log: {log})")
    return {"node": node, "exit_code": code}


def _await_other_nodes(run_dir: Path, job_id: str, node: int, nnodes: int, timeout: float) -> None:
    """Wait up to ``timeout`` s until no other node's task record of the job says ``running``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tasks = read_task_records(run_dir, job_id)
        running = [
            n
            for n in range(nnodes)
            if n != node and tasks.get(n, {}).get("state") == str(RunState.RUNNING)
        ]
        if not running:
            return
        time.sleep(0.5)


def read_task_records(run_dir: Path, job_id: str) -> dict[int, dict[str, Any]]:
    """The per-node task records of job ``job_id`` by node index (unreadable ones skipped)."""
    out: dict[int, dict[str, Any]] = {}
    folder = Path(run_dir) / SLURM_DIR
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob(TASK_GLOB.format(job_id=job_id))):
        try:
            data = rundir.read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("node"), int):
            out[data["node"]] = data
    return out


def task_states(run_dir: Path, record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per node task: node, host, state, exit code — for ``rankscope status``.

    A task that never wrote a record is ``queued`` while the job waits, else the job's state;
    a task still ``running`` in a finished job, or ended by a cancel or the time limit, takes
    the job's state (``cancelled``, ``timeout``).
    """
    slurm = record.get("slurm") or {}
    job_id = str(slurm.get("job_id", ""))
    nodes = int(slurm.get("nodes") or record.get("nnodes") or 1)
    job_state = RunState(record.get("state", RunState.QUEUED))
    tasks = read_task_records(run_dir, job_id) if job_id else {}
    rows = []
    for node in range(nodes):
        rec = tasks.get(node)
        if rec is None:
            state = RunState.QUEUED if not job_state.finished else job_state
            if job_state == RunState.RUNNING:
                state = RunState.RUNNING
            rows.append({"node": node, "host": None, "state": str(state), "exit_code": None})
            continue
        state = RunState(rec.get("state", RunState.RUNNING))
        if job_state in (RunState.CANCELLED, RunState.TIMEOUT) and state != RunState.COMPLETED:
            state = job_state
        elif job_state.finished and state == RunState.RUNNING:
            state = job_state if job_state != RunState.COMPLETED else RunState.FAILED
        rows.append(
            {
                "node": node,
                "host": rec.get("slurm_node") or rec.get("host"),
                "state": str(state),
                "exit_code": rec.get("exit_code"),
            }
        )
    return rows


def finalize(run_dir: Path | str, settle_s: float = SETTLE_S) -> int:
    """Body of the merge job: record the final state, then merge and analyse; return the status.

    Runs after the job ended in any way. Waits up to ``settle_s`` seconds for accounting to show
    the final state, then runs ``rankscope merge RUN`` and ``rankscope analyze RUN`` as commands,
    recording each step's exit status in ``run.json`` (``slurm.merge``).
    """
    run_dir = Path(run_dir).resolve()
    launcher = SlurmLauncher()
    handle = launcher.attach(run_dir)
    deadline = time.monotonic() + settle_s
    state = RunState(handle.record()["state"])
    while True:
        try:
            state = handle.state()
        except SlurmError as exc:  # accounting briefly unreachable: retry, then merge anyway
            print(f"rankscope finalize: {exc}", flush=True)
        if state.finished or time.monotonic() >= deadline:
            break
        time.sleep(FOLLOW_POLL_S)
    merge: dict[str, Any] = {
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "state": str(MergeState.RUNNING),
        "started_at": utc_now(),
    }
    _update_slurm(run_dir, merge=merge)
    print(f"rankscope finalize: run {run_dir} is {state}", flush=True)
    if not any((run_dir / rundir.RANKS_DIR).glob(f"*/{rundir.WINDOW_GLOB}")):
        print("rankscope finalize: no rank wrote a profiler window: nothing to merge", flush=True)
        merge.update(state=str(MergeState.SKIPPED), ended_at=utc_now(), store=None)
        _update_slurm(run_dir, merge=merge)
        return 0
    # the merge job has one CPU: parse in-process instead of starting a Dask LocalCluster
    status = _rankscope("merge", str(run_dir), "--scheduler", SYNCHRONOUS)
    merge["merge_exit_code"] = status
    if status == 0:
        # the analysis is a bonus: its failure (or absence) leaves the merge completed
        merge["analyze_exit_code"] = _rankscope("analyze", str(run_dir), "--scheduler", SYNCHRONOUS)
    store = run_dir / rundir.STORE_NAME
    merge.update(
        state=str(MergeState.COMPLETED if status == 0 else MergeState.FAILED),
        ended_at=utc_now(),
        store=str(store) if store.exists() else None,
    )
    _update_slurm(run_dir, merge=merge)
    return status


def _rankscope(*argv: str) -> int:
    """Run ``python -m rankscope ARGV…`` (a command line: no import of the floors above)."""
    res = subprocess.run([sys.executable, "-m", "rankscope", *argv], check=False)
    print(f"rankscope finalize: rankscope {argv[0]} exited with {res.returncode}", flush=True)
    return res.returncode


def _update_slurm(run_dir: Path, **changes: Any) -> dict[str, Any]:
    """Merge ``changes`` into ``run.json``'s ``slurm`` object (atomic rewrite)."""
    record = load_run(run_dir)
    slurm = dict(record.get("slurm") or {})
    slurm.update(changes)
    return update_run(run_dir, slurm=slurm)


def merge_state(record: dict[str, Any], env: dict[str, str] | None = None) -> MergeState | None:
    """State of the merge job: ``run.json``'s, corrected by Slurm when the job died unrecorded."""
    slurm = record.get("slurm") or {}
    merge_id = slurm.get("merge_job_id")
    if not merge_id:
        return None
    recorded = MergeState((slurm.get("merge") or {}).get("state", MergeState.PENDING))
    if recorded.finished:
        return recorded
    try:
        info = query_job(str(merge_id), env)
    except SlurmError:
        return recorded
    if info is None:
        return recorded
    run_state = info.state.run_state
    if not run_state.finished:
        return MergeState.RUNNING if run_state == RunState.RUNNING else MergeState.PENDING
    if run_state == RunState.COMPLETED:
        # finished between its own last write and this query; re-read once
        again = MergeState(
            (load_run(record["run_dir"]).get("slurm") or {}).get("merge", {}).get("state", "failed")
        )
        return again if again.finished else MergeState.COMPLETED
    return MergeState.CANCELLED if run_state == RunState.CANCELLED else MergeState.FAILED


# ------------------------------------------------------------------------------ the launcher
@dataclass
class SlurmJobRef:
    """The backend handle: enough to find the job again from any process (``run.json``)."""

    run_dir: Path
    """The run directory."""
    job_id: str
    """Slurm id of the training job."""
    merge_job_id: str | None
    """Slurm id of the dependent merge job."""
    nodes: int
    """Nodes (= tasks) of the job."""
    follow: bool = False
    """``wait`` blocks until the job and its merge end; otherwise it returns at once."""
    slurm_conf: str | None = None
    """``SLURM_CONF`` at submission (used when the current shell has none)."""
    torchrun_args: list[str] = field(default_factory=list)
    """torchrun flags of every node besides the rendezvous ones rankscope adds."""
    nproc_per_node: int = 1
    """Ranks per node."""

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm commands about this job."""
        return _slurm_env(self.slurm_conf)


def node_torchrun_args(torchrun_args: list[str], gpus_per_node: int = 0) -> tuple[list[str], int]:
    """Each node's torchrun flags and its number of ranks.

    The user's flags minus the rendezvous ones rankscope sets on Slurm; without
    ``--nproc-per-node``, one rank per GPU Slurm gives the node (torchrun's own default is 1).
    """
    out: list[str] = []
    i = 0
    while i < len(torchrun_args):
        tok = torchrun_args[i]
        flag, has_value, _ = tok.partition("=")
        if flag in RENDEZVOUS_OWNED:
            i += 1 if (has_value or not RENDEZVOUS_OWNED[flag]) else 2
            continue
        out.append(tok)
        i += 1
    given = _flag_value(out, ("--nproc-per-node", "--nproc_per_node"))
    if given is None:
        nproc = max(1, gpus_per_node)
        return [f"--nproc-per-node={nproc}", *out], nproc
    if given.isdigit():
        return out, int(given)
    if given == "gpu" and gpus_per_node:
        return out, gpus_per_node
    raise UsageError(f"--nproc-per-node {given}: give a number of ranks per node on Slurm")


def _flag_value(tokens: list[str], names: tuple[str, ...]) -> str | None:
    for i, tok in enumerate(tokens):
        flag, has_value, value = tok.partition("=")
        if flag in names:
            if has_value:
                return value
            return tokens[i + 1] if i + 1 < len(tokens) else None
    return None


class SlurmLauncher(Launcher):
    """Submit through submitit: one task per node, torchrun in each, a dependent merge job."""

    kind: ClassVar[LauncherKind] = LauncherKind.SLURM
    started_state: ClassVar[RunState] = RunState.QUEUED

    def __init__(self, *, echo: bool = True) -> None:
        self.echo = echo
        """Print the job ids when submitting (``rankscope run`` prints them)."""

    # ---------------------------------------------------- `rankscope status` / `cancel`
    def refresh(self, run_dir: Path) -> str | None:
        """Ask Slurm (sacct, then squeue); a note when Slurm cannot be asked."""
        try:
            self.attach(run_dir).state()
        except SlurmError as exc:
            return f"{exc} (showing run.json as last written)"
        return None

    def status_details(self, run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
        """The job ids, Slurm's state and pending reason, one row per task, the merge job."""
        slurm = record.get("slurm") or {}
        out: dict[str, Any] = {
            "job_id": slurm.get("job_id"),
            "slurm_state": slurm.get("state"),
            "slurm_reason": (slurm.get("reason") or None)
            if slurm.get("state") == "PENDING"
            else None,
            "merge_job_id": slurm.get("merge_job_id"),
            "tasks": task_states(run_dir, record),
            "notes": [],
        }
        try:
            state = merge_state(
                {**record, "run_dir": str(run_dir)}, _slurm_env(slurm.get("slurm_conf"))
            )
        except SlurmError as exc:
            state = None
            out["notes"].append(f"cannot ask Slurm about the merge job: {exc}")
        out["merge_state"] = None if state is None else str(state)
        return out

    def cancel_run(self, run_dir: Path) -> str:
        """scancel the job (every rank gets SIGTERM and flushes); the merge job still runs."""
        handle = self.attach(run_dir)
        before = RunState(handle.record()["state"])
        if not before.finished:
            before = handle.state()  # it may have ended meanwhile
        if before.finished:
            return f"{run_dir} already ended: {before}"
        state = handle.cancel()
        slurm = handle.record().get("slurm") or {}
        merge = slurm.get("merge_job_id")
        then = f"; merge job {merge} merges the windows already written" if merge else ""
        return f"Slurm job {slurm.get('job_id')} {state}{then}"

    # ---------------------------------------------------------------- hooks
    def _start(self, spec: RunSpec, run_dir: Path) -> SlurmJobRef:
        import submitit

        raw = dict(spec.options.get("slurm") or {})
        if not raw:
            raw = {**load_defaults(), "nodes": spec.nnodes or 1}
        user_nnodes = _flag_value(spec.torchrun_args, ("--nnodes",))
        if not spec.options.get("nodes_given", True) and user_nnodes and user_nnodes.isdigit():
            raw["nodes"] = int(user_nnodes)  # torchrun's spelling of the node count
        options = SlurmOptions.from_dict(raw)
        if user_nnodes is not None and user_nnodes != str(options.nodes):
            raise UsageError(
                f"--nnodes {user_nnodes} contradicts --nodes {options.nodes}; on Slurm give --nodes only"
            )
        env = _slurm_env()
        check_slurm(options.partition, env)
        torchrun_args, nproc = node_torchrun_args(spec.torchrun_args, options.gpus_per_node)
        plan = NodePlan(
            run_dir=str(run_dir),
            cwd=str(Path.cwd()),
            nnodes=options.nodes,
            torchrun_args=tuple(torchrun_args),
            rank_argv=tuple(rank_argv(spec)),
            env=rank_settings_env(spec, run_dir),
        )
        executor = submitit.SlurmExecutor(
            folder=run_dir / rundir.LOGS_DIR / SUBMITIT_FOLDER, max_num_timeout=0
        )
        executor.update_parameters(**options.executor_parameters(nproc, f"rankscope-{spec.name}"))
        try:
            # submitit prints sbatch's stderr itself before raising: keep the error to one line
            with contextlib.redirect_stderr(io.StringIO()):
                job = executor.submit(run_node, plan)
        except Exception as exc:  # submitit wraps sbatch's refusal in its own error types
            raise SlurmError(f"sbatch refused the job: {_first_line(str(exc))}") from exc
        job_id = str(job.job_id)
        try:
            merge_id: str | None = submit_merge_job(
                run_dir,
                job_id,
                partition=options.partition,
                account=options.account,
                qos=options.qos,
                name=f"rankscope-merge-{spec.name}",
                env=env,
            )
        except SlurmError as exc:
            merge_id = None
            print(
                f"rankscope run: warning: {exc}; merge later with `rankscope merge {run_dir}`",
                file=sys.stderr,
            )
        if self.echo:
            print(
                f"rankscope run: submitted Slurm job {job_id} ({options.nodes} node(s) x {nproc} rank(s)); "
                f"merge job {merge_id or '-'} runs when it ends",
                flush=True,
            )
        return SlurmJobRef(
            run_dir=run_dir,
            job_id=job_id,
            merge_job_id=merge_id,
            nodes=options.nodes,
            follow=bool(spec.options.get("follow", False)),
            slurm_conf=env.get("SLURM_CONF"),
            torchrun_args=list(torchrun_args),
            nproc_per_node=nproc,
        )

    def _record_fields(self, job: SlurmJobRef) -> dict[str, Any]:
        record = load_run(job.run_dir)
        options = (record.get("options") or {}).get("slurm") or {}
        return {
            "nnodes": job.nodes,
            "nproc_per_node": job.nproc_per_node,
            "world_size": job.nodes * job.nproc_per_node,
            # what each node's torchrun got (plus --nnodes and the c10d rendezvous at node 0)
            "torchrun_args": job.torchrun_args,
            "slurm": {
                "job_id": job.job_id,
                "merge_job_id": job.merge_job_id,
                "state": str(SlurmJobState.PENDING),
                "nodes": job.nodes,
                "options": options,
                "slurm_conf": job.slurm_conf,
                "submitit_folder": str(job.run_dir / rundir.LOGS_DIR / SUBMITIT_FOLDER),
                "merge": {"job_id": job.merge_job_id, "state": str(MergeState.PENDING)},
            },
        }

    def _attach(self, run_dir: Path, record: dict[str, Any]) -> SlurmJobRef | None:
        slurm = record.get("slurm") or {}
        if not slurm.get("job_id"):
            return None
        return SlurmJobRef(
            run_dir=Path(run_dir),
            job_id=str(slurm["job_id"]),
            merge_job_id=slurm.get("merge_job_id"),
            nodes=int(slurm.get("nodes") or record.get("nnodes") or 1),
            slurm_conf=slurm.get("slurm_conf"),
        )

    def _poll(self, job: SlurmJobRef) -> JobOutcome | None:
        info = query_job(job.job_id, job.env)
        record = load_run(job.run_dir)
        if info is None:
            return None  # not visible yet: still queued as far as we know
        state = info.state.run_state
        slurm = dict(record.get("slurm") or {})
        if not state.finished:
            if (
                record.get("state") != str(state)
                or slurm.get("state") != str(info.state)
                or slurm.get("reason", "") != info.reason
            ):
                slurm.update(state=str(info.state), nodelist=info.nodelist, reason=info.reason)
                update_run(job.run_dir, state=str(state), slurm=slurm)
            return None
        tasks = read_task_records(job.run_dir, job.job_id)
        failures: list[dict[str, Any]] = []
        if state == RunState.FAILED:
            seen: set[int] = set()
            for rec in tasks.values():
                for f in rec.get("failures") or []:
                    if f.get("rank") not in seen:
                        seen.add(f.get("rank"))
                        failures.append(f)
            if not failures:
                failures.append(
                    {
                        "rank": None,
                        "error": f"Slurm job {job.job_id} {info.state}",
                        "exit_code": info.exit_code,
                    }
                )
        slurm.update(
            state=str(info.state),
            exit_code=info.exit_code,
            nodelist=info.nodelist,
            elapsed=info.elapsed,
        )
        outcome = JobOutcome(
            state=state, exit_code=info.exit_code, failures=failures, fields={"slurm": slurm}
        )
        slurm["tasks"] = task_states(job.run_dir, {**record, "state": str(state), "slurm": slurm})
        return outcome

    def _wait(self, job: SlurmJobRef, timeout: float | None) -> JobOutcome | None:
        """Without ``follow``: return at once (a batch job). With it: poll until job and merge end.

        Ctrl-C stops following, never the job (it keeps running; ``rankscope cancel`` stops it).
        """
        if not job.follow:
            print(
                f"rankscope run: follow it with `rankscope status {job.run_dir}` "
                f"(stop it with `rankscope cancel {job.run_dir}`)",
                flush=True,
            )
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            outcome = None
            while outcome is None:
                outcome = self._poll(job)
                if outcome is None:
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
                    time.sleep(FOLLOW_POLL_S)
            while job.merge_job_id:
                info = query_job(job.merge_job_id, job.env)
                if info is not None and info.state.run_state.finished:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                time.sleep(FOLLOW_POLL_S)
            outcome = self._poll(job) or outcome  # re-read: the merge job changed run.json
        except KeyboardInterrupt:
            print(
                f"\nrankscope: stopped following; Slurm job {job.job_id} goes on "
                f"(rankscope status {job.run_dir} / rankscope cancel {job.run_dir})",
                file=sys.stderr,
            )
            return None
        return outcome

    def _finish(self, handle: RunHandle, outcome: JobOutcome) -> RunState:
        """Base behaviour, keeping what the merge job wrote meanwhile (``slurm.merge``)."""
        slurm = outcome.fields.get("slurm")
        if isinstance(slurm, dict):
            fresh = load_run(handle.run_dir).get("slurm") or {}
            for key in ("merge", "merge_job_id"):
                if key in fresh:
                    slurm[key] = fresh[key]
        return super()._finish(handle, outcome)

    def _cancel(self, job: SlurmJobRef, *, interrupt: bool) -> JobOutcome:
        """scancel: Slurm sends SIGTERM (ranks flush), then SIGKILL; the merge job still runs."""
        scancel(job.job_id, job.env)
        record = load_run(job.run_dir)
        slurm = dict(record.get("slurm") or {})
        slurm.update(state=str(SlurmJobState.CANCELLED), cancelled_at=utc_now())
        return JobOutcome(state=RunState.CANCELLED, exit_code=None, fields={"slurm": slurm})


# ------------------------------------------------------------------------------ sbatch template
def prepare_run(argv: list[str]) -> Path:
    """For ``slurm/rankscope.sbatch``: create the run directory of THIS job and its merge job.

    Reads the job from Slurm's environment (``SLURM_JOB_ID``, ``SLURM_JOB_NUM_NODES``, …), writes
    ``run.json`` (launcher ``slurm``, state ``running``), submits the ``afterany`` merge job and
    returns the run directory.
    """
    parser = argparse.ArgumentParser(prog="python -m rankscope.launchers.slurm prepare")
    parser.add_argument("--out", type=Path, default=Path("rankscope-runs"))
    parser.add_argument("--name", default="")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise UsageError(
            "prepare runs inside a Slurm job (no $SLURM_JOB_ID); submit slurm/rankscope.sbatch with sbatch"
        )
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    spec = RunSpec(
        script=args.script,
        script_args=list(args.script_args),
        torchrun_args=[f"--nproc-per-node={args.nproc_per_node}"],
        profiler=ProfilerSettings.from_json(os.environ[rundir.ENV_PROFILER])
        if os.environ.get(rundir.ENV_PROFILER)
        else ProfilerSettings(),
        out=args.out,
        name=args.name,
        launcher=LauncherKind.SLURM,
        command=["sbatch", "slurm/rankscope.sbatch", args.script, *args.script_args],
        nnodes=nodes,
        nproc_per_node=args.nproc_per_node,
    )
    run_dir = create_run_dir(spec.out, spec.name)
    partition = os.environ.get("SLURM_JOB_PARTITION")
    account = os.environ.get("SLURM_JOB_ACCOUNT")
    qos = os.environ.get("SLURM_JOB_QOS")
    record = {
        "rankscope_version": versions()["rankscope"],
        "run_id": run_dir.name,
        **spec.to_record(),
        "launcher": str(LauncherKind.SLURM),
        "run_dir": str(run_dir),
        "cwd": str(Path.cwd()),
        "host": socket.gethostname(),
        "versions": versions(),
        "state": str(RunState.RUNNING),
        "exit_code": None,
        "started_at": utc_now(),
        "ended_at": None,
        "failures": [],
        "slurm": {
            "job_id": job_id,
            "merge_job_id": None,
            "state": str(SlurmJobState.RUNNING),
            "nodes": nodes,
            "nodelist": os.environ.get("SLURM_JOB_NODELIST", ""),
            "slurm_conf": os.environ.get("SLURM_CONF"),
            "submitted_by": "sbatch template",
            "merge": {"job_id": None, "state": str(MergeState.PENDING)},
        },
    }
    rundir.write_json_atomic(run_dir / rundir.RUN_JSON, record)
    merge_id = submit_merge_job(
        run_dir,
        job_id,
        partition=partition,
        account=account,
        qos=qos,
        name=f"rankscope-merge-{spec.name}",
    )
    _update_slurm(
        run_dir, merge_job_id=merge_id, merge={"job_id": merge_id, "state": str(MergeState.PENDING)}
    )
    return run_dir


def main(argv: list[str] | None = None) -> int:
    """``python -m rankscope.launchers.slurm prepare|finalize …`` (used by jobs, not by people)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m rankscope.launchers.slurm {prepare ARGS | finalize RUN}"
    if not argv or argv[0] not in ("prepare", "finalize"):
        print(usage, file=sys.stderr)
        return 2
    try:
        if argv[0] == "prepare":
            print(prepare_run(argv[1:]))
            return 0
        if len(argv) != 2:
            print(usage, file=sys.stderr)
            return 2
        return finalize(argv[1])
    except RankscopeError as exc:
        print(f"rankscope slurm {argv[0]}: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
