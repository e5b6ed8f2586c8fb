"""``rankscope synth``'s command line: one flag per :class:`SynthConfig` field, help from the
field docstrings, both by :mod:`rankscope.config_flags` (import-light: numpy is loaded only when a
job is generated)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rankscope.config_flags import BadValue, Flags
from rankscope.errors import UsageError
from rankscope.orchestrator.synth.config import RANK_FILE_PATTERN, TRUTH_FILE, SynthConfig

#: ``rankscope synth``'s flags: one per :class:`SynthConfig` field, help from its docstring and
#: the default; a bad value is a one-line UsageError ``--flag: …``, like ``validate``'s.
SYNTH_FLAGS = Flags(
    SynthConfig,
    toggles=True,
    default_note=" (default {})",
    repeat_note=" (repeatable)",
    bad_value=BadValue.USAGE_ERROR,
)


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope synth``: one flag per :class:`SynthConfig` field (import-light)."""
    parser.add_argument("out", type=Path, metavar="OUT_DIR", help="folder to write the job into")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the rank files and truth.json of an earlier job in OUT_DIR",
    )
    SYNTH_FLAGS.add(parser)


def config_from_args(args: argparse.Namespace) -> SynthConfig:
    """The :class:`SynthConfig` of parsed arguments (UsageError, one line, on a bad value)."""
    config = SYNTH_FLAGS.build(args)
    config.validate()
    return config


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope synth``."""
    import time

    from rankscope.orchestrator.synth.write import generate

    config = config_from_args(args)
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder")
    if out.is_dir() and not args.overwrite:
        old = [p.name for p in out.iterdir() if RANK_FILE_PATTERN.match(p.name)]
        if old or (out / TRUTH_FILE).exists():
            raise UsageError(
                f"{out}: holds a job already (rank files, truth.json); --overwrite replaces it"
            )
    t0 = time.perf_counter()
    summary = generate(config, out, overwrite=args.overwrite)
    seconds = time.perf_counter() - t0
    print(
        f"wrote {config.ranks} rank traces ({config.steps} steps, {summary['events']:,} events, "
        f"{summary['bytes'] / 1e6:.1f} MB) and {TRUTH_FILE} to {out} in {seconds:.1f} s"
    )
    if "mean_step_ns" in summary:
        print(
            f"step {summary['mean_step_ns'] / 1e6:.2f} ms (mean); without the faults "
            f"{(summary['mean_step_ns'] - summary['saving_ns']) / 1e6:.2f} ms "
            f"(saving {summary['saving_ns'] / 1e6:.2f} ms, {summary['saving_pct']:.1f} %)"
        )
    return 0
