"""The floors (docs/architecture.md): ``orchestrator`` on top may import ``launchers`` and
``analysis``; those two never import each other nor the orchestrator. Shared pieces (errors,
atomic output) live in the ``rankscope`` umbrella (``package/``), which anyone may import, and
Slurm's own words (its tools, their output, its job states) in the shared ``slurm/`` folder
(``rankscope.slurm``), which anyone may import and which imports only the umbrella.

Imports are read from the source with ``ast`` — module level and inside functions alike, since
the project imports heavy modules lazily — so a sideways import cannot hide in a function body;
every folder is read recursively, so a subpackage (``orchestrator/synth/``) cannot escape. Inside
the floors no two modules import each other, directly or around a cycle (imports under ``if
TYPE_CHECKING:`` do not run and do not count), and no module is over 600 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: floor -> the rankscope subpackages it must not import
FORBIDDEN = {
    "launchers": ("rankscope.analysis", "rankscope.orchestrator"),
    "analysis": ("rankscope.launchers", "rankscope.orchestrator"),
    "orchestrator": (),
    "slurm": ("rankscope.launchers", "rankscope.analysis", "rankscope.orchestrator"),
}


def imported_modules(path: Path, *, runtime_only: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path`` (``from x import y`` gives ``x`` and ``x.y``);
    ``runtime_only``: leave out those under ``if TYPE_CHECKING:`` (they never run)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for b in node.body for n in ast.walk(b))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
    return out


def violations(floor: str, root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / floor).rglob("*.py")):
        for line, module in imported_modules(path):
            if any(module == f or module.startswith(f + ".") for f in FORBIDDEN[floor]):
                bad.append(f"{path.relative_to(root)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("floor", sorted(FORBIDDEN))
def test_no_upward_or_sideways_import(floor: str) -> None:
    assert violations(floor) == []


def test_the_guard_sees_imports_inside_functions(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from rankscope.analysis.store.schema import EventKind\n")
    assert (2, "rankscope.analysis.store.schema") in imported_modules(src)


def test_the_guard_sees_the_shared_slurm_folder_import_a_floor(tmp_path: Path) -> None:
    """``rankscope.slurm`` is shared by the launchers and the analysis: it may import neither
    (nor the orchestrator), or the floors would reach each other through it."""
    shared = tmp_path / "slurm"
    shared.mkdir()
    (shared / "commands.py").write_text(
        "from rankscope.errors import RankscopeError\n"
        "def f():\n    from rankscope.launchers.rundir import RunState\n"
        "import rankscope.analysis.engine.slurm_workers\n"
    )
    assert sorted(violations("slurm", tmp_path)) == [
        "slurm/commands.py:3 imports rankscope.launchers.rundir",
        "slurm/commands.py:3 imports rankscope.launchers.rundir.RunState",
        "slurm/commands.py:4 imports rankscope.analysis.engine.slurm_workers",
    ]


def test_the_guard_reads_subpackages(tmp_path: Path) -> None:
    sub = tmp_path / "analysis" / "views"
    sub.mkdir(parents=True)
    (sub / "mod.py").write_text("from rankscope.orchestrator.ingest.merge import merge_run_dir\n")
    assert violations("analysis", tmp_path) == [
        "analysis/views/mod.py:1 imports rankscope.orchestrator.ingest.merge",
        "analysis/views/mod.py:1 imports rankscope.orchestrator.ingest.merge.merge_run_dir",
    ]


#: folder -> the package it is installed as (pyproject.toml's package-dir)
PACKAGES = {
    "orchestrator": "rankscope.orchestrator",
    "launchers": "rankscope.launchers",
    "analysis": "rankscope.analysis",
    "package": "rankscope",
    "slurm": "rankscope.slurm",
}


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports when it runs (functions included, ``if
    TYPE_CHECKING:`` blocks left out); ``from pkg import mod`` counts as importing ``pkg.mod``."""
    files: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in (root / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(root / folder).with_suffix("").parts]
            parts = [p for p in parts if p != "__init__"]
            files[".".join([package, *parts])] = path
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        for _, name in imported_modules(path, runtime_only=True):
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name not in (module, "rankscope"):
                graph[module].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_inside_the_floors() -> None:
    assert cycles(module_graph()) == []


def test_the_cycle_guard_sees_a_cycle_through_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "analysis"
    pkg.mkdir()
    (pkg / "a.py").write_text("from rankscope.analysis.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from rankscope.analysis import a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rankscope.analysis import a\n"
    )
    for folder in ("orchestrator", "launchers", "package"):
        (tmp_path / folder).mkdir()
    assert cycles(module_graph(tmp_path)) == [["rankscope.analysis.a", "rankscope.analysis.b"]]


def test_the_generator_is_independent_of_the_analysis() -> None:
    """``rankscope synth`` writes the ground truth the analysis is judged against
    (tests/test_scenarios.py): it may share nothing with the analysis or the merge that read its
    traces, or a mistake in either could agree with itself."""
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "orchestrator" / "synth").rglob("*.py"))
        for line, module in imported_modules(path)
        if module.startswith(("rankscope.analysis", "rankscope.orchestrator."))
        and not module.startswith("rankscope.orchestrator.synth")
    ]
    assert bad == []


#: No module may be longer than this, whatever its docstring says (issue 25).
MAX_MODULE_LINES = 600


def test_no_module_over_600_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)} ({n} lines)"
        for folder in PACKAGES
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long == []


