"""``rankscope synth``'s command line: one flag per :class:`SynthConfig` field, help from the
field docstrings (import-light: numpy is loaded only when a job is generated)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from rankscope.errors import UsageError
from rankscope.orchestrator.synth.config import (
    RANK_FILE_PATTERN,
    TRUTH_FILE,
    Schedule,
    SynthConfig,
    _flag,
)


def _field_docs() -> dict[str, str]:
    """The attribute docstrings of :class:`SynthConfig` (the CLI's help), read from the source."""
    import ast
    import inspect
    import itertools

    try:
        tree = ast.parse(inspect.getsource(SynthConfig).lstrip())
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split()).replace("%", "%%")
    return docs


def _tuple_parser(flag: str, arity: tuple[int, int], kinds: tuple[type, ...], defaults: tuple):
    """A parser of ``A:B[:C]`` values (``arity`` = (least, most) parts) raising UsageError."""

    def parse(text: str) -> tuple:
        parts = text.split(":")
        if not arity[0] <= len(parts) <= arity[1]:
            raise UsageError(f"{flag}: expected {_METAVARS[flag]}, got {text!r}")
        try:
            values = [kind(p) for kind, p in zip(kinds, parts, strict=False)]
        except ValueError:
            raise UsageError(f"{flag}: expected {_METAVARS[flag]}, got {text!r}") from None
        return (*values, *defaults[len(values) - arity[0] :])

    return parse


_METAVARS = {
    "--straggler": "RANK:EXTRA_MS[:FRACTION]",
    "--slow-input": "RANK:EXTRA_MS",
    "--clock-offset": "HOST:MS",
    "--clock-drift": "HOST:PPM",
    "--stage-layers": "STAGE:LAYERS",
    "--slow-worker": "RANK:FACTOR[:FRACTION]",
    "--slow-host-link": "HOST:HOST:FACTOR",
    "--gc-pause": "RANK:MS[:FRACTION]",
}
_LIST_FIELDS = {
    "stragglers": (
        "--straggler",
        _tuple_parser("--straggler", (2, 3), (int, float, float), (1.0,)),
    ),
    "slow_input": ("--slow-input", _tuple_parser("--slow-input", (2, 2), (int, float), ())),
    "clock_offset": ("--clock-offset", _tuple_parser("--clock-offset", (2, 2), (int, float), ())),
    "clock_drift": ("--clock-drift", _tuple_parser("--clock-drift", (2, 2), (int, float), ())),
    "stage_layers": ("--stage-layers", _tuple_parser("--stage-layers", (2, 2), (int, int), ())),
    "slow_worker": (
        "--slow-worker",
        _tuple_parser("--slow-worker", (2, 3), (int, float, float), (1.0,)),
    ),
    "slow_host_link": (
        "--slow-host-link",
        _tuple_parser("--slow-host-link", (3, 3), (int, int, float), ()),
    ),
    "gc_pause": ("--gc-pause", _tuple_parser("--gc-pause", (2, 3), (int, float, float), (1.0,))),
}


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope synth``: one flag per :class:`SynthConfig` field (import-light)."""
    parser.add_argument("out", type=Path, metavar="OUT_DIR", help="folder to write the job into")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the rank files and truth.json of an earlier job in OUT_DIR",
    )
    docs = _field_docs()
    defaults = SynthConfig()
    for f in dataclasses.fields(SynthConfig):
        default = getattr(defaults, f.name)
        help_text = docs.get(f.name, "")
        if f.name in _LIST_FIELDS:
            flag, _ = _LIST_FIELDS[f.name]
            parser.add_argument(
                flag,
                dest=f.name,
                action="append",
                default=[],
                metavar=_METAVARS[flag],
                help=help_text.split(": ", 1)[-1] + " (repeatable)",
            )
        elif f.name == "bucket_bytes":
            parser.add_argument(
                "--bucket-bytes",
                dest=f.name,
                metavar="N[,N...]",
                default=",".join(str(b) for b in default),
                help=f"{help_text} (default {','.join(str(b) for b in default)})",
            )
        elif isinstance(default, Schedule):
            parser.add_argument(
                f"--{_flag(f.name)}",
                dest=f.name,
                metavar="|".join(s.value for s in Schedule),
                default=None,
                help=f"{help_text} (default {default.value})",
            )
        elif isinstance(default, bool):
            parser.add_argument(
                f"--{_flag(f.name)}",
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{help_text} (default {'on' if default else 'off'})",
            )
        else:
            parser.add_argument(
                f"--{_flag(f.name)}",
                dest=f.name,
                metavar=type(default).__name__.upper(),
                default=None,
                help=f"{help_text} (default {default})",
            )


def config_from_args(args: argparse.Namespace) -> SynthConfig:
    """The :class:`SynthConfig` of parsed arguments (UsageError, one line, on a bad value)."""
    values: dict[str, Any] = {}
    defaults = SynthConfig()
    for f in dataclasses.fields(SynthConfig):
        raw = getattr(args, f.name, None)
        if f.name in _LIST_FIELDS:
            _, parse = _LIST_FIELDS[f.name]
            values[f.name] = [parse(v) for v in raw or []]
        elif f.name == "bucket_bytes":
            try:
                values[f.name] = tuple(int(v) for v in str(raw).split(",") if v.strip())
            except ValueError:
                raise UsageError(f"--bucket-bytes: expected N[,N...] bytes, got {raw!r}") from None
        elif raw is None:
            continue
        elif isinstance(getattr(defaults, f.name), Schedule):
            try:
                values[f.name] = Schedule(str(raw).lower())
            except ValueError:
                names = ", ".join(s.value for s in Schedule)
                raise UsageError(f"--schedule: one of {names}, got {raw!r}") from None
        elif isinstance(getattr(defaults, f.name), bool):
            values[f.name] = bool(raw)
        else:
            kind = type(getattr(defaults, f.name))
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise UsageError(
                    f"--{_flag(f.name)}: expected {'an integer' if kind is int else 'a number'}, "
                    f"got {raw!r}"
                ) from None
    config = SynthConfig(**values)
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
