"""torchrun's own argument parser, built without importing torch.

``rankscope run`` checks torchrun's flags with torchrun's parser
(``torch.distributed.run.get_args_parser``) so that a mistyped flag fails before anything
starts, in torchrun's words. Importing that module imports all of torch: 3.3 s of a
``rankscope run`` on an idle 2-core machine, 14 s under load — before the job even starts, and
torchrun imports torch again anyway. The parser itself needs nothing of torch: it is plain
``argparse`` with two small ``Action`` classes (``torch/distributed/argparse_util.py``) and the
values of one enum (``torch.numa.binding.AffinityMode``).

So :func:`torchrun_parser` compiles that one function from the installed torch's own source
(found with ``importlib.util.find_spec``, which does not import the package), with each name it
uses taken from the module that defines it: standard-library imports as written, torch's names
by compiling their definition the same way. It is the installed torch's parser, not a copy that
could drift from it. Anything unexpected (a name defined otherwise, a source that moved, a
syntax this interpreter cannot compile) falls back to importing torch: slower, never wrong.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib.util
from pathlib import Path
from typing import Any

#: The module and function of torchrun's parser.
RUN_MODULE = "torch.distributed.run"
PARSER_FUNCTION = "get_args_parser"
#: The top-level package whose modules are never imported here (their definitions are
#: compiled from source instead).
HEAVY_PACKAGE = "torch"
#: How many definitions deep one name may pull others (a guard: the parser needs 2 levels).
MAX_DEPTH = 4


class _NotLiftable(Exception):
    """The source does not have the expected shape: import torch instead."""


def _source_path(module: str) -> Path:
    """The ``.py`` file of ``module`` (a torch submodule), without importing any package."""
    top = importlib.util.find_spec(HEAVY_PACKAGE)
    if top is None or not top.submodule_search_locations:
        raise _NotLiftable(f"{HEAVY_PACKAGE} not installed")
    base = Path(next(iter(top.submodule_search_locations)))
    parts = module.split(".")[1:]
    path = base.joinpath(*parts).with_suffix(".py")
    if not path.is_file():
        path = base.joinpath(*parts, "__init__.py")
    if not path.is_file():
        raise _NotLiftable(f"no source for {module}")
    return path


def _heavy(module: str | None) -> bool:
    return module is not None and (
        module == HEAVY_PACKAGE or module.startswith(HEAVY_PACKAGE + ".")
    )


def _lift(module: str, name: str, depth: int = 0) -> Any:
    """Compile the top-level definition (function or class) ``name`` of ``module`` from its
    source and return it, resolving the names it uses (at definition and call time) from that
    module's imports: light ones imported, torch ones lifted the same way."""
    if depth > MAX_DEPTH:
        raise _NotLiftable(f"{module}.{name}: too deep")
    tree = ast.parse(_source_path(module).read_text(encoding="utf-8"))
    found = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name
    ]
    if len(found) != 1:
        raise _NotLiftable(f"{module}.{name}: not one top-level definition")
    (definition,) = found
    used = {n.id for n in ast.walk(definition) if isinstance(n, ast.Name)}
    used |= {
        n.value.id
        for n in ast.walk(definition)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    namespace: dict[str, Any] = {"__name__": f"rankscope.lifted.{module}"}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                local = alias.asname or alias.name
                if local not in used:
                    continue
                if _heavy(node.module):
                    namespace[local] = _lift(str(node.module), alias.name, depth + 1)
                else:
                    mod = importlib.import_module(str(node.module))
                    namespace[local] = getattr(mod, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.partition(".")[0]
                if local not in used:
                    continue
                if _heavy(alias.name):
                    raise _NotLiftable(f"{module} uses the module {alias.name}")
                namespace[local] = importlib.import_module(alias.name)
    # names the definition binds itself: parameters, assignments, loop targets, nested defs
    defined = {n.arg for n in ast.walk(definition) if isinstance(n, ast.arg)}
    defined |= {
        n.id
        for n in ast.walk(definition)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    defined |= {
        n.name
        for n in ast.walk(definition)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    # a name it uses but neither imports, binds nor finds in builtins is a module-level helper
    # or constant: not the shape this expects
    missing = sorted(n for n in used - set(namespace) - defined if not hasattr(builtins, n))
    if missing:
        raise _NotLiftable(f"{module}.{name}: uses {missing}")
    code = compile(
        ast.Module(body=[definition], type_ignores=[]), str(_source_path(module)), "exec"
    )
    exec(code, namespace)  # the installed torch's own source, one definition of it
    return namespace[name]


def torchrun_parser() -> argparse.ArgumentParser:
    """torchrun's parser (``torch.distributed.run.get_args_parser()``), without importing torch
    where its source has the expected shape; else by importing it."""
    try:
        parser = _lift(RUN_MODULE, PARSER_FUNCTION)()
        if isinstance(parser, argparse.ArgumentParser):
            return parser
    except Exception:  # any surprise: torch's own import is the answer
        pass
    from torch.distributed.run import get_args_parser

    return get_args_parser()
