"""pytest plugin: a REAL local Slurm cluster (two emulated nodes, with accounting) for tests.

Registered in tests/conftest.py (``pytest_plugins``). The session fixture :func:`slurm_cluster`
runs ``slurm/slurm-up.sh --nodes 2`` (installs the Debian packages the first time: root and
apt-get needed), exports ``SLURM_CONF`` for the session, and at the end stops the cluster by its
PID files with ``slurm/slurm-down.sh`` — unless it was already running before the session, in
which case it is left as found. Tests that do not use the fixture never start anything.

The cluster lives in its own folder and ports so it never clashes with one started by hand:
``$RANKSCOPE_TEST_SLURM_ROOT`` [/tmp/rankscope-slurm-tests], ``$RANKSCOPE_TEST_SLURM_PORT`` [7817].
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from needs import unavailable

REPO = Path(__file__).resolve().parents[1]
SLURM_UP = REPO / "slurm" / "slurm-up.sh"
SLURM_DOWN = REPO / "slurm" / "slurm-down.sh"
#: Folder of the test cluster (config, state, logs, PID files).
ROOT = Path(os.environ.get("RANKSCOPE_TEST_SLURM_ROOT", "/tmp/rankscope-slurm-tests"))
#: slurmctld port of the test cluster (the others follow it, see slurm-up.sh).
PORT = os.environ.get("RANKSCOPE_TEST_SLURM_PORT", "7817")
#: Emulated nodes of the test cluster.
NODES = 2
#: CPUs each emulated node advertises, whatever the host has (``RANKSCOPE_SLURM_CPUS``): a test
#: module runs several 2-node jobs (one CPU per node each) and their one-CPU merge jobs at once;
#: with the host's 2 CPUs per node the third job would wait in the queue for the first to end.
#: The jobs share the host's cores either way.
CPUS_PER_NODE = 8
#: Seconds slurm-up.sh may take (a first start installs packages with apt-get).
UP_TIMEOUT_S = 900
DOWN_TIMEOUT_S = 300


@dataclass(frozen=True)
class LocalSlurm:
    """The running test cluster."""

    root: Path
    """Folder of everything (``etc/slurm.conf``, ``log/``, ``run/``)."""
    conf: Path
    """Its ``slurm.conf`` (exported as ``SLURM_CONF`` for the session)."""
    nodes: int
    """Number of emulated nodes (n1, n2, …)."""
    partition: str = "debug"
    """The default partition."""

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` (and ``extra``) set."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}


def _controller_running(root: Path) -> bool:
    """True when the PID file names a live slurmctld (same check as the scripts)."""
    pid_file = root / "run" / "slurmctld.pid"
    try:
        pid = int(pid_file.read_text().strip())
        exe = Path(os.readlink(f"/proc/{pid}/exe")).name
    except (OSError, ValueError):
        return False
    return exe in ("slurmctld", "slurmctld-wlm")


def _unavailable(reason: str) -> None:
    """The Slurm tests cannot run here: :func:`needs.unavailable`."""
    unavailable(reason)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalSlurm]:
    """Start (or reuse) the two-node local cluster; stop it after the session if we started it."""
    if os.geteuid() != 0:
        _unavailable("the local Slurm cluster needs root (slurm/slurm-up.sh)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        _unavailable("no Slurm and no apt-get to install it")
    env = {
        **os.environ,
        "RANKSCOPE_SLURM_ROOT": str(ROOT),
        "RANKSCOPE_SLURM_PORT": PORT,
        "RANKSCOPE_SLURM_CPUS": str(CPUS_PER_NODE),
    }
    env.pop("SLURM_CONF", None)
    # dask's LocalCluster sets OMP_NUM_THREADS=1 in its parent process (an earlier test);
    # the daemons and the jobs they run must not inherit it.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(var, None)
    was_running = _controller_running(ROOT)
    res = subprocess.run(
        ["bash", str(SLURM_UP), "--nodes", str(NODES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
        check=False,
    )
    if res.returncode != 0:
        pytest.fail(f"slurm/slurm-up.sh failed ({res.returncode}):\n{res.stderr[-4000:]}")
    cluster = LocalSlurm(root=ROOT, conf=ROOT / "etc" / "slurm.conf", nodes=NODES)
    patch = pytest.MonkeyPatch()
    patch.setenv("SLURM_CONF", str(cluster.conf))
    try:
        yield cluster
    finally:
        patch.undo()
        if not was_running:
            subprocess.run(
                ["bash", str(SLURM_DOWN)],
                env=env,
                capture_output=True,
                timeout=DOWN_TIMEOUT_S,
                check=False,
            )


#: ``python -c`` program that runs ``python -m rankscope ARGS...`` with Ctrl-C's default handling
#: (see :func:`interruptible`).
_INTERRUPTIBLE = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('rankscope', run_name='__main__', alter_sys=True)"
)


def interruptible(*args: str) -> list[str]:
    """The command line of ``rankscope ARGS...`` for a test that sends it SIGINT (Ctrl-C).

    A test session started with SIGINT ignored (a background job of a non-interactive shell,
    ``pytest &`` or ``nohup``, as CI runners start it) passes that on through fork and exec;
    Python keeps an inherited SIG_IGN, and rankscope keeps a user's choice to ignore SIGINT
    (``merge_cli.interrupt_wins``), so the test's SIGINT would never reach the command, which then
    runs on until the test's timeout (seen: ``SigIgn: 0000000001001007`` in the merge's
    ``/proc/PID/status``, its main thread still waiting for results 240 s later). The command
    gets Python's own SIGINT handler first, as from a terminal.
    """
    return [sys.executable, "-c", _INTERRUPTIBLE, *args]


def rankscope(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the real ``rankscope`` command line (this venv's) to its end; the CompletedProcess
    (text)."""
    return subprocess.run(
        [sys.executable, "-m", "rankscope", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
