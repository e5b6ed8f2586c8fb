"""Shared fixtures: small real data in tests/data, and markers that skip what cannot run here."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
pytest_plugins = ["slurm_cluster"]  # the real local Slurm cluster fixture (tests/slurm_cluster.py)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: The modules whose tests use the real Slurm cluster (the session fixture ``slurm_cluster``):
#: under ``pytest -n 2 --dist loadscope`` (tests/run.sh) they are one unit of work, so one worker
#: starts the cluster and runs them all while the other runs the rest. A test elsewhere that uses
#: the cluster is a collection error (two workers would start it at once).
SLURM_MODULES = frozenset(
    {"test_slurm.py", "test_slurm_hang.py", "test_merge_slurm.py", "test_analyze_cli.py"}
)
#: The unit of work of :data:`SLURM_MODULES`.
SLURM_SCOPE = "slurm"


def _in_slurm_module(nodeid: str) -> bool:
    return Path(nodeid.split("::", 1)[0]).name in SLURM_MODULES


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadscope`` with the Slurm modules as one scope (else xdist's own scheduler).

    Why: most of the Slurm tests' time (~200 s for ~50 s CPU) is waiting for slurmctld, which
    the other tests can use; every other module stays one scope, so its module-scoped fixtures
    (a real run its tests share) run once."""
    if config.getoption("dist", None) != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SlurmTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SLURM_SCOPE if _in_slurm_module(nodeid) else nodeid.split("::", 1)[0]

    return SlurmTogether(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Slurm modules first (their unit starts at once; run.sh keeps the collection order
    with ``--no-loadscope-reorder``); GPU tests skipped without a GPU."""
    stray = [
        item.nodeid
        for item in items
        if "slurm_cluster" in getattr(item, "fixturenames", ())
        and not _in_slurm_module(item.nodeid)
    ]
    if stray:
        raise pytest.UsageError(
            f"{stray[0]} uses the Slurm cluster outside SLURM_MODULES (tests/conftest.py)"
        )
    items.sort(key=lambda item: not _in_slurm_module(item.nodeid))
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: small real traces copied from the shared data set (with their LICENSE)."""
    return DATA
