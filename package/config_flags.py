"""One way from a configuration dataclass to command-line flags and back, for every command.

The project's rule: configuration is dataclasses with a docstring per field, and their flags are
generated from the fields by one mechanism — this module. A field says how it is spelled with
:func:`flag` metadata (flag name, metavar, parser, choices, help, a mutually exclusive group) and
everything it leaves out is derived from the field: the flag is ``--`` and the field's name with
dashes; the parser comes from the annotation (``int``, ``float``, ``str``, ``Path``, an enum; a
``list`` or ``tuple`` of one makes a repeatable flag; ``bool`` a switch or a ``--x/--no-x``
toggle); the help is the field's docstring (:func:`field_docs`, the one reader of field
docstrings, once per class). :class:`Flags` adds a dataclass's flags to a parser or an argument
group (:meth:`Flags.add`) and gives back the values given on the command line, typed
(:meth:`Flags.given`, :meth:`Flags.build`); the dataclass supplies the defaults of the others
(every flag's argparse default is None: "not given"). ``rankscope run``'s profiler and Slurm
flags, ``rankscope synth``'s and the ``--scheduler`` flags of ``merge`` and ``analyze`` all come
from here.

A bad value is reported on one line, in one of two wordings (:class:`BadValue`): argparse's
(``argument --x: …``, while parsing) or a :class:`~rankscope.errors.UsageError` ``--x: …`` when
the dataclass is built (``rankscope synth``'s, which its validation shares).

Import-light: only the standard library (no argparse until flags are added or read), so the
configuration dataclasses, which every rank imports, and ``rankscope --help`` pay nothing for it.
No units: values pass through in the units their fields define.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import re
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from rankscope.errors import UsageError

if TYPE_CHECKING:
    import argparse

T = TypeVar("T")
#: Text of one flag value to the field's value (one item of a repeatable flag).
Parser = Callable[[str], Any]

#: The key of a field's :class:`Flag` in its ``dataclasses.field(metadata=...)``.
FLAG_KEY = "rankscope.flag"
#: Parsers whose failures argparse words itself (``invalid int value: 'x'``).
_NATIVE: tuple[Parser, ...] = (int, float, str, Path)
#: A repeatable flag's docstring may start with a gloss of its items, ``(rank, ms): …``; the
#: metavar says that on the command line, so the help leaves it out.
_ITEM_GLOSS = re.compile(r"^\([^)]*\):\s*")


@dataclasses.dataclass(frozen=True)
class Flag:
    """How one dataclass field is spelled on the command line; what is None is derived."""

    name: str | None = None
    """The flag (``--sbatch-arg``); None: ``--`` and the field's name with dashes."""
    metavar: str | None = None
    """The value's name in the help; None: an enum's values joined by ``|``, ``INT`` or ``FLOAT``
    for a number, else argparse's (the field's name in capitals)."""
    parse: Parser | None = None
    """Text to value (of one item, for a repeatable flag); None: from the annotation. A
    ``ValueError`` reads ``expected METAVAR, got 'TEXT'``; an ``argparse.ArgumentTypeError``
    says its own message."""
    choices: tuple[Any, ...] | None = None
    """The only values accepted (argparse's check and message: against the parsed value, or the
    text with :attr:`BadValue.USAGE_ERROR`)."""
    help: str | None = None
    """The help, literal text; None: the field's docstring."""
    exclusive: str | None = None
    """Name of a mutually exclusive group: a dataclass's flags naming the same one exclude each
    other."""
    repeatable: bool | None = None
    """Given once per item and collected (``action="append"``); None: when the field is a
    ``list`` or ``tuple`` (a tuple field with its own ``parse`` of the whole text says False)."""


def flag(
    *,
    name: str | None = None,
    metavar: str | None = None,
    parse: Parser | None = None,
    choices: tuple[Any, ...] | None = None,
    help: str | None = None,
    exclusive: str | None = None,
    repeatable: bool | None = None,
) -> dict[str, Any]:
    """A field's metadata: ``dataclasses.field(default=1, metadata=flag(metavar="N"))`` (merge
    it into a larger dict to add keys of one's own)."""
    spec = Flag(name, metavar, parse, choices, help, exclusive, repeatable)
    return {FLAG_KEY: spec}


