"""torchrun's own flags, read from torch's installed source without importing torch.

``rankscope run`` checks every flag that goes to torchrun before it starts anything, so a typo
fails in a second with the closest flag named, not after the job's rendezvous. torchrun's parser
(``torch.distributed.run.get_args_parser``) is the authority, but importing it imports all of
torch: 3.3 s on an idle 2-core machine and 14 s on a loaded one, in a process that never runs a
tensor (the ranks import torch themselves). So the parser is rebuilt here from the syntax tree of
that function — nothing of torch's is executed (``tests/test_security.py`` forbids exec in
rankscope's own code) — and torch's own parser is used only when the tree holds something this
reading does not model exactly:

* every ``parser.add_argument(...)`` call must have constant option strings and keywords this
  module knows (``action``, ``type``, ``default``, ``choices``, ``nargs``, ``dest``,
  ``required``, ``const``, ``help``, ``metavar``); any other call on the parser (an argument
  group, ``set_defaults``) makes the whole reading refused;
* an argument whose ``type`` is not ``str``/``int``/``float``, or whose ``choices``/``default``
  is not a constant (torch builds ``--numa-binding``'s choices from an enum), is read but marked
  inexact: when the user passes it, torch's own parser judges the command line.

The rebuilt actions behave as torch's ``env``/``check_env`` (``torch/distributed/argparse_util``):
a value flag's default comes from ``PET_<DEST>`` when set, a switch is true when ``PET_<DEST>``
is a non-zero integer. ``tests/test_torchrun_flags.py`` compares the two parsers flag by flag and
on a corpus of good and bad command lines, so a torch release that changes the parser is caught.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: torchrun's module, relative to the installed ``torch`` package folder.
RUN_MODULE = Path("distributed") / "run.py"
#: The function in it that builds torchrun's argument parser.
PARSER_FUNCTION = "get_args_parser"
#: Prefix of the environment variables torchrun's ``env``/``check_env`` actions read defaults from.
ENV_PREFIX = "PET_"
#: ``type=`` names whose conversion is Python's own (anything else is torch's code: inexact).
KNOWN_TYPES: dict[str, type] = {"str": str, "int": int, "float": float}
#: Keywords of ``add_argument`` this reading models.
KNOWN_KEYWORDS = frozenset(
    {
        "action",
        "type",
        "default",
        "choices",
        "nargs",
        "dest",
        "required",
        "const",
        "help",
        "metavar",
    }
)
#: torch's custom actions, by name (``torch/distributed/argparse_util.py``).
ENV_ACTION = "env"
CHECK_ENV_ACTION = "check_env"


class UnreadableParser(Exception):
    """The parser function holds something this reading does not model (the reason)."""


@dataclass(frozen=True)
class FlagSpec:
    """One ``add_argument`` call of torchrun's parser, as read from the source."""

    names: tuple[str, ...]
    """Option strings (``--nproc-per-node``, ``--nproc_per_node``) or one positional name."""
    action: str | None = None
    """``env``, ``check_env``, an argparse action name (``store_true``), or None (store)."""
    type_name: str | None = None
    """The ``type=`` callable's name (None: no conversion)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constant keywords (``default``, ``choices``, ``nargs``, ``dest``, ``required``, ``const``)."""
    exact: bool = True
    """False when a part could not be read as a constant (a computed ``choices`` or
    ``default``) or ``type`` is torch's own function: torch's parser judges a command line that
    uses this flag."""


def run_module_path() -> Path | None:
    """Where torch's ``distributed/run.py`` is installed, found without importing torch (a
    top-level ``find_spec`` locates the package only); None when torch is not installed."""
    try:
        found = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if found is None or found.origin is None:
        return None
    return Path(found.origin).parent / RUN_MODULE


def _constant(node: ast.expr) -> tuple[bool, Any]:
    """(True, value) for a literal expression, (True, REMAINDER) for argparse's ``REMAINDER``
    name, (False, None) for anything computed."""
    if isinstance(node, ast.Name) and node.id == "REMAINDER":
        return True, argparse.REMAINDER
    if isinstance(node, ast.Attribute) and node.attr == "REMAINDER":
        return True, argparse.REMAINDER
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _flag(call: ast.Call) -> FlagSpec:
    names: list[str] = []
    for arg in call.args:
        ok, value = _constant(arg)
        if not ok or not isinstance(value, str):
            raise UnreadableParser("an option string is not a constant")
        names.append(value)
    if not names:
        raise UnreadableParser("add_argument without option strings")
    action: str | None = None
    type_name: str | None = None
    kwargs: dict[str, Any] = {}
    exact = True
    for kw in call.keywords:
        if kw.arg is None or kw.arg not in KNOWN_KEYWORDS:
            raise UnreadableParser(f"add_argument keyword {kw.arg or '**'} is not modelled")
        if kw.arg in ("help", "metavar"):
            continue  # neither changes what is accepted nor the errors' words
        if kw.arg == "action":
            if isinstance(kw.value, ast.Name) and kw.value.id in (ENV_ACTION, CHECK_ENV_ACTION):
                action = kw.value.id
                continue
            ok, value = _constant(kw.value)
            if not ok or not isinstance(value, str):
                raise UnreadableParser("an action that is neither a name of argparse's nor env")
            action = value
            continue
        if kw.arg == "type":
            if not isinstance(kw.value, ast.Name):
                raise UnreadableParser("a type that is not a plain name")
            type_name = kw.value.id
            exact = exact and type_name in KNOWN_TYPES
            continue
        ok, value = _constant(kw.value)
        if not ok:
            if kw.arg not in ("default", "choices"):
                raise UnreadableParser(f"add_argument keyword {kw.arg} is computed")
            exact = False
            continue
        kwargs[kw.arg] = value
    return FlagSpec(tuple(names), action, type_name, kwargs, exact)


