"""What must start light stays light: the paths a user waits on before any work import no heavy
library (docs/architecture.md, "Deferred imports").

Light paths: ``rankscope --help`` and every command's ``--help`` (the top parser and each
command module's ``configure``), ``rankscope status RUN``, ``rankscope cancel RUN``, and the start
of ``python -m rankscope.launchers.rank`` before the user's script. Each is run in a fresh
interpreter (``sys.executable -c``) and ``sys.modules`` is read at the end: a module that a light
path imports must keep its numpy/pandas/h5py/… imports inside the functions that need them;
every other module imports them at its top like normal code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from run_folders import failed_local_run

#: top-level packages no light path may import
HEAVY = (
    "numpy",
    "pandas",
    "h5py",
    "torch",
    "dask",
    "distributed",
    "holoviews",
    "bokeh",
    "panel",
    "scipy",
    "jinja2",
)

#: printed last by every probe: the heavy packages found in ``sys.modules``
_REPORT = f"""
import json as _json
import sys as _sys
_heavy = sorted({{m.split(".")[0] for m in _sys.modules}} & set({HEAVY!r}))
print("HEAVY=" + _json.dumps(_heavy))
"""


def heavy_after(code: str) -> list[str]:
    """The heavy packages imported once ``code`` has run in a fresh interpreter."""
    script = textwrap.dedent(code) + _REPORT
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("HEAVY=")][-1]
    return list(json.loads(line.removeprefix("HEAVY=")))


def test_every_parser_and_help_is_light() -> None:
    """``rankscope --help`` and every command's ``--help`` (``run`` parses its own flags)."""
    code = """
    import contextlib, io, sys
    from rankscope.orchestrator import cli

    parser = cli.build_parser()
    parser.format_help()
    names = []
    for name in cli.COMMANDS:
        sub = cli._sub_parser(parser, name)
        assert sub is not None, name
        sub.format_help()
        names.append(name)
    assert set(names) == set(cli.COMMANDS), names
    for argv in (["--help"], ["run", "--help"], *([n, "--help"] for n in cli.COMMANDS)):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                cli.main(argv)
            except SystemExit as exc:
                assert exc.code in (0, None), (argv, exc.code)
    """
    assert heavy_after(code) == []


def test_status_and_cancel_are_light(tmp_path: Path) -> None:
    """``rankscope status RUN`` (and ``--json``), ``rankscope cancel RUN`` on a local run."""
    run_dir = failed_local_run(tmp_path)
    code = f"""
    import contextlib, io, sys
    from rankscope.orchestrator import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["status", {str(run_dir)!r}]) == 0
        assert cli.main(["status", "--json", {str(run_dir)!r}]) == 0
    assert "rank 1 failed" in out.getvalue(), out.getvalue()
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["cancel", {str(run_dir)!r}]) == 2  # a local run: nothing to cancel
    """
    assert heavy_after(code) == []


def test_rank_entry_is_light_before_the_script() -> None:
    """``python -m rankscope.launchers.rank``: its modules and the runtime's load no heavy
    library (the runtime imports torch once it starts the profiler, never pandas)."""
    code = """
    import rankscope.launchers.rank
    import rankscope.launchers.runtime
    """
    assert heavy_after(code) == []
