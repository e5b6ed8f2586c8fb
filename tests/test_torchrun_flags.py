"""torchrun's parser read from torch's source (``rankscope.launchers.torchrun_flags``) judges
command lines exactly as torch's own ``get_args_parser()`` does, and ``rankscope run`` checks its
flags without importing torch.

The reference is torch's real parser, imported here (once per module): a torch release that
changes its flags in a way the reading gets wrong fails these tests, not a user's run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from rankscope.launchers import torchrun_flags

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"

#: Command lines of torchrun's flags (the script placeholder is added by :func:`judge`): good
#: ones, typos, missing and ill-typed values, abbreviations, switches given values.
CORPUS: list[list[str]] = [
    [],
    ["--nproc-per-node", "4"],
    ["--nproc_per_node=2", "--nnodes", "1:2"],
    ["--nnodes=2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29400"],
    ["--standalone", "--max-restarts", "3", "--monitor-interval", "0.5"],
    ["--rdzv-backend", "c10d", "--rdzv-endpoint", "host:1234", "--rdzv-id", "abc"],
    ["--max-restarts", "x"],
    ["--monitor-interval", "fast"],
    ["--master-port", "29_500"],
    ["--node-rank"],
    ["--nproc-per-node"],
    ["--bogus", "1"],
    ["--nproc", "2"],
    ["--nn", "2"],
    ["--standalone=1"],
    ["--redirects", "3", "--tee", "1:3", "--local-ranks-filter", "0,1"],
    ["--log-dir", "/tmp/x", "--role", "trainer", "--start-method", "fork"],
    ["-r", "3", "-t", "2", "-m"],
    ["--no-python", "--run-path"],
    ["--virtual-local-rank", "--shutdown-timeout", "5"],
    ["--shutdown-timeout", "soon"],
    ["--signals-to-handle", "SIGTERM,SIGUSR1"],
    ["--logs-specs", "mine"],
    ["--rdzv_conf", "timeout=900", "--event-log-handler", "console"],
]


@pytest.fixture(scope="module")
def torchs_parser() -> argparse.ArgumentParser:
    from torch.distributed.run import get_args_parser

    return get_args_parser()


@pytest.fixture(scope="module")
def source() -> str:
    path = torchrun_flags.run_module_path()
    assert path is not None and path.is_file(), path
    return path.read_text(encoding="utf-8")


class _Refused(Exception):
    pass


def judge(parser: argparse.ArgumentParser, tokens: list[str]) -> tuple[str, Any]:
    """("ok", the namespace as a dict) or ("error", argparse's message)."""

    def fail(message: str) -> None:
        raise _Refused(message)

    parser.error = fail  # type: ignore[method-assign,assignment]
    try:
        return "ok", vars(parser.parse_args([*tokens, "train.py", "--lr", "1"]))
    except _Refused as exc:
        return "error", str(exc)


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest != "help"}


def test_the_installed_torchs_parser_is_read_without_falling_back(source: str) -> None:
    flags = torchrun_flags.read_flags(source)
    assert {"--nnodes", "--nproc-per-node", "--standalone"} <= {n for f in flags for n in f.names}
    assert torchrun_flags.fast_parser(["--nproc-per-node", "2"]) is not None


def test_every_flag_is_read_as_torch_defines_it(
    torchs_parser: argparse.ArgumentParser, source: str
) -> None:
    ours = torchrun_flags.build_parser(torchrun_flags.read_flags(source))
    assert set(ours._option_string_actions) == set(torchs_parser._option_string_actions)
    exact = {name for f in torchrun_flags.read_flags(source) if f.exact for name in f.names} | {
        "training_script",
        "training_script_args",
    }
    theirs = _actions(torchs_parser)
    mine = _actions(ours)
    assert set(mine) == set(theirs)
    for dest, a in theirs.items():
        b = mine[dest]
        assert (b.option_strings, b.nargs, b.required) == (a.option_strings, a.nargs, a.required)
        if set(a.option_strings) & exact or dest in exact:
            assert (b.default, b.choices, b.const) == (a.default, a.choices, a.const), dest
            assert getattr(b.type, "__name__", None) == getattr(a.type, "__name__", None), dest