#: Metadata of a field that has no flag (set by code, never from the command line).
NO_FLAG: Mapping[str, Any] = types.MappingProxyType({FLAG_KEY: None})


class FlagKind(enum.Enum):
    """How a flag takes its value."""

    VALUE = "value"
    """``--x VALUE``"""
    REPEATED = "repeated"
    """``--x VALUE``, once per item of a list or tuple"""
    SWITCH = "switch"
    """``--x`` turns the field on (a bool field whose default is False)"""
    TOGGLE = "toggle"
    """``--x`` / ``--no-x`` (a bool field, with :attr:`Flags.toggles`)"""


class BadValue(enum.Enum):
    """Where and how a value that does not parse is reported (one line either way)."""

    ARGPARSE = "argparse"
    """while parsing, argparse's own ``argument --x: …`` (the parser's ``error``)"""
    USAGE_ERROR = "usage_error"
    """when the dataclass is built, ``UsageError("--x: …")``"""


@dataclasses.dataclass(frozen=True)
class FieldFlag:
    """One field's flag with everything derived (:attr:`Flags.fields`)."""

    field: str
    """The field's name; also the parsed arguments' attribute (argparse's ``dest``)."""
    flag: str
    """The flag, ``--name``."""
    kind: FlagKind
    """How it takes its value."""
    parse: Parser | None
    """Text to value (of one item when repeated); None: the text itself, or a switch's bool."""
    metavar: str | None
    """The value's name in the help (None: argparse's)."""
    choices: tuple[Any, ...] | None
    """The only values accepted, or None."""
    help: str | None
    """The help given in the metadata; None: the field's docstring."""
    exclusive: str | None
    """Mutually exclusive group, or None."""
    default: Any
    """The field's default (None when it has none), for the help's note."""
    container: type | None
    """``list`` or ``tuple``: what a repeated flag's items are collected in."""