def test_one_word_for_the_in_process_scheduler() -> None:
    """merge and analyze take their scheduler words from one module (analysis/engine/scheduler.py)."""
    from rankscope.analysis.engine.driver import SYNCHRONOUS as ANALYSIS
    from rankscope.analysis.engine.scheduler import SYNCHRONOUS as MERGE

    assert MERGE == ANALYSIS


#: A module may grow past this many lines only when its docstring says why it is one module.
LONG_MODULE_LINES = 500


def test_long_modules_say_why_they_are_one_module() -> None:
    """Issue 10: no module over ~500 lines without a sentence in its docstring saying why."""
    import ast

    silent = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            if len(text.splitlines()) <= LONG_MODULE_LINES:
                continue
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "Why one module" not in doc:
                silent.append(f"{path.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    assert not silent, f"long modules without a 'Why one module' sentence: {silent}"


#: The inner floors of the analysis, lowest first (docs/architecture.md): a module may import its
#: own floor and those below it, never one above. The package's own ``__init__`` (the public
#: facade, which loads names lazily) stands above them all.
ANALYSIS_FLOORS = ("store", "compute", "engine", "conclude", "render", "views")


def inner_violations(root: Path = ROOT) -> list[str]:
    """Imports from a lower inner floor of the analysis into a higher one, and modules that sit
    in no floor."""
    bad = []
    for path in sorted((root / "analysis").rglob("*.py")):
        rel = path.relative_to(root / "analysis")
        if rel.parts == ("__init__.py",):
            continue
        if len(rel.parts) < 2 or rel.parts[0] not in ANALYSIS_FLOORS:
            bad.append(f"analysis/{rel} is in no floor of {ANALYSIS_FLOORS}")
            continue
        level = ANALYSIS_FLOORS.index(rel.parts[0])
        for line, module in imported_modules(path):
            parts = module.split(".")
            if parts[:2] != ["rankscope", "analysis"] or len(parts) < 3:
                continue
            if parts[2] in ANALYSIS_FLOORS and ANALYSIS_FLOORS.index(parts[2]) > level:
                bad.append(f"analysis/{rel}:{line} imports {module} (a floor above)")
            elif parts[2] not in ANALYSIS_FLOORS:
                bad.append(f"analysis/{rel}:{line} imports {module} (no floor)")
    return sorted(set(bad))


def test_the_analysis_floors_only_import_downwards() -> None:
    assert inner_violations() == []


def test_the_inner_guard_sees_an_upward_import_and_a_loose_module(tmp_path: Path) -> None:
    compute = tmp_path / "analysis" / "compute"
    compute.mkdir(parents=True)
    (compute / "mod.py").write_text("def f():\n    from rankscope.analysis.render import report\n")
    (tmp_path / "analysis" / "loose.py").write_text("")
    (tmp_path / "analysis" / "__init__.py").write_text("from rankscope.analysis.views import app\n")
    assert inner_violations(tmp_path) == [
        "analysis/compute/mod.py:2 imports rankscope.analysis.render (a floor above)",
        "analysis/compute/mod.py:2 imports rankscope.analysis.render.report (a floor above)",
        "analysis/loose.py is in no floor of " + str(ANALYSIS_FLOORS),
    ]


#: Inside the orchestrator and the launchers: folder -> the modules of its floor that it must not
#: import. ``orchestrator/ingest`` (the merge) sits below the commands (the modules at
#: ``orchestrator/``'s top) and the generator; ``launchers/slurm`` (a backend) above the
#: launchers' core, which finds it by name only.
INNER_FORBIDDEN = {
    "orchestrator/ingest": ("rankscope.orchestrator.",),
    "launchers": ("rankscope.launchers.slurm",),
}
#: What a folder of INNER_FORBIDDEN may import all the same: its own floor.
INNER_ALLOWED = {
    "orchestrator/ingest": ("rankscope.orchestrator.ingest",),
    "launchers": (),
}


def floor_violations(folder: str, root: Path = ROOT) -> list[str]:
    """Imports of a folder of :data:`INNER_FORBIDDEN` into what it must not import (for
    ``launchers``: its top-level modules only; its backend folder is above them)."""
    base = root / folder
    paths = sorted(base.rglob("*.py")) if folder != "launchers" else sorted(base.glob("*.py"))
    bad = []
    for path in paths:
        for line, module in imported_modules(path):
            name = module + "."
            if any(
                name.startswith(f if f.endswith(".") else f + ".") for f in INNER_FORBIDDEN[folder]
            ) and not any(name.startswith(a + ".") for a in INNER_ALLOWED[folder]):
                bad.append(f"{path.relative_to(root)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("folder", sorted(INNER_FORBIDDEN))
def test_the_inner_floors_of_the_orchestrator_and_launchers(folder: str) -> None:
    assert floor_violations(folder) == []


def test_the_ingest_guard_sees_an_import_of_a_command(tmp_path: Path) -> None:
    ingest = tmp_path / "orchestrator" / "ingest"
    ingest.mkdir(parents=True)
    (ingest / "mod.py").write_text(
        "from rankscope.orchestrator.ingest import clock\n"
        "def f():\n    from rankscope.orchestrator.analyze import print_run_summary\n"
    )
    assert floor_violations("orchestrator/ingest", tmp_path) == [
        "orchestrator/ingest/mod.py:3 imports rankscope.orchestrator.analyze",
        "orchestrator/ingest/mod.py:3 imports rankscope.orchestrator.analyze.print_run_summary",
    ]