def read_flags(source: str) -> list[FlagSpec]:
    """Every ``add_argument`` of :data:`PARSER_FUNCTION` in ``source`` (torchrun's module text),
    in order. :class:`UnreadableParser` when the function is missing or does anything else to its
    parser (module docstring)."""
    tree = ast.parse(source)
    func = next(
        (
            n
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == PARSER_FUNCTION
        ),
        None,
    )
    if func is None:
        raise UnreadableParser(f"no {PARSER_FUNCTION}()")
    parser_name: str | None = None
    for stmt in func.body:
        if (
            isinstance(stmt, ast.Assign)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name)
            and stmt.value.func.id == "ArgumentParser"
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            if stmt.value.args or any(k.arg != "description" for k in stmt.value.keywords):
                raise UnreadableParser("ArgumentParser() is built with options")
            parser_name = stmt.targets[0].id
            break
    if parser_name is None:
        raise UnreadableParser("no `parser = ArgumentParser(...)`")
    stores = [
        n
        for n in ast.walk(func)
        if isinstance(n, ast.Name) and n.id == parser_name and isinstance(n.ctx, ast.Store)
    ]
    if len(stores) != 1:
        raise UnreadableParser("the parser is assigned more than once")
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "add_argument"
            and not (isinstance(node.value, ast.Name) and node.value.id == parser_name)
        ):
            raise UnreadableParser("add_argument on something other than the parser")
        if not (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == parser_name
        ):
            continue
        if node.attr != "add_argument":
            raise UnreadableParser(f"parser.{node.attr} is not modelled")
    calls = [
        n
        for n in ast.walk(func)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "add_argument"
    ]
    calls.sort(key=lambda c: (c.lineno, c.col_offset))  # argparse cares for positionals' order
    return [_flag(c) for c in calls]


class _Env(argparse.Action):
    """torch's ``env`` action: the default comes from ``PET_<DEST>`` when that is set."""

    def __init__(
        self, dest: str, default: Any = None, required: bool = False, **kwargs: Any
    ) -> None:
        default = os.environ.get(f"{ENV_PREFIX}{dest.upper()}", default)
        if default:
            required = False
        super().__init__(dest=dest, default=default, required=required, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)


class _CheckEnv(argparse.Action):
    """torch's ``check_env`` action: a switch, true by default when ``PET_<DEST>`` is a
    non-zero integer."""

    def __init__(self, dest: str, default: bool = False, **kwargs: Any) -> None:
        default = bool(int(os.environ.get(f"{ENV_PREFIX}{dest.upper()}", "1" if default else "0")))
        super().__init__(dest=dest, const=True, default=default, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, self.const)


def build_parser(flags: Sequence[FlagSpec]) -> argparse.ArgumentParser:
    """An argument parser that accepts and rejects what torchrun's does, for ``flags``."""
    parser = argparse.ArgumentParser(prog="torchrun")
    for f in flags:
        kwargs: dict[str, Any] = dict(f.kwargs)
        if f.action == ENV_ACTION:
            kwargs["action"] = _Env
        elif f.action == CHECK_ENV_ACTION:
            kwargs["action"] = _CheckEnv
        elif f.action is not None:
            kwargs["action"] = f.action
        if f.type_name is not None:
            kwargs["type"] = KNOWN_TYPES.get(f.type_name, str)
        parser.add_argument(*f.names, **kwargs)
    return parser


def fast_parser(tokens: Sequence[str], source: str | None = None) -> argparse.ArgumentParser | None:
    """torchrun's parser rebuilt from ``source`` (default: the installed torch's
    :data:`RUN_MODULE`), when it judges ``tokens`` exactly as torch's would: None when torch or
    its source is missing, the source holds something not modelled, a flag in ``tokens`` is
    inexact (:attr:`FlagSpec.exact`), or the ``nnodes``/``nproc_per_node`` flags rankscope reads
    are. Then the caller imports torch's own parser."""
    if source is None:
        path = run_module_path()
        if path is None:
            return None
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
    try:
        flags = read_flags(source)
    except (UnreadableParser, SyntaxError, ValueError):
        return None
    used = {t.partition("=")[0] for t in tokens if t.startswith("-")}
    for f in flags:
        needed = {"--nnodes", "--nproc-per-node"} & set(f.names)
        if not f.exact and (needed or any(_abbreviates(u, f.names) for u in used)):
            return None
    try:
        return build_parser(flags)
    except (argparse.ArgumentError, TypeError, ValueError):
        return None


def _abbreviates(token: str, names: Sequence[str]) -> bool:
    """Whether the flag ``token`` names one of ``names``, in full or as argparse's unique prefix
    (argparse accepts ``--nproc`` for ``--nproc-per-node``: counting every prefix is safe)."""
    return token.startswith("--") and any(n.startswith(token) for n in names)
