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


#: The xdist group of the tests that use the real Slurm cluster: one worker runs them all (one
#: cluster per session), first, while the other worker runs the rest.
SLURM_GROUP = "slurm"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for ``pytest -n 2 --dist loadgroup`` (tests/run.sh), and skip GPU tests
    without a GPU.

    Why: most of the Slurm tests' time (~200 s of ~50 s CPU) is waiting for slurmctld, which
    the other tests can use. Each module is one group, so its module-scoped fixtures (a real
    run shared by its tests) run once; every test that uses the Slurm cluster is in one group,
    so one worker starts the cluster, and that group is collected first so it starts at once.
    Without xdist the markers are inert and only the order changes."""
    for item in items:
        slurm = "slurm_cluster" in getattr(item, "fixturenames", ())
        item.add_marker(pytest.mark.xdist_group(SLURM_GROUP if slurm else item.path.stem))
    items.sort(key=lambda item: "slurm_cluster" not in getattr(item, "fixturenames", ()))
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: small real traces copied from the shared data set (with their LICENSE)."""
    return DATA