@dataclasses.dataclass(frozen=True)
class Flags(Generic[T]):
    """The flags of one dataclass as one command spells them: :meth:`add` them to a parser, read
    them back with :meth:`given` or :meth:`build`."""

    cls: type[T]
    """The dataclass; every field has a flag unless its metadata is :data:`NO_FLAG`."""
    toggles: bool = False
    """bool fields are ``--x/--no-x`` toggles; otherwise switches that turn a False field on."""
    default_note: str | None = None
    """How the help shows a field's default, e.g. ``" (default {})"`` (bools as on/off, enums by
    value, tuples comma-joined; nothing for a switch, a None default or a repeatable flag), so no
    help copies a default; None: the help says nothing of it."""
    repeat_note: str | None = None
    """What the help of a repeatable flag ends with, e.g. ``" (repeatable)"``; None: nothing."""
    bad_value: BadValue = BadValue.ARGPARSE
    """How a value that does not parse is reported."""

    @functools.cached_property
    def fields(self) -> tuple[FieldFlag, ...]:
        """Each flagged field's :class:`FieldFlag`, in field order."""
        cls: type = self.cls
        hints = _type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            spec = f.metadata.get(FLAG_KEY, Flag())
            if spec is not None:
                out.append(self._resolve(f, spec, hints.get(f.name)))
        return tuple(out)

    def add(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        """Add one flag per field to ``parser`` (a parser or an argument group), exclusive
        groups as the fields name them."""
        import argparse

        groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
        for ff in self.fields:
            target: argparse._ActionsContainer = parser
            if ff.exclusive is not None:
                if ff.exclusive not in groups:
                    groups[ff.exclusive] = parser.add_mutually_exclusive_group()
                target = groups[ff.exclusive]
            kwargs: dict[str, Any] = {"dest": ff.field, "default": None, "help": self.help(ff)}
            if ff.kind is FlagKind.SWITCH:
                kwargs["action"] = "store_true"
            elif ff.kind is FlagKind.TOGGLE:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["metavar"] = ff.metavar
                if ff.kind is FlagKind.REPEATED:
                    kwargs["action"] = "append"
                if ff.choices is not None:
                    kwargs["choices"] = ff.choices
                if ff.parse is not None and self.bad_value is BadValue.ARGPARSE:
                    kwargs["type"] = _argparse_type(ff)
            target.add_argument(ff.flag, **kwargs)

    def help(self, ff: FieldFlag) -> str:
        """The help of ``ff``'s flag: its own or the field's docstring, and the default's note."""
        text = ff.help
        if text is None:
            cls: type = self.cls
            text = field_docs(cls).get(ff.field, "")
            if ff.kind is FlagKind.REPEATED:
                text = _ITEM_GLOSS.sub("", text, count=1)
        if ff.kind is FlagKind.REPEATED:
            text += self.repeat_note or ""
        elif (
            self.default_note is not None
            and ff.default is not None
            and ff.kind is not FlagKind.SWITCH
        ):
            text += self.default_note.format(shown(ff.default))
        return text.replace("%", "%%")  # literal text, not an argparse format

    def given(self, args: argparse.Namespace) -> dict[str, Any]:
        """The fields given on the command line, typed: ``{field: value}`` (those not given are
        left out, for the dataclass's defaults or the caller's to fill)."""
        values: dict[str, Any] = {}
        for ff in self.fields:
            raw = getattr(args, ff.field, None)
            if raw is None:
                continue
            if self.bad_value is BadValue.USAGE_ERROR and ff.parse is not None:
                if ff.kind is FlagKind.REPEATED:
                    raw = [_convert(ff, item) for item in raw]
                else:
                    raw = _convert(ff, raw)
            if ff.kind is FlagKind.REPEATED and ff.container is tuple:
                raw = tuple(raw)
            values[ff.field] = raw
        return values

    def build(self, args: argparse.Namespace, **extra: Any) -> T:
        """The dataclass of the parsed ``args`` (and ``extra`` fields); its own checks raise."""
        return self.cls(**self.given(args), **extra)

    def _resolve(self, f: dataclasses.Field[Any], spec: Flag, hint: Any) -> FieldFlag:
        """``f``'s :class:`FieldFlag` from its metadata, annotation and default."""
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        if hint is None:  # annotations that did not resolve: the default's type stands in
            hint = str if default is None else type(default)
        kind_of = _optional_base(hint)
        container = typing.get_origin(kind_of)
        repeated = spec.repeatable
        if repeated is None:
            repeated = container in (list, tuple)
        item = kind_of
        if repeated:
            args = typing.get_args(kind_of)
            item = args[0] if args else str
        where = f"{self.cls.__name__}.{f.name}"
        parse = spec.parse
        if kind_of is bool:
            kind = FlagKind.TOGGLE if self.toggles else FlagKind.SWITCH
            if kind is FlagKind.SWITCH and default is not False:
                raise TypeError(f"{where}: a switch only turns a False field on")
        else:
            kind = FlagKind.REPEATED if repeated else FlagKind.VALUE
            if parse is None:
                parse = _parser_of(item, where)
        metavar = spec.metavar
        if metavar is None and isinstance(item, type) and issubclass(item, enum.Enum):
            metavar = "|".join(str(m.value) for m in item)
        elif metavar is None and parse in (int, float):
            metavar = getattr(parse, "__name__", "").upper()
        return FieldFlag(
            field=f.name,
            flag=spec.name or "--" + f.name.replace("_", "-"),
            kind=kind,
            parse=parse,
            metavar=metavar,
            choices=spec.choices,
            help=spec.help,
            exclusive=spec.exclusive,
            default=default,
            container=container if repeated else None,
        )


def flag_of(cls: type, name: str) -> str:
    """The command-line flag of field ``name`` of dataclass ``cls`` (for messages)."""
    spec = next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get(FLAG_KEY)
    return spec.name if spec is not None and spec.name else "--" + name.replace("_", "-")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right after its annotated line in the class
    body), whitespace collapsed, for ``cls`` and its bases (its own win). Read once per class
    from its module's syntax tree (:func:`_class_bodies`); a class whose source cannot be read
    gives none."""
    import ast

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):  # object last: no source
        body = _class_bodies(klass.__module__).get(klass.__qualname__, [])
        for node, nxt in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


@functools.cache
def _class_bodies(module: str) -> dict[str, list[Any]]:
    """Qualified class name → its body's statements (``ast`` nodes), for every class of
    ``module``, from one parse of the module's source: ``inspect.getsource`` per class parsed the
    whole module, tokenized it and parsed the class again (~20 ms a class, paid by every command
    that builds its flags' help). ``{}`` when the source cannot be read."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        origin = spec.origin if spec is not None else None
        if origin is None or not origin.endswith(".py"):
            return {}
        tree = ast.parse(Path(origin).read_bytes())
    except (OSError, ImportError, ValueError, SyntaxError):
        return {}
    out: dict[str, list[Any]] = {}

    def visit(nodes: list[ast.stmt], prefix: str) -> None:
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                name = prefix + node.name
                out.setdefault(name, node.body)
                visit(node.body, name + ".")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(node.body, f"{prefix}{node.name}.<locals>.")

    visit(tree.body, "")
    return out


def shown(value: Any) -> str:
    """A default as the help writes it: on/off, an enum's value, a tuple comma-joined."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return str(value)


# ------------------------------------------------------------------------------------ parsers
def positive_int(text: str) -> int:
    """A whole number >= 1 (``must be a whole number >= 1, not 'TEXT'`` otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        import argparse

        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return value


def colon_tuple(*kinds: Parser, defaults: tuple[Any, ...] = ()) -> Parser:
    """A parser of ``A:B[:C]``: one part per kind, the last ``len(defaults)`` optional (their
    defaults fill in); ``ValueError`` on any other text (worded from the flag's metavar)."""
    least = len(kinds) - len(defaults)

    def parse(text: str) -> tuple[Any, ...]:
        parts = text.split(":")
        if not least <= len(parts) <= len(kinds):
            raise ValueError(text)
        values = [kind(part) for kind, part in zip(kinds, parts, strict=False)]
        return (*values, *defaults[len(parts) - least :])

    return parse


def _enum_parser(kind: type[enum.Enum]) -> Parser:
    """A parser of ``kind``'s values, any case (``one of A, B, got 'TEXT'`` otherwise)."""

    def parse(text: str) -> enum.Enum:
        for member in kind:
            if str(member.value).lower() == text.lower():
                return member
        import argparse

        names = ", ".join(str(m.value) for m in kind)
        raise argparse.ArgumentTypeError(f"one of {names}, got {text!r}")

    parse.__name__ = kind.__name__
    return parse


def _parser_of(kind: Any, where: str) -> Parser | None:
    """The parser of a value annotated ``kind`` (None: the text itself)."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _enum_parser(kind)
    if kind in (int, float, Path):
        return typing.cast(Parser, kind)
    if kind is str:
        return None
    raise TypeError(f"{where}: no parser for {kind!r}; give flag(parse=...)")


def _argparse_type(ff: FieldFlag) -> Parser:
    """``ff.parse`` as argparse's ``type``: a ValueError of one of ours becomes its one line."""
    import argparse

    parse = ff.parse
    assert parse is not None
    if parse in _NATIVE:
        return parse

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {ff.metavar}, got {text!r}") from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _convert(ff: FieldFlag, text: Any) -> Any:
    """One value parsed when the dataclass is built (:attr:`BadValue.USAGE_ERROR`)."""
    import argparse

    assert ff.parse is not None
    if not isinstance(text, str):
        return text
    try:
        return ff.parse(text)
    except argparse.ArgumentTypeError as exc:
        reason = str(exc)
    except ValueError:
        if ff.parse is int:
            reason = f"expected an integer, got {text!r}"
        elif ff.parse is float:
            reason = f"expected a number, got {text!r}"
        else:
            reason = f"expected {ff.metavar}, got {text!r}"
    raise UsageError(f"{ff.flag}: {reason}")


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """``cls``'s field annotations, evaluated; {} when a name in them cannot be resolved (a class
    defined in a function: the defaults' types stand in)."""
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):
        return {}


def _optional_base(kind: Any) -> Any:
    """``X`` of ``X | None``; anything else as it is."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return kind
