"""A new user's first hour (issue 8): shared results, a clone beside the work, a quiet terminal.

* Results follow the umask like any other file (a teammate can open the report under 022).
* A clone named ``rankscope`` in the current folder does not shadow the installed package.
* ``rankscope run`` shows neither Kineto's per-window ``USDT`` markers nor torchrun's OMP banner
  (a real run: tests/test_run_local.py::test_summary_printed).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rankscope import atomic
from rankscope.atomic import atomic_output
from rankscope.launchers import rundir
from rankscope.launchers.output import ConsoleFilter
from rankscope.launchers.spec import RunSpec
from rankscope.launchers.torchrun import OMP_THREADS_ENV, TORCHRUN_OMP_THREADS, rank_env

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"
STRAGGLER_DATA = "cpu_gloo_4rank_straggler"
#: umask -> mode of a new file (0666 masked), as ``open()`` gives it.
UMASK_MODES = [(0o022, 0o644), (0o077, 0o600)]
#: What a copy of the working tree leaves out (environments, caches, build output, git, data).
COPY_IGNORED = {
    ".venv",
    ".git",
    "build",
    "dist",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".typecheck",
    "rankscope-runs",
    "rankscope.egg-info",
}
#: Prints the facts of ``import rankscope`` that tell which package was imported.
IMPORT_PROBE = (
    "import rankscope, rankscope.analysis, rankscope.launchers.rundir; "
    "print(callable(rankscope.open), rankscope.__file__, rankscope.launchers.rundir.__file__)"
)
#: Kineto's markers as two ranks print them together: two markers, then their two newlines.
INTERLEAVED_MARKERS = [
    b"USDT:2026-11-30 10:34:11 6603:6603 SyncActivityProfilerHandler.cpp:52] profiler_start"
    b"USDT:2026-11-30 10:34:11 6602:6602 SyncActivityProfilerHandler.cpp:52] profiler_start\n",
    b"\n",
    b"USDT:2026-11-30 10:34:11 6603:6603 SyncActivityProfilerHandler.cpp:59] profiler_stop\n",
]


def mode_of(path: Path) -> int:
    """Permission bits of ``path``."""
    return path.stat().st_mode & 0o777


@pytest.fixture
def umask() -> Iterator[None]:
    """Restores the process umask after a test that sets it."""
    old = os.umask(0o022)
    os.umask(old)
    try:
        yield
    finally:
        os.umask(old)


# ------------------------------------------------------------------- item 5: permissions
@pytest.mark.parametrize(("mask", "expected"), UMASK_MODES, ids=["umask022", "umask077"])
def test_atomic_writers_honour_the_umask(
    umask: None, tmp_path: Path, mask: int, expected: int
) -> None:
    os.umask(mask)
    with atomic_output(tmp_path / "plain.bin") as fh:
        fh.write(b"x")
    with atomic_output(tmp_path / "shared.json.gz", mode=0o644) as fh:  # the Perfetto export
        fh.write(b"x")
    rundir.write_bytes_atomic(tmp_path / "ranks" / "00000" / "window-000.json.gz", b"x")
    rundir.write_json_atomic(tmp_path / rundir.RUN_JSON, {"state": "running"})
    for name in ("plain.bin", "ranks/00000/window-000.json.gz", rundir.RUN_JSON):
        assert oct(mode_of(tmp_path / name)) == oct(expected), name
    assert oct(mode_of(tmp_path / "shared.json.gz")) == oct(0o644 & ~mask)
    assert not list(tmp_path.rglob("*.tmp"))


def test_umask_is_read_the_same_without_proc(
    umask: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    os.umask(0o027)
    assert atomic.current_umask() == 0o027
    monkeypatch.setattr(atomic, "PROC_STATUS", tmp_path / "no-proc")
    assert atomic.current_umask() == 0o027
    assert os.umask(0o027) == 0o027, "the fallback restores the umask it read"


@pytest.mark.slow
def test_analyze_leaves_results_a_teammate_can_read(data_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(data_dir / STRAGGLER_DATA, run)
    res = subprocess.run(
        [sys.executable, "-m", "rankscope", "analyze", str(run), "--scheduler", "synchronous"],
        capture_output=True,
        text=True,
        timeout=240,
        umask=0o022,
    )
    assert res.returncode == 0, res.stderr
    for rel in (rundir.STORE_NAME, "report/summary.json", "report/report.html"):
        assert oct(mode_of(run / rel)) == oct(0o644), rel


# ----------------------------------------------------------------- item 9: import shadowing
def _copy_working_tree(dst: Path) -> None:
    """The checkout as a user's clone holds it (no environments, caches or test data)."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in COPY_IGNORED or n.endswith(".egg-info")}
        if Path(folder).resolve() == ROOT / "tests":
            skip.add("data")
        return skip

    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


def _probe(cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", IMPORT_PROBE],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_clone_in_the_current_folder_does_not_shadow_the_installed_package(
    tmp_path: Path,
) -> None:
    clone = tmp_path / "rankscope"
    _copy_working_tree(clone)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reference = _probe(elsewhere)
    assert reference.returncode == 0, reference.stderr
    beside = _probe(tmp_path)
    assert beside.returncode == 0, beside.stderr
    assert beside.stdout == reference.stdout, "the clone's parent imports the installed package"
    assert beside.stdout.startswith("True ")
    assert not beside.stdout.split()[1].startswith(str(clone))


def test_a_clone_with_nothing_installed_serves_itself(tmp_path: Path) -> None:
    clone = tmp_path / "rankscope"
    _copy_working_tree(clone)
    res = _probe(tmp_path, "-S")  # no site-packages: no editable finder, no installed rankscope
    assert res.returncode == 0, res.stderr
    ok, umbrella, rundir_file = res.stdout.split()
    assert ok == "True"
    assert Path(umbrella) == clone / "package" / "__init__.py"
    assert Path(rundir_file) == clone / "launchers" / "rundir.py"


def test_the_repository_root_under_another_name_does_nothing() -> None:
    """pytest imports the checkout's root as a package named after its folder (e.g. ``main``)."""
    before = sys.modules["rankscope"]
    spec = importlib.util.spec_from_file_location("not_rankscope", ROOT / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert sys.modules["rankscope"] is before
    assert not hasattr(module, "open")


# -------------------------------------------------------------------------- item 10: noise
def test_console_filter_drops_interleaved_kineto_markers_only() -> None:
    shown = ConsoleFilter()
    assert [shown(line) for line in INTERLEAVED_MARKERS] == [None, None, None]
    assert shown(b"\n") == b"\n", "a blank line of the job's own is kept once no newline is owed"
    assert shown(b"train_ddp: 6 steps\n") == b"train_ddp: 6 steps\n"
    spliced = (
        b"loss 0.98USDT:2026-11-30 10:34:11 1:1 SyncActivityProfilerHandler.cpp:59] profiler_stop\n"
    )
    assert shown(spliced) == b"loss 0.98\n"


def test_omp_threads_set_like_torchrun_only_when_unset(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(OMP_THREADS_ENV, raising=False)
    several = RunSpec(script="train.py", nproc_per_node=2)
    assert rank_env(several, tmp_path)[OMP_THREADS_ENV] == TORCHRUN_OMP_THREADS
    assert OMP_THREADS_ENV not in rank_env(RunSpec(script="train.py", nproc_per_node=1), tmp_path)
    assert OMP_THREADS_ENV not in rank_env(RunSpec(script="t.py", nproc_per_node=None), tmp_path)
    monkeypatch.setenv(OMP_THREADS_ENV, "4")
    assert rank_env(several, tmp_path)[OMP_THREADS_ENV] == "4"
