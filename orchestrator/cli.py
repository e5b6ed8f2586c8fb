"""The ``rankscope`` command line.

Each sub-command lives in its own module of this package, which exposes
``configure(parser)`` (adds its arguments; must stay import-light) and ``main(args) -> int``.
Heavy imports (torch, dask, h5py, holoviews) happen inside ``main`` so ``rankscope --help`` is
instant. ``run`` parses its own argument list (torchrun's flags pass through unchanged), so it
receives the raw remainder in ``args.argv``.

User mistakes raise :class:`rankscope.errors.RankscopeError`: printed on one line, no traceback.
argparse's own mistakes (a missing or mistyped flag) are printed the same way, by
:class:`CommandParser`, and an unknown option names the closest real one.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import NoReturn

from rankscope import __version__
from rankscope.errors import EXIT_INTERRUPTED, RankscopeError

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
    "compare": ("rankscope.orchestrator.compare", "compare two runs; gate CI on regressions"),
    "synth": (
        "rankscope.orchestrator.synth",
        "generate a synthetic multi-GPU job's traces with ground truth",
    ),
    "finalize": (
        "rankscope.orchestrator.finalize",
        "record a Slurm run's end, then merge and analyse it (the merge job runs it)",
    ),
    "monitor": (
        "rankscope.orchestrator.monitor",
        "the live monitor of a Slurm batch job: changes noticed, windows triggered (its first "
        "node runs it)",
    ),
}

#: commands that parse their own arguments (everything after the command name).
RAW_COMMANDS = frozenset({"run"})
#: commands left out of ``rankscope --help``: run by jobs, not by people.
HIDDEN_COMMANDS = frozenset({"finalize", "monitor"})
#: Exit status of a command-line mistake (argparse's own).
USAGE_EXIT = 2
#: How close (difflib ratio) a real option must be to a mistyped one to be suggested.
SUGGEST_CUTOFF = 0.6
#: A token that argparse reads as a negative number (a value), not as an option.
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def suggestion(token: str, options: Iterable[str]) -> str:
    """``"; did you mean --active?"`` for ``--activ`` (empty when no option is close).

    Shared with ``rankscope run``, which parses its own flags: one wording for every command.
    """
    flag = token.partition("=")[0]
    close = difflib.get_close_matches(flag, sorted(set(options)), n=1, cutoff=SUGGEST_CUTOFF)
    return f"; did you mean {close[0]}?" if close else ""


def unknown_option_message(token: str, options: Iterable[str]) -> str:
    """``unknown option --activ; did you mean --active?`` (the suggestion only when one is close)."""
    return f"unknown option {token.partition('=')[0]}" + suggestion(token, options)


class CommandParser(argparse.ArgumentParser):
    """argparse whose mistakes are ONE line ``PROG: error: MESSAGE`` (exit 2), like every error.

    argparse would print its usage block first; the project's rule is one line per mistake, and
    ``--help`` still shows the usage.
    """

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(USAGE_EXIT)

    def unknown_option(self, argv: Sequence[str]) -> str | None:
        """The first token of ``argv`` that is no option of this parser (nor a prefix argparse
        would accept), or None. Checked before parsing so that a mistyped flag is named even
        when argparse would first complain about the required one it was meant to be.
        """
        known = self._option_string_actions
        for token in argv:
            if token == "--":
                break
            if not token.startswith("-") or token == "-" or NEGATIVE_NUMBER.match(token):
                continue
            flag = token.partition("=")[0] if token.startswith("--") else token[:2]
            if flag in known:
                continue
            if (
                flag.startswith("--")
                and self.allow_abbrev
                and len([o for o in known if o.startswith(flag)]) == 1
            ):
                continue  # an abbreviation argparse accepts
            return token
        return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per available command.

    ``only``: a command's name, for parsing that command's arguments: its sub-parser alone is
    built and only its module imported (every command's ``configure`` and module imports cost
    ~0.04 s of CPU per process, ~2 % of ``rankscope analyze`` on a small job). Its sub-parser is
    the one the full parser holds (same prog, usage, help and errors); a name that is no command
    gets every sub-parser, so argparse's "invalid choice" still lists them all.
    """
    parser = CommandParser(
        prog="rankscope",
        description="Profile distributed PyTorch jobs on every rank, merge the traces with aligned "
        "clocks, and find where the time went and which rank holds the others back.",
    )
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for name, (module_name, help_text) in COMMANDS.items():
        if only in COMMANDS and name != only:
            continue
        module = importlib.import_module(module_name)
        if name in RAW_COMMANDS:
            p = sub.add_parser(name, help=help_text, add_help=False)
            p.add_argument("argv", nargs=argparse.REMAINDER)
        elif name in HIDDEN_COMMANDS:  # no help= : argparse then lists no line for it
            p = sub.add_parser(name, description=help_text)
            module.configure(p)
        else:
            p = sub.add_parser(name, help=help_text, description=help_text)
            module.configure(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rankscope`` console script; returns the exit status.

    Called without ``argv`` it is the process itself (the console script, ``python -m
    rankscope``): once the command has returned and every ``finally`` block has run, it ends the
    process with that status at once, after an interrupt (:func:`_end_interrupted`) and, where
    nothing is left to wait for, after any other outcome too (:func:`_end_finished`).
    """
    if argv is None:
        from rankscope.collector import keep_pace_to_exit

        keep_pace_to_exit()  # the process ends with the command: no pace to put back
    code = _main(argv)
    if argv is None:
        if code == EXIT_INTERRUPTED:
            _end_interrupted()
        _end_finished(code)
    return code


def _end_finished(code: int) -> None:
    """End the process with ``code`` without the interpreter's teardown, when that is safe.

    Why: after the last line of output, CPython's exit deallocates every module and object it
    holds (pandas, numpy, h5py, the analysis' frames), which the operating system would free
    anyway: 75-95 ms of a ``rankscope merge`` of 8 small ranks and 45-80 ms of a ``rankscope
    analyze``, whole processes on this project's 2-core machine (docs/performance.md, issue 31's
    eighth pass). What an exit must do still happens, in the interpreter's order: the ``atexit``
    handlers (logging's flush, multiprocessing's and ``weakref.finalize``'s cleanup, temporary
    folders), then stdout and stderr flushed, then :func:`os._exit` with the same status.

    Returns instead (the usual exit follows) when the usual exit has more to do: a thread that
    is not a daemon still runs (the interpreter would wait for it); a tracer or profiler is set
    (``python -m cProfile``, coverage, a debugger write their results after this returns); or
    the output cannot be flushed (a closed pipe: the interpreter reports it as it always did).
    """
    import atexit
    import threading

    if sys.gettrace() is not None or sys.getprofile() is not None:
        return
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    if _flushed():
        os._exit(code)


def _flushed() -> bool:
    """Flush stdout and stderr; False when one cannot be (a closed pipe, a closed stream). A
    process started without them (``>&-``: the stream is None) has nothing to flush there."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return False
    return True


def _end_interrupted() -> NoReturn:
    """Leave the process with ``EXIT_INTERRUPTED`` through :func:`os._exit`, not ``sys.exit``.

    CPython 3.11 marks a ``KeyboardInterrupt`` raised inside ``exec()`` of a string (as
    dataclasses and namedtuples do while a lazily imported module loads) as unhandled even when it
    was caught, and at exit ends the process by SIGINT instead of the status returned: seen as -2
    instead of 130 when Ctrl-C landed while ``rich.progress`` was being imported. All cleanup has
    run by now (it lives in ``finally`` blocks); only the output is left to flush.
    """
    _flushed()  # what cannot be flushed is lost either way: the status is what matters
    os._exit(EXIT_INTERRUPTED)


def _main(argv: Sequence[str] | None) -> int:
    """:func:`main` proper: parse, run the command, turn user errors and Ctrl-C into a status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=argv[0] if argv else None)
    if argv and argv[0] in RAW_COMMANDS and argv[0] in COMMANDS:
        # argparse's REMAINDER drops a remainder that starts with a flag (`run --nproc-per-node 4`),
        # so raw commands get their argument list verbatim.
        module = importlib.import_module(COMMANDS[argv[0]][0])
        args = argparse.Namespace(command=argv[0], argv=argv[1:], _module=module)
    else:
        sub = _sub_parser(parser, argv[0]) if argv else None
        token = sub.unknown_option(argv[1:]) if sub is not None else None
        if sub is not None and token is not None:
            sub.error(unknown_option_message(token, sub._option_string_actions))
        args, extra = parser.parse_known_args(argv)
        if extra:
            where = _sub_parser(parser, args.command) if args.command else None
            (where or parser).error(f"unrecognized arguments: {' '.join(extra)}")
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
        return EXIT_INTERRUPTED


def _sub_parser(parser: argparse.ArgumentParser, name: str) -> CommandParser | None:
    """The sub-parser of command ``name`` (None for anything else)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = action.choices.get(name)
            return found if isinstance(found, CommandParser) else None
    return None


if __name__ == "__main__":
    sys.exit(main())
