"""What a test needs from the machine (root, a cluster): skipped on a developer's machine that
lacks it, a failure under CI."""

from __future__ import annotations

import os

import pytest


def unavailable(reason: str) -> None:
    """Skip the test that cannot run here, with ``reason``; under CI (``$CI`` set, as CI runners
    set it) fail with the same words instead: a CI machine that cannot run it must not pass
    without it."""
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(reason)
    pytest.skip(reason)