@pytest.mark.parametrize("env", [{}, {"PET_NPROC_PER_NODE": "3", "PET_STANDALONE": "1"}])
def test_both_parsers_judge_every_command_line_alike(
    source: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with torchrun's ``PET_*`` environment defaults set (read when a parser is built)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from torch.distributed.run import get_args_parser

    for tokens in CORPUS:
        fast = torchrun_flags.fast_parser(tokens, source)
        if fast is None:  # an inexact flag in the line: torch's parser is used, nothing to compare
            continue
        assert judge(fast, tokens) == judge(get_args_parser(), tokens), tokens
    verdicts = {judge(get_args_parser(), t)[0] for t in CORPUS}
    assert verdicts == {"ok", "error"}  # the corpus holds both kinds


def _source(body: str) -> str:
    return "from argparse import ArgumentParser\n" + textwrap.dedent(body)


def test_a_parser_built_in_a_way_not_modelled_is_refused() -> None:
    """Anything else done to the parser (an argument group, set_defaults, a computed option
    string or keyword) refuses the whole reading: torch's own parser is used."""
    good = """
    def get_args_parser():
        parser = ArgumentParser(description="x")
        parser.add_argument("--nnodes", type=str, default="1:1")
        parser.add_argument("--nproc-per-node", type=str, default="1")
        parser.add_argument("training_script", type=str)
        return parser
    """
    assert torchrun_flags.fast_parser([], _source(good)) is not None
    for bad in (
        good.replace("return parser", "parser.set_defaults(nnodes='2')\n        return parser"),
        good.replace('"--nnodes"', "'--' + 'nnodes'"),
        good.replace('default="1:1"', 'default="1:1", nargs=N'),
        good.replace('type=str, default="1"', 'type=str, default="1", deprecated=True'),
        good.replace("parser = ArgumentParser(", "parser = ArgumentParser(allow_abbrev=False, "),
        good.replace("def get_args_parser", "def other_parser"),
        "def get_args_parser(:\n",
    ):
        assert torchrun_flags.fast_parser([], _source(bad)) is None, bad


def test_an_inexact_flag_sends_only_its_command_lines_to_torchs_parser() -> None:
    """A computed ``choices`` (torch builds ``--numa-binding``'s from an enum) or a type that is
    torch's own function is judged by torch's parser, only where the line uses it (by its full
    name or an abbreviation); ``--nnodes``/``--nproc-per-node``, which rankscope reads, must
    always be exact."""
    text = _source(
        """
    def get_args_parser():
        parser = ArgumentParser()
        parser.add_argument("--nnodes", type=str, default="1:1")
        parser.add_argument("--nproc-per-node", type=str, default="1")
        parser.add_argument("--numa-binding", type=str, choices=[m.value for m in Mode])
        parser.add_argument("--filters", type=comma_separated_list, default=[])
        return parser
    """
    )
    assert torchrun_flags.fast_parser(["--nnodes", "1"], text) is not None
    for tokens in (["--numa-binding", "node"], ["--numa", "node"], ["--filters=a,b"]):
        assert torchrun_flags.fast_parser(tokens, text) is None, tokens
    computed = text.replace('type=str, default="1"', "type=str, default=default_nproc()")
    assert torchrun_flags.fast_parser([], computed) is None


def test_rankscope_run_checks_torchruns_flags_without_importing_torch(tmp_path: Path) -> None:
    """The whole validation of ``rankscope run``'s command line (ours and torchrun's flags) in a
    fresh interpreter: torch stays unimported, and a typo is still named with its closest flag."""
    code = f"""
    import sys
    from rankscope.errors import UsageError
    from rankscope.orchestrator.run import build_parser, build_spec

    spec, _ = build_spec(
        ["--out", {str(tmp_path)!r}, "--nproc-per-node", "3", "--max-restarts", "0",
         {str(EXAMPLE)!r}, "--steps", "2"],
        build_parser(),
    )
    assert (spec.nproc_per_node, spec.nnodes) == (3, 1), spec
    try:
        build_spec(["--out", {str(tmp_path)!r}, "--nproc-per-nod", "2", "--max-restart", "x",
                    {str(EXAMPLE)!r}], build_parser())
    except UsageError as exc:
        print("ERROR=" + str(exc))
    print("TORCH=" + str("torch" in sys.modules))
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    lines = dict(ln.split("=", 1) for ln in res.stdout.splitlines() if "=" in ln)
    assert lines["TORCH"] == "False"
    assert "invalid int value: 'x'" in lines["ERROR"], lines["ERROR"]
