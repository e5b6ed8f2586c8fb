"""What to run and how to profile it: the launcher kind, the profiler settings and the run spec.

These dataclasses are the only configuration the launchers take. They are validated when built
(``ValueError`` with a one-line message; the CLI turns it into a usage error) and serialise to
plain JSON: the profiler settings travel to every rank in the environment variable
:data:`rankscope.launchers.rundir.ENV_PROFILER`, and the whole spec is recorded in ``run.json``.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from rankscope.config_flags import flag, flag_of

#: Default parent folder of the run directories (relative to the current directory).
DEFAULT_OUT = Path("rankscope-runs")

#: Characters a run name may not contain (it becomes part of a folder name).
FORBIDDEN_NAME_PARTS = ("/", "\\", "..", "\x00")


class LauncherKind(enum.StrEnum):
    """Where the ranks run; recorded as ``launcher`` in ``run.json``."""

    LOCAL = "local"
    SLURM = "slurm"
    EXTERNAL = "external"
    """The user's own launcher line ran ``-m rankscope.launchers.rank``; rank 0 wrote run.json."""


@dataclass(frozen=True)
class ProfilerSettings:
    """The torch.profiler schedule and options every rank uses.

    One profiler *step* is one training iteration (an optimizer step, or a call of
    ``rankscope.step()``). The schedule skips ``skip_first`` steps, then repeats ``repeat`` times
    ``wait`` idle steps, ``warmup`` steps (profiler on, results dropped) and ``active`` recorded
    steps; every repetition becomes one window file per rank. ``repeat=0`` repeats until the end.
    Each field's ``rankscope run`` flag is declared beside it (:func:`rankscope.config_flags.flag`).
    """

    wait: int = field(default=1, metadata=flag(metavar="N", help="idle steps per cycle"))
    """Steps without profiling at the start of every cycle."""
    warmup: int = field(default=1, metadata=flag(metavar="N", help="warm-up steps"))
    """Steps with the profiler running but discarded (hides its start-up cost)."""
    active: int = field(default=3, metadata=flag(metavar="N", help="recorded steps per window"))
    """Steps recorded in each window (at least 1)."""
    repeat: int = field(default=1, metadata=flag(metavar="N", help="windows, 0 = until the end"))
    """Number of windows to record; 0 records windows until the job ends."""
    skip_first: int = field(
        default=0, metadata=flag(metavar="N", help="steps skipped once at the start")
    )
    """Steps ignored once before the first cycle (e.g. to skip compilation)."""
    record_shapes: bool = field(default=False, metadata=flag(help="record operator input shapes"))
    """Record input shapes of operators (larger traces)."""
    profile_memory: bool = field(default=False, metadata=flag(help="record allocations"))
    """Record tensor allocations and frees (larger traces, more overhead)."""
    with_stack: bool = field(default=False, metadata=flag(help="record call stacks"))
    """Record Python/C++ call stacks of operators (much larger traces, more overhead)."""
    record_gc: bool = field(
        default=False,
        metadata=flag(
            help="record Python garbage collections (turns on --with-stack; GC pauses as a cause)"
        ),
    )
    """Record each Python garbage collection as a ``Python GC`` event (torch's
    ``record_python_gc_info``; it needs the Python tracer, so this turns on ``with_stack``), so
    that the analysis can name GC pauses as a slow rank's cause instead of "host"."""
    with_flops: bool = field(
        default=False,
        metadata=flag(
            help="count operator FLOPs per step (FLOP/s and MFU KPIs; implies input shapes)"
        ),
    )
    """Count FLOPs of the operators torch has formulas for (matmuls, convolutions, elementwise
    add/mul; implies input shapes). The runtime sums them per recorded step into meta.json's
    ``step_flops`` (the exported trace does not carry them)."""
    samples_per_step: float | None = field(
        default=None,
        metadata=flag(
            metavar="N",
            help="samples (or tokens) one rank processes per step (throughput KPI); "
            "rankscope.step(samples=N) records it per step instead",
        ),
    )
    """Samples (or tokens) one rank processes per step, when constant (``--samples-per-step``);
    ``rankscope.step(samples=N)`` records a per-step value instead. Used for the throughput KPI."""

    def __post_init__(self) -> None:
        if not isinstance(self.active, int) or self.active < 1:
            raise ValueError(f"--active must be an integer >= 1, got {self.active!r}")
        for name in ("wait", "warmup", "repeat", "skip_first"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"{flag_of(ProfilerSettings, name)} must be an integer >= 0, got {value!r}"
                )
        if self.samples_per_step is not None:
            check_samples(self.samples_per_step, "--samples-per-step")

    @property
    def cycle(self) -> int:
        """Steps per window cycle (wait + warmup + active)."""
        return self.wait + self.warmup + self.active

    def expected_windows(self, steps: int) -> int:
        """Complete windows recorded by a job that makes ``steps`` profiler steps."""
        usable = max(0, steps - self.skip_first)
        complete = usable // self.cycle
        return complete if self.repeat == 0 else min(complete, self.repeat)

    def busy(self, step: int) -> bool:
        """Whether the scheduled windows use profiler step ``step`` (``ProfilerStep#step``:
        warming up or recording), as torch.profiler's ``schedule`` with these settings says."""
        if step < self.skip_first:
            return False
        k = step - self.skip_first
        if self.repeat > 0 and k // self.cycle >= self.repeat:
            return False
        return k % self.cycle >= self.wait

    def perturbed(self, step: int) -> bool:
        """Whether step ``step``'s time is the profiler's more than the job's: the scheduled
        windows' steps and the step after each one (it pays the window's export)."""
        return self.busy(step) or (step > 0 and self.busy(step - 1))

    def window_fits(self, start: int, steps: int) -> bool:
        """Whether an extra window recording steps ``start`` … ``start + steps - 1`` (after its
        ``warmup`` steps) and its export step stays clear of the scheduled windows."""
        first = max(0, start - self.warmup)
        return not any(self.perturbed(k) for k in range(first, start + steps + 1))

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (the ``profiler`` field of ``run.json``)."""
        return asdict(self)

    def to_json(self) -> str:
        """Compact JSON for the environment variable read by the ranks."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProfilerSettings:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (newer writers)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> ProfilerSettings:
        """Inverse of :meth:`to_json`."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"profiler settings must be a JSON object, got {text!r}")
        return cls.from_dict(data)


def check_samples(value: object, label: str = "samples") -> float:
    """``value`` as a finite float > 0 (samples or tokens per step), else ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"{label} must be a number > 0, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{label} must be a number > 0, got {value!r}") from None
    if not (number > 0 and number != float("inf")):
        raise ValueError(f"{label} must be a number > 0, got {value!r}")
    return number


