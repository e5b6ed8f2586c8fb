"""The wheel holds every package folder and module, and works when installed (not the source tree).

The wheel is installed into a fresh venv whose only view of the main environment is a path entry
for the dependencies (torch, rich …): the editable install's import hook would otherwise make
``import rankscope`` read the source tree, and this test would prove nothing.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: import package -> source folder (pyproject's package-dir).
PACKAGE_DIRS = {
    "rankscope": "package",
    "rankscope.orchestrator": "orchestrator",
    "rankscope.launchers": "launchers",
    "rankscope.analysis": "analysis",
    "rankscope.slurm": "slurm",
}
#: What users and the other floors type; each must import from the installed wheel.
PUBLIC_NAMES = [
    "rankscope.open",
    "rankscope.step",
    "rankscope.__version__",
    "rankscope.errors.RankscopeError",
    "rankscope.errors.UsageError",
    "rankscope.errors.InputFileError",
    "rankscope.orchestrator.cli.main",
    "rankscope.orchestrator.run.main",
    "rankscope.launchers.base.Launcher",
    "rankscope.launchers.base.RunHandle",
    "rankscope.launchers.rundir.load_run",
    "rankscope.launchers.base.open_run",
    "rankscope.launchers.local.LocalLauncher",
    "rankscope.launchers.spec.RunSpec",
    "rankscope.launchers.spec.ProfilerSettings",
    "rankscope.launchers.spec.LauncherKind",
    "rankscope.launchers.runtime.step",
    "rankscope.launchers.rank.main",
    "rankscope.launchers.clocksync.exchange",
    "rankscope.launchers.rundir.RunState",
    "rankscope.analysis.schema",
    "rankscope.analysis.analyze",
    "rankscope.analysis.open_store",
]

#: The HTML pages' Jinja2 templates (package data of rankscope.analysis.render).
TEMPLATES = "analysis/render/templates"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(ROOT),
            "-w",
            str(out),
        ],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (path,) = out.glob("rankscope-*.whl")
    return path


@pytest.fixture(scope="module")
def venv_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # dependencies from the main environment, WITHOUT running its .pth files (the editable hook)
    (site / "_main_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    scripts = venv / "bin"
    (scripts / "rankscope").write_text(
        f"#!{py}\nimport sys\nfrom rankscope.orchestrator.cli import main\nsys.exit(main())\n"
    )
    (scripts / "rankscope").chmod(0o755)
    return py


def test_every_package_folder_and_module_is_in_the_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for package, folder in PACKAGE_DIRS.items():
        prefix = package.replace(".", "/")
        assert f"{prefix}/__init__.py" in names, f"{package} missing from the wheel"
        for source in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in source.parts:
                continue
            member = f"{prefix}/{source.relative_to(ROOT / folder).as_posix()}"
            assert member in names, (
                f"{folder}/{source.relative_to(ROOT / folder)} missing from the wheel"
            )
    assert "rankscope/py.typed" in names
    # the trace reader's compiled scanner (setup.py), built for this Python
    assert any(
        n.startswith("rankscope/orchestrator/ingest/_kineto_scan.") and n.endswith(".so")
        for n in names
    ), "the compiled scanner is missing from the wheel"
    # the HTML pages' templates (package data)
    templates = sorted((ROOT / TEMPLATES).glob("*.html.j2"))
    assert templates
    for source in templates:
        member = f"rankscope/analysis/render/templates/{source.name}"
        assert member in names, f"{TEMPLATES}/{source.name} missing from the wheel"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "rankscope = rankscope.orchestrator.cli:main"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )


def test_public_names_import_from_the_installed_wheel(venv_python: Path, tmp_path: Path) -> None:
    code = "\n".join(
        [
            "import importlib, pkgutil, rankscope",
            "root = rankscope.__path__[0]",
            "assert '/package' not in root and 'site-packages' in root, root",
            "mods = [m.name for m in pkgutil.walk_packages(rankscope.__path__, 'rankscope.')",
            "        if not m.name.endswith('__main__')]",
            "for m in mods: importlib.import_module(m)",
            f"for name in {PUBLIC_NAMES!r}:",
            "    mod, _, attr = name.rpartition('.')",
            "    try:",
            "        obj = importlib.import_module(name)",
            "    except ImportError:",
            "        obj = getattr(importlib.import_module(mod), attr)",
            "    assert obj is not None, name",
            "from rankscope.orchestrator.ingest import kineto_scan",
            "assert kineto_scan.AVAILABLE and 'site-packages' in kineto_scan._kineto_scan.__file__",
            "print(len(mods), 'modules')",
        ]
    )
    proc = subprocess.run(
        [str(venv_python), "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[0]) >= len(PACKAGE_DIRS)


def test_console_script_help(venv_python: Path, tmp_path: Path) -> None:
    rankscope = venv_python.parent / "rankscope"
    top = subprocess.run([str(rankscope), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert top.returncode == 0 and "run" in top.stdout
    run = subprocess.run(
        [str(rankscope), "run", "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 0 and "--nproc-per-node" in run.stdout and "--active" in run.stdout


def test_the_html_report_renders_from_the_installed_wheel(
    venv_python: Path, tmp_path: Path
) -> None:
    """Every template loads from the installed package, and ``rankscope analyze --html`` of a
    real run writes the report (the templates are package data, not the source tree's)."""
    import shutil

    expected = sorted(p.name for p in (ROOT / TEMPLATES).glob("*.html.j2"))
    code = "\n".join(
        [
            "from rankscope.analysis.render import templating",
            "env = templating.environment()",
            "names = templating.template_names()",
            "for n in names: env.get_template(n)",
            "path = env.get_template(names[0]).filename",
            "assert 'site-packages' in path and '/analysis/render/' in path, path",
            "print(' '.join(names))",
        ]
    )
    proc = subprocess.run(
        [str(venv_python), "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == expected
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "cpu_gloo_4rank_straggler", run)
    report = tmp_path / "report.html"
    rankscope = venv_python.parent / "rankscope"
    res = subprocess.run(
        [str(rankscope), "analyze", str(run), "--scheduler", "synchronous", "--html", str(report)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<h2>Stragglers</h2>" in page
