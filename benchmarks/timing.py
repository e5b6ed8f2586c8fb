"""Timing a whole process, as a user feels it: shared by the benchmark scripts beside it.

Run a script of this folder directly (``python benchmarks/x.py``): Python puts this folder first
on ``sys.path``, so ``from timing import whole_process_s`` finds this module.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def whole_process_s(argv: list[str], cwd: Path | None = None) -> float:
    """Wall seconds of one whole process (its output kept out of the benchmark's table); a
    failure stops the benchmark with the command and the end of its stderr."""
    t = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv[:4])}… failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
        )
    return wall