def check_run_name(name: str) -> str:
    """Return ``name`` if it can be part of a folder name, else raise ``ValueError``."""
    if not name or not name.strip():
        raise ValueError("--name must not be empty")
    for part in FORBIDDEN_NAME_PARTS:
        if part in name:
            raise ValueError(f"--name must not contain {part!r}: {name!r}")
    if name.startswith("."):
        raise ValueError(f"--name must not start with '.': {name!r}")
    return name


@dataclass
class RunSpec:
    """One profiled job: the user's script and arguments, torchrun's flags, where results go."""

    script: str
    """The training script as the user typed it (a path; a module name when ``module``)."""
    script_args: list[str] = field(default_factory=list)
    """Arguments of the script, passed through unchanged."""
    torchrun_args: list[str] = field(default_factory=list)
    """torchrun's own flags (``--nproc-per-node 4 --standalone`` …), passed through unchanged."""
    profiler: ProfilerSettings = field(default_factory=ProfilerSettings)
    """Schedule and options of the per-rank profiler."""
    out: Path = DEFAULT_OUT
    """Parent folder of the run directory (``out/<run_id>``)."""
    name: str = ""
    """Human name of the run, part of the run id; defaults to the script's stem."""
    launcher: LauncherKind = LauncherKind.LOCAL
    """Which backend places the ranks."""
    module: bool = False
    """``script`` is a module name run like ``python -m`` (torchrun's ``-m``)."""
    command: list[str] = field(default_factory=list)
    """The command line exactly as the user typed it (recorded in ``run.json``)."""
    nnodes: int | None = 1
    """Number of nodes (None when torchrun got a range like ``1:4``)."""
    nproc_per_node: int | None = 1
    """Ranks per node (None when torchrun resolves it, e.g. ``auto``)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the ranks."""
    options: dict[str, Any] = field(default_factory=dict)
    """Backend-specific options (e.g. Slurm partition, nodes, time limit)."""

    def __post_init__(self) -> None:
        if not self.script:
            raise ValueError("no training script given")
        self.out = Path(self.out)
        self.launcher = LauncherKind(self.launcher)
        if not self.name:
            self.name = self.script.rsplit(".", 1)[-1] if self.module else Path(self.script).stem
        check_run_name(self.name)
        for label, value in (("--nnodes", self.nnodes), ("--nproc-per-node", self.nproc_per_node)):
            if value is not None and value < 1:
                raise ValueError(f"{label} must be >= 1, got {value}")

    @property
    def world_size(self) -> int | None:
        """Total number of ranks, when known before launch."""
        if self.nnodes is None or self.nproc_per_node is None:
            return None
        return self.nnodes * self.nproc_per_node

    def to_record(self) -> dict[str, Any]:
        """The spec's fields of ``run.json`` (see docs/run-directory.md)."""
        return {
            "name": self.name,
            "launcher": str(self.launcher),
            "command": list(self.command),
            "torchrun_args": list(self.torchrun_args),
            "script": self.script,
            "script_args": list(self.script_args),
            "module": self.module,
            "world_size": self.world_size,
            "nnodes": self.nnodes,
            "nproc_per_node": self.nproc_per_node,
            "profiler": self.profiler.to_dict(),
            "options": dict(self.options),
        }
