"""The one flag generator (``rankscope.config_flags``, issue 25): a dataclass with a docstring per
field gives its flags and their help, the values come back typed, a bad value is one line; and
``rankscope run``'s profiler and Slurm flags, ``rankscope synth``'s and the ``--scheduler`` flags
of ``merge`` and ``analyze`` are all its output, from fields that each have a docstring."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import subprocess
import sys
from pathlib import Path

import pytest
from rankscope.config_flags import (
    NO_FLAG,
    BadValue,
    FlagKind,
    Flags,
    colon_tuple,
    field_docs,
    flag,
    flag_of,
    positive_int,
)
from rankscope.errors import UsageError
from rankscope.orchestrator.cli import CommandParser


class Color(enum.StrEnum):
    """A kind with two values."""

    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Knobs:
    """A configuration as the project writes one: a docstring per field."""

    count: int = 3
    """how many (a 100% plain int)"""
    ratio: float = 0.5
    """a fraction"""
    label: str | None = None
    """a free word"""
    folder: Path = Path(".")
    """where things go"""
    color: Color = Color.RED
    """which colour"""
    loud: bool = False
    """shout"""
    pairs: list[tuple[int, float]] = dataclasses.field(
        default_factory=list,
        metadata=flag(name="--pair", metavar="RANK:MS", parse=colon_tuple(int, float)),
    )
    """(rank, ms): one rank's extra time"""
    words: tuple[str, ...] = ()
    """extra words"""
    size: str = dataclasses.field(default="m", metadata=flag(choices=("s", "m", "l")))
    """a size"""
    host: str | None = dataclasses.field(
        default=None, metadata=flag(metavar="ADDR", exclusive="where", help="its own help")
    )
    """an address"""
    workers: int | None = dataclasses.field(
        default=None, metadata=flag(metavar="N", parse=positive_int, exclusive="where")
    )
    """workers to start"""
    internal: int = dataclasses.field(default=7, metadata=NO_FLAG)
    """set by code only"""


@dataclasses.dataclass
class MoreKnobs(Knobs):
    """A subclass: its own field's docstring and its bases'."""

    extra: int = 1
    """one more"""


def _parser(flags: Flags[Knobs]) -> CommandParser:
    parser = CommandParser(prog="knobs")
    flags.add(parser)
    return parser


