"""The ``rankscope`` command line.

Each sub-command lives in its own module of this package, which exposes
``configure(parser)`` (adds its arguments; must stay import-light) and ``main(args) -> int``.
Heavy imports (torch, dask, h5py, holoviews) happen inside ``main`` so ``rankscope --help`` is
instant. ``run`` parses its own argument list (torchrun's flags pass through unchanged), so it
receives the raw remainder in ``args.argv``.

User mistakes raise :class:`rankscope.errors.RankscopeError`: printed on one line, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rankscope import __version__
from rankscope.errors import RankscopeError

#: sub-command -> (module, one-line help). The module provides configure() and main().
COMMANDS: dict[str, tuple[str, str]] = {
    "run": (
        "rankscope.orchestrator.run",
        "profile a torchrun job (locally, or on Slurm with --slurm)",
    ),
    "merge": (
        "rankscope.orchestrator.merge",
        "merge per-rank traces into one HDF5 store, clocks aligned",
    ),
    "analyze": (
        "rankscope.orchestrator.analyze",
        "breakdown, collectives, stragglers and a verdict per rank",
    ),
    "status": ("rankscope.orchestrator.status", "show the state of a run (local or Slurm)"),
    "cancel": ("rankscope.orchestrator.cancel", "cancel a Slurm run"),
    "view": ("rankscope.orchestrator.view", "serve the cross-rank timeline (Panel app)"),
    "export": (
        "rankscope.orchestrator.export",
        "export one aligned trace (Perfetto / Chrome JSON)",
    ),
}

#: commands that parse their own arguments (everything after the command name).
RAW_COMMANDS = frozenset({"run"})


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per available command."""
    parser = argparse.ArgumentParser(
        prog="rankscope",
        description="Profile distributed PyTorch jobs on every rank, merge the traces with aligned "
        "clocks, and find where the time went and which rank holds the others back.",
    )
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # command not built yet
            raise
        if name in RAW_COMMANDS:
            p = sub.add_parser(name, help=help_text, add_help=False)
            p.add_argument("argv", nargs=argparse.REMAINDER)
        else:
            p = sub.add_parser(name, help=help_text, description=help_text)
            module.configure(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rankscope`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in RAW_COMMANDS and argv[0] in COMMANDS:
        # argparse's REMAINDER drops a remainder that starts with a flag (`run --nproc-per-node 4`),
        # so raw commands get their argument list verbatim.
        module = importlib.import_module(COMMANDS[argv[0]][0])
        args = argparse.Namespace(command=argv[0], argv=argv[1:], _module=module)
    else:
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args._module.main(args) or 0)
    except RankscopeError as exc:
        print(f"rankscope {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"rankscope {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
