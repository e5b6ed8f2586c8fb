"""The floors (docs/architecture.md): ``orchestrator`` on top may import ``launchers`` and
``analysis``; those two never import each other nor the orchestrator. Shared pieces (errors,
atomic output) live in the ``rankscope`` umbrella (``package/``), which anyone may import.

Imports are read from the source with ``ast`` — module level and inside functions alike, since
the project imports heavy modules lazily — so a sideways import cannot hide in a function body.
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
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path`` (``from x import y`` gives ``x`` and ``x.y``)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
    return out


def violations(floor: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / floor).glob("*.py")):
        for line, module in imported_modules(path):
            if any(module == f or module.startswith(f + ".") for f in FORBIDDEN[floor]):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("floor", sorted(FORBIDDEN))
def test_no_upward_or_sideways_import(floor: str) -> None:
    assert violations(floor) == []


def test_the_guard_sees_imports_inside_functions(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from rankscope.analysis.schema import EventKind\n")
    assert (2, "rankscope.analysis.schema") in imported_modules(src)


def test_one_word_for_the_in_process_scheduler() -> None:
    """merge and analyze take their scheduler words from one module (analysis/scheduler.py)."""
    from rankscope.analysis.pipeline import SYNCHRONOUS as ANALYSIS
    from rankscope.analysis.scheduler import SYNCHRONOUS as MERGE

    assert MERGE == ANALYSIS


#: A module may grow past this many lines only when its docstring says why it is one module.
LONG_MODULE_LINES = 500


def test_long_modules_say_why_they_are_one_module() -> None:
    """Issue 10: no module over ~500 lines without a sentence in its docstring saying why."""
    import ast

    silent = []
    for folder in ("orchestrator", "launchers", "analysis", "package"):
        for path in sorted((ROOT / folder).glob("*.py")):
            text = path.read_text()
            if len(text.splitlines()) <= LONG_MODULE_LINES:
                continue
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "Why one module" not in doc:
                silent.append(f"{folder}/{path.name} ({len(text.splitlines())} lines)")
    assert not silent, f"long modules without a 'Why one module' sentence: {silent}"
