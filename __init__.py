"""Keeps a clone of this repository from shadowing the installed ``rankscope``.

Why this file exists: people clone into ``~/src/rankscope`` and work from ``~/src``. Python puts
the current folder first on ``sys.path``, and without this file the clone's folder is a
*namespace package* called ``rankscope`` (a folder without ``__init__.py``). setuptools'
editable install (plain ``pip install -e .``) serves ``rankscope`` from a finder appended to
``sys.meta_path`` *after* the ``PathFinder``, so the empty namespace won:
``module 'rankscope' has no attribute 'open'``; torchrun's ranks (``python -m
rankscope.launchers.rank`` in that folder) failed the same way.

With this file the clone's folder is a regular package, and when it is imported as
``rankscope`` it hands over to the *installed* rankscope: it asks every ``sys.meta_path`` finder
for ``rankscope`` while ignoring this folder (so an editable finder, or a regular install in
site-packages, is found), loads that package, and puts it in ``sys.modules["rankscope"]``. The
import system returns ``sys.modules[name]`` after executing a module, so ``import rankscope``
then yields the installed package, ``rankscope.__file__`` included (documented in the language
reference, "The import system", 5.4.1 Loaders). When nothing is installed, the clone itself is
served (``package/`` as the umbrella, the top-level folders as subpackages), as the install
would lay it out.

Alternatives rejected: setuptools' strict editable mode (``--config-settings
editable_mode=strict``) puts a real package on ``sys.path`` and so beats the namespace, but a
user who types plain ``pip install -e .`` still hits the bug, and new modules need a
re-install. A fix inside ``package/__init__.py`` cannot work: that file is never reached when
the namespace wins.

Under any other name (pytest imports the repository root as a package named after the folder,
e.g. ``main``), this module does nothing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

#: The import name this folder stands in for.
_PACKAGE = "rankscope"
#: The folder (relative to this one) holding the umbrella package's ``__init__.py``.
_UMBRELLA_DIR = "package"


def _resolve(entry: str) -> Path | None:
    """``sys.path`` entry as an absolute, resolved folder ("" is the current folder)."""
    try:
        return Path(entry or os.getcwd()).resolve()
    except (OSError, RuntimeError):
        return None


def _installed_spec(clone: Path) -> ModuleSpec | None:
    """Spec of a ``rankscope`` that is not this clone's root, from the regular finders."""
    # The folder this file was found in, as imported (a symlink named rankscope) and resolved.
    parents = {_resolve(str(Path(__file__).absolute().parent.parent)), clone.parent}
    search_path = [p for p in sys.path if isinstance(p, str) and _resolve(p) not in parents]
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            if finder is PathFinder:
                spec = PathFinder.find_spec(_PACKAGE, search_path)
            else:
                spec = find_spec(_PACKAGE, None)
        except (ImportError, OSError, ValueError):
            continue
        if spec is None or spec.loader is None or not spec.has_location or spec.origin is None:
            continue  # nothing, or a namespace portion: not an installed package
        if Path(spec.origin).resolve().parent == clone:
            continue  # this very file, found again through another finder
        return spec
    return None


def _clone_spec(clone: Path) -> ModuleSpec | None:
    """Spec serving this clone as the installed layout would: umbrella + top-level folders."""
    umbrella = clone / _UMBRELLA_DIR
    return importlib.util.spec_from_file_location(
        _PACKAGE,
        umbrella / "__init__.py",
        submodule_search_locations=[str(umbrella), str(clone)],
    )


def _hand_over() -> None:
    """Replace this module in ``sys.modules`` by the installed rankscope (or the clone's)."""
    clone = Path(__file__).resolve().parent
    spec = _installed_spec(clone) or _clone_spec(clone)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[_PACKAGE] = module  # before exec: the package's own imports must find it
    spec.loader.exec_module(module)  # on an error, the import system drops the entry


if __name__ == _PACKAGE:
    _hand_over()
