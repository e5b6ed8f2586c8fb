"""What a Slurm job asks for: :class:`SlurmOptions`, its defaults, and the ``rankscope run`` flags.

An option is said once, as a :class:`SlurmOptions` field declared with :func:`option`; the run
flag (:func:`add_slurm_arguments`, by the project's one flag generator
:mod:`rankscope.config_flags`), the config-file key (:data:`CONFIG_KEYS`), the
``RANKSCOPE_SLURM_<NAME>`` default (:data:`ENV_DEFAULTS`) and the sbatch parameter
(:meth:`SlurmOptions.executor_parameters`) are generated from the fields.

Defaults for partition, account, time, QOS and constraint: command-line flag, else environment
(:data:`ENV_DEFAULTS`), else the TOML file ``$RANKSCOPE_SLURM_CONFIG`` or
``~/.config/rankscope/slurm.toml`` (:data:`CONFIG_KEYS`), else the built-in default.

Signals — submitit always writes ``#SBATCH --signal=USR2@90`` for its checkpoint/requeue. Slurm
delivers it to every process of the step 90 s before the time limit: torchrun and the ranks would
die (USR2's default action) and submitit's handler would end task 0 early, as measured on the
local cluster. rankscope replaces it with SIGCONT (:data:`TIME_LIMIT_SIGNAL`, a no-op for every
process), so a job that runs out of time is ended by Slurm's own SIGTERM at the limit (ranks
flush their window in progress) and SIGKILL ``KillWait`` seconds later; its state is then
``timeout``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankscope.config_flags import Flags, flag_of
from rankscope.config_flags import flag as flag_metadata
from rankscope.errors import UsageError
from rankscope.launchers.slurm.commands import check_slurm

#: The file of configuration defaults, unless ``$RANKSCOPE_SLURM_CONFIG`` names another.
DEFAULT_CONFIG_PATH = Path("~/.config/rankscope/slurm.toml")
ENV_CONFIG = "RANKSCOPE_SLURM_CONFIG"
#: Prefix of the environment variables giving option defaults (``RANKSCOPE_SLURM_PARTITION``).
ENV_PREFIX = "RANKSCOPE_SLURM_"
#: Default time limit of the job, in minutes.
DEFAULT_TIME_MIN = 60
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
    meta = {
        **flag_metadata(name=flag, metavar=metavar, help=help),
        "config": config,
        "env": env,
        "submit": submit,
    }
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
        1, metavar="N", help="nodes; one torchrun per node", config=False, submit=False
    )
    """Nodes of the job; one submitit task (one torchrun) runs on each."""
    gpus_per_node: int = option(0, metavar="N", help="GPUs per node; 0 = CPU", submit=False)
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
        help="time limit in minutes",
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
                flag = flag_of(SlurmOptions, name)
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
                flag = flag_of(type(self), f.name)
                raise ValueError(f"{flag} must be a non-empty word, got {value!r}")
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
#: The ``rankscope run`` flags of the fields, their defaults in the help (every argparse default is
#: None: config and environment fill in).
SLURM_FLAGS = Flags(SlurmOptions, default_note=" ({})")
#: CLI flag dest -> SlurmOptions field (one name: the flags are read back under the fields').
_FLAG_FIELDS = {ff.field: ff.field for ff in SLURM_FLAGS.fields}


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--slurm`` flags of ``rankscope run`` (all rankscope flags: they go before SCRIPT),
    one per :class:`SlurmOptions` field (:data:`SLURM_FLAGS`)."""
    envs = "/".join(
        "_" + v.removeprefix(ENV_PREFIX) if i else v for i, v in enumerate(ENV_DEFAULTS.values())
    )
    g = parser.add_argument_group(
        f"Slurm (with --slurm; defaults from ${envs} or ~/.config/rankscope/slurm.toml)"
    )
    g.add_argument(
        "--slurm", action="store_true", help="submit to Slurm (submitit) instead of running here"
    )
    SLURM_FLAGS.add(g)
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
    given = SLURM_FLAGS.given(args)
    if not getattr(args, "slurm", False):
        if given or getattr(args, "follow", False):
            flags = ", ".join(ff.flag for ff in SLURM_FLAGS.fields if ff.field in given)
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
