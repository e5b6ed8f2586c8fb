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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: small real traces copied from the shared data set (with their LICENSE)."""
    return DATA
