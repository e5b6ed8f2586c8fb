"""``rankscope run``: profile a torchrun job on every rank with one command.

    rankscope run [torchrun flags] [rankscope flags] SCRIPT [script args…]

torchrun's own flags pass through unchanged; rankscope's flags (profiler schedule, ``--out``,
``--name`` …) may be mixed with them, but everything after SCRIPT belongs to the script, even
when it looks like a flag (``--lr 3e-4``). The command validates everything before launching
(exit 2, one line, nothing created), runs the job, prints a summary, then merges and analyses
the run when those steps are installed (``--no-merge`` / ``--no-analyze`` skip them). The exit
status is the job's (130 after Ctrl-C), whatever the merge or analysis do. What the run did
is read back by ``run_outcome.py``; the merge and analysis after it are ``workflow.py``'s.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rankscope.errors import UsageError
from rankscope.orchestrator.finalize import ANALYZE_OPTION

if TYPE_CHECKING:
    from rankscope.config_flags import Flags
    from rankscope.launchers.spec import ProfilerSettings

#: torchrun flags that take no value (all its other flags take exactly one).
TORCHRUN_SWITCHES = frozenset(
    {
        "--standalone",
        "-m",
        "--module",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
    }
)
#: torchrun flags that choose a rendezvous: when none is given (and one node), add --standalone.
RENDEZVOUS_FLAGS = frozenset(
    {
        "--standalone",
        "--rdzv-backend",
        "--rdzv_backend",
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        "--rdzv-id",
        "--rdzv_id",
        "--rdzv-conf",
        "--rdzv_conf",
        "--master-addr",
        "--master_addr",
        "--master-port",
        "--master_port",
    }
)
#: torchrun flags that select a module instead of a script path.
MODULE_FLAGS = frozenset({"-m", "--module"})
#: torchrun flags rankscope cannot honour (it always runs a Python rank module).
REJECTED_FLAGS = {
    "--no-python": "cannot profile a non-Python program (--no-python)",
    "--no_python": "cannot profile a non-Python program (--no_python)",
}
#: torchrun flags that rankscope drops because the rank module already runs the script by path.
DROPPED_FLAGS = frozenset({"--run-path", "--run_path"})

USAGE = "rankscope run [torchrun flags] [rankscope flags] SCRIPT [script args ...]"
DESCRIPTION = (
    "Run SCRIPT under torchrun with a profiler in every rank. torchrun's flags "
    "(--nproc-per-node, --nnodes, --standalone, --rdzv-*, --master-port, --max-restarts ...) pass "
    "through unchanged; with one node and no rendezvous flag, --standalone is added (a free port). "
    "Everything after SCRIPT goes to the script. To keep your own launcher line instead, insert "
    "the rank module: `RANKSCOPE_RUN_DIR=DIR torchrun ... -m rankscope.launchers.rank train.py ...`."
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports mistakes as a one-line UsageError instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def profiler_flags() -> Flags[ProfilerSettings]:
    """The profiler's flags: one per :class:`ProfilerSettings` field, the default in parentheses."""
    from rankscope.config_flags import Flags
    from rankscope.launchers.spec import ProfilerSettings

    return Flags(ProfilerSettings, default_note=" ({})")


