"""Record the runs in this folder (a compute regression; tests/test_compare.py).

    python tests/data/compare_ddp_3rank_wide/make_runs.py        # from the project root

Two ``rankscope run`` of ``examples/train_ddp.py`` on 3 ranks (torch CPU, gloo), one after the
other, 10 profiled steps each (wait 1, warmup 1, active 10: steps 2-11): ``base`` with the
example's defaults and ``wide`` with ``--hidden 1024`` (a wider model: more matmul work per
step). Only ``run.json`` and ``ranks/`` are kept (the tests merge a copy).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
RUNS: dict[str, tuple[str, ...]] = {"base": (), "wide": ("--hidden", "1024")}
PROFILED = 10


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in RUNS.items():
            cmd = [
                sys.executable, "-m", "rankscope.orchestrator", "run",
                "--nproc-per-node", "3", "--out", tmp, "--name", name,
                "--wait", "1", "--warmup", "1", "--active", str(PROFILED), "--repeat", "1",
                "--no-analyze", str(EXAMPLE), "--steps", str(PROFILED + 4), *extra,
            ]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"run {name} failed:\n{proc.stderr[-2000:]}")
            (run,) = [p for p in Path(tmp).iterdir() if p.is_dir() and f"-{name}-" in p.name]
            dest = HERE / name
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            shutil.copy2(run / "run.json", dest / "run.json")
            shutil.copytree(run / "ranks", dest / "ranks")
            print(f"{name}: {run.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
