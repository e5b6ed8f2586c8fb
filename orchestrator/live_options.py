"""The options of ``rankscope run``'s live line and triggered windows (import-light: the parser
of ``rankscope run`` builds its flags from :class:`LiveOptions` without loading the monitor)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from rankscope.config_flags import flag

if TYPE_CHECKING:
    import argparse


class TriggerMode(enum.StrEnum):
    """Whether a noticed change asks for an extra profiler window."""

    OFF = "off"
    ON = "on"


@dataclass(frozen=True)
class LiveOptions:
    """The live line and what a noticed change does (``rankscope run``'s flags)."""

    trigger: TriggerMode = field(default=TriggerMode.ON, metadata=flag(metavar="{off,on}"))
    """on a lasting slow-down, record one extra profiler window on every rank from the same
    step ('on', default) or only report it ('off')"""
    max_triggers: int = field(default=2, metadata=flag(metavar="K"))
    """at most K extra windows per run"""
    total_steps: int | None = field(default=None, metadata=flag(metavar="N"))
    """total steps of the run, for the live line's ETA"""
    no_live: bool = False
    """no live line (changes are still noticed, printed and written)"""

    def __post_init__(self) -> None:
        if self.max_triggers < 0:
            raise ValueError(f"--max-triggers must be >= 0, got {self.max_triggers}")
        if self.total_steps is not None and self.total_steps < 1:
            raise ValueError(f"--total-steps must be >= 1, got {self.total_steps}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (``run.json``'s ``options.live``: ``rankscope status`` reads the ETA's
        total steps from it)."""
        return {
            "trigger": str(self.trigger),
            "max_triggers": self.max_triggers,
            "total_steps": self.total_steps,
            "no_live": self.no_live,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LiveOptions:
        """Inverse of :meth:`to_dict` (``rankscope monitor`` reads them back from ``run.json``);
        a missing key keeps its default (a run made by the sbatch template records none)."""
        kept = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        if "trigger" in kept:
            kept["trigger"] = TriggerMode(kept["trigger"])
        return cls(**kept)


def live_flags() -> Any:
    """The flags of :class:`LiveOptions` (``rankscope run``)."""
    from rankscope.config_flags import Flags

    return Flags(LiveOptions)


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    """``rankscope run``'s live-line flags, in their own group."""
    live_flags().add(parser.add_argument_group("live line and triggered windows"))