def _error(parser: argparse.ArgumentParser, argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """argparse's complaint about ``argv``: exit 2 and exactly one line."""
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_docstring_per_field_gives_each_flag_its_help() -> None:
    flags = Flags(Knobs)
    actions = {a.dest: a for a in _parser(flags)._actions}
    assert "internal" not in actions  # NO_FLAG
    docs = field_docs(Knobs)
    assert docs["ratio"] == "a fraction" and field_docs(Knobs) is docs  # read once per class
    assert actions["ratio"].help == "a fraction" and actions["ratio"].option_strings == ["--ratio"]
    assert actions["count"].help == "how many (a 100%% plain int)"  # literal, not a format
    assert actions["host"].help == "its own help"  # the metadata's wins
    assert actions["pairs"].help == "one rank's extra time"  # the items' gloss is the metavar's
    assert actions["pairs"].option_strings == ["--pair"] and actions["pairs"].metavar == "RANK:MS"
    assert actions["color"].metavar == "red|blue" and actions["count"].metavar == "INT"
    assert all(actions[f.field].default is None for f in flags.fields)  # "not given"
    noted = Flags(Knobs, toggles=True, default_note=" (default {})", repeat_note=" (again)")
    helps = {f.field: noted.help(f) for f in noted.fields}
    assert helps["ratio"] == "a fraction (default 0.5)" and helps["loud"] == "shout (default off)"
    assert helps["color"] == "which colour (default red)" and helps["label"] == "a free word"
    assert helps["pairs"] == "one rank's extra time (again)"
    assert field_docs(MoreKnobs)["extra"] == "one more" and field_docs(MoreKnobs)["ratio"]


def test_docstrings_of_classes_inside_functions_and_classes_are_read() -> None:
    """The docs are read from the module's syntax tree by qualified name: a dataclass made
    inside a function (``f.<locals>.C``) or inside another class gets its own fields' docs,
    not a same-named class's elsewhere in the module."""

    @dataclasses.dataclass
    class Knobs:  # same name as the module's: its own docs win
        ratio: float = 0.5
        """a local fraction"""

        @dataclasses.dataclass
        class Inner:
            depth: int = 1
            """how deep"""

    assert field_docs(Knobs) == {"ratio": "a local fraction"}
    assert field_docs(Knobs.Inner) == {"depth": "how deep"}


def test_values_come_back_typed_and_only_when_given() -> None:
    flags = Flags(Knobs)
    parser = _parser(flags)
    assert flags.given(parser.parse_args([])) == {}
    assert flags.build(parser.parse_args([])) == Knobs()
    args = parser.parse_args(
        ["--count", "4", "--ratio", "0.25", "--folder", "out", "--color", "BLUE", "--loud",
         "--pair", "1:2.5", "--pair", "3:1", "--words", "a", "--words", "b", "--size", "l",
         "--workers", "2"]
    )  # fmt: skip
    built = flags.build(args, internal=9)
    assert built == Knobs(
        count=4, ratio=0.25, folder=Path("out"), color=Color.BLUE, loud=True,
        pairs=[(1, 2.5), (3, 1.0)], words=("a", "b"), size="l", workers=2, internal=9,
    )  # fmt: skip
    kinds = {f.field: f.kind for f in flags.fields}
    assert kinds["loud"] is FlagKind.SWITCH and kinds["words"] is FlagKind.REPEATED
    toggled = Flags(Knobs, toggles=True)
    assert toggled.build(_parser(toggled).parse_args(["--no-loud"])).loud is False
    assert flag_of(Knobs, "pairs") == "--pair" and flag_of(Knobs, "count") == "--count"


def test_a_bad_value_is_argparse_s_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser(Flags(Knobs))
    assert _error(parser, ["--count", "x"], capsys) == (
        "knobs: error: argument --count: invalid int value: 'x'"
    )
    assert "argument --pair: expected RANK:MS, got '1'" in _error(parser, ["--pair", "1"], capsys)
    assert "argument --color: one of red, blue, got 'green'" in _error(
        parser, ["--color", "green"], capsys
    )
    assert "must be a whole number >= 1, not '0'" in _error(parser, ["--workers", "0"], capsys)
    assert "invalid choice: 'xl'" in _error(parser, ["--size", "xl"], capsys)
    assert "argument --workers: not allowed with argument --host" in _error(
        parser, ["--host", "h", "--workers", "2"], capsys
    )


def test_bad_values_as_usage_errors_when_built() -> None:
    flags = Flags(Knobs, bad_value=BadValue.USAGE_ERROR)
    parser = _parser(flags)
    for argv, message in [
        (["--count", "x"], "--count: expected an integer, got 'x'"),
        (["--ratio", "half"], "--ratio: expected a number, got 'half'"),
        (["--pair", "1:x"], "--pair: expected RANK:MS, got '1:x'"),
        (["--color", "green"], "--color: one of red, blue, got 'green'"),
    ]:
        args = parser.parse_args(argv)  # argparse takes the text as it is
        with pytest.raises(UsageError) as exc:
            flags.build(args)
        assert str(exc.value) == message
    assert flags.build(parser.parse_args(["--pair", "2:3"])).pairs == [(2, 3.0)]


def test_a_field_without_a_way_to_parse_it_is_refused() -> None:
    @dataclasses.dataclass
    class Odd:
        on: bool = True
        """a switch cannot turn this off"""

    with pytest.raises(TypeError, match="a switch only turns a False field on"):
        Flags(Odd).add(argparse.ArgumentParser())
    Flags(Odd, toggles=True).add(argparse.ArgumentParser())  # --on/--no-on can

    @dataclasses.dataclass
    class Pairs:
        pairs: list[tuple[int, int]] = dataclasses.field(default_factory=list)
        """(a, b): no parser says how"""

    with pytest.raises(TypeError, match="no parser"):
        Flags(Pairs).add(argparse.ArgumentParser())


def test_the_commands_flags_come_from_their_dataclasses() -> None:
    """Every flag of the four configurations is the generator's: one action per field, under the
    field's name, with the help the generator gives; and every field has a docstring."""
    from rankscope.analysis.engine.cluster_flags import CLUSTER_FLAGS
    from rankscope.analysis.engine.scheduler import ClusterSpec
    from rankscope.launchers.slurm.options import SLURM_FLAGS, SlurmOptions
    from rankscope.launchers.spec import ProfilerSettings
    from rankscope.orchestrator import run as run_cmd
    from rankscope.orchestrator.cli import build_parser
    from rankscope.orchestrator.synth.cli import SYNTH_FLAGS
    from rankscope.orchestrator.synth.config import SynthConfig

    for cls in (SlurmOptions, SynthConfig, ProfilerSettings, ClusterSpec):
        docs = field_docs(cls)
        assert [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)] == [], cls

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert isinstance(sub, dict)
    run_actions = {a.dest: a for a in run_cmd.build_parser()._actions}
    for flags, actions in [
        (run_cmd.profiler_flags(), run_actions),
        (SLURM_FLAGS, run_actions),
        (SYNTH_FLAGS, {a.dest: a for a in sub["synth"]._actions}),
        (CLUSTER_FLAGS, {a.dest: a for a in sub["merge"]._actions}),
        (CLUSTER_FLAGS, {a.dest: a for a in sub["analyze"]._actions}),
    ]:
        for ff in flags.fields:
            action = actions[ff.field]
            assert action.option_strings[0] == ff.flag and action.help == flags.help(ff), ff
    assert len(SYNTH_FLAGS.fields) == len(dataclasses.fields(SynthConfig))
    assert [f.field for f in CLUSTER_FLAGS.fields] == [
        "scheduler",
        "slurm_workers",
        "slurm_partition",
    ]


def test_the_generator_imports_no_argparse_until_flags_are_made() -> None:
    """The configuration dataclasses import it in every rank: standard library only, and no
    argparse until a command adds its flags."""
    code = (
        "import sys, rankscope.launchers.spec\n"
        "heavy = {'argparse', 'numpy', 'pandas', 'torch'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