def add_profiler_arguments(parser: argparse.ArgumentParser) -> None:
    """The profiler schedule and options (:func:`profiler_flags`)."""
    g = parser.add_argument_group("profiler (one step = one optimizer step or rankscope.step())")
    profiler_flags().add(g)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where results go and what happens after the job."""
    from rankscope.launchers.spec import DEFAULT_OUT

    g = parser.add_argument_group("output")
    g.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"parent folder of run folders ({DEFAULT_OUT})",
    )
    g.add_argument("--name", default=None, help="run name, part of the folder name (script name)")
    g.add_argument("--no-merge", action="store_true", help="do not merge the traces after the run")
    g.add_argument(
        "--no-analyze",
        action="store_true",
        help="do not analyse the run after it (on Slurm: its merge job only merges)",
    )


def add_hang_arguments(parser: argparse.ArgumentParser) -> None:
    """When the job counts as hung and what happens then (``HangRule``'s fields)."""
    from rankscope.config_flags import Flags
    from rankscope.launchers.hang_watch import HangRule

    Flags(HangRule).add(parser.add_argument_group("hangs"))


def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    """Slurm flags (``--slurm``, nodes, partition, time …): the Slurm launcher's region.

    Everything added here is a rankscope flag (it must come before SCRIPT); switches need
    ``nargs=0`` actions (``store_true``) so the splitter knows they take no value.
    """
    from rankscope.launchers.slurm.options import add_slurm_arguments as add_flags

    add_flags(parser)


def build_parser() -> argparse.ArgumentParser:
    """rankscope's own flags of ``rankscope run`` (torchrun's are validated by torchrun's parser)."""
    parser = _Parser(prog="rankscope run", usage=USAGE, description=DESCRIPTION, add_help=False)
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    add_profiler_arguments(parser)
    add_output_arguments(parser)
    add_hang_arguments(parser)
    from rankscope.orchestrator.live_options import add_live_arguments

    add_live_arguments(parser)
    add_slurm_arguments(parser)
    return parser


def configure(parser: argparse.ArgumentParser) -> None:
    """``run`` parses its own arguments (see :func:`main`); nothing to add here."""


def split_argv(
    argv: Sequence[str], parser: argparse.ArgumentParser
) -> tuple[list[str], list[str], str | None, list[str]]:
    """Split ``argv`` into (rankscope flags, torchrun flags, script, script args).

    The script is the first token that is neither a flag nor the value of the flag before it;
    flag arity comes from our parser and :data:`TORCHRUN_SWITCHES`.
    """
    ours = parser._option_string_actions
    mine: list[str] = []
    torchrun: list[str] = []
    i = 0
    argv = list(argv)
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            i += 1
            break
        if not tok.startswith("-") or tok == "-":
            break
        flag, has_value, _ = tok.partition("=")
        target = mine if flag in ours else torchrun
        takes_value = ours[flag].nargs != 0 if flag in ours else flag not in TORCHRUN_SWITCHES
        target.append(tok)
        i += 1
        if takes_value and not has_value:
            if i >= len(argv):
                raise UsageError(f"{flag} needs a value")
            target.append(argv[i])
            i += 1
    if i >= len(argv):
        return mine, torchrun, None, []
    return mine, torchrun, argv[i], argv[i + 1 :]


def _flag_names(tokens: Sequence[str]) -> list[str]:
    return [t.partition("=")[0] for t in tokens if t.startswith("-")]


def parse_torchrun_args(tokens: list[str], ours: Sequence[str] = ()) -> argparse.Namespace:
    """Validate torchrun's flags as torchrun's own parser does.

    Every flag that is not ours reaches torchrun, so a mistyped flag of either kind fails here:
    it is named with the closest of torchrun's flags and ``ours``. The parser is rebuilt from
    torch's source without importing torch (:mod:`rankscope.launchers.torchrun_flags`: seconds
    saved per run); torch's own is imported only when that reading cannot judge ``tokens``
    exactly.
    """
    from rankscope.launchers.torchrun_flags import fast_parser
    from rankscope.orchestrator.cli import suggestion

    tr = fast_parser(tokens)
    if tr is None:
        from torch.distributed.run import get_args_parser

        tr = get_args_parser()

    def fail(message: str) -> NoReturn:
        head, _, rest = message.partition(": ")
        unknown = [t for t in rest.split() if t.startswith("-")]
        hint = ""
        if head == "unrecognized arguments" and unknown:
            hint = suggestion(unknown[0], [*tr._option_string_actions, *ours])
        # torchrun's own words (the flag went to torchrun), plus the closest flag when one is near
        raise UsageError(f"torchrun: {message}{hint}")

    tr.error = fail  # type: ignore[method-assign]
    return tr.parse_args([*tokens, "rankscope-placeholder.py"])


def _count(value: str, label: str) -> int | None:
    """An int flag value of torchrun (None when torchrun resolves it itself, e.g. ``auto``)."""
    text = str(value)
    if ":" in text:
        lo, _, hi = text.partition(":")
        text = lo if lo == hi else ""
    if text.isdigit():
        return int(text)
    if text == "cpu":
        return os.cpu_count() or 1
    if text in ("gpu", "auto"):
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count()
        if text == "auto":
            return os.cpu_count() or 1
        return None
    if not text:
        return None
    raise UsageError(f"{label}: not a number: {value!r}")


def build_spec(
    argv: Sequence[str], parser: argparse.ArgumentParser
) -> tuple[Any, argparse.Namespace]:
    """Validate ``argv`` completely and build the RunSpec (UsageError on any mistake)."""
    from rankscope.launchers.base import check_out_dir
    from rankscope.launchers.spec import RunSpec, check_run_name

    mine, torchrun, script, script_args = split_argv(argv, parser)
    args = parser.parse_args(mine)
    if args.help:
        return None, args
    if script is None:
        raise UsageError("no training script given (usage: " + USAGE + ")")
    flags = _flag_names(torchrun)
    for flag in flags:
        if flag in REJECTED_FLAGS:
            raise UsageError(REJECTED_FLAGS[flag])
    module = any(f in MODULE_FLAGS for f in flags)
    if not module and not Path(script).is_file():
        raise UsageError(f"script not found: {script}")
    try:
        profiler = profiler_flags().build(args)
        from rankscope.orchestrator.live_options import live_flags

        live = live_flags().build(args)
        if args.name is not None:
            check_run_name(args.name)  # before torch loads: cheap mistakes fail fast
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    check_out_dir(args.out)

    kept = [t for t in torchrun if t.partition("=")[0] not in MODULE_FLAGS | DROPPED_FLAGS]
    tr = parse_torchrun_args(kept, list(parser._option_string_actions))
    nnodes = _count(tr.nnodes, "--nnodes")
    if nnodes == 1 and not any(f in RENDEZVOUS_FLAGS for f in flags):
        kept = ["--standalone", *kept]
    try:
        spec = RunSpec(
            script=script,
            script_args=list(script_args),
            torchrun_args=kept,
            profiler=profiler,
            out=args.out,
            name=args.name or "",
            launcher=launcher_kind(args),
            module=module,
            command=["rankscope", "run", *argv],
            nnodes=nnodes,
            nproc_per_node=_count(tr.nproc_per_node, "--nproc-per-node"),
            options={
                **backend_options(args),
                "hang": hang_options(args),
                ANALYZE_OPTION: not args.no_analyze,
                "live": live.to_dict(),
            },
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return spec, args


def launcher_kind(args: argparse.Namespace) -> Any:
    """Which backend the flags ask for (``--slurm`` → Slurm)."""
    from rankscope.launchers.spec import LauncherKind

    return LauncherKind.SLURM if getattr(args, "slurm", False) else LauncherKind.LOCAL


def hang_options(args: argparse.Namespace) -> dict[str, Any]:
    """The hang rule, for the spec (a Slurm batch job's first node watches with it)."""
    from rankscope.config_flags import Flags
    from rankscope.launchers.hang_watch import HangRule
    from rankscope.launchers.slurm.node_hang import rule_options

    return rule_options(Flags(HangRule).build(args))


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """Backend-specific options recorded in the spec (the Slurm launcher's region)."""
    from rankscope.launchers.slurm.options import slurm_options_from_args

    return slurm_options_from_args(args)


# --------------------------------------------------------------------------- summary
def main(args: argparse.Namespace) -> int:
    """Validate, launch, wait (Ctrl-C → interrupted, 130), summarise, merge, analyse."""
    from rankscope.launchers.base import EXIT_HUNG, EXIT_INTERRUPTED, launcher_for_kind
    from rankscope.launchers.rundir import RunState

    parser = build_parser()
    spec, opts = build_spec(list(args.argv), parser)
    if spec is None:
        parser.print_help()
        return 0
    launcher = launcher_for_kind(spec.launcher)
    handle = launcher.launch(spec)
    print(f"rankscope run: {handle.run_dir}", flush=True)
    from rankscope.config_flags import Flags
    from rankscope.launchers.hang_watch import HangRule, HangWatch
    from rankscope.orchestrator.hang import say_who_and_where

    # the ranks' progress is watched for hangs while this process follows the job (a local run,
    # a Slurm run with --follow; a Slurm batch job is watched by its first node: docs/hangs.md)
    rule = Flags(HangRule).build(opts)
    from rankscope.orchestrator.live import LiveMonitor
    from rankscope.orchestrator.live_options import live_flags

    monitor = LiveMonitor(handle.run_dir, spec.profiler, live_flags().build(opts), spec.world_size)
    watch = HangWatch(
        handle.run_dir,
        rule,
        local=launcher.ranks_are_local,
        failing=lambda: launcher._failing(handle.job),
    )
    try:
        state = handle.wait(
            hang=watch if launcher.follows(handle.job) else None,
            on_hang=lambda n: say_who_and_where(handle.run_dir, n),
            monitor=monitor.poll,
        )
    except KeyboardInterrupt:
        state = RunState.INTERRUPTED
    finally:
        monitor.close()
    if not state.finished:
        return 0  # a batch job still queued or running (Slurm); `rankscope status` follows it
    from rankscope.orchestrator.run_outcome import print_run_outcome

    summary = print_run_outcome(handle.run_dir)
    if state == RunState.FAILED:
        from rankscope.orchestrator.hang import say_what_the_others_did

        say_what_the_others_did(handle.run_dir)
    if state == RunState.HUNG:
        from rankscope.orchestrator.hang import say_the_timeout

        say_the_timeout(handle.run_dir)  # a collective timed out: who and where
    if summary["windows"]:
        # a Slurm run's merge job has written the store already (--follow waits for it)
        from rankscope.launchers.rundir import STORE_NAME

        merged = (handle.run_dir / STORE_NAME).exists()
        from rankscope.orchestrator.workflow import after_run

        after_run(
            handle.run_dir,
            merge_traces=not opts.no_merge and not merged,
            analyse=not opts.no_analyze,
        )
    if state == RunState.INTERRUPTED:
        return EXIT_INTERRUPTED
    if state == RunState.HUNG:
        return EXIT_HUNG
    code = handle.exit_code
    if state == RunState.COMPLETED:
        return 0
    if code is None or code == 0:
        return 1
    return 128 - code if code < 0 else code  # killed by a signal: 128 + its number, as shells do
